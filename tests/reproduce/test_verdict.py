import math


from torch_mz.reproduce import verdict


def test_verdict_rule_on_hand_made_numbers():
    # within max(0.02, 25% of the paper's figure)
    assert verdict(0.33, 0.30, 0.01, 2) == 'reproduced'
    assert verdict(-0.003, 0.01, 0.005, 3) == 'reproduced'
    # the paper's sign, resolved from zero, another size
    assert verdict(0.33, 0.11, 0.02, 2) == 'direction only'
    # the opposite sign, resolved
    assert verdict(0.33, -0.10, 0.02, 2) == 'not reproduced'
    # no difference where the paper has a large one: the paper is outside ours ± 2 s
    assert verdict(0.61, 0.0, 0.02, 2) == 'not reproduced'
    # seeds too few or too noisy for the paper's effect
    assert verdict(0.33, 0.33, 0.0, 1) == 'inconclusive'
    assert verdict(0.5, 0.1, 0.3, 3) == 'inconclusive'
    assert verdict(0.025, 0.03, 0.02, 2) == 'inconclusive'
    assert verdict(0.33, math.nan, 0.01, 2) == 'inconclusive'
    # the paper's figure inside our band but our mean neither close nor resolved
    assert verdict(0.5, 0.2, 0.2, 3) == 'inconclusive'
    # exact figures (no seeds)
    assert verdict(0.9, 0.95, 0.0, None) == 'reproduced'
    assert verdict(0.9, 0.3, 0.0, None) == 'direction only'
    # rule 0: a difference at the paper's size between two models that learn nothing, where
    # the paper's model A learns the task, is not the paper's result
    assert verdict(0.036, 0.03, 0.005, 2) == 'reproduced'
    assert verdict(0.036, 0.03, 0.005, 2, levels=(0.02, -0.01, 0.904)) == 'not reproduced'
    # ... but it applies only where neither of ours learns and the paper's A does
    assert verdict(0.036, 0.03, 0.005, 2, levels=(0.32, 0.29, 0.904)) == 'reproduced'
    assert verdict(0.036, 0.03, 0.005, 2, levels=(0.02, -0.01, 0.3)) == 'reproduced'
    assert verdict(0.036, 0.03, 0.005, 2, levels=(0.02, -0.01, math.nan)) == 'reproduced'


def test_a_difference_exactly_at_a_threshold_reads_as_the_rule_states():
    # |ours - p| <= tol is reproduced: 0.07 - 0.05 is 0.020000000000000004 in floats, which
    # read as beyond tol = 0.02 ('direction only'), on either side of the paper's figure
    assert verdict(0.05, 0.07, 0.0, 2) == 'reproduced'
    assert verdict(0.05, 0.03, 0.0, 2) == 'reproduced'
    assert verdict(0.05, 0.0701, 0.0, 2) == 'direction only'  # (beyond it: as before)
    # 2 s exactly at max(|p|, tol) is not "larger than the paper's effect": decided by the
    # other rules (0.1 + 0.2 is 0.30000000000000004 in floats)
    spread = (0.1 + 0.2) / 2
    assert verdict(0.3, 0.3, spread, 3) == 'reproduced'
    assert verdict(0.3, 0.3, spread + 0.001, 3) == 'inconclusive'
    # the paper's figure exactly 2 s from ours is inside ours ± 2 s: not resolved
    assert verdict(0.5, 0.2, 0.15, 3) == 'inconclusive'
    assert verdict(0.5, 0.2, 0.1499, 3) == 'not reproduced'


def test_a_missing_run_is_inconclusive_after_rule_0():
    assert verdict(0.33, 0.30, 0.01, 2) == 'reproduced'
    assert verdict(0.33, 0.30, 0.01, 2, complete=False) == 'inconclusive'
    assert verdict(0.9, 0.95, 0.0, None, complete=False) == 'inconclusive'
    assert verdict(0.036, 0.03, 0.005, 2, levels=(0.02, -0.01, 0.904),
                   complete=False) == 'not reproduced'
