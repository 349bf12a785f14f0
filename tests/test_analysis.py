import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from torch_mz import analysis
from torch_mz.models import MZSetTransformer
from torch_mz.nn import MZAttention


def _attn(L=3, seed=0):
    torch.manual_seed(seed)
    return MZAttention(8, heads=2, num_generators=2, value='mz', num_matrix_generators=L).double()


def test_operators_follow_the_matrix_zonotope():
    attn = _attn()
    mu = torch.randn(5, 8, dtype=torch.float64)
    ops = analysis.operators(attn, mu)
    g = torch.tanh(mu @ attn.gate.weight.T)
    expected = attn.weight + sum(g[:, l, None, None, None] * attn.matrix_gens[None, :, l]
                                 for l in range(3))
    torch.testing.assert_close(ops, expected)
    assert bool((analysis.gates(attn, mu).abs() <= 1).all())


def test_signed_operator_is_what_the_signed_readout_of_the_attention_reaches():
    # keys without generators: the output's c + sum_g G_g is (M_c + sum_l s_l gamma_l M_l) c_hat
    # per head, s_l the column sums of W_mix; the paper's M(mu) (s_l = 1) is not, in general
    from torch_mz.nn import Zonotope
    attn = _attn(L=3)
    with torch.no_grad():  # an invertible M_c other than the identity
        attn.weight.add_(0.3 * torch.randn_like(attn.weight))
    query_set = torch.tensor([0, 0, 1, 1, 1])
    kv_set = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    query = Zonotope(torch.randn(5, 8, dtype=torch.float64),
                     torch.randn(5, 2, 8, dtype=torch.float64))
    keys = Zonotope(torch.randn(7, 8, dtype=torch.float64), torch.zeros(7, 2, 8,
                                                                        dtype=torch.float64))
    out = attn(query, keys, query_set, kv_set, 2)
    H, dk = attn.heads, attn.head_dim
    c_hat = torch.linalg.solve(attn.weight[None], out.center.view(5, H, dk, 1))  # M_c^-1 o_c
    signed = (out.center + out.gens.sum(1)).view(5, H, dk, 1)
    mu = attn.key_value_summary(keys, kv_set, 2)  # (2, |mu|)
    ops = analysis.operators(attn, mu, readout='signed')[query_set]  # (5, H, dk, dk)
    torch.testing.assert_close(ops @ c_hat, signed)
    paper = analysis.operators(attn, mu)[query_set]
    assert not torch.allclose(paper @ c_hat, signed)
    assert analysis.operator_effective_rank(attn, mu, readout='signed') <= 3.0 + 1e-9
    with pytest.raises(ValueError, match='readout'):
        analysis.operators(attn, mu, readout='unsigned')


def test_generator_cosine_of_orthogonal_generators_is_identity():
    attn = _attn(L=3)
    with torch.no_grad():
        attn.matrix_gens.zero_()
        for l in range(3):  # disjoint supports: Frobenius-orthogonal, norms 1, 2, 3
            attn.matrix_gens[0, l, l, l] = l + 1.0
    torch.testing.assert_close(analysis.generator_cosine(attn), torch.eye(3, dtype=torch.float64))
    torch.testing.assert_close(analysis.generator_norms(attn),
                               torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))


def test_soft_effective_rank_exact_values():
    assert analysis.soft_effective_rank(torch.eye(4)) == pytest.approx(4.0)
    assert analysis.soft_effective_rank(torch.diag(torch.tensor([2.0, 2.0, 0.0]))) == \
        pytest.approx(2.0)
    assert analysis.soft_effective_rank(torch.zeros(3, 3)) == 0.0
    r = analysis.soft_effective_rank(torch.diag(torch.tensor([1.0, 0.1])))
    assert 1.0 < r < 2.0
    # relative, not absolute: a matrix of small entries keeps its rank (it read 0)
    small = 1e-14 * torch.eye(3, dtype=torch.float64)
    assert analysis.soft_effective_rank(small) == pytest.approx(3.0)
    # a non-finite entry is named (an inf one gave 1.0, a rank read off a diverged model)
    for bad in (float('inf'), float('nan')):
        with pytest.raises(ValueError, match='finite entries'):
            analysis.soft_effective_rank(torch.eye(3).index_put((torch.tensor([0]),
                                                                  torch.tensor([1])),
                                                                 torch.tensor(bad)))


def test_operator_effective_rank_is_bounded_by_L():
    mu = torch.randn(200, 8, dtype=torch.float64)
    one = _attn(L=1)
    assert analysis.operator_effective_rank(one, mu) == pytest.approx(1.0)
    four = _attn(L=4)
    rank = analysis.operator_effective_rank(four, mu)
    assert 1.0 < rank <= 4.0 + 1e-9


def test_gate_activity_threshold():
    attn = _attn()
    with torch.no_grad():
        attn.gate.weight.zero_()
        attn.gate.weight[0, 0] = 10.0  # gate 0 saturates on x_0 != 0, the others stay 0
    mu = torch.ones(10, 8, dtype=torch.float64)
    assert analysis.gate_activity(attn, mu, threshold=0.1) == pytest.approx(1 / 3)
    assert analysis.gate_activity(attn, mu, threshold=1.0) == 0.0


