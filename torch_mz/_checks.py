r"""Checks of constructor arguments, shared by the modules and models: a count, a flag or a
rate of the wrong type or range raises a :class:`ValueError` that names it, instead of being
taken as something else (the text ``'False'`` as a true flag, ``-1`` layers as none) or failing
deep inside a layer."""
import math
import numbers
import os
from typing import Any, NoReturn, Optional, Tuple

import torch

__all__ = ['check_count', 'check_optional_count', 'check_flag', 'check_number',
           'check_range', 'check_rate', 'check_fits', 'host_memory', 'SizeError',
           'refuse_jit_trace', 'refuse_jit_script']


class SizeError(ValueError):
    r"""The :class:`ValueError` of sizes whose model could not fit in this machine's memory
    (:func:`check_fits`)."""


#: Fewer bytes than one module of PyTorch takes in Python objects (an empty ``Module``: about
#: 2 KiB, a ``Linear`` 2.4 KiB).
_MODULE_BYTES = 1024


def host_memory() -> Optional[int]:
    r"""The bytes of the host's physical memory; :obj:`None` where they cannot be read."""
    try:
        return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError, AttributeError):  # (not on every platform)
        return None


def _machine_memory(need: int) -> Optional[int]:
    r"""The bytes of this machine's memory, the host's and, where :obj:`need` is more, its
    GPUs' too (read only then: CUDA is not initialised for a model that fits in the host's);
    :obj:`None` where the host's cannot be read."""
    memory = host_memory()
    if memory is None:
        return None
    if need > memory and torch.cuda.is_available():
        memory += sum(torch.cuda.get_device_properties(i).total_memory
                      for i in range(torch.cuda.device_count()))
    return memory


def check_fits(what: str, parameters: int, modules: int = 0) -> None:
    r"""Raises a :class:`SizeError` naming :obj:`what` (the sizes asked for) where
    :obj:`parameters` parameters of the default dtype and :obj:`modules` modules (at least 1 KiB
    of Python objects each) could not fit in this machine's memory, the host's and its GPUs'
    together. Called with lower bounds of a model's counts before any of its blocks is built
    (``num_encoder_blocks=2**70`` built blocks without end), so that no model that fits is
    refused (one a little too large may still run out of memory); the memory is read only past
    1 GiB. Built on the meta device (``with torch.device('meta')``) the parameters take no
    memory, and only the modules count."""
    if torch.get_default_device().type == 'meta':  # (a model of any size built to inspect it)
        parameters = 0
    need = parameters * torch.get_default_dtype().itemsize + modules * _MODULE_BYTES
    if need <= 2 ** 30:
        return
    memory = _machine_memory(need)
    if memory is not None and need > memory:
        raise SizeError(f"{what}: at least {parameters:,} parameters in {modules:,} modules, "
                        f"more than {need // 2 ** 30:,} GiB, beyond this machine's "
                        f"{memory / 2 ** 30:,.1f} GiB of memory: give smaller sizes")


def refuse_jit_trace(what: str) -> None:
    r"""Raises a :class:`RuntimeError` naming :obj:`what` while :func:`torch.jit.trace` records:
    what a set aggregation or a model reads of the sets on the host (an attention layout, the
    number of sets, EGNN's pairs of elements) would enter the trace as constants of the traced
    input, so that a trace served that input's sets alone (PyG's own
    ``SetTransformerAggregation``, traced, gives other values than eager on a batch of other set
    sizes, without an error; a traced Deep Sets gave rows for sets a smaller batch did not
    have). Called by the aggregations and by every model's ``forward``."""
    if torch.jit.is_tracing():
        raise RuntimeError(
            f"{what} cannot be recorded by torch.jit.trace: the sizes of the sets would enter the "
            f"trace as constants of the traced input, and the trace would serve those sets "
            f"alone. Use torch.compile (it handles new set sizes), or run it eagerly")


#: Why a set aggregation or a set model cannot be scripted (:func:`refuse_jit_script`).
SET_LAYOUT_IN_PYTHON = "its forward finds each batch's set layout in Python"


