"""Sample dump (``e2e_dump_settings.sample_mode`` 1): each tensor file holds only the first
``sample_num`` elements of the tensor, flattened (README, "Debug dumps").

Guarantees: the sample is the first ``sample_num`` elements of exactly the array an
unsampled dump would have written (same element order, same dtype), as a 1-D array;
a tensor with fewer elements is saved whole (flattened).  File names, statistic.csv
rows and statistics are untouched: statistics are computed on the whole tensor.
The manifest records the sample size (:func:`manifest_fields`) so readers and
``compare`` know the files are samples.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch


def sample_size(config) -> int:
    """Elements kept per tensor file, 0 when the session does not sample."""
    return int(config.sample_num) if getattr(config, "sample_mode", 0) else 0


def take(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` elements of ``t`` flattened (a view when ``t`` is contiguous; for a
    non-contiguous tensor only those elements are gathered, never the whole tensor)."""
    if t.is_contiguous():
        return t.reshape(-1)[:n]
    numel = t.numel()
    if numel <= n:
        return t.reshape(-1)
    # storage offsets of the first n elements in logical (row-major) order, gathered through the strides
    index = torch.arange(n, device=t.device)
    offset = torch.full((n,), t.storage_offset(), dtype=torch.long, device=t.device)
    for size, stride in zip(reversed(t.shape), reversed(t.stride())):
        offset += (index % size) * stride
        index = index // size
    storage = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    return storage[offset]


def take_array(array, n: int):
    """The same sample of a host numpy array (the file written from a whole-tensor copy)."""
    return array.reshape(-1)[:n]


def manifest_fields(config) -> Dict[str, Optional[int]]:
    """What ``manifest.json`` says about sampling: ``sample_num`` (None: files hold whole tensors)."""
    n = sample_size(config) if config.dump_tensors else 0      # statistics alone: nothing is sampled
    return {"sample_num": n or None}
