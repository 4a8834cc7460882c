"""Which memory a tensor reads, and in which order: the keys of statistics reuse.

Every statistic opdump computes (max, min, sums, counts) is invariant under a
reordering of the elements, so a tensor is reduced in memory order
(:func:`memory_order`: a transposed or permuted tensor through the permutation of its
dimensions that is contiguous, a view), and two tensors reading exactly the same memory
(same first element, count and dtype; with gaps, also the same sizes and strides) have
the same statistics (:func:`memory_key`), as long as the memory was not written in
between (:func:`tensor_version`).
"""
from __future__ import annotations

from typing import Optional

import torch

from .contract import COPY_LIMIT

# Non-dense tensors up to this size are copied to contiguous memory before being
# reduced: a strided CPU reduction is up to 30x slower than a memcpy + a contiguous one.
# (The native memo, stats_memo.cpp, uses the same limit: contract.COPY_LIMIT.)
_COPY_LIMIT = COPY_LIMIT

def dense_view(t: torch.Tensor) -> Optional[torch.Tensor]:
    """``t`` with its elements in memory order if they fill one block of memory: ``t``
    itself when contiguous, else the permutation of its dimensions that is contiguous (a
    view, no copy); None for a tensor with gaps or overlaps (slices, expands)."""
    if t.is_contiguous():
        return t
    if t.dim() < 2:
        return None
    order = sorted(range(t.dim()), key=lambda d: (t.stride(d), t.shape[d]), reverse=True)
    p = t.permute(order)
    return p if p.is_contiguous() else None


def gathered(t: torch.Tensor) -> torch.Tensor:
    """A tensor with gaps or overlaps, copied to contiguous memory when at most
    ``_COPY_LIMIT`` bytes (a strided CPU reduction is up to 30x slower than a memcpy + a
    contiguous one), else ``t`` itself (read as it is)."""
    return t.contiguous() if t.numel() * t.element_size() <= _COPY_LIMIT else t


def memory_order(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its elements in memory order: the same multiset, read contiguously.

    Every statistic here (max, min, sums, counts) is invariant under a permutation of
    the elements, so a transposed or permuted tensor is reduced through a permutation
    of its dimensions that is contiguous — a view, no copy.  (A strided reduction of
    ``w.t()`` on CPU is ~30x slower than of ``w``.)  Tensors with gaps or overlaps
    are copied when smaller than ``_COPY_LIMIT`` and otherwise read as they are.
    """
    dense = dense_view(t)
    return dense if dense is not None else gathered(t)


def memory_key(t: torch.Tensor):
    """(``t`` in memory order if dense, else None; the key of the memory it reads): tensors
    with equal keys read the same elements, so they have the same statistics.  Nothing is
    copied: a tensor with gaps is gathered only if its key is new (see :func:`gathered`)."""
    dense = dense_view(t)
    if dense is not None:
        return dense, (t.device, t.data_ptr(), t.numel(), t.dtype, t.is_neg())
    # gaps or overlaps: the same elements only through the very same strides
    return None, (t.device, t.data_ptr(), t.dtype, t.is_neg(), t.shape, t.stride())


def tensor_version(tensor: torch.Tensor) -> int:
    """The tensor's version counter (shared by all views of one base); -1 for inference
    tensors, which have none (so an in-place update of them could not be detected)."""
    try:
        return tensor._version
    except RuntimeError:            # "Inference tensors do not track version counter"
        return -1
