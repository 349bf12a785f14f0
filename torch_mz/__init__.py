r"""torch_mz: Matrix Zonotopic Attention (MZAttn) for PyTorch Geometric.

Subpackages: :mod:`torch_mz.nn` (zonotope tokens, MZ attention, Set Transformer blocks,
:class:`~torch_mz.nn.MZAggregation`), :mod:`torch_mz.models` (MZ-Set Transformer, baselines,
EGNN, presets), :mod:`torch_mz.datasets` (synthetic tasks, ModelNet40, ScanObjectNN, QM9),
:mod:`torch_mz.train` (trainer), :mod:`torch_mz.inference` (:func:`load_model`: a trained
model from its checkpoint; :func:`load_test_split`: its run's test sets),
:mod:`torch_mz.testing` (equivariance checks), :mod:`torch_mz.geometry` (ground-truth
geometry), :mod:`torch_mz.analysis` (what the matrix zonotope learns), :mod:`torch_mz.runtime`
(process-wide CPU settings: kept freed memory), :mod:`torch_mz.tasks` (every task by name),
:mod:`torch_mz.study` (what the benchmarks and ``torch-mz compare`` share: measurement, the
training grid, reports, plots, statistics), :mod:`torch_mz.uncertainty` (quality of predictive
uncertainty, Appendix D.3), :mod:`torch_mz.reproduce` (the reproduction of the paper's claims
behind ``benchmarks/reproduce.py``), and the ``torch-mz`` command (:mod:`torch_mz.cli`).
"""
from torch_mz import testing
from torch_mz.inference import load_model, load_test_split
from torch_mz.models import EGNN, MZSetTransformer, build_model
from torch_mz.nn import MZAggregation, MZAttention, Zonotope

__version__ = '0.3.0.dev0'

__all__ = [
    'MZAggregation',
    'MZAttention',
    'Zonotope',
    'MZSetTransformer',
    'EGNN',
    'build_model',
    'load_model',
    'load_test_split',
    'testing',
    '__version__',
]
