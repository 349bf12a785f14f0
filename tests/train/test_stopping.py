import math

import pytest

from torch_mz.train import stop_by
from torch_mz.train.stopping import _stop_due


@pytest.mark.parametrize('deadline', [math.nan, '0', True, '1700000000'])
def test_stop_by_refuses_a_deadline_that_is_not_a_time(deadline):
    # NaN was accepted and no time reaches it: a run inside the block never stopped; text and
    # bools were taken by float() ('0' and True as deadlines long past)
    with pytest.raises(ValueError, match=r"'deadline' must be a time in seconds .*got"):
        with stop_by(deadline, clock=lambda: 1e12):
            pass
    with pytest.raises(ValueError, match="'clock' must be a callable"):
        with stop_by(0.0, clock=1e12):
            pass


def test_stop_by_is_due_at_and_past_the_deadline():
    now = [99.5]
    with stop_by(100, clock=lambda: now[0]):
        assert not _stop_due()
        now[0] = 100.0
        assert _stop_due()
    assert not _stop_due()  # no deadline outside the block
    with stop_by(math.inf, clock=lambda: 1e300), stop_by(None):
        assert not _stop_due()
