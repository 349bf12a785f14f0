r"""Model specs as the CLI and the benchmarks take them: ``'name'`` or ``'name:key=value,...'``
(a preset and its overrides), and comma-separated lists of them."""
from typing import Any, Dict, List, Tuple

from torch_mz.options import parse_key_values

__all__ = ['parse_model_spec', 'split_model_specs']


def parse_model_spec(spec: str) -> Tuple[str, Dict[str, Any]]:
    r"""Splits a model spec ``'name'`` or ``'name:key=value,key=value'`` (e.g.
    ``'hypernet:rank=64,dim=64'``) into the preset name and its overrides (values read by
    :func:`parse_key_values`)."""
    name, _, rest = spec.partition(':')
    try:
        return name, parse_key_values(filter(None, rest.split(',')))
    except ValueError as e:
        raise ValueError(f"Model spec '{spec}': options {e}") from None


def split_model_specs(text: str) -> List[str]:
    r"""Splits a comma-separated list of model specs, keeping a spec's own ``key=value`` options
    together: ``'mz,hypernet:rank=64,dim=64'`` gives ``['mz', 'hypernet:rank=64,dim=64']`` (a
    piece with ``=`` but no ``:`` continues the spec before it)."""
    specs: List[str] = []
    for piece in (p.strip() for p in text.split(',')):
        if not piece:
            continue
        if '=' in piece and ':' not in piece and specs and ':' in specs[-1]:
            specs[-1] += ',' + piece
        else:
            specs.append(piece)
    return specs
