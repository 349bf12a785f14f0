r"""Argument types for the command lines of the studies in ``benchmarks/``: a mistake in an
option (a zero count, a misspelt model, a list with a word in it) ends as argparse's usage error,
naming the option, before any data is built or any model trained, not as a traceback hours
later. Library code: the script owns and parses the command line; these are only the
``type=`` callables it declares its options with::

    parser.add_argument('--sets', type=positive_int, default=64)
    parser.add_argument('--dims', type=int_list(low=1), default=[16, 64])
    parser.add_argument('--aggrs', type=choice_list(AGGRS), default=list(AGGRS))
"""
import argparse
import math
from typing import Any, Callable, List, Optional, Sequence

__all__ = ['positive_int', 'nonnegative_int', 'positive_float', 'nonnegative_float',
           'int_list', 'float_list', 'choice_list']


def _number(text: str, kind: type, low: float, strict: bool) -> float:
    name = 'an integer' if kind is int else 'a number'
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected {name}, got {text!r}') from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f'expected a finite number, got {text!r}')
    if value < low or (strict and value == low):
        bound = f'> {low:g}' if strict else f'>= {low:g}'
        raise argparse.ArgumentTypeError(f'expected {name} {bound}, got {text!r}')
    return value


def positive_int(text: str) -> int:
    r"""An integer >= 1."""
    return int(_number(text, int, 1, strict=False))


def nonnegative_int(text: str) -> int:
    r"""An integer >= 0."""
    return int(_number(text, int, 0, strict=False))


def positive_float(text: str) -> float:
    r"""A finite number > 0."""
    return float(_number(text, float, 0.0, strict=True))


def nonnegative_float(text: str) -> float:
    r"""A finite number >= 0."""
    return float(_number(text, float, 0.0, strict=False))


def _split(text: str) -> List[str]:
    items = [item.strip() for item in text.split(',')]
    if not text.strip() or any(not item for item in items):
        raise argparse.ArgumentTypeError(f'expected a comma-separated list, got {text!r}')
    if len(set(items)) != len(items):
        repeated = sorted({item for item in items if items.count(item) > 1})
        raise argparse.ArgumentTypeError(f"{', '.join(repeated)} given twice in {text!r}")
    return items


def _distinct(values: List[Any], text: str) -> None:
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{', '.join(map(str, repeated))} given twice in "
                                         f"{text!r}")


def int_list(low: int = 1, high: Optional[int] = None) -> Callable[[str], List[int]]:
    r"""A comma-separated list of distinct integers in ``[low, high]`` (e.g. ``'4,16,32'``)."""
    def parse(text: str) -> List[int]:
        values = [int(_number(item, int, low, strict=False)) for item in _split(text)]
        _distinct(values, text)  # ('4,04' names one value twice)
        if high is not None and max(values) > high:
            raise argparse.ArgumentTypeError(f'expected integers <= {high}, got {text!r}')
        return values
    parse.__name__ = 'integer list'  # argparse names the type in its messages
    return parse


def float_list(low: float = 0.0, strict: bool = True) -> Callable[[str], List[float]]:
    r"""A comma-separated list of distinct finite numbers above :obj:`low` (at or above it
    unless :obj:`strict`)."""
    def parse(text: str) -> List[float]:
        values = [float(_number(item, float, low, strict)) for item in _split(text)]
        _distinct(values, text)  # ('0.1,1e-1' names one value twice)
        return values
    parse.__name__ = 'number list'
    return parse


def choice_list(choices: Sequence[str]) -> Callable[[str], List[str]]:
    r"""A comma-separated list of distinct names, each one of :obj:`choices`."""
    def parse(text: str) -> List[str]:
        items = _split(text)
        unknown = [item for item in items if item not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, unknown))} (choose from {', '.join(choices)})")
        return items
    parse.__name__ = 'name list'
    return parse
