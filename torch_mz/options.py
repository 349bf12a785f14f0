r"""Options given as ``KEY=VALUE`` text (the CLI's ``--task-arg``/``--model-arg``, model specs
such as ``hypernet:rank=4``): reading them, and checking them against the defaults of what they
configure (a task, a model preset) before any work is done."""
import json
import numbers
import re
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple

__all__ = ['parse_key_values', 'check_options']


_PYTHON_CONSTANTS = {'True': True, 'False': False, 'None': None}

# Python's decimal literals, signed, that JSON does not read: '.1', '5.', '-.5', '+1', '1_000',
# '1e1_0' (not 'nan' nor 'inf': a string option may hold those words; JSON's NaN and Infinity
# are read by JSON). An integer keeps Python's rule: no leading zero ('007' stays a string).
_DIGITS = r'[0-9](?:_?[0-9])*'
_PYTHON_INT = re.compile(r'[+-]?(?:0(?:_?0)*|[1-9](?:_?[0-9])*)')
_PYTHON_FLOAT = re.compile(
    rf'[+-]?(?:{_DIGITS}\.(?:{_DIGITS})?|\.{_DIGITS}|{_DIGITS}(?=[eE]))(?:[eE][+-]?{_DIGITS})?')


def _python_number(text: str) -> Any:
    if _PYTHON_INT.fullmatch(text):
        return int(text)
    if _PYTHON_FLOAT.fullmatch(text):
        return float(text)
    return None


def parse_key_values(items: Iterable[str]) -> Dict[str, Any]:
    r"""Reads ``KEY=VALUE`` strings into a dict: each value as JSON where it parses (``8``,
    ``0.2``, ``1e-3``, ``true``, ``[10, 30]``), then a Python decimal number that JSON does not
    read as that number (``.1``, ``5.``, ``-.5``, ``+1``, ``1_000``: an :obj:`int` without a
    point or exponent, else a :obj:`float`; not the words ``nan`` and ``inf``), Python's
    ``True``, ``False`` and ``None`` as those (not as the text ``'False'``, which a flag would
    take for true), else as the string itself; dashes in keys become underscores. Raises
    :class:`ValueError` on an item without ``=``."""
    out: Dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition('=')
        if not sep or not key.strip():
            raise ValueError(f"must look like KEY=VALUE (got '{item}')")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = _python_number(value.strip())
            if parsed is None:
                parsed = _PYTHON_CONSTANTS.get(value.strip(), value)
        out[key.strip().replace('-', '_')] = parsed
    return out


def check_options(given: Mapping[str, Any], defaults: Mapping[str, Any], what: str,
                  complete: bool = True, nullable: Iterable[str] = ()) -> Dict[str, Any]:
    r"""Checks options (e.g. from :func:`parse_key_values`) against the defaults of what they
    configure: with :obj:`complete`, a name not in :obj:`defaults` is an error; a value whose type
    differs from its default's is one too (an int is accepted for a float, a list for a tuple;
    NumPy integers, floats and bools as Python's, and for a string option :obj:`True` and
    :obj:`False` as the texts ``'true'`` and ``'false'``, since :func:`parse_key_values` reads
    ``alignment=true`` as JSON's true; a default of :obj:`None` accepts anything).
    Raises a :class:`ValueError` that names :obj:`what`, the option, and what was expected.

    Args:
        given (Mapping): The options to check.
        defaults (Mapping): Every known option with its default value.
        what (str): How messages name the owner of the options, e.g. ``"task 'max'"``.
        complete (bool, optional): Whether :obj:`defaults` lists every accepted option.
            (default: :obj:`True`)
        nullable (iterable of str, optional): Options that also accept :obj:`None`.
            (default: :obj:`()`)

    Returns:
        dict: The options, with the NumPy numbers and bools of options with an integer, float
        or bool default as Python's :obj:`int`, :obj:`float` and :obj:`bool` (which JSON
        writes), a bool given to a string option as its text; every other value as given.
    """
    nullable = set(nullable)
    checked = dict(given)
    for key, value in given.items():
        if key not in defaults:
            if complete:
                known = ', '.join(sorted(defaults)) or 'none'
                raise ValueError(f"{what} has no option '{key}' (options: {known})")
            continue
        if value is None and key in nullable:
            continue
        expected = _expected_type(defaults[key])
        if expected is not None and not expected[1](value):
            raise ValueError(f"{what}: option '{key}' expects {expected[0]} (got {value!r})")
        if expected is not None:
            checked[key] = expected[2](value)
    return checked


def _is_bool(value: Any) -> bool:  # (NumPy's bool is neither a bool nor a number)
    return type(value).__name__ in ('bool', 'bool_')


def _as_python_number(value: Any) -> Any:
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _same(value: Any) -> Any:
    return value


def _text(value: Any) -> str:  # ('--task-arg alignment=true' reads as JSON's true: the text)
    return ('true' if value else 'false') if isinstance(value, bool) else value


def _expected_type(default: Any) -> Optional[Tuple[str, Callable[[Any], bool],
                                                   Callable[[Any], Any]]]:
    # (what is expected, whether a value is that, the value as a Python one)
    if isinstance(default, bool):
        return 'true or false', _is_bool, bool
    if isinstance(default, int):
        return ('an integer', lambda v: isinstance(v, numbers.Integral) and not _is_bool(v),
                _as_python_number)
    if isinstance(default, float):
        return ('a number', lambda v: isinstance(v, numbers.Real) and not _is_bool(v),
                _as_python_number)
    if isinstance(default, str):
        return 'a string', lambda v: isinstance(v, (str, bool)), _text
    if isinstance(default, (tuple, list)):
        return 'a list', lambda v: isinstance(v, (tuple, list)), _same
    return None