def refuse_jit_script(what: str, why: str = SET_LAYOUT_IN_PYTHON) -> NoReturn:
    r"""Raises a :class:`RuntimeError` naming :obj:`what`, :obj:`why` (what its forward does
    that TorchScript does not take) and :func:`torch.compile`; the ``__prepare_scriptable__``
    of the set aggregations, of every model :func:`~torch_mz.models.build_model` builds and of
    :class:`~torch_mz.models.EGNNConv` calls it. :func:`torch.jit.script` calls that hook on
    the module it scripts first, then on every module below it (a conv's aggregation too, and
    one that a holder's ``__jit_ignored_attributes__`` leaves out of the script: refused too,
    left so rather than read torch's private frames); without it the script failed inside, on
    the first construct TorchScript lacks, with a message that did not say why."""
    raise RuntimeError(f"{what} cannot be compiled by torch.jit.script: {why} that TorchScript "
                       f"does not take. Use torch.compile (it handles new set sizes), or run it "
                       f"eagerly")


def refuse_compiled_wrapper(model: Any, what: str) -> None:
    r"""Refuses the wrapper that ``torch.compile(model)`` returns where :obj:`what` keeps or
    changes the model itself (its ``state_dict`` keys all start with ``_orig_mod.``, and
    sub-modules added to it are not found through it), and names ``model.compile()``, which
    compiles in place."""
    if isinstance(model, torch.nn.Module) and isinstance(
            getattr(model, '_orig_mod', None), torch.nn.Module):
        raise ValueError(f"{what} takes the model itself, not the wrapper torch.compile(model) "
                         f"returns (its checkpoints would hold keys '_orig_mod.*' that the "
                         f"model does not load): compile in place with model.compile(), or pass "
                         f"model._orig_mod")


def check_count(name: str, value: Any, low: int = 1) -> int:
    r"""An integer of at least :obj:`low` (not a bool), returned as a Python :obj:`int`."""
    if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
            or value < low):
        raise ValueError(f"'{name}' must be an integer >= {low} (got {value!r})")
    return int(value)


def check_optional_count(name: str, value: Any, low: int = 1) -> Optional[int]:
    r""":func:`check_count`, or :obj:`None`."""
    if value is None:
        return None
    try:
        return check_count(name, value, low)
    except ValueError:
        raise ValueError(f"'{name}' must be an integer >= {low} or None (got {value!r})") from None


def check_flag(name: str, value: Any) -> bool:
    r"""A bool (or NumPy bool, or the integer 0 or 1), returned as a Python :obj:`bool`;
    anything else, e.g. the text ``'False'`` (which is true), raises."""
    if type(value).__name__ not in ('bool', 'bool_') and not (
            isinstance(value, numbers.Integral) and value in (0, 1)):
        raise ValueError(f"'{name}' must be True or False (got {value!r})")
    return bool(value)


def _real(value: Any) -> float:
    r""":obj:`value` as a Python :obj:`float`, or NaN where it is no real number (a bool, a
    string) or none a float holds (an integer too large for one raised an OverflowError)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.nan


def check_rate(name: str, value: Any, low: float = 0.0, high: float = 1.0,
               high_inclusive: bool = False) -> float:
    r"""A finite real number in ``[low, high)`` (``[low, high]`` with :obj:`high_inclusive`)."""
    number = _real(value)
    if (not math.isfinite(number) or number < low
            or (number > high if high_inclusive else number >= high)):
        raise ValueError(f"'{name}' must be a number in [{low:g}, {high:g}"
                         f"{']' if high_inclusive else ')'} (got {value!r})")
    return number


def check_number(name: str, value: Any, allow_zero: bool = False) -> float:
    r"""A finite real number above 0 (at least 0 with :obj:`allow_zero`; not a bool or a
    string), returned as a Python :obj:`float`."""
    number = _real(value)
    if not math.isfinite(number) or number < 0.0 or (number == 0.0 and not allow_zero):
        raise ValueError(f"'{name}' must be a finite number {'>= 0' if allow_zero else '> 0'} "
                         f"(got {value!r})")
    return number


def check_range(name: str, value: Any, low: int = 1, integer: bool = True) -> Tuple:
    r"""A pair ``(low, high)`` with ``low <= high``: integers of at least :obj:`low`
    (:func:`check_count`), or with :obj:`integer` false numbers above 0
    (:func:`check_number`)."""
    try:
        lo, hi = value
    except (TypeError, ValueError):
        raise ValueError(f"'{name}' must be a pair (low, high) (got {value!r})") from None
    if integer:
        lo, hi = check_count(f'{name}[0]', lo, low), check_count(f'{name}[1]', hi, low)
    else:
        lo, hi = check_number(f'{name}[0]', lo), check_number(f'{name}[1]', hi)
    if lo > hi:
        raise ValueError(f"'{name}' must satisfy low <= high (got {value!r})")
    return lo, hi
