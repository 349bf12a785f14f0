r"""Neural-network operators of torch_mz: zonotope tokens, MZ attention, Set Transformer blocks,
the :class:`MZAggregation` PyG aggregation, and PyG's Set Transformer aggregation on the flat
layout (:class:`FlatSetTransformerAggregation`).

Which set each row belongs to is one vector with PyG's names at PyG's boundaries (``index`` for
an aggregation, ``batch`` for a model's input) and, inside this package, ``set_id`` where one
group of tokens is involved and ``query_set`` / ``kv_set`` where queries and keys/values are two
groups (attention)."""
from torch_mz.nn.aggr import MZAggregation
from torch_mz.nn.attention import MZAttention
from torch_mz.nn.blocks import ISAB, MAB, PMA, SAB, FeedForward, GeneratorFeedForward
from torch_mz.nn.functional import grouped_attention
from torch_mz.nn.fused import (fused_kernels_enabled, set_fused_kernels, set_tanh_kernel,
                               tanh_kernel_faster)
from torch_mz.nn.set_transformer_aggr import FlatSetTransformerAggregation
from torch_mz.nn.zonotope import InputProjection, Zonotope, zonotope_layer_norm

__all__ = [
    'Zonotope',
    'InputProjection',
    'zonotope_layer_norm',
    'grouped_attention',
    'MZAttention',
    'FeedForward',
    'GeneratorFeedForward',
    'MAB',
    'SAB',
    'ISAB',
    'PMA',
    'MZAggregation',
    'FlatSetTransformerAggregation',
    'set_fused_kernels',
    'fused_kernels_enabled',
    'set_tanh_kernel',
    'tanh_kernel_faster',
]
