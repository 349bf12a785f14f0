r"""Options given as ``KEY=VALUE`` text (the CLI's ``--task-arg``/``--model-arg``, model specs
such as ``hypernet:rank=4``): reading them, and checking them against the defaults of what they
configure (a task, a model preset) before any work is done."""
import json
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple

__all__ = ['parse_key_values', 'check_options']


_PYTHON_CONSTANTS = {'True': True, 'False': False, 'None': None}


def parse_key_values(items: Iterable[str]) -> Dict[str, Any]:
    r"""Reads ``KEY=VALUE`` strings into a dict: each value as JSON where it parses (``8``,
    ``0.2``, ``true``, ``[10, 30]``), Python's ``True``, ``False`` and ``None`` as those (not as
    the text ``'False'``, which a flag would take for true), else as the string itself; dashes
    in keys become underscores. Raises :class:`ValueError` on an item without ``=``."""
    out: Dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition('=')
        if not sep or not key.strip():
            raise ValueError(f"must look like KEY=VALUE (got '{item}')")
        try:
            out[key.strip().replace('-', '_')] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip().replace('-', '_')] = _PYTHON_CONSTANTS.get(value.strip(), value)
    return out


def check_options(given: Mapping[str, Any], defaults: Mapping[str, Any], what: str,
                  complete: bool = True, nullable: Iterable[str] = ()) -> None:
    r"""Checks options (e.g. from :func:`parse_key_values`) against the defaults of what they
    configure: with :obj:`complete`, a name not in :obj:`defaults` is an error; a value whose type
    differs from its default's is one too (an int is accepted for a float, a list for a tuple;
    a default of :obj:`None` accepts anything). Raises a :class:`ValueError` that names
    :obj:`what`, the option, and what was expected.

    Args:
        given (Mapping): The options to check.
        defaults (Mapping): Every known option with its default value.
        what (str): How messages name the owner of the options, e.g. ``"task 'max'"``.
        complete (bool, optional): Whether :obj:`defaults` lists every accepted option.
            (default: :obj:`True`)
        nullable (iterable of str, optional): Options that also accept :obj:`None`.
            (default: :obj:`()`)
    """
    nullable = set(nullable)
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


def _expected_type(default: Any) -> Optional[Tuple[str, Callable[[Any], bool]]]:
    if isinstance(default, bool):
        return 'true or false', lambda v: isinstance(v, bool)
    if isinstance(default, int):
        return 'an integer', lambda v: isinstance(v, int) and not isinstance(v, bool)
    if isinstance(default, float):
        return 'a number', lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    if isinstance(default, str):
        return 'a string', lambda v: isinstance(v, str)
    if isinstance(default, (tuple, list)):
        return 'a list', lambda v: isinstance(v, (tuple, list))
    return None
