r"""Detection of optional dependencies, in one place (as PyG's ``torch_geometric.typing``).

Heavy optional packages are imported lazily where they are used, through :func:`require`, which
raises an :class:`ImportError` naming the pip extra that provides the package.
"""
import importlib
import importlib.metadata
import importlib.util
from types import ModuleType
from typing import Optional

# package import name -> pip extra of torch_mz that installs it
EXTRAS = {
    'rdkit': 'datasets',
    'trimesh': 'datasets',
    'h5py': 'datasets',
    'torch_scatter': 'scatter',
    'matplotlib': 'plot',
}


def _available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


WITH_TORCH_SCATTER = _available('torch_scatter')  # recorded in every benchmark's environment


def require(name: str) -> ModuleType:
    r"""Imports the optional package ``name`` or raises an :class:`ImportError` that says which
    ``torch_mz`` extra installs it (``pip install 'torch_mz[<extra>]'``)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        extra = EXTRAS.get(name.split('.')[0])
        hint = (f"pip install 'torch_mz[{extra}]'" if extra is not None else f'pip install {name}')
        raise ImportError(f"'{name}' is required for this feature but could not be imported "
                          f"({e}). Install it with: {hint}") from e


def installed_version(name: str) -> Optional[str]:
    r"""The version of the optional package ``name`` as it gives it (its ``__version__``, else
    its distribution's), or :obj:`None` where it is not installed (then nothing is imported)."""
    if not _available(name):
        return None
    try:
        version = getattr(importlib.import_module(name), '__version__', None)
        return str(version) if version is not None else importlib.metadata.version(name)
    except (ImportError, importlib.metadata.PackageNotFoundError):
        return None
