r"""Models built on torch_mz: the MZ-Set Transformer, the paper's baselines (the attention ones
from the same blocks, Deep Sets and the mean-MLP oracle from MLPs), the E(n)-equivariant
comparison model (EGNN) and named presets."""
from torch_mz.models.base import SetModel, SetPrediction, set_features
from torch_mz.models.egnn import (EGNN, EGNNConv, fully_connected_edge_index, radius_edge_index,
                                  split_pos_features)
from torch_mz.models.mean_mlp import MeanMLP
from torch_mz.models.registry import (PRESETS, build_model, count_parameters, list_models,
                                      match_budget)
from torch_mz.models.set_transformer import DeepSets, MZSetTransformer, PerceiverSet

__all__ = [
    'SetPrediction',
    'SetModel',
    'set_features',
    'MZSetTransformer',
    'PerceiverSet',
    'DeepSets',
    'MeanMLP',
    'EGNN',
    'EGNNConv',
    'fully_connected_edge_index',
    'radius_edge_index',
    'split_pos_features',
    'PRESETS',
    'build_model',
    'count_parameters',
    'list_models',
    'match_budget',
]
