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


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """Exact numpy copy/view of a CPU tensor, converted or bit-viewed per :func:`storage_dtype`.
    A DTensor (FSDP2's parameters) is its local shard: each rank's files hold what it holds (B7 of
    the seventh trial: ``.numpy()`` of the subclass raised in the writer and stopped the dump)."""
    if type(tensor) is not torch.Tensor and callable(getattr(tensor, "to_local", None)):
        tensor = tensor.to_local()
    target = storage_dtype(tensor.dtype)
    if target is not tensor.dtype:
        if str(tensor.dtype)[6:] in VIEWED_AS:
            tensor = tensor.view(target)
        else:
            tensor = tensor.to(target)
    return tensor.detach().resolve_conj().resolve_neg().numpy()
