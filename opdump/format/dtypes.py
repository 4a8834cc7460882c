"""Dtype names: the dtype field of a dump file name and of ``statistic.csv``.

Why: the file name carries the tensor's *original* dtype in MindSpore's spelling
(``Float32``, ``BFloat16``…), while the ``.npy`` inside holds the exact values in a
dtype numpy can represent (docs/design.md, "Dtypes").  This module is that table; it
needs neither torch nor numpy (torch dtypes are looked up by their name).

Guarantees:

* :func:`dtype_name` gives MindSpore's name for every torch dtype, and for a dtype
  the table does not know the same CamelCase style (``torch.foo_bar`` -> ``FooBar``).
* :func:`torch_name` inverts it for every name in :data:`MINDSPORE_NAMES`.
* :func:`stored_as` names the torch dtype a tensor is saved as: bfloat16 and the
  float8 types as float32, complex32 as complex64 (converted, exact); the sub-byte
  integers (``int1``-``int7``, ``uint1``-``uint7``) as int8/uint8 and the packed types
  (``bits*``, ``float4_e2m1fn_x2``) as uint8 (their bytes viewed, exact); everything
  else as itself.
"""
from __future__ import annotations

import re
from typing import Dict, Optional

#: torch dtype name (``torch.<name>``) -> MindSpore name
MINDSPORE_NAMES: Dict[str, str] = {
    "float32": "Float32", "float16": "Float16", "bfloat16": "BFloat16", "float64": "Float64",
    "int8": "Int8", "int16": "Int16", "int32": "Int32", "int64": "Int64",
    "uint8": "UInt8", "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64", "bool": "Bool",
    "complex32": "Complex32", "complex64": "Complex64", "complex128": "Complex128",
    "float8_e4m3fn": "Float8E4M3FN", "float8_e5m2": "Float8E5M2",
    "float8_e4m3fnuz": "Float8E4M3FNUZ", "float8_e5m2fnuz": "Float8E5M2FNUZ",
    "float8_e8m0fnu": "Float8E8M0FNU", "float4_e2m1fn_x2": "Float4E2M1FNX2", "int4": "Int4", "uint1": "UInt1",
}
_TORCH_NAMES = {v: k for k, v in MINDSPORE_NAMES.items()}

#: torch dtype name -> the torch dtype name its ``.npy`` holds (numpy cannot hold the key):
#: converted value by value, exactly (every value of the key is one of the target's)
STORED_AS: Dict[str, str] = {
    "bfloat16": "float32", "complex32": "complex64",
    "float8_e4m3fn": "float32", "float8_e5m2": "float32", "float8_e4m3fnuz": "float32",
    "float8_e5m2fnuz": "float32", "float8_e8m0fnu": "float32",
}
#: torch dtype name -> the one-byte dtype whose *bits* its ``.npy`` holds (a view, not a
#: conversion: torch keeps the sub-byte integers one per byte, so their values are exact;
#: packed types keep their packed bytes)
VIEWED_AS: Dict[str, str] = {
    **{f"int{n}": "int8" for n in range(1, 8)}, **{f"uint{n}": "uint8" for n in range(1, 8)},
    **{b: "uint8" for b in ("bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "float4_e2m1fn_x2")},
}

_CACHE: Dict[object, str] = {}


def _torch_attr(dtype) -> str:
    """``torch.float32`` (or the string ``"float32"``/``"torch.float32"``) -> ``float32``."""
    return str(dtype).replace("torch.", "")


def dtype_name(dtype) -> str:
    """MindSpore's name for a torch dtype (``Float32``, ``BFloat16``…), same style for the rest."""
    name = _CACHE.get(dtype)
    if name is None:
        raw = _torch_attr(dtype)
        name = MINDSPORE_NAMES.get(raw) or "".join(part.capitalize() for part in raw.split("_"))
        _CACHE[dtype] = name
    return name


def torch_name(name: str) -> Optional[str]:
    """The torch dtype name (``bfloat16``) of a MindSpore name (``BFloat16``); None if unknown."""
    return _TORCH_NAMES.get(name)


def stored_as(dtype) -> str:
    """The torch dtype name a tensor of ``dtype`` is saved as in its ``.npy`` (converted per
    :data:`STORED_AS` or bit-viewed per :data:`VIEWED_AS`)."""
    raw = _torch_attr(dtype)
    return STORED_AS.get(raw) or VIEWED_AS.get(raw) or raw


def is_float_dtype(name: Optional[str]) -> bool:
    """True for floating dtype names in any spelling (``Float32``, ``BFloat16``, ``float16``,
    ``Float8E4M3FN``, ``half`` …)."""
    if not name or not isinstance(name, str):
        return False
    n = name.lower().replace("_", "")
    return n.startswith(("float", "bfloat", "half", "double", "hifloat")) or n in ("f16", "f32", "f64", "bf16")


def is_complex_dtype(name: Optional[str]) -> bool:
    return bool(name) and isinstance(name, str) and name.lower().startswith("complex")


#: lower-case dtype spellings other writers (MindSpore, Ascend tools) put in file names
_KNOWN = {n.lower().replace("_", "") for n in MINDSPORE_NAMES.values()} | {
    "hifloat8", "double", "half", "int", "uint", "float", "string", "int2", "uint2",
    "float4e2m1fnx2", "qint8", "quint8", "qint32", "quint4x2",
}
_DTYPE_LIKE = re.compile(r"^(b?float|u?int|complex)\d")


def looks_like_dtype(token: str) -> bool:
    """Is this file-name token a dtype name (some writers put it where the format goes)?"""
    t = token.lower()
    return t in _KNOWN or bool(_DTYPE_LIKE.match(t))
