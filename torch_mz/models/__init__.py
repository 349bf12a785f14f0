r"""Models built on torch_mz: the E(n)-equivariant comparison model (EGNN)."""
from torch_mz.models.egnn import (EGNN, EGNNConv, fully_connected_edge_index, radius_edge_index,
                                  split_pos_features)

__all__ = [
    'EGNN',
    'EGNNConv',
    'fully_connected_edge_index',
    'radius_edge_index',
    'split_pos_features',
]
