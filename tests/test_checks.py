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


def test_sizes_whose_model_could_not_fit_in_memory_are_refused_and_those_that_fit_are_not(
        monkeypatch):
    import torch_mz._checks as checks
    from torch_mz._checks import SizeError, check_fits
    monkeypatch.setattr(checks, '_machine_memory', lambda need: 16 * 2 ** 30)
    check_fits('n=4', 4 * 2 ** 30)  # 16 GiB of float32: fits
    with pytest.raises(SizeError, match=r"^n=5: at least 5,368,709,120 parameters in 3 modules, "
                                        r"more than 20 GiB, beyond this machine's 16.0 GiB"):
        check_fits('n=5', 5 * 2 ** 30, 3)
    with pytest.raises(ValueError, match='in 17,179,869,184 modules'):  # (1 KiB each at least)
        check_fits('m', 0, 2 ** 34)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # (the parameters' size: the default dtype's)
    try:
        check_fits('n=2', 2 * 2 ** 30)
        with pytest.raises(SizeError):
            check_fits('n=2', 2 * 2 ** 30 + 1)
    finally:
        torch.set_default_dtype(previous)

    def unread(need):
        raise AssertionError('the memory was read')
    monkeypatch.setattr(checks, '_machine_memory', unread)
    check_fits('small', 2 ** 28)  # (1 GiB: no look-up)


def test_check_fits_counts_no_parameters_on_the_meta_device(monkeypatch):
    # parameters on the meta device take no memory (a model of any size is built there to
    # count or inspect it): a 140 GiB MZAggregation on a host of 23.5 GiB was refused
    import torch_mz._checks as checks
    from torch_mz._checks import SizeError, check_fits
    from torch_mz.nn import MZAggregation
    monkeypatch.setattr(checks, '_machine_memory', lambda need: 2 * 2 ** 30)
    with pytest.raises(SizeError):
        check_fits('n=1', 2 ** 30)
    with torch.device('meta'):
        check_fits('n=1', 2 ** 30)
        with pytest.raises(SizeError, match='in 17,179,869,184 modules'):  # (these do)
            check_fits('m', 2 ** 30, 2 ** 34)
        aggr = MZAggregation(4, dim=16384, d_ff=64, heads=4, num_encoder_blocks=2)
    assert sum(p.numel() for p in aggr.parameters()) * 4 > 2 * 2 ** 30
    assert all(p.is_meta for p in aggr.parameters())
    with pytest.raises(SizeError):  # (on the CPU, refused as before)
        MZAggregation(4, dim=16384, d_ff=64, heads=4, num_encoder_blocks=2)
