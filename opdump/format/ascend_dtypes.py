"""Dtypes of Ascend "bin" dump files: the ``DT_*`` enum of ``dump_data.proto`` <-> torch
dtype names, and the bytes of each on disk (README, "Ascend bin files").

Why a table of its own: a bin file holds a tensor's device bytes (bfloat16 as 2 bytes,
int4 two to a byte), while opdump's ``.npy`` files hold values numpy can represent
(:mod:`.dtypes`, :func:`~.dtypes.stored_as`).  This module turns one into the other, in
numpy only (no torch, no Ascend toolkit).

Guarantees:

* :data:`DT_OF_TORCH` maps every torch dtype name opdump writes to bin (the numpy-native
  ones, bfloat16, complex32, float8_e4m3fn, float8_e5m2, float8_e8m0fnu, int4) to its
  ``DT_*`` value; :func:`torch_name_of` inverts it (and reads the quantized/dual aliases
  ``DT_QINT8``… as their plain integer types).
* :func:`decode` returns, for ``n`` elements of a known dtype, exactly the values, in
  the dtype :func:`~.dtypes.stored_as` names: bfloat16 and float8 as float32, complex32
  as complex64 (exact conversions), int4 as int8 (two per byte, low nibble first,
  sign-extended), the rest as themselves (little-endian).
* :func:`nbytes` is the byte count a tensor of a known dtype must have; None for
  dtypes this module does not know (their bytes are kept as uint8).
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

#: ``DT_*`` enum values of dump_data.proto (``OutputDataType``)
DT_FLOAT, DT_FLOAT16, DT_INT8, DT_UINT8, DT_INT16, DT_UINT16 = 1, 2, 3, 4, 5, 6
DT_INT32, DT_INT64, DT_UINT32, DT_UINT64, DT_BOOL, DT_DOUBLE = 7, 8, 9, 10, 11, 12
DT_DUAL_SUB_INT8, DT_DUAL_SUB_UINT8, DT_COMPLEX64, DT_COMPLEX128 = 14, 15, 16, 17
DT_QINT8, DT_QINT16, DT_QINT32, DT_QUINT8, DT_QUINT16 = 18, 19, 20, 21, 22
DT_BF16, DT_INT4, DT_COMPLEX32 = 27, 28, 32
DT_FLOAT8_E5M2, DT_FLOAT8_E4M3FN, DT_FLOAT8_E8M0 = 34, 35, 36

#: torch dtype name -> ``DT_*`` value (what opdump writes)
DT_OF_TORCH: Dict[str, int] = {
    "float32": DT_FLOAT, "float16": DT_FLOAT16, "int8": DT_INT8, "uint8": DT_UINT8,
    "int16": DT_INT16, "uint16": DT_UINT16, "int32": DT_INT32, "int64": DT_INT64,
    "uint32": DT_UINT32, "uint64": DT_UINT64, "bool": DT_BOOL, "float64": DT_DOUBLE,
    "complex64": DT_COMPLEX64, "complex128": DT_COMPLEX128, "bfloat16": DT_BF16, "int4": DT_INT4,
    "complex32": DT_COMPLEX32, "float8_e5m2": DT_FLOAT8_E5M2, "float8_e4m3fn": DT_FLOAT8_E4M3FN,
    "float8_e8m0fnu": DT_FLOAT8_E8M0,
}
_TORCH_OF_DT: Dict[int, str] = {v: k for k, v in DT_OF_TORCH.items()}
_TORCH_OF_DT.update({DT_QINT8: "int8", DT_QINT16: "int16", DT_QINT32: "int32", DT_QUINT8: "uint8",
                     DT_QUINT16: "uint16", DT_DUAL_SUB_INT8: "int8", DT_DUAL_SUB_UINT8: "uint8"})

#: torch dtype name -> the little-endian numpy dtype of its bytes on disk
_RAW: Dict[str, str] = {
    "float32": "<f4", "float16": "<f2", "int8": "i1", "uint8": "u1", "int16": "<i2", "uint16": "<u2",
    "int32": "<i4", "int64": "<i8", "uint32": "<u4", "uint64": "<u8", "bool": "?", "float64": "<f8",
    "complex64": "<c8", "complex128": "<c16", "bfloat16": "<u2", "complex32": "<f2",
    "float8_e5m2": "u1", "float8_e4m3fn": "u1", "float8_e8m0fnu": "u1",
}


def torch_name_of(data_type: int) -> Optional[str]:
    """The torch dtype name of a ``DT_*`` value (``DT_BF16`` -> ``bfloat16``); None if unknown."""
    return _TORCH_OF_DT.get(int(data_type))


def numpy_raw_dtype(torch_name: str) -> Optional[np.dtype]:
    """The numpy dtype whose items are one element's bytes on disk (None: int4, unknown)."""
    raw = _RAW.get(torch_name)
    return None if raw is None else np.dtype(raw)


