import pytest
import torch
from torch_geometric.data import Batch, Data

from torch_mz.models.set_transformer import DeepSets, MZSetTransformer, PerceiverSet
from torch_mz.testing import permute_within_sets
from tests.nn._sets import make_index

SMALL = dict(dim=8, heads=2, d_ff=8, num_inducing=3, num_encoder_blocks=1, dropout=0.0)


def _models():
    torch.manual_seed(0)
    return {
        'mz': MZSetTransformer(3, 2, num_generators=2, num_matrix_generators=2, **SMALL),
        'mz-signed': MZSetTransformer(3, 2, num_generators=2, num_matrix_generators=1,
                                      readout='signed', **SMALL),
        'rigid': MZSetTransformer(3, 2, value='rigid', num_generators=0, **SMALL),
        'film': MZSetTransformer(3, 2, value='film', num_generators=0, **SMALL),
        'hypernet': MZSetTransformer(3, 2, value='hypernet', num_generators=0, rank=2, **SMALL),
        'perceiver': PerceiverSet(3, 2, dim=8, heads=2, num_latents=3, d_ff=8),
        'deepsets': DeepSets(3, 2, hidden_channels=8),
    }


def _model_and_sets(name):
    r"""Model :obj:`name` in float64 and eval mode, and four sets (sizes 4, 1, 6, 3) for it."""
    model = _models()[name].double().eval()
    index = make_index([4, 1, 6, 3])
    return model, index, torch.randn(index.numel(), 3, dtype=torch.float64)


@pytest.mark.parametrize('name', list(_models()))
def test_models_are_permutation_invariant_and_local(name):
    model, index, x = _model_and_sets(name)
    pred, ihw = model(x, index)
    assert pred.shape == (4, 2)
    assert (ihw is None) == (name in ('perceiver', 'deepsets')) and (ihw is None
                                                                      or ihw.shape == (4, ))
    perm = permute_within_sets(index, torch.Generator().manual_seed(1))
    pred2, ihw2 = model(x[perm], index[perm])
    torch.testing.assert_close(pred2, pred)
    if ihw is not None:
        torch.testing.assert_close(ihw2, ihw)
    x3 = x.clone()
    x3[index == 2] += 1.0
    pred3, _ = model(x3, index)
    keep = torch.tensor([0, 1, 3])
    torch.testing.assert_close(pred3[keep], pred[keep])
    assert not torch.allclose(pred3[2], pred[2])


@pytest.mark.parametrize('name', list(_models()))
def test_forward_mode_ad_of_every_model_matches_reverse_mode(name):
    # dual tensors through a whole model (the attention's fast paths run as their plain
    # operations under forward-mode AD): the tangents of the prediction and of the IHW equal
    # the reverse-mode Jacobians times the tangent
    import torch.autograd.forward_ad as fwAD
    model = _models()[name].double().eval()
    index = make_index([4, 1, 6, 3])
    x = torch.randn(index.numel(), 3, dtype=torch.float64)
    t = torch.randn_like(x)
    with fwAD.dual_level():
        pred, ihw = model(fwAD.make_dual(x, t), index)
        got = [fwAD.unpack_dual(o).tangent for o in (pred, ihw) if o is not None]
    for i, tangent in enumerate(got):
        jac = torch.autograd.functional.jacobian(lambda xx: model(xx, index)[i], x)
        expected = (jac * t).flatten(jac.dim() - 2).sum(-1)
        if tangent is None:  # an output that does not depend on x (rigid's zero IHW)
            assert not expected.any()
            continue
        torch.testing.assert_close(tangent, expected, rtol=1e-9, atol=1e-11)


