r"""What a processed cache records to tell whether it still fits: a fingerprint of the raw files
it was built from (:func:`fingerprint_files`) and a description of the ``pre_transform`` /
``pre_filter`` it was made with, by class and parameters (:func:`_describe`), which
:class:`~torch_mz.datasets.common.ProcessedDataset` compares when it opens a cache."""
import enum
import functools
import hashlib
import os
import os.path as osp
import re
import types
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ['fingerprint_files', 'files_below', 'split_digest', 'FINGERPRINT_HASH_LIMIT',
           'DESCRIBE_DEPTH']


#: Files of the raw data of at most this many bytes that :func:`fingerprint_files` records by
#: the SHA-1 of their bytes (with :obj:`content`); larger ones by their modification time.
FINGERPRINT_HASH_LIMIT = 8 * 2**20


def fingerprint_files(paths: Sequence[str], base: Optional[str] = None,
                      content: bool = False) -> Dict[str, Any]:
    r"""A cheap fingerprint of the raw files :obj:`paths` (those that exist), for ``stats.json``:
    for each file, keyed by its path relative to :obj:`base` (``/``-separated; the path as
    given where :obj:`base` is :obj:`None`), ``[size, 'mtime_ns:<time>']``: its size in bytes
    and modification time, so that an edit that keeps the size (an HDF5 file of fixed shapes
    rewritten, a digit of a mesh changed) is seen too; a copy that does not keep the times
    rebuilds once. With :obj:`content` (a file read as a whole, such as a CSV file),
    ``[size, 'sha1:<hex>']`` for a file of at most :data:`FINGERPRINT_HASH_LIMIT` bytes (a
    copy is the same file) and the size and modification time for a larger one. (Before
    2026-12-06 the default recorded the size alone: such a cache is rebuilt once.)"""
    out: Dict[str, Any] = {}
    for path in paths:
        if not osp.isfile(path):
            continue
        key = path if base is None else osp.relpath(path, base).replace(os.sep, '/')
        info = os.stat(path)
        if content and info.st_size <= FINGERPRINT_HASH_LIMIT:
            with open(path, 'rb') as f:
                out[key] = [info.st_size, 'sha1:' + hashlib.sha1(f.read()).hexdigest()]
        else:
            out[key] = [info.st_size, f'mtime_ns:{info.st_mtime_ns}']
    return dict(sorted(out.items()))


# the digests of the collated storages hashed so far: id -> (the storage, its digest); the
# storage is held so that its id is not reused while the entry stands
_STORAGE_DIGESTS: Dict[int, Any] = {}


def _storage_digest(data: Any, slices: Any) -> str:
    entry = _STORAGE_DIGESTS.get(id(data))
    if entry is not None and entry[0] is data:
        return entry[1]
    h = hashlib.sha1()

    def add(name: str, value: Any) -> None:
        if isinstance(value, Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f'{name}:{t.dtype}:{tuple(t.shape)};'.encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b'')
        elif isinstance(value, (int, float, str, bool)) or value is None:
            h.update(f'{name}={value!r};'.encode())

    store = data.to_dict() if hasattr(data, 'to_dict') else dict(data)
    for key in sorted(store):
        add(key, store[key])
    for key in sorted(slices or {}):
        add('slices.' + key, slices[key])
    digest = h.hexdigest()
    if len(_STORAGE_DIGESTS) >= 8:
        _STORAGE_DIGESTS.clear()
    _STORAGE_DIGESTS[id(data)] = (data, digest)
    return digest


def split_digest(split: Any) -> Optional[str]:
    r"""A digest of the data a split of a real dataset holds, for a checkpoint's ``run_info``
    (``torch-mz predict`` and a resumed run compare it, so that another dataset folder or
    changed raw files are not taken for the run's data): for a view of a PyG
    :class:`~torch_geometric.data.InMemoryDataset` (``dataset.index_select(...)``), the SHA-1 of
    its collated storage (every tensor's dtype, shape and bytes, and the slices; hashed once per
    storage) and of the indices it selects. The stored items, not those a ``transform`` makes
    of them (a random transform would differ every time). :obj:`None` for anything else (the
    synthetic tasks' lists of sets, which their seed and options determine)."""
    from torch_geometric.data import InMemoryDataset
    if not isinstance(split, InMemoryDataset) or getattr(split, '_data', None) is None:
        return None
    h = hashlib.sha1(_storage_digest(split._data, split.slices).encode())
    h.update(np.asarray(list(split.indices()), dtype=np.int64).tobytes())
    return h.hexdigest()


