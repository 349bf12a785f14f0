r"""The MZAttn paper's reported figures that the studies compare with, typed in from the paper
text (``papers/mzattn-paper.txt``) once, here, and read by ``benchmarks/`` and
:mod:`torch_mz.reproduce`. Model names are this package's presets (the paper's "Standard" is
``rigid``, "MZAttn"/"MZAttn-Full" is ``mz``)."""
from typing import Dict, Tuple

from torch_mz.datasets.qm9 import QM9_TARGETS

#: Table 1 (depth separation, quadratic-TDOF target, 3 seeds):
#: L -> (MZAttn-1L R², ST-4L R², residual-MSE ratio ST-4L / MZAttn-1L).
TABLE1: Dict[int, Tuple[float, float, float]] = {
    4: (0.995, 0.970, 6.6), 8: (0.988, 0.809, 15.4), 16: (0.950, 0.618, 7.6),
    24: (0.944, 0.547, 8.0), 32: (0.908, 0.396, 6.5)}
#: Table 1's seed spreads (std of R²): L -> (MZAttn-1L, ST-4L).
TABLE1_STD: Dict[int, Tuple[float, float]] = {
    4: (0.002, 0.005), 8: (0.001, 0.011), 16: (0.001, 0.017), 24: (0.011, 0.020),
    32: (0.016, 0.001)}

#: Models of the geometry tables, in the order of :data:`GEOMETRY` tuples.
GEOMETRY_MODELS = ('rigid', 'st-large', 'hypernet', 'perceiver', 'mz')
#: R² per (task, d) for :data:`GEOMETRY_MODELS`: Table 3 (MEB radius, 5 seeds), Table 2's Task F
#: (rotation matching in R^8) and Table 4 (rotation matching from d = 16), and the
#: target-normalised Tables 17 (MST) and 18 (hull volume).
GEOMETRY: Dict[Tuple[str, int], Tuple[float, ...]] = {
    ('MEB', 8): (0.025, 0.018, 0.004, 0.024, 0.691),       # Table 3
    ('MEB', 16): (0.020, 0.012, 0.005, 0.016, 0.629),
    ('MEB', 32): (0.006, -0.006, -0.001, 0.010, 0.378),
    ('rot', 8): (0.904, 0.917, 0.730, 0.829, 0.953),       # Table 2, Task F
    ('rot', 16): (0.084, 0.285, 0.020, -0.001, 0.826),     # Table 4
    ('rot', 32): (-0.002, -0.001, -0.005, -0.006, 0.519),
    ('rot', 64): (-1.20, -0.023, -1.10, -1.17, 0.071),
    ('rot', 128): (-21.54, -9.47, -16.51, -19.18, -0.001),
    ('rot', 256): (-61.69, -50.15, -61.48, -61.52, -0.005),
    ('MST', 16): (0.660, 0.658, 0.495, 0.467, 0.738),      # Table 17 (normalised targets)
    ('MST', 32): (0.565, 0.567, 0.435, 0.417, 0.640),
    ('MST', 64): (0.539, 0.524, 0.447, 0.435, 0.594),
    ('MST', 128): (0.510, 0.493, 0.443, 0.401, 0.554),
    ('MST', 256): (0.461, 0.462, 0.373, 0.363, 0.469),
    ('hull', 3): (0.822, 0.866, 0.727, 0.725, 0.863),      # Table 18 (normalised targets)
    ('hull', 6): (0.292, 0.412, 0.195, 0.209, 0.555),
    ('hull', 9): (0.138, 0.160, 0.108, 0.119, 0.123),
}

#: Table 2's Task F (rotation matching in R^8): R² of ST + FiLM (225K parameters, a
#: "smaller-budget baseline reported for reference"), the model of the paper's headline there
#: ("51% over FiLM"); Table 4 (d >= 16) has no FiLM row.
FILM_ROT8 = 0.904

#: Table 7 (MZAttn vs EGNN, 3 seeds): the cells in the paper's order, and R² per model.
TABLE7_CELLS = ('rot d=8', 'rot d=32', 'rot d=64', 'hull d=3', 'hull d=9', 'MEB d=8', 'MEB d=32',
                'CN d=8', 'Mah d=8', 'PCA d=16', 'quad L=4', 'quad L=8', 'quad L=16')
TABLE7: Dict[str, Tuple[float, ...]] = {
    'st-large': (0.92, 0.00, -0.02, 0.50, -0.09, 0.02, -0.01, 0.90, -0.004, 0.11, 0.83, 0.79, 0.78),
    'mz': (0.95, 0.52, 0.07, 0.80, 0.003, 0.69, 0.38, 0.97, -0.022, 0.58, 0.96, 0.90, 0.90),
    'egnn': (0.99, 0.99, 0.98, 0.95, 0.85, 0.66, 0.78, 0.99, 0.40, 0.93, -0.002, 0.000, 0.006),
}

#: Table 28 (QM9, 3 seeds), test R² per target (keys of
#: :data:`torch_mz.datasets.qm9.QM9_TARGETS`; the paper's mu, alpha, homo, lumo, gap, r2, zpve,
#: U0, U, H, G, Cv); Deep Sets is reported on three targets.
TABLE28: Dict[str, Dict[str, float]] = {
    'deepsets': dict(mu=0.437, alpha=0.865, gap=0.653),
    'rigid': dict(zip(QM9_TARGETS, (0.752, 0.905, 0.803, 0.838, 0.858, 0.959, 0.954, 0.856,
                                    0.856, 0.856, 0.859, 0.940))),
    'st-large': dict(zip(QM9_TARGETS, (0.795, 0.914, 0.842, 0.852, 0.879, 0.967, 0.958,
                                       0.864, 0.862, 0.863, 0.858, 0.950))),
    'perceiver': dict(zip(QM9_TARGETS, (0.766, 0.920, 0.774, 0.819, 0.824, 0.967, 0.955,
                                        0.891, 0.886, 0.883, 0.888, 0.948))),
    'hypernet': dict(zip(QM9_TARGETS, (0.641, 0.902, 0.722, 0.773, 0.786, 0.955, 0.934,
                                       0.871, 0.863, 0.869, 0.876, 0.922))),
    'mz': dict(zip(QM9_TARGETS, (0.761, 0.911, 0.802, 0.830, 0.855, 0.947, 0.952, 0.877,
                                 0.875, 0.871, 0.867, 0.940))),
    'mz-large': dict(zip(QM9_TARGETS, (0.500, 0.698, 0.875, 0.926, 0.874, 0.823, 0.702,
                                       0.759, 0.760, 0.722, 0.757, 0.676))),
}

#: Table 30 (computational overhead, ratio MZ / Standard, RTX 5090, batch 64):
#: config -> (params, inference, training, memory).
TABLE30: Dict[str, Tuple[float, float, float, float]] = {
    'Small (d=64, n=30)': (1.9, 2.4, 2.2, 2.5),
    'Medium (d=128, n=50)': (1.9, 2.5, 3.8, 2.0),
    'Large (d=256, n=100)': (1.7, 2.7, 5.5, 2.5),
}
