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