def files_below(folder: str) -> List[str]:
    r"""Every file below :obj:`folder` (none where it does not exist), sorted."""
    found = []
    for top, dirs, files in os.walk(folder):
        dirs.sort()
        found += [osp.join(top, name) for name in sorted(files)]
    return found


def _raw_changes(recorded: Dict[str, Any], current: Dict[str, Any]) -> str:
    r"""What differs between two :func:`fingerprint_files` results, in words."""
    added = sorted(set(current) - set(recorded))
    removed = sorted(set(recorded) - set(current))
    changed = sorted(k for k in set(recorded) & set(current) if recorded[k] != current[k])
    parts = []
    for label, names in (('added', added), ('removed', removed),
                         ('changed in size, contents or modification time', changed)):
        if names:
            more = f' and {len(names) - 5} more' if len(names) > 5 else ''
            parts.append(f"{label}: {', '.join(names[:5])}{more}")
    return '; '.join(parts) or 'recorded differently'


#: How deep :func:`_describe` follows the attributes of a transform (nested transforms, their
#: lists and dicts); deeper objects are described by their class only.
DESCRIBE_DEPTH = 12


# a description longer than this (a transform holding a long list) is kept as a hash of it
_DESCRIBE_LONG = 4096


def _describe(transform: Any) -> str:
    r"""What a processed cache records of the ``pre_transform`` or ``pre_filter`` it was made
    with, to tell whether it was made with the one given: its class (module and qualified
    name) with its parameters, the attributes in its ``vars()`` (or slots), each described in
    turn. Nested transforms, lists, tuples, dicts and sets are followed (up to
    :data:`DESCRIBE_DEPTH` levels); numbers, strings and other primitives are described by
    their repr; tensors and arrays by dtype, shape and the SHA-1 of their bytes; functions by
    their qualified name, a hash of their code, their defaults and the values they close over;
    other objects by their class, their public attributes (a leading underscore marks state a
    transform may change as it runs: not described, so that an instance shared by several
    datasets, one of which processed with it, is described alike) and their repr without
    addresses (which shows parameters kept in private attributes). The text holds no address,
    so the same transform, or an equal one made again, gets the same description; a transform
    whose repr is the same but whose parameters differ (PyG's
    ``FixedPoints(32, allow_duplicates=True)``, ``KNNGraph(loop=True)``) gets another one."""
    return 'None' if transform is None else _describe_value(transform, DESCRIBE_DEPTH, set())


def _type_name(cls: Any) -> str:
    # the module and qualified name of a class or a function ('builtins.' left out)
    module = getattr(cls, '__module__', None)
    qualname = str(getattr(cls, '__qualname__', None) or getattr(cls, '__name__', repr(cls)))
    return qualname if module in (None, 'builtins') else f'{module}.{qualname}'


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _describe_value(value: Any, depth: int, active: set) -> str:
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, enum.Enum)):
        return repr(value)
    if isinstance(value, np.generic):
        return f'{_type_name(type(value))}({_describe_value(value.item(), 0, active)})'
    if isinstance(value, Tensor):
        return (f'tensor(dtype={value.dtype}, shape={tuple(value.shape)}, '
                f'sha1={_tensor_digest(value)})')
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        return (f'ndarray(dtype={value.dtype.str}, shape={value.shape}, '
                f'sha1={_sha1(np.ascontiguousarray(value).tobytes())})')
    if isinstance(value, type):
        return f'class {_type_name(value)}'
    if isinstance(value, types.ModuleType):
        return f'module {value.__name__}'
    if depth <= 0:
        return f'{_type_name(type(value))}(...)'
    if id(value) in active:  # (an object that holds itself)
        return f'{_type_name(type(value))}(<cycle>)'
    active.add(id(value))
    try:
        text = _describe_compound(value, depth - 1, active)
    finally:
        active.discard(id(value))
    if len(text) > _DESCRIBE_LONG:
        text = f'{_type_name(type(value))}(sha1={_sha1(text.encode())})'
    return text