def test_collect_summaries_and_probe_on_a_model():
    torch.manual_seed(0)
    model = MZSetTransformer(3, 1, dim=8, heads=2, num_generators=2, num_matrix_generators=2,
                             num_inducing=2, num_encoder_blocks=1, d_ff=8)
    g = torch.Generator().manual_seed(1)
    data = [Data(x=torch.randn(n, 3, generator=g)) for n in (3, 5, 2, 4)]
    loader = DataLoader(data, batch_size=3)
    model.train()
    summaries = analysis.collect_summaries(model, loader)
    assert model.training  # mode restored
    # one summary per set for every MZ layer: ISAB (2 MABs), PMA, one decoder SAB
    assert len(summaries) == 4 and all(mu.shape == (4, 8) for mu in summaries.values())
    # the PMA's key/value tokens of a set are its elements: the summary is their mean
    name = next(n for n in summaries if n.startswith('body.pma'))
    pma = model.body.pma
    for i, d in enumerate(data):
        z = model.body.input_proj(d.x)
        z = model.body.encoders[0](z, torch.zeros(d.num_nodes, dtype=torch.long), 1)
        kv = pma.rff(z.center)
        torch.testing.assert_close(summaries[name][i], kv.mean(0), rtol=1e-4, atol=1e-5)
    report = analysis.probe(model, loader)
    entry = report[name]
    assert entry['num_sets'] == 4 and 0.0 <= entry['gate_activity'] <= 1.0
    assert 0.0 < entry['operator_effective_rank'] <= 2.0 + 1e-9
    with pytest.raises(ValueError, match="value='mz'"):
        analysis.collect_summaries(MZSetTransformer(3, 1, value='rigid', num_generators=0,
                                                    dim=8, heads=2, d_ff=8), loader)


def test_collect_summaries_restores_each_modules_mode_and_takes_keyword_calls():
    # model.train(was) put a child frozen in eval back into training; a layer called with
    # keyword arguments broke the hook; no batches failed inside torch.cat
    torch.manual_seed(0)
    model = MZSetTransformer(3, 1, dim=8, heads=2, num_generators=2, num_matrix_generators=2,
                             num_inducing=2, num_encoder_blocks=1, d_ff=8)
    data = [Data(x=torch.randn(n, 3)) for n in (3, 5)]
    model.train()
    model.body.pma.eval()
    before = analysis.collect_summaries(model, DataLoader(data, batch_size=2))
    assert model.training and not model.body.pma.training
    assert before and all(mu.size(0) == 2 for mu in before.values())  # two sets, every layer
    with pytest.raises(ValueError, match='got no batches'):
        analysis.collect_summaries(model, [])
    from torch_mz.nn import Zonotope

    class Keywords(torch.nn.Module):  # a model of one's own that names the arguments
        def __init__(self):
            super().__init__()
            self.attn = MZAttention(8, heads=2, num_generators=2, num_matrix_generators=1)

        def forward(self, x):
            z = Zonotope(x, torch.zeros(x.size(0), 2, 8))
            ids = torch.zeros(x.size(0), dtype=torch.long)
            return self.attn(z, key_value=z, query_set=ids, kv_set=ids, num_sets=1)

    own = Keywords()
    x = torch.randn(5, 8)
    got = analysis.collect_summaries(own, [x])['attn']
    ids = torch.zeros(5, dtype=torch.long)
    torch.testing.assert_close(got, own.attn.key_value_summary(
        Zonotope(x, torch.zeros(5, 2, 8)), ids, 1))


def test_soft_effective_rank_refuses_a_batch_of_matrices_and_an_eps_outside_0_1():
    # three copies of eye(2) read 6.0 (one rank of all their singular values); eps NaN or >= 1
    # dropped every singular value and read 1.0 for eye(3)
    with pytest.raises(ValueError, match='one matrix, a 2-D tensor'):
        analysis.soft_effective_rank(torch.eye(2).expand(3, 2, 2))
    with pytest.raises(ValueError, match='one matrix, a 2-D tensor'):
        analysis.soft_effective_rank(torch.ones(3))
    for eps in (float('nan'), 1.0, 2.0, -1e-3):
        with pytest.raises(ValueError, match=r"'eps' must be a number in \[0, 1\)"):
            analysis.soft_effective_rank(torch.eye(3), eps=eps)
    assert analysis.soft_effective_rank(torch.eye(3), eps=0.0) == pytest.approx(3.0)


def test_gate_activity_refuses_what_gives_no_fraction():
    # a NaN threshold read 0.0, one above 1 read 0.0 and a negative one 1.0; no summaries read
    # NaN; NaN summaries (a diverged model) counted as inactive gates
    attn = _attn()
    mu = torch.randn(5, 8, dtype=torch.float64)
    for bad in (float('nan'), -0.5, 1.5, float('inf'), True, '0.1'):
        with pytest.raises(ValueError, match=r"'threshold' must be a number in \[0, 1\]"):
            analysis.gate_activity(attn, mu, threshold=bad)
    with pytest.raises(ValueError, match='at least one set'):
        analysis.gate_activity(attn, mu[:0])
    nan = mu.clone()
    nan[0, 0] = float('nan')
    with pytest.raises(ValueError, match='finite entries'):
        analysis.gate_activity(attn, nan)
    assert analysis.gate_activity(attn, mu, threshold=0.0) == pytest.approx(1.0)


def test_summaries_of_the_wrong_shape_are_refused_by_name():
    # one summary (8,) gave gates of shape (L,), then an einsum error; (n, 9) a matmul error;
    # no summaries a reshape error in operator_effective_rank
    attn = _attn()
    mu = torch.randn(5, 8, dtype=torch.float64)
    for bad in (mu[0], mu.view(5, 1, 8), torch.randn(5, 9, dtype=torch.float64)):
        for f in (analysis.gates, analysis.operators, analysis.operator_effective_rank):
            with pytest.raises(ValueError, match=r'set summaries of shape \(n, 8\)'):
                f(attn, bad)
    with pytest.raises(ValueError, match='at least one set'):
        analysis.operator_effective_rank(attn, mu[:0])
    assert analysis.operator_effective_rank(attn, mu[:1]) == 0.0  # one operator: no variation
    assert analysis.operators(attn, mu[:0]).shape == (0, 2, 4, 4)
