r"""A check beside ``gradgradcheck`` for the hand-written backward passes: ``gradgradcheck``
compares the derivative of the ``create_graph=True`` gradient with finite differences of that
same gradient, so a graph branch that returns a wrong but self-consistent first derivative (say
1.001 times the true one) passes it. This compares the graph branch's first derivative with the
plain branch's, which ``gradcheck`` holds to finite differences of the forward."""
import torch


def assert_graph_branch_gradients_match(fn, inputs, seed=0):
    r"""The first derivatives of :obj:`fn` at :obj:`inputs` (those requiring gradients) with
    ``create_graph=True`` equal those without, for a random output cotangent."""
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    out = fn(*inputs)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed),
                            dtype=out.dtype)
    plain = torch.autograd.grad(out, leaves, cotangent, retain_graph=True, allow_unused=True)
    graph = torch.autograd.grad(fn(*inputs), leaves, cotangent, create_graph=True,
                                allow_unused=True)
    for a, b in zip(plain, graph):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