def _tensor_digest(value: Tensor) -> str:
    value = value.detach().cpu()
    try:
        if value.layout != torch.strided:
            value = value.to_dense()
        data = value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    except (RuntimeError, TypeError):  # (a quantized tensor, for one)
        data = repr(value.tolist()).encode()
    return _sha1(data)


def _code_digest(code: types.CodeType) -> str:
    r"""A hash of what a function does: its bytecode, constants and names (not its file or line
    numbers)."""
    digest = hashlib.sha1(code.co_code)
    for const in code.co_consts:
        digest.update(_const_text(const).encode())
    digest.update(repr(code.co_names).encode())
    return digest.hexdigest()[:16]


def _const_text(const: Any) -> str:
    if isinstance(const, types.CodeType):
        return _code_digest(const)
    if isinstance(const, (tuple, frozenset)):  # (a frozenset's order differs between runs)
        items = [_const_text(c) for c in const]
        return repr(tuple(items) if isinstance(const, tuple) else sorted(items))
    return repr(const)


def _describe_compound(value: Any, depth: int, active: set) -> str:
    def describe(item: Any) -> str:
        return _describe_value(item, depth, active)

    name = _type_name(type(value))
    if isinstance(value, dict):
        items = sorted(f'{describe(k)}: {describe(v)}' for k, v in value.items())
        return f"{name}{{{', '.join(items)}}}"
    if isinstance(value, (list, tuple)):
        return f"{name}[{', '.join(map(describe, value))}]"
    if isinstance(value, (set, frozenset)):
        return f"{name}{{{', '.join(sorted(map(describe, value)))}}}"
    if isinstance(value, np.ndarray):  # (of objects)
        return f'ndarray(shape={value.shape}, items={describe(value.ravel().tolist())})'
    if isinstance(value, functools.partial):
        return (f'functools.partial({describe(value.func)}, args={describe(value.args)}, '
                f'keywords={describe(value.keywords)})')
    if isinstance(value, types.MethodType):
        return f'method {_type_name(value.__func__)} of {describe(value.__self__)}'
    if isinstance(value, types.FunctionType):
        parts = [f'code={_code_digest(value.__code__)}']
        if value.__defaults__:
            parts.append(f'defaults={describe(value.__defaults__)}')
        if value.__kwdefaults__:
            parts.append(f'kwdefaults={describe(value.__kwdefaults__)}')
        if value.__closure__:
            cells = []
            for cell in value.__closure__:
                try:
                    cells.append(cell.cell_contents)
                except ValueError:  # a cell not filled yet
                    cells.append('<empty cell>')
            parts.append(f'closure={describe(cells)}')
        return f"function {_type_name(value)}({', '.join(parts)})"
    attributes = _attributes(value)
    text = _repr_without_address(value)
    if attributes is not None:
        # the public attributes, and the repr (for parameters kept in private ones); private
        # attributes are state a transform may change as it runs (a lazy cache, a counter), so
        # an instance shared by several datasets is described alike before and after
        described = ', '.join(f'{k}={describe(v)}' for k, v in sorted(attributes.items())
                              if not k.startswith('_'))
        return f'{name}({described}; repr {text})'
    # no attributes to read (a builtin function, a C object): its repr without addresses
    return f'{name}: {text}'


def _repr_without_address(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as e:  # (a repr that fails: described by its failure)
        text = f'<repr failed: {type(e).__name__}>'
    return re.sub(r' (object )?at 0x[0-9a-fA-F]+', '', text)


def _attributes(value: Any) -> Optional[Dict[str, Any]]:
    r"""The attributes of an object, from its ``__dict__`` and its slots; :obj:`None` for an
    object with neither."""
    found: Optional[Dict[str, Any]] = None
    try:
        found = dict(vars(value))
    except TypeError:
        pass
    for cls in type(value).__mro__:
        slots = cls.__dict__.get('__slots__', ())
        for slot in ([slots] if isinstance(slots, str) else slots):
            if slot in ('__dict__', '__weakref__'):
                continue
            found = {} if found is None else found
            if slot.startswith('__') and not slot.endswith('__'):
                slot = f'_{cls.__name__.lstrip("_")}{slot}'  # (a private name, mangled)
            if hasattr(value, slot):
                found.setdefault(slot, getattr(value, slot))
    return found
