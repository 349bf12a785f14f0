r"""What a processed cache records to tell whether it still fits: a fingerprint of the raw files
it was built from (:func:`fingerprint_files`) and a description of the ``pre_transform`` /
``pre_filter`` it was made with, by class and parameters (:func:`_describe`), which
:class:`~torch_mz.datasets.common.ProcessedDataset` compares when it opens a cache."""
import dis
import enum
import functools
import hashlib
import inspect
import os
import os.path as osp
import pathlib
import re
import types
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set

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
    rewritten, a digit of a mesh changed) is seen too. Inside :func:`hashing_files` (a cache
    being built) a third entry ``'sha1:<hex>'`` records the bytes, so that a copy that did not
    keep the times is told to be the same files (:func:`raw_files_differ`) instead of rebuilt.
    With :obj:`content` (a file read as a whole, such as a CSV file), ``[size, 'sha1:<hex>']``
    for a file of at most :data:`FINGERPRINT_HASH_LIMIT` bytes and the size and modification
    time (and inside :func:`hashing_files` the SHA-1) for a larger one. (Before 2026-12-06 the
    default recorded the size alone: such a cache is rebuilt once.)"""
    out: Dict[str, Any] = {}
    for path in paths:
        if not osp.isfile(path):
            continue
        key = path if base is None else osp.relpath(path, base).replace(os.sep, '/')
        info = os.stat(path)
        if content and info.st_size <= FINGERPRINT_HASH_LIMIT:
            out[key] = [info.st_size, 'sha1:' + _sha1_of(path)]
        else:
            out[key] = [info.st_size, f'mtime_ns:{info.st_mtime_ns}']
            if _HASHING[0] and (_HASHING[1] is None or key in _HASHING[1]):
                out[key].append('sha1:' + _sha1_of(path))
    return dict(sorted(out.items()))


# inside hashing_files(): fingerprint_files adds the SHA-1 of every file, or of those keys
_HASHING: List[Any] = [False, None]


def _sha1_of(path: str) -> str:
    h = hashlib.sha1()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 22), b''):
            h.update(block)
    return h.hexdigest()


@contextmanager
def hashing_files(keys: Optional[Any] = None) -> Iterator[None]:
    r"""Within it :func:`fingerprint_files` records every file's SHA-1 too (a cache being built
    reads every raw file anyway; checking a cache reads none unless their times changed), or,
    with :obj:`keys`, only that of the files of those keys."""
    before = list(_HASHING)
    _HASHING[:] = [True, None if keys is None else set(keys)]
    try:
        yield
    finally:
        _HASHING[:] = before


def raw_files_differ(recorded: Any, current: Dict[str, Any],
                     rehash: Callable[[Set[str]], Dict[str, Any]]) -> str:
    r"""What differs between the raw-file fingerprint a cache :obj:`recorded` and the
    :obj:`current` one, in words ('' where nothing does). A file whose size is the same and
    whose modification time is not (a copy that did not keep the times) is compared by its
    SHA-1 where the record has one: ``rehash(keys)`` gives the current fingerprint with the
    hashes of those files (:func:`fingerprint_files` within ``hashing_files(keys)``), called
    only then."""
    if not isinstance(recorded, dict):
        return 'the cache records no fingerprint of them'
    if recorded == current:
        return ''
    if any(isinstance(v, int) for v in recorded.values()):  # (with hashed lists beside them)
        return ('the cache records their sizes alone, as releases before 2026-12-06 did, not '
                'their modification times')

    def same(a: Any, b: Any) -> bool:  # (a record with a hash against one without)
        return a == b or (isinstance(a, list) and isinstance(b, list) and a[:2] == b[:2])

    differ = {k for k in set(recorded) | set(current)
              if k not in recorded or k not in current or not same(recorded[k], current[k])}
    touched = {k for k in differ if k in recorded and k in current
               and isinstance(recorded[k], list) and isinstance(current[k], list)
               and recorded[k][0] == current[k][0] and str(recorded[k][-1]).startswith('sha1:')}
    if touched:  # the same sizes, other times: the same bytes?
        hashed = rehash(touched)
        differ -= {k for k in touched if isinstance(hashed.get(k), list)
                   and hashed[k][-1] == recorded[k][-1]}
    if not differ:
        return ''
    return _raw_changes({k: v for k, v in recorded.items() if k in differ},
                        {k: v for k, v in current.items() if k in differ})


def split_digest(split: Any) -> Optional[str]:
    r"""A digest of the sets a split of a real dataset holds, for a checkpoint's ``run_info``
    (``torch-mz predict`` and a resumed run compare it, so that another dataset folder or
    changed raw files are not taken for the run's data): for a view of a PyG
    :class:`~torch_geometric.data.InMemoryDataset` (``dataset.index_select(...)``), the SHA-1 of
    the stored rows of the items it selects, in its order (every collated tensor's rows of each
    item, with the item's row count; an attribute stored whole, by all of it; a non-tensor
    attribute with one entry per item, such as a name, by the text of its items' entries
    where each is a number, a string or None, and another number or string by its text). The
    stored
    items, not those a ``transform`` makes of them (a random transform would differ every
    time). :obj:`None` for anything else (the synthetic tasks' lists of sets, which their seed
    and options determine)."""
    from torch_geometric.data import InMemoryDataset
    if not isinstance(split, InMemoryDataset) or getattr(split, '_data', None) is None:
        return None
    data, slices = split._data, split.slices or {}
    idx = np.asarray(list(split.indices()), dtype=np.int64)
    h = hashlib.sha1(f'{idx.size} items;'.encode())

    def add(name: str, t: Tensor) -> None:
        t = t.detach().cpu().contiguous()
        h.update(f'{name}:{t.dtype}:{tuple(t.shape)};'.encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())

    store = data.to_dict()
    for key in sorted(store):
        value = store[key]
        if not isinstance(value, Tensor):
            bounds = slices.get(key)
            if (isinstance(value, (list, tuple)) and isinstance(bounds, Tensor)
                    and bounds.dim() == 1 and bounds.numel() == len(value) + 1):
                # one entry per item (PyG collates a non-tensor attribute, e.g. a name, into a
                # list): the selected items' entries, by their text, where every one is a
                # plain value (another object's text may hold its address, other in every
                # process)
                chosen = [value[i] for i in idx]
                if all(v is None or isinstance(v, (int, float, str, bool)) for v in chosen):
                    h.update(f'{key}=[{";".join(repr(v) for v in chosen)}];'.encode())
            elif isinstance(value, (int, float, str, bool)) or value is None:
                h.update(f'{key}={value!r};'.encode())  # stored whole
            continue
        bounds = slices.get(key)
        if not isinstance(bounds, Tensor) or bounds.dim() != 1 or value.dim() == 0:
            add(key, value)  # stored whole
            continue
        b = bounds.cpu().numpy().astype(np.int64)
        starts, lengths = b[idx], b[idx + 1] - b[idx]
        ends = np.cumsum(lengths)
        rows = np.repeat(starts - (ends - lengths), lengths) + np.arange(int(ends[-1]) if
                                                                          idx.size else 0)
        dim = data.__cat_dim__(key, value)
        if dim is None:  # stacked along a new first dimension: one row per item
            dim = 0
        if not isinstance(dim, int):  # (a tuple: a sparse layout) hashed whole
            add(key, value)
            continue
        dim = dim + value.dim() if dim < 0 else dim
        add(key, value.index_select(dim, torch.from_numpy(rows)))
        add(key + '.rows', torch.from_numpy(lengths))
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
    their qualified name, a hash of their code, their defaults, the values they close over and
    the values they read as globals that are plain numbers, strings or flags, containers
    (dicts, lists, tuples, sets: a ``CONFIG = {'scale': 2}``, described item by item) or
    tensors and arrays (hashed); ``torch.nn.Module`` objects also by their state dict; other
    objects by their class, their public attributes, the private ones named after a
    constructor parameter whatever they hold (a factor kept as ``self._factor``, a tensor
    ``self._factor = torch.as_tensor(factor)``; where the constructors do not name their
    parameters, ``**kwargs``, the private ones that hold a plain number, string or flag; other
    private attributes are state a transform may change as it runs, a cache or a counter: not
    described, so that an instance shared by the splits or by several datasets is described
    alike before and after) and their repr without addresses (which shows other parameters
    kept in private attributes). The text holds no address, so the same transform, or an equal
    one made again, gets the same description; a transform whose repr is the same but whose
    parameters differ (PyG's ``FixedPoints(32, allow_duplicates=True)``,
    ``KNNGraph(loop=True)``) gets another one.

    Not described, so that changing them does not tell a cache apart: a private attribute of
    another name (or one holding more than a plain value where the constructors do not name
    their parameters), other objects a function reads as globals (a transform instance, a
    random generator: described by nothing), values a function reads through a module or an
    object (``config.SCALE``, ``data.FACTOR``), and anything outside the transform (a file it
    reads). A function that keeps state in a container it reads as a global (a memo dict) is
    described with that state, and the cache it made is rebuilt where the state differs."""
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
    if isinstance(value, pathlib.PurePath):  # by its text: its private attributes are caches
        # that fill as it is used (str() fills _str), so they would describe it differently
        return f'{_type_name(type(value))}({str(value)!r})'
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
        read = _read_globals(value)
        if read:  # (a module-level setting the function reads, FACTOR = 2, CONFIG = {...})
            parts.append(f'globals={describe(read)}')
        return f"function {_type_name(value)}({', '.join(parts)})"
    attributes = _attributes(value)
    text = _repr_without_address(value)
    if attributes is not None:
        # the public attributes, the private ones named after a parameter of the constructor
        # whatever they hold (factor kept as self._factor, a number or a tensor; where the
        # constructors do not name their parameters, those that hold a plain value), and the
        # repr; other private attributes are state a transform may change as it runs (a lazy
        # cache, a counter), so an instance shared by the splits or by several datasets is
        # described alike before and after
        parameters = _init_parameters(type(value))
        described = ', '.join(f'{k}={describe(v)}' for k, v in sorted(attributes.items())
                              if not k.startswith('_')
                              or (_plain(v) if parameters is None
                                  else bool(_parameter_name(type(value), k) & parameters)))
        if isinstance(value, torch.nn.Module):  # (its weights are in private attributes)
            described += f', state_dict={describe(dict(value.state_dict()))}'
        return f'{name}({described}; repr {text})'
    # no attributes to read (a builtin function, a C object): its repr without addresses
    return f'{name}: {text}'


def _plain(value: Any) -> bool:
    return (isinstance(value, (bool, int, float, complex, str, bytes, enum.Enum, np.generic,
                               pathlib.PurePath))
            and not isinstance(value, type))


def _init_parameters(cls: type) -> Optional[set]:
    r"""The parameter names of the constructors of :obj:`cls` and its bases; :obj:`None` where
    they do not name them all (no constructor of its own, ``*args`` or ``**kwargs``, a signature
    that cannot be read): then every private attribute that holds a plain value is described."""
    names: set = set()
    own = False
    for base in cls.__mro__:
        if base is object or '__init__' not in vars(base):
            continue
        own = True
        try:
            parameters = inspect.signature(vars(base)['__init__']).parameters.values()
        except (TypeError, ValueError):
            return None
        for p in parameters:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                return None
            names.add(p.name)
    return names - {'self'} if own else None


def _parameter_name(cls: type, key: str) -> set:
    r"""The constructor parameter names a private attribute :obj:`key` may stand for: itself
    (a dataclass field ``_factor``), without its underscores (``_factor`` for ``factor``), and
    unmangled (``_Scale__factor`` for ``__factor`` in class ``Scale``)."""
    names = {key, key.lstrip('_')}
    for base in cls.__mro__:
        prefix = f'_{base.__name__.lstrip("_")}__'
        if key.startswith(prefix):
            names.add(key[len(prefix):])
    return names


def _code_names(code: types.CodeType) -> set:
    r"""The names :obj:`code` (and the code nested in it) loads as globals, not attribute
    names (``d.name`` reads no global ``name``)."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname == 'LOAD_GLOBAL'}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # (a nested function or comprehension)
            names |= _code_names(const)
    return names


# what a function reads as a global that is described: settings, not code (modules, classes
# and functions, described by their names) nor other objects (a generator, a logger: state)
_GLOBAL_CONTAINERS = (dict, list, tuple, set, frozenset, Tensor, np.ndarray)


def _read_globals(function: types.FunctionType) -> Dict[str, Any]:
    r"""The module-level names :obj:`function` reads whose values are plain numbers, strings or
    flags, containers (dicts, lists, tuples, sets) or tensors and arrays (not modules, classes
    or functions: those are code, described by their names; nor other objects)."""
    found = {}
    for name in sorted(_code_names(function.__code__)):
        if name in function.__globals__:
            value = function.__globals__[name]
            if _plain(value) or isinstance(value, _GLOBAL_CONTAINERS):
                found[name] = value
    return found


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
