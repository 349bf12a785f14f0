import warnings

import pytest
import torch
from torch_geometric.data import Batch, Data

import torch_mz.models.base as base
import torch_mz.nn.aggr as aggr
from torch_mz.models import SetPrediction, build_model
from torch_mz.models.registry import PRESETS
from torch_mz.nn import MZAggregation
from torch_mz.nn.zonotope import InputProjection

#: presets whose forward returns an uncertainty (the MZ-Set-Transformer family)
WITH_IHW = ('mz', 'mz-slim', 'mz-large', 'mz-1l', 'rigid', 'st-4l', 'st-large', 'film',
            'hypernet')
SMALL = dict(dim=8, heads=2, d_ff=8, num_inducing=3)


def _model(name):
    torch.manual_seed(0)
    small = SMALL if name in WITH_IHW else {}
    if name == 'perceiver':
        small = dict(dim=8, heads=2, d_ff=8, num_latents=3)
    if name in ('deepsets', 'mean-mlp'):
        small = dict(hidden_channels=8)
    if name.startswith('egnn'):
        small = dict(hidden_channels=8, num_layers=2)
    return build_model(name, 4, 2, pos_dim=3 if name.startswith('egnn') else None,
                       **small).double().eval()


def _call(model, name, x, index, num_sets=None):
    if name.startswith('egnn'):
        return model(x, None, index, num_sets=num_sets)
    return model(x, index, num_sets=num_sets)


