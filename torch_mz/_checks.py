r"""Checks of constructor arguments, shared by the modules and models: a count, a flag or a
rate of the wrong type or range raises a :class:`ValueError` that names it, instead of being
taken as something else (the text ``'False'`` as a true flag, ``-1`` layers as none) or failing
deep inside a layer."""
import math
import numbers
from typing import Any, Optional

__all__ = ['check_count', 'check_optional_count', 'check_flag', 'check_rate']


def check_count(name: str, value: Any, low: int = 1) -> int:
    r"""An integer of at least :obj:`low` (not a bool), returned as a Python :obj:`int`."""
    if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
            or value < low):
        raise ValueError(f"'{name}' must be an integer >= {low} (got {value!r})")
    return int(value)


def check_optional_count(name: str, value: Any, low: int = 1) -> Optional[int]:
    r""":func:`check_count`, or :obj:`None`."""
    if value is None:
        return None
    try:
        return check_count(name, value, low)
    except ValueError:
        raise ValueError(f"'{name}' must be an integer >= {low} or None (got {value!r})") from None


def check_flag(name: str, value: Any) -> bool:
    r"""A bool (or NumPy bool), returned as a Python :obj:`bool`; anything else, e.g. the text
    ``'False'`` (which is true), raises."""
    if type(value).__name__ not in ('bool', 'bool_'):
        raise ValueError(f"'{name}' must be True or False (got {value!r})")
    return bool(value)


def check_rate(name: str, value: Any, low: float = 0.0, high: float = 1.0,
               high_inclusive: bool = False) -> float:
    r"""A finite real number in ``[low, high)`` (``[low, high]`` with :obj:`high_inclusive`)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        number = math.nan
    else:
        number = float(value)
    if (not math.isfinite(number) or number < low
            or (number > high if high_inclusive else number >= high)):
        raise ValueError(f"'{name}' must be a number in [{low:g}, {high:g}"
                         f"{']' if high_inclusive else ')'} (got {value!r})")
    return number
