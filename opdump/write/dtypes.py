"""torch dtypes as MindSpore names them, and how each is stored in a ``.npy``.

The dtype field of a file name always carries the tensor's *original* dtype; the
array inside is the tensor's exact values in a numpy-representable dtype
(SPEC F15): bfloat16 and float8 become float32 (exact: every value of those
types is a float32), int4 int8, uint1 uint8; everything else is stored as is.
"""
from __future__ import annotations

import numpy as np
import torch

_NAMES = {
    torch.float32: "Float32", torch.float16: "Float16", torch.bfloat16: "BFloat16",
    torch.float64: "Float64", torch.int8: "Int8", torch.int16: "Int16", torch.int32: "Int32",
    torch.int64: "Int64", torch.uint8: "UInt8", torch.bool: "Bool",
    torch.complex64: "Complex64", torch.complex128: "Complex128", torch.complex32: "Complex32",
}
for _attr, _name in [
    ("uint16", "UInt16"), ("uint32", "UInt32"), ("uint64", "UInt64"),
    ("float8_e4m3fn", "Float8E4M3FN"), ("float8_e5m2", "Float8E5M2"),
    ("float8_e4m3fnuz", "Float8E4M3FNUZ"), ("float8_e5m2fnuz", "Float8E5M2FNUZ"),
    ("float8_e8m0fnu", "Float8E8M0FNU"), ("int4", "Int4"), ("uint1", "UInt1"),
]:
    if hasattr(torch, _attr):
        _NAMES[getattr(torch, _attr)] = _name

#: dtypes that numpy cannot hold: stored upcast, exactly.
_STORED_AS = {torch.bfloat16: torch.float32, torch.complex32: torch.complex64}
for _attr in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if hasattr(torch, _attr):
        _STORED_AS[getattr(torch, _attr)] = torch.float32
for _attr, _to in (("int4", torch.int8), ("uint1", torch.uint8)):
    if hasattr(torch, _attr):
        _STORED_AS[getattr(torch, _attr)] = _to


def dtype_name(dtype: torch.dtype) -> str:
    """MindSpore's name for ``dtype`` (``Float32``, ``BFloat16``…), same style for the rest."""
    name = _NAMES.get(dtype)
    if name is None:
        raw = str(dtype).replace("torch.", "")
        name = "".join(part.capitalize() for part in raw.split("_"))
    return name


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` is saved as in its ``.npy``."""
    return _STORED_AS.get(dtype, dtype)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """Exact numpy copy/view of a CPU tensor, converted per :func:`storage_dtype`."""
    target = storage_dtype(tensor.dtype)
    if target is not tensor.dtype:
        tensor = tensor.to(target)
    return tensor.detach().resolve_conj().resolve_neg().numpy()