@pytest.mark.parametrize('name', list(PRESETS))
def test_one_return_type_and_empty_sets_predict_zero(name):
    model = _model(name)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64)
    index = torch.tensor([0, 0, 0, 2, 2, 2, 2, 3])  # set 1 is a gap, sets 4 and 5 trail empty
    out = _call(model, name, x, index, num_sets=6)
    assert isinstance(out, SetPrediction) and out.prediction.shape == (6, 2)
    assert (out.ihw is not None) == (name in WITH_IHW)
    for s in (1, 4, 5):  # exactly zero, prediction and uncertainty alike
        assert torch.equal(out.prediction[s], torch.zeros(2, dtype=torch.float64))
        if out.ihw is not None:
            assert out.ihw[s].item() == 0.0
    for s in (0, 2, 3):  # a set inside the batch predicts what it predicts alone
        alone = _call(model, name, x[index == s], None)
        torch.testing.assert_close(out.prediction[s], alone.prediction[0])
        assert not torch.equal(out.prediction[s], torch.zeros(2, dtype=torch.float64))
    prediction, ihw = out  # unpacks as a pair
    assert prediction is out.prediction and ihw is out.ihw
    # a PyG batch with an empty graph
    data = Batch.from_data_list([Data(x=x[:3]), Data(x=x[:0]), Data(x=x[3:7])])
    out_data = model(data)
    assert torch.equal(out_data.prediction[1], torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(out_data.prediction[[0, 2]], out.prediction[[0, 2]])


@pytest.mark.parametrize('name', [n for n in PRESETS if not n.startswith('egnn')])
def test_a_batch_is_validated_once(name, monkeypatch):
    model = _model(name)
    calls = {'check_set_input': 0, 'resolve_set_index': 0}

    def counting(fn_name):
        fn = getattr(aggr, fn_name)

        def wrapper(*args, **kwargs):
            calls[fn_name] += 1
            return fn(*args, **kwargs)
        return wrapper

    wrappers = {fn_name: counting(fn_name) for fn_name in calls}
    for module in (aggr, base):
        for fn_name, wrapper in wrappers.items():
            monkeypatch.setattr(module, fn_name, wrapper)
    x = torch.randn(7, 4, dtype=torch.float64)
    model(x, torch.tensor([0, 0, 1, 1, 1, 2, 2]))
    assert calls == {'check_set_input': 1, 'resolve_set_index': 1}


@pytest.mark.parametrize('name', [n for n in PRESETS if not n.startswith('egnn')])
def test_bad_batches_are_refused_at_the_model_boundary(name):
    model = _model(name)
    with pytest.raises(ValueError, match=r'shape \(N, 4\) \(got \(5, 3\)\)'):
        model(torch.randn(5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match='floating-point'):
        model(torch.ones(5, 4, dtype=torch.long))
    with pytest.raises(ValueError, match='dtype torch.float64'):
        model(torch.randn(5, 4))
    with pytest.raises(ValueError, match=r"'batch' of shape \(5,\)"):
        model(torch.randn(5, 4, dtype=torch.float64), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="'pos' or node features 'x'"):
        model(Data(num_nodes=5))


def test_mz_aggregation_public_api_is_what_forward_and_the_model_use():
    torch.manual_seed(0)
    body = MZAggregation(4, 6, preset='paper', dim=8, heads=2, d_ff=8, num_inducing=3).double()
    x = torch.randn(9, 4, dtype=torch.float64)
    index = torch.tensor([2, 0, 0, 2, 2, 0, 2, 2, 0])
    set_id, num_sets = body.validate(x, index, dim_size=4)
    assert torch.equal(set_id, index) and num_sets == 4
    out, ihw = body.pool(x, set_id, num_sets)
    assert torch.equal(out, body(x, index, dim_size=4))
    assert torch.equal(out[[1, 3]], torch.zeros(2, 6, dtype=torch.float64))
    assert bool((ihw[[0, 2]] > 0).all()) and torch.equal(ihw[[1, 3]], torch.zeros(2).double())
    # no rows at all: zeros, with a graph for backward()
    out0, ihw0 = body.pool(x[:0], *body.validate(x[:0], index[:0], dim_size=2))
    assert torch.equal(out0, torch.zeros(2, 6, dtype=torch.float64)) and out0.requires_grad
    assert torch.equal(ihw0, torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match='exceed'):
        body.validate(torch.full((2, 4), 1e200, dtype=torch.float64))


@pytest.mark.parametrize('name', list(PRESETS))
def test_a_plain_data_object_with_a_batch_vector_is_several_sets(name):
    # a Data (not a Batch) that carries 'batch': the sets it names, as PyG's pooling counts
    # them, where before it was read as one set and refused with an index error
    model = _model(name)
    g = torch.Generator().manual_seed(2)
    pos = torch.randn(7, 3, generator=g, dtype=torch.float64)
    feat = torch.randn(7, 1, generator=g, dtype=torch.float64)
    batch = torch.tensor([0, 0, 1, 1, 1, 2, 2])
    plain = Data(x=feat, pos=pos, batch=batch)
    parts = Batch.from_data_list([Data(x=feat[batch == k], pos=pos[batch == k])
                                  for k in range(3)])
    expected = model(parts).prediction
    assert expected.shape == (3, 2)
    torch.testing.assert_close(model(plain).prediction, expected, rtol=1e-12, atol=1e-12)
    # one set without 'batch', as before
    single = model(Data(x=feat[:2], pos=pos[:2])).prediction
    torch.testing.assert_close(single, expected[:1])


@pytest.mark.parametrize('name', list(PRESETS))
def test_a_batch_without_its_batch_vector_reads_its_sets_from_ptr(name):
    # a Batch whose 'batch' was removed: its sets come from 'ptr' (they were pooled as one set,
    # and the others predicted zero); with neither, refused
    model = _model(name)
    g = torch.Generator().manual_seed(3)
    parts = Batch.from_data_list([
        Data(x=torch.randn(n, 1, generator=g, dtype=torch.float64),
             pos=torch.randn(n, 3, generator=g, dtype=torch.float64)) for n in (4, 3, 5)])
    expected = model(parts).prediction
    assert bool((expected != 0).all())
    parts.batch = None
    torch.testing.assert_close(model(parts).prediction, expected, rtol=0, atol=0)
    assert base.batch_vector(parts).tolist() == [0] * 4 + [1] * 3 + [2] * 5
    parts._num_graphs = 3
    parts.ptr = None
    with pytest.raises(ValueError, match="holds 3 sets but has no 'batch' vector"):
        model(parts)
    parts.ptr = torch.tensor([0, 4, 3, 12])
    with pytest.raises(ValueError, match="'ptr' decreases"):
        model(parts)


def test_a_width_mismatch_from_a_data_object_says_what_the_model_reads():
    model = _model('rigid')  # built for 4 columns
    data = Data(pos=torch.randn(5, 3, dtype=torch.float64), x=torch.randn(5, 2,
                                                                         dtype=torch.float64))
    with pytest.raises(ValueError, match=r"shape \(N, 4\) \(got \(5, 5\)\): from a data object the "
                       r"model reads \[pos, x\] side by side \(here pos \(3 columns\) and x \(2 "
                       r"columns\)\); build it with in_channels=5"):
        model(data)


def test_set_features_meet_in_the_wider_dtype():
    # float64 features beside float32 coordinates were cast to float32 without a word (their
    # digits lost); a float64 model then refused them as float32 input
    from torch_mz.models.base import set_features
    pos = torch.tensor([[0.5, -1.0], [2.0, 0.25]])  # (2, 2), float32
    x = torch.tensor([[1 + 2 ** -40], [-3.0]], dtype=torch.float64)  # (2, 1): not a float32
    features = set_features(Data(pos=pos, x=x))
    assert features.dtype == torch.float64
    assert torch.equal(features, torch.cat([pos.double(), x], dim=-1))
    assert set_features(Data(pos=x.repeat(1, 2), x=pos)).dtype == torch.float64
    # integer or boolean features take the coordinates' dtype (as before)
    flags = set_features(Data(pos=pos, x=torch.tensor([[1], [0]])))
    assert flags.dtype == torch.float32 and torch.equal(flags[:, 2], torch.tensor([1.0, 0.0]))
    assert set_features(Data(pos=pos, x=torch.tensor([[True], [False]]))).dtype == torch.float32
    # a float64 model reads them; a float32 one refuses them, naming the dtype
    model = build_model('deepsets', 3, 2, hidden_channels=8)
    with pytest.raises(ValueError, match=r"module's dtype torch.float32 \(got torch.float64\)"):
        model(Data(pos=pos, x=x))
    assert model.double()(Data(pos=pos, x=x)).prediction.dtype == torch.float64


@pytest.mark.parametrize('name', [n for n in PRESETS if not n.startswith('egnn')])
def test_tensors_without_batch_are_one_set_even_when_empty(name):
    # as a data object without batch (and EGNN): zero rows gave zero sets (no prediction) from
    # tensors, one empty set (a zero prediction) from a Data object
    model = _model(name)
    empty = torch.zeros(0, 4, dtype=torch.float64)
    for out in (model(empty), model(Data(x=empty))):
        assert torch.equal(out.prediction, torch.zeros(1, 2, dtype=torch.float64))
    assert model(empty, num_sets=3).prediction.shape == (3, 2)
    with pytest.raises(ValueError, match="'num_sets' to be a non-negative integer"):
        model(torch.randn(5, 4, dtype=torch.float64), torch.zeros(5, dtype=torch.long),
              num_sets=-1)



@pytest.mark.parametrize('name', [n for n in PRESETS if not n.startswith('egnn')])
def test_an_input_without_rows_stays_in_the_graph(name):
    # as the aggregations' (and PyG's): the Perceiver's latents found no key, and its attention
    # gave zeros detached from the input, so torch.autograd.grad(out, x) raised and a frozen
    # Perceiver's prediction required no gradient
    model = _model(name)
    x = torch.zeros(0, 4, dtype=torch.float64, requires_grad=True)
    for frozen in (False, True):
        model.requires_grad_(not frozen)
        prediction = model(x, torch.zeros(0, dtype=torch.long), num_sets=2).prediction
        assert prediction.requires_grad and not prediction.any()
        grad, = torch.autograd.grad(prediction.sum(), x)
        assert grad.shape == (0, 4)


def test_every_model_with_an_input_projection_refuses_inputs_beyond_its_limit():
    # the limit of MZAggregation.validate (the input LayerNorm's statistics overflow beyond it)
    # was not applied by SetModel.validate, so the Perceiver, which has the same input
    # projection, predicted NaN at 1e160 in float64; every model with an InputProjection now
    # refuses such input, and the models without one (an MLP per element or on the mean, no
    # LayerNorm on the input) still predict finite values there
    index = torch.tensor([0] * 5 + [1] * 3)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = x / x.abs().max()
    checked = []
    for name in [n for n in PRESETS if not n.startswith('egnn')]:
        model = _model(name)
        if any(isinstance(m, InputProjection) for m in model.modules()):
            checked.append(name)
            with pytest.raises(ValueError, match=r'exceed 1e\+150, beyond which the LayerNorm'):
                model(x * 1e160, index)
            assert torch.isfinite(model(x * 1e150, index).prediction).all()
        else:
            assert torch.isfinite(model(x * 1e160, index).prediction).all()
    assert 'perceiver' in checked and 'mz' in checked
    assert set(PRESETS) - set(checked) == {'deepsets', 'mean-mlp', 'egnn', 'egnn-qm9'}


def test_models_without_an_input_projection_refuse_what_overflows_float16():
    # Deep Sets and the mean MLP have no input LayerNorm (no limit in float32: finite at 1e30),
    # but their first linear map overflows in float16: under float16 autocast, input of 1e5 gave
    # NaN; it is refused with the float16 limit now
    index = torch.tensor([0] * 5 + [1] * 3)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    x = x / x.abs().max()
    for name in ('deepsets', 'mean-mlp'):
        model = _model(name).float().eval()
        assert torch.isfinite(model(x * 1e30, index).prediction).all()
        with torch.autocast('cpu', dtype=torch.float16):
            with pytest.raises(ValueError, match=r'beyond which the first linear map of the '
                                                 r'input overflows in torch.float16'):
                model(x * 1e5, index)
            assert torch.isfinite(model(x * 1e3, index).prediction).all()


def test_every_set_model_names_a_module_autocast_does_not_cast():
    # a float64 model under autocast, whose weights autocast leaves as they are, failed inside
    # its first matrix product on the cast input ('mat1 and mat2 must have the same dtype')
    index = torch.tensor([0] * 5 + [1] * 3)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    for name in [n for n in PRESETS if not n.startswith('egnn')]:
        model = _model(name)  # float64
        with torch.autocast('cpu', dtype=torch.bfloat16):
            with pytest.raises(ValueError, match=r"module's dtype torch.float64 \(got "
                                                 r"torch.float32\)"):
                model(x, index)
            assert model(x.double(), index).prediction.dtype == torch.float64


@pytest.mark.parametrize('module, cast', [(torch.float16, torch.bfloat16),
                                          (torch.bfloat16, torch.float16)])
def test_models_without_layer_norms_take_the_other_half_precision_under_autocast(module, cast):
    # a half-precision model under autocast to the other half precision was refused ('Expected
    # a module of float32 or ... parameters') for the LayerNorms of the Set Transformers, which
    # DeepSets and MeanMLP do not have: autocast casts their weights in every matrix product,
    # and they ran (as EGNN, without LayerNorms either, still does)
    index = torch.tensor([0] * 5 + [1] * 3)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    for name in ('deepsets', 'mean-mlp'):
        model = _model(name).float()
        ref = model(x, index).prediction
        model.to(module)
        with torch.autocast('cpu', dtype=cast):
            for came in (torch.float32, module, cast):
                out = model(x.to(came), index).prediction
                assert out.dtype == cast and torch.isfinite(out).all()
                torch.testing.assert_close(out.float(), ref, rtol=0.1, atol=0.1)
    # a model with LayerNorms is refused, as it failed inside them
    model = _model('perceiver').to(module)
    with torch.autocast('cpu', dtype=cast):
        with pytest.raises(ValueError, match=rf"module of float32 or {cast} parameters under "
                                             rf"torch.autocast to {cast} \(got {module} "):
            model(x, index)


class _Prediction(torch.nn.Module):
    r"""A preset's prediction alone (``torch.jit.trace`` returns no ``None``), called as the
    preset is: ``(x, batch)``, or EGNN's ``(x, pos, batch)``."""
    def __init__(self, model, name):
        super().__init__()
        self.model, self.name = model, name

    def forward(self, x, batch):
        return _call(self.model, self.name, x, batch).prediction


@pytest.mark.parametrize('name', list(PRESETS))
def test_every_preset_refuses_torch_jit_trace(name):
    # only the attention presets refused it: a traced Deep Sets or mean MLP kept the traced
    # batch's number of sets, and on the smaller last batch of a loader gave its rows and zero
    # rows for the sets it did not have (4 predictions for 2 sets); a traced EGNN kept the
    # traced batch's pairs of elements and its sorted-ids branch, and gave other values, without
    # an error, on a batch of the same set sizes listed in another order of elements
    model = _model(name)
    traced_on = torch.tensor([0] * 3 + [1] * 4 + [2] * 2 + [3] * 3)
    x = torch.randn(traced_on.numel(), 4, generator=torch.Generator().manual_seed(2),
                    dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # (the tracer's own warnings)
        with pytest.raises(RuntimeError, match='cannot be recorded by torch.jit.trace.*'
                           'torch.compile'):
            torch.jit.trace(_Prediction(model, name), (x, traced_on), check_trace=False)
    # eager, the same model serves any batch (a smaller one, one in another order)
    for index in (torch.tensor([0] * 5 + [1] * 7),
                  traced_on[torch.randperm(traced_on.numel(),
                                           generator=torch.Generator().manual_seed(3))]):
        out = _call(model, name, x, index).prediction
        assert out.shape == (int(index.max()) + 1, 2) and torch.isfinite(out).all()
