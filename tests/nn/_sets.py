"""Helpers that build flat PyG-style set batches for the operator tests."""
import torch


def make_index(sizes, shuffle=False, generator=None):
    r"""Set ids for sets of the given sizes; optionally in a random (unsorted) row order."""
    index = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes, dtype=torch.long))
    if shuffle:
        index = index[torch.randperm(index.numel(), generator=generator)]
    return index


def ptr_from_sizes(sizes):
    ptr = torch.zeros(len(sizes) + 1, dtype=torch.long)
    ptr[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.long), 0)
    return ptr
