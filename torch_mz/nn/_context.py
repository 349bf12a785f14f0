r"""What the exact fast paths of :mod:`torch_mz.nn` must know about the context they run in:
hooks on a layer (its own or global), :mod:`torch.func` transforms and forward-mode AD, under
which they run as the plain operations they stand for (the same values up to rounding), and
whether attention must be written out instead of PyTorch's fused kernel."""
from typing import Any

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.nn import Module
from torch.nn.modules import module as _module

__all__ = ['_hooked', '_functorch_active', '_forward_ad_active', '_attention_written_out',
           '_plain_ops']


def tie_parameters(out: Tensor, module: Module, *inputs: Tensor) -> Tensor:
    r""":obj:`out` with every parameter of :obj:`module` that requires gradients joined to it
    at weight zero (the same values): where they reach no output (an input without elements,
    EGNN's last coordinate MLP) each then gets a zero gradient, where it got none, which
    :class:`~torch.nn.parallel.DistributedDataParallel` with ``find_unused_parameters=False``
    takes for an error. Each of :obj:`inputs` that requires gradients is joined the same way
    (an input without elements then gets its empty gradient, as from PyG's sum aggregation,
    where :func:`torch.autograd.grad` found it unused, and :obj:`out` requires gradients where
    the input does, a frozen module's too). A positive zero (``0 * |sum|``) is subtracted: the
    identity on every value, -0.0 included, where ``out + 0 * sum`` turned a -0.0 (an empty
    set's zeroed prediction) into +0.0. A parameter that is not finite makes :obj:`out` NaN."""
    tied = [p.sum() for p in module.parameters() if p.requires_grad]
    tied += [t.sum() for t in inputs if t.requires_grad]
    if not tied:
        return out
    total = tied[0]
    for s in tied[1:]:
        total = total + s
    return out - 0 * total.abs()


def _hooked(module: Module) -> bool:
    r"""Whether calling :obj:`module` does more than its plain forward: hooks of its own
    (forward or backward, e.g. :mod:`torch.nn.utils.prune`'s) or global module hooks. Exact
    reorderings that use a layer's weights directly (PMA's folded maps, EGNN's per-node first
    edge layer, the input projection's affine generators) run the layer as it is then."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or _module._global_forward_hooks
                or _module._global_forward_pre_hooks or _module._global_backward_hooks
                or _module._global_backward_pre_hooks)


def _functorch_active() -> bool:
    r"""Whether a :mod:`torch.func` transform (``grad``, ``vjp``, ``jacrev``, ``vmap``...) is
    running. Its transforms take neither this package's hand-written autograd functions (which
    define no ``setup_context``) nor saved-tensor hooks (activation checkpointing): the exact
    fast paths then run as the plain operations they stand for."""
    return torch._C._are_functorch_transforms_active()


def _forward_ad_active() -> bool:
    r"""Whether a forward-mode AD level is open (:func:`torch.autograd.forward_ad.dual_level`):
    tensors may then carry tangents, which neither this package's hand-written autograd
    functions (all but :class:`_Dropout` define no ``jvp``) nor PyTorch's fused CPU attention
    kernel (no forward derivative) serve. The level is torch's, one for the process (a level
    open in one thread sends every thread's calls to the plain operations: the same values,
    more time and memory)."""
    return getattr(forward_ad, '_current_level', -1) >= 0


try:  # torch.func's transform stack (private; without it every transform writes attention out)
    from torch._C._functorch import TransformType as _TransformType
    from torch._C._functorch import get_unwrapped as _get_unwrapped
    from torch._C._functorch import is_functorch_wrapped_tensor as _is_wrapped
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    _functorch_interpreters: Any = retrieve_all_functorch_interpreters
except ImportError:  # pragma: no cover (another torch)
    _functorch_interpreters = None


def _attention_written_out(*tensors: Tensor) -> bool:
    r"""Whether the attention of :obj:`tensors` (its queries, keys and values) must run as its
    operations written out rather than as PyTorch's fused kernel, which has neither a forward
    derivative nor a second derivative: while a forward-mode AD level is open, and under
    :mod:`torch.func` transforms that take a forward derivative (``jvp``, ``jacfwd``,
    ``hessian``) or more than one reverse-mode derivative (``jacrev(jacrev(f))``,
    ``grad(grad(f))``, or autograd recording through ``grad(f)``: inputs that require gradients
    beneath the transform's wrappers, also under ``vmap`` alone). A single reverse-mode
    transform (``grad``, ``vjp``, ``jacrev``, with ``vmap``) over inputs and parameters that do
    not otherwise require gradients keeps the kernel."""
    if _forward_ad_active():
        return True
    if not _functorch_active():
        return False
    if _functorch_interpreters is None:  # pragma: no cover (another torch)
        return True
    keys = [i.key() for i in _functorch_interpreters()]
    if _TransformType.Jvp in keys:
        return True
    if sum(k == _TransformType.Grad for k in keys) > 1:
        return True
    # autograd recording outside the transforms (inputs that require gradients beneath their
    # wrappers): a further derivative may follow, which the kernel under a transform lacks
    for t in tensors:
        while _is_wrapped(t):
            t = _get_unwrapped(t)
        if t.requires_grad:
            return True
    return False


def _plain_ops() -> bool:
    r"""Whether the exact fast paths run as the plain operations they stand for: under
    :mod:`torch.func` transforms (:func:`_functorch_active`) and while forward-mode AD is
    open (:func:`_forward_ad_active`), so that ``torch.func.jvp``, ``jacfwd``, ``hessian`` and
    dual tensors differentiate them. The values are the same up to rounding."""
    return _functorch_active() or _forward_ad_active()
