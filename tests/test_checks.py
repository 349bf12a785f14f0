r"""The constructor-argument checks of :mod:`torch_mz._checks`: what each accepts (and returns as a
plain Python value) and what it refuses, by name."""
import math

import numpy as np
import pytest
import torch

from torch_mz._checks import (check_count, check_flag, check_number, check_optional_count,
                              check_range, check_rate)


def test_counts_take_integers_of_any_kind_and_return_python_ints():
    for value in (3, np.int64(3), np.int32(3)):
        out = check_count('n', value)
        assert out == 3 and type(out) is int
    assert check_count('n', 0, low=0) == 0 and check_optional_count('n', None) is None
    for bad in (0, -1, 2.0, 2.5, '2', True, None, torch.tensor([2, 3])):
        with pytest.raises(ValueError, match=r"'n' must be an integer >= 1"):
            check_count('n', bad)
    with pytest.raises(ValueError, match=r"'n' must be an integer >= 1 or None \(got 0\)"):
        check_optional_count('n', 0)


def test_flags_are_bools_never_text():
    for value, expected in ((True, True), (False, False), (np.bool_(True), True), (1, True),
                            (0, False)):
        out = check_flag('f', value)
        assert out is expected
    for bad in ('False', 'true', 2, -1, None, 0.0):  # 'False' is a true string
        with pytest.raises(ValueError, match="'f' must be True or False"):
            check_flag('f', bad)


def test_numbers_rates_and_ranges():
    assert check_number('x', 2) == 2.0 and type(check_number('x', np.float32(0.5))) is float
    assert check_number('x', 0, allow_zero=True) == 0.0
    for bad in (0, -1e-9, math.inf, math.nan, '0.5', True):
        with pytest.raises(ValueError, match="'x' must be a finite number > 0"):
            check_number('x', bad)
    assert check_rate('p', 0.0) == 0.0 and check_rate('p', 1.0, high_inclusive=True) == 1.0
    for bad in (1.0, -0.1, math.nan, '0.1', False):
        with pytest.raises(ValueError, match=r"'p' must be a number in \[0, 1\)"):
            check_rate('p', bad)
    assert check_range('r', [2, 5]) == (2, 5) and check_range('r', (0.5, 1.5), integer=False) == (
        0.5, 1.5)
    with pytest.raises(ValueError, match=r"'r' must be a pair \(low, high\)"):
        check_range('r', 5)
    with pytest.raises(ValueError, match="'r' must satisfy low <= high"):
        check_range('r', (5, 2))
    with pytest.raises(ValueError, match=r"'r\[0\]' must be an integer >= 1"):
        check_range('r', (0, 2))


def test_numbers_too_large_for_a_float_are_refused_by_name():
    # float(10**400) raised an OverflowError that named no argument
    with pytest.raises(ValueError, match="'x' must be a finite number > 0"):
        check_number('x', 10 ** 400)
    with pytest.raises(ValueError, match=r"'p' must be a number in \[0, 1\)"):
        check_rate('p', -10 ** 400)
    with pytest.raises(ValueError, match=r"'r\[1\]' must be a finite number > 0"):
        check_range('r', (1, 10 ** 400), integer=False)