def nbytes(torch_name: Optional[str], count: int) -> Optional[int]:
    """Bytes on disk of ``count`` elements of ``torch_name``; None where unknown."""
    if torch_name == "int4":
        return (count + 1) // 2
    raw = _RAW.get(torch_name or "")
    if raw is None:
        return None
    return count * np.dtype(raw).itemsize * (2 if torch_name == "complex32" else 1)


def pack_int4(values: np.ndarray) -> np.ndarray:
    """int4 values (any integer array, each in [-8, 7]) -> their packed bytes (uint8,
    two per byte, the first in the low nibble; an odd count leaves the last high nibble 0)."""
    v = np.asarray(values).reshape(-1).astype(np.int8) & 0x0F
    if v.size % 2:
        v = np.concatenate([v, np.zeros(1, np.int8)])
    pairs = v.reshape(-1, 2).astype(np.uint8)
    return (pairs[:, 0] | (pairs[:, 1] << 4)).astype(np.uint8)


def unpack_int4(packed: np.ndarray, count: int) -> np.ndarray:
    """Packed int4 bytes -> ``count`` int8 values (low nibble first, sign-extended)."""
    b = np.asarray(packed, np.uint8).reshape(-1)
    nib = np.empty(b.size * 2, np.int8)
    nib[0::2] = (b & 0x0F).astype(np.int8)
    nib[1::2] = (b >> 4).astype(np.int8)
    nib = np.where(nib > 7, nib - 16, nib).astype(np.int8)
    return nib[:count]


def _fp8_table(exp_bits: int, man_bits: int, bias: int, fn: bool) -> np.ndarray:
    """float32 value of every byte of an fp8 format (``fn``: no infinities, only
    all-ones is NaN, as float8_e4m3fn; otherwise IEEE-like, as float8_e5m2)."""
    b = np.arange(256, dtype=np.int64)
    sign = np.where(b >> 7, -1.0, 1.0)
    e = (b >> man_bits) & ((1 << exp_bits) - 1)
    m = b & ((1 << man_bits) - 1)
    frac = m / float(1 << man_bits)
    val = np.where(e == 0, frac * 2.0 ** (1 - bias), (1.0 + frac) * 2.0 ** (e - bias)) * sign
    top = (1 << exp_bits) - 1
    if fn:
        val = np.where((e == top) & (m == (1 << man_bits) - 1), np.nan, val)
    else:
        val = np.where(e == top, np.where(m == 0, sign * np.inf, np.nan), val)
    return val.astype(np.float32)


_E8M0 = np.where(np.arange(256) == 255, np.nan, 2.0 ** (np.arange(256) - 127.0)).astype(np.float32)
_FP8_TABLES = {"float8_e4m3fn": lambda: _fp8_table(4, 3, 7, True),
               "float8_e5m2": lambda: _fp8_table(5, 2, 15, False), "float8_e8m0fnu": lambda: _E8M0}
_TABLE_CACHE: Dict[str, np.ndarray] = {}


def fp8_table(torch_name: str) -> np.ndarray:
    """The 256-entry float32 table of a float8 dtype (byte -> value)."""
    t = _TABLE_CACHE.get(torch_name)
    if t is None:
        t = _TABLE_CACHE[torch_name] = _FP8_TABLES[torch_name]()
    return t


def decode(raw: np.ndarray, torch_name: str, count: int) -> np.ndarray:
    """``count`` elements' bytes (uint8, exactly :func:`nbytes` of them) -> 1-D values in
    the dtype :func:`~.dtypes.stored_as` names (module docstring)."""
    raw = np.asarray(raw, np.uint8).reshape(-1)
    if torch_name == "int4":
        return unpack_int4(raw, count)
    items = raw.view(_RAW[torch_name])
    if torch_name == "bfloat16":
        return (items.astype(np.uint32) << 16).view(np.float32)
    if torch_name == "complex32":
        return items.astype(np.float32).view(np.complex64)
    if torch_name in _FP8_TABLES:
        return fp8_table(torch_name)[items]
    return items.astype(items.dtype.newbyteorder("="), copy=False)
