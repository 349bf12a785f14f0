import json
from dataclasses import replace


import torch_mz.reproduce as reproduce
from torch_mz.reproduce import Reproduction
from torch_mz.reproduce import sweep_extension

from tests.reproduce._common import TINY, SUM, CLAIM, _counting


def test_sweep_extension_steps_beyond_the_edge_alike_for_every_model(tmp_path, monkeypatch):
    grid = ((1e-3, 1e-5), (1e-3, 0.1), (3e-4, 1e-5), (3e-4, 0.1))
    assert sweep_extension(grid, (1e-3, 0.1)) == [(3e-3, 0.1), (1e-3, 0.3)]
    assert sweep_extension(grid, (3e-4, 1e-5)) == [(1e-4, 1e-5)]
    assert sweep_extension(((1e-3, 1e-5), ), (1e-3, 1e-5)) == []  # nothing varies
    # beyond the points tried so far (not only the first grid)
    tried = list(grid) + [(3e-3, 0.1), (1e-3, 0.3)]
    assert sweep_extension(tried, (1e-3, 0.3)) == [(1e-3, 0.9)]
    assert sweep_extension(tried, (1e-3, 0.1)) == []  # interior now
    # a reproduction with the extension: each model trains the grid, then the points beyond the
    # edge its best point lies on, again while the best stays on the edge (at most
    # SWEEP_MAX_STEPS rounds), and takes the lowest validation loss of all
    calls = _counting(monkeypatch)
    budget = replace(TINY, sweep=((1e-3, 1e-5), (3e-4, 1e-5)), extend_sweep=True)
    repro = Reproduction(budget, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    chosen = repro.sweep('sum', CLAIM.models)
    records = [json.loads(p.read_text()) for p in tmp_path.rglob('records/tiny/**/*.json')]
    for model in CLAIM.models:
        runs = {(r['key']['config']['lr'], r['key']['config']['weight_decay']): r['val']['loss']
                for r in records if r['model'] == model}
        # replay the rule on the recorded losses: the same points, round by round
        points = list(budget.sweep)
        for _ in range(reproduce.SWEEP_MAX_STEPS):
            best = min(points, key=runs.__getitem__)
            extra = [p for p in sweep_extension(points, best) if p not in points]
            if not extra:
                break
            points += extra
        assert set(runs) == set(points)
        assert chosen[model] == min(runs, key=runs.__getitem__)
    assert len(calls) == len(records)  # every run trained once
    # read back: nothing trained again
    calls.clear()
    again = Reproduction(budget, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    assert again.sweep('sum', CLAIM.models) == chosen and calls == []
