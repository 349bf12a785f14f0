import pytest
import torch

from torch_mz.models.base import SetPrediction
from torch_mz.models.registry import (PRESETS, build_model, count_parameters, list_models,
                                      match_budget)


def test_every_preset_builds_and_runs():
    x = torch.randn(7, 4)
    index = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    for name in list_models():
        model = build_model(name, 4, 3, pos_dim=3 if name.startswith('egnn') else None).eval()
        out = model(x, index) if not name.startswith('egnn') else model(x, None, index)
        assert isinstance(out, SetPrediction), name
        pred = out.prediction
        assert pred.shape == (2, 3), name
        assert torch.isfinite(pred).all(), name


def test_paper_parameter_ordering():
    counts = {name: count_parameters(build_model(name, 3, 1, pos_dim=3 if name.startswith('egnn')
                                                  else None)) for name in PRESETS}
    # the standard Set Transformer preset is the paper's ~208K model
    assert 190_000 < counts['rigid'] < 220_000
    assert counts['mz-slim'] < counts['mz'] < counts['mz-large']
    assert counts['rigid'] < counts['st-4l'] and counts['mz-1l'] < counts['mz']
    # parameter-matched baselines are within 10% of mz
    for name in ('hypernet', 'perceiver'):
        assert abs(counts[name] - counts['mz']) / counts['mz'] < 0.1, name


def test_match_budget_picks_the_closest_width():
    model = match_budget('rigid', 300_000, 3, 1, candidates=[32, 64, 96, 128])
    counts = {d: count_parameters(build_model('rigid', 3, 1, dim=d)) for d in [32, 64, 96, 128]}
    best = min(counts, key=lambda d: abs(counts[d] - 300_000))
    assert count_parameters(model) == counts[best]
    with pytest.raises(ValueError, match="candidate value for 'dim'"):
        match_budget('rigid', 300_000, 3, 1, candidates=[])


def test_unknown_model_and_bad_sizes():
    with pytest.raises(ValueError, match='Unknown model'):
        build_model('transformer-xl', 3, 1)
    with pytest.raises(ValueError, match='positive'):
        build_model('mz', 0, 1)
    with pytest.raises(ValueError, match='pos_dim'):
        build_model('egnn', 3, 1, pos_dim=5)


@pytest.mark.parametrize('name, kwargs', [
    ('rigid', dict(dim=16, dropout=0.0)),
    ('hypernet', dict(rank=4)),  # width chosen by budget matching
    ('egnn', dict(feature_columns=(1, 2), hidden_channels=8)),  # wrapped in SelectFeatures
])
def test_model_records_how_it_was_built(name, kwargs):
    model = build_model(name, 4, 2, **kwargs)
    info = model.build_info
    overrides = {k: v for k, v in kwargs.items() if k != 'feature_columns'}
    assert info == dict(name=name, in_channels=4, out_channels=2, pos_dim=None,
                        feature_columns=list(kwargs.get('feature_columns', [])) or None,
                        args=overrides)
    again = build_model(info['name'], info['in_channels'], info['out_channels'],
                        pos_dim=info['pos_dim'], feature_columns=info['feature_columns'],
                        **info['args'])
    assert {k: v.shape for k, v in again.state_dict().items()} == {
        k: v.shape for k, v in model.state_dict().items()}