def test_batch_input_and_ihw_uncertainty():
    model = _models()['mz'].eval()
    g = torch.Generator().manual_seed(2)
    data = [Data(x=torch.randn(n, 3, generator=g)) for n in (3, 5, 2)]
    batch = Batch.from_data_list(data)
    pred, ihw = model(batch)
    for i, d in enumerate(data):
        p, u = model(d.x)
        torch.testing.assert_close(pred[i], p[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ihw[i], u[0], rtol=1e-4, atol=1e-5)
    # IHW is the summed interval-hull width of the pooled tokens: positive with generators ...
    assert bool((ihw > 0).all())
    # ... and zero for plain vector tokens
    _, ihw_rigid = _models()['rigid'](batch)
    assert torch.equal(ihw_rigid, torch.zeros(3))


def test_rigid_preset_equals_mz_with_zero_context_and_no_generator_readout():
    r"""value='mz' with M_l = 0 and W_mix = 0 gives the same prediction as value='rigid' with the
    same weights (both with generators)."""
    torch.manual_seed(3)
    mz = MZSetTransformer(3, 1, num_generators=2, num_matrix_generators=2, **SMALL).eval()
    with torch.no_grad():
        for m in mz.modules():
            if hasattr(m, 'matrix_gens'):
                m.matrix_gens.zero_()
                m.mix.zero_()
    rigid = MZSetTransformer(3, 1, value='rigid', num_generators=2, **SMALL).eval()
    rigid.load_state_dict(mz.state_dict(), strict=False)
    x, index = torch.randn(9, 3), make_index([4, 5])
    torch.testing.assert_close(mz(x, index)[0], rigid(x, index)[0])


def test_deepsets_sum_pooling_is_exact():
    model = DeepSets(2, 1, hidden_channels=4, num_layers=1).double()
    x = torch.randn(5, 2, dtype=torch.float64)
    index = torch.tensor([0, 0, 1, 1, 1])
    pred, _ = model(x, index)
    pooled = torch.stack([model.phi(x[index == b]).sum(0) for b in range(2)])
    torch.testing.assert_close(pred, model.rho(pooled))
    with pytest.raises(ValueError, match='pooling'):
        DeepSets(2, 1, pool='max')


def test_the_model_trains_a_batch_at_once_and_groups_large_inputs_in_inference(monkeypatch):
    # MZSetTransformer takes checkpoint=False: chunk_size='auto' groups large inputs in inference,
    # with the values of the whole input; a training batch is never recomputed in groups (where
    # glibc's malloc maps large blocks afresh, inputs with activations above 32 MiB are trained
    # in groups, every activation kept: tests/nn/test_aggr.py)
    import torch_mz.nn.aggr as aggr_module
    torch.manual_seed(0)
    model = MZSetTransformer(3, 2, dim=8, heads=2, num_inducing=2, d_ff=8).double()
    assert model.body.checkpoint is False and model.body.chunk_size == 'auto'
    whole = MZSetTransformer(3, 2, dim=8, heads=2, num_inducing=2, d_ff=8,
                             chunk_size=None).double()
    whole.load_state_dict(model.state_dict())
    monkeypatch.setattr(aggr_module, 'AUTO_CHUNK_ELEMENTS', 4 * 8)  # groups of 4 rows
    groups = []
    encode = model.body._encode_group
    monkeypatch.setattr(model.body, '_encode_group',
                        lambda *a: groups.append(a[0].size(0)) or encode(*a))
    x = torch.randn(15, 3, dtype=torch.float64)
    batch = torch.tensor([0] * 5 + [1] * 6 + [2] * 4)
    model.train()
    whole.train()
    out = model(x, batch)[0]
    out.sum().backward()
    assert groups == []  # 15 rows > 8, trained at once
    ref = whole(x, batch)[0]
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    model.eval()
    whole.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x, batch)[0], whole(x, batch)[0], rtol=1e-10,
                                   atol=1e-10)
    assert groups == [5, 6, 4]  # in inference: whole sets by the window of their first row
    # checkpoint='auto', asked for: the groups in training too, each run again in the backward
    grouped = MZSetTransformer(3, 2, dim=8, heads=2, num_inducing=2, d_ff=8,
                               checkpoint='auto').double().train()
    grouped.load_state_dict(model.state_dict())
    assert grouped.body.checkpoint == 'auto'
    encode_grouped = grouped.body._encode_group
    monkeypatch.setattr(grouped.body, '_encode_group',
                        lambda *a: groups.append(a[0].size(0)) or encode_grouped(*a))
    groups.clear()
    xg = x.clone().requires_grad_()
    xw = x.clone().requires_grad_()
    out = grouped(xg, batch)[0]
    out.sum().backward()
    assert groups == [5, 6, 4] + [4, 6, 5]
    ref = whole(xw, batch)[0]
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(xg.grad, xw.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('name', list(_models()))
def test_attention_models_see_the_empirical_distribution_deep_sets_counts(name):
    # Softmax pooling averages: a set whose every element appears twice gives the same output
    # (prediction and IHW) to the attention models; Deep Sets' sum pooling counts the elements.
    # (benchmarks/rotation_matching_features.py reads the rotation-matching sweep against this.)
    model, index, x = _model_and_sets(name)
    pred, ihw = model(x, index)
    pred2, ihw2 = model(torch.cat([x, x]), torch.cat([index, index]))
    if name == 'deepsets':
        assert not torch.allclose(pred2, pred)
        return
    torch.testing.assert_close(pred2, pred, rtol=1e-12, atol=1e-12)
    if ihw is not None:
        torch.testing.assert_close(ihw2, ihw, rtol=1e-12, atol=1e-12)


def test_perceiver_refuses_inputs_beyond_the_input_projection_limit():
    # the Perceiver's input goes through the same input projection (a LayerNorm) as the Set
    # Transformers', but its validation lacked their magnitude check: at 1e20 (float32) and
    # 1e160 (float64) it predicted NaN where 'mz' and 'rigid' raise; now it raises the same error
    # and the largest accepted magnitude predicts finite values, as theirs
    index = make_index([10, 10])
    g = torch.Generator().manual_seed(0)
    for dtype, limit, beyond in ((torch.float32, 1e15, 1e20), (torch.float64, 1e150, 1e160)):
        x = torch.randn(index.numel(), 3, generator=g, dtype=dtype)
        x = x / x.abs().max()
        models = _models()
        perceiver, rigid = models['perceiver'].to(dtype).eval(), models['rigid'].to(dtype).eval()
        with pytest.raises(ValueError) as expected:
            rigid(x * beyond, index)
        with pytest.raises(ValueError, match=r'exceed 1e\+\d+, beyond which the LayerNorm') as e:
            perceiver(x * beyond, index)
        assert str(e.value) == str(expected.value)
        assert torch.isfinite(perceiver(x * limit, index).prediction).all()
    with torch.autocast('cpu', dtype=torch.float16):
        with pytest.raises(ValueError, match=r'overflows in torch.float16 \(under'):
            _models()['perceiver'].eval()(x.float() * 1e5, index)


@pytest.mark.parametrize('preset', ['paper', 'neighbourhood'])
@pytest.mark.parametrize('heads', [0, -2, '4', 2.5])
def test_bad_heads_are_named_with_either_preset(preset, heads):
    # with preset='neighbourhood' the width is computed from the heads before the body checks
    # them: heads=0 raised ZeroDivisionError and heads='4' a TypeError
    with pytest.raises(ValueError, match="'heads' must be an integer >= 1"):
        MZSetTransformer(3, 1, preset=preset, heads=heads)


def test_perceiver_repr_shows_every_option_that_shapes_the_model():
    # Perceivers of other heads, feed-forward widths, dropout or latent blocks printed the same
    base = dict(dim=16, heads=4, d_ff=32, dropout=0.1, num_latent_blocks=1)
    text = repr(PerceiverSet(3, 1, **base))
    assert text == ('PerceiverSet(3, 1, dim=16, heads=4, num_latents=16, num_cross=2, '
                    'num_latent_blocks=1, d_ff=32, dropout=0.1)')
    for change in (dict(heads=2), dict(d_ff=64), dict(dropout=0.0), dict(num_latent_blocks=3)):
        assert repr(PerceiverSet(3, 1, **dict(base, **change))) != text, change


@pytest.mark.parametrize('sizes', [dict(num_cross=2 ** 70), dict(num_latent_blocks=2 ** 70)])
def test_perceiver_block_counts_that_could_not_fit_in_memory_are_refused_before_any_block(
        sizes, monkeypatch):
    # num_cross=2**70 built blocks without end
    import torch_mz.models.set_transformer as st

    def built(*args, **kwargs):
        raise AssertionError('a block was built')
    for name in ('MAB', 'SAB', 'PMA'):
        monkeypatch.setattr(st, name, built)
    with pytest.raises(ValueError, match="^num_cross=.*beyond this machine's"):
        PerceiverSet(3, 1, **sizes)


def test_deepsets_repr_evaluates():
    # pool was printed unquoted (pool=mean), where EGNN quotes its string options
    model = DeepSets(3, 2, hidden_channels=8, num_layers=2, pool='mean')
    text = repr(model)
    assert "pool='mean'" in text
    again = eval(text, {'DeepSets': DeepSets})
    assert repr(again) == text and again.pool == 'mean'
