"""Converting a tensor to the array its ``.npy`` holds.

The names and the storage rule are :mod:`opdump.format.dtypes` (the dtype field of a
file name always carries the tensor's *original* dtype; the array inside is the
tensor's exact values in a numpy-representable dtype, docs/design.md "Dtypes").  This
module applies the rule to torch tensors.
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from ..format.dtypes import VIEWED_AS, dtype_name, stored_as

__all__ = ["dtype_name", "storage_dtype", "to_numpy"]

_STORAGE: Dict[torch.dtype, torch.dtype] = {}


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` is saved as in its ``.npy``."""
    target = _STORAGE.get(dtype)
    if target is None:
        target = _STORAGE[dtype] = getattr(torch, stored_as(dtype), dtype)
    return target


def local_shard(tensor):
    """``tensor``, or for a DTensor (FSDP2's ``fully_shard`` parameters) the shard this rank
    holds -- its ``_local_tensor``, taken with no dispatcher call: each rank's files and rows are
    of what it holds, under the parameter's name (seventh trial, B7: a DTensor parameter has no
    storage of its own, and reading it natively crashed the process)."""
    if type(tensor) is torch.Tensor or type(tensor) is torch.nn.Parameter:
        return tensor
    local = getattr(tensor, "_local_tensor", None)
    return local if type(local) is torch.Tensor else tensor


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """Exact numpy copy/view of a CPU tensor, converted or bit-viewed per :func:`storage_dtype`.
    A DTensor is its :func:`local_shard` (``.numpy()`` of the subclass raised in the writer and
    stopped the dump: B7 of the seventh trial)."""
    tensor = local_shard(tensor)
    target = storage_dtype(tensor.dtype)
    if target is not tensor.dtype:
        if str(tensor.dtype)[6:] in VIEWED_AS:
            tensor = tensor.view(target)
        else:
            tensor = tensor.to(target)
    return tensor.detach().resolve_conj().resolve_neg().numpy()
