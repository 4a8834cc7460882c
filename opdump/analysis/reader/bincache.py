"""Tensors of Ascend ``bin`` dump files, read as the ``.npy`` files the rest of the analysis
reads (README, "Reading dumps").

Why a cache: one bin file holds every input and output of an operator, in the device
format the kernel used (NC1HWC0, FRACTAL_NZ, ...) and the device's dtype encoding (bf16 as
2 bytes, int4 two to a byte). Compare, watch, overflow and triage stream tensors out of
``.npy`` files by path (:mod:`.npy`); rather than teach each of them a second file format,
a bin tensor gets a path of its own, a ``.npy`` in a per-process temporary folder, written
(whole, temp + rename) the first time anything reads it: values decoded by
:func:`opdump.format.ascend_bin.load` (bfloat16/float8 -> float32, int4 -> int8, as the
``.npy`` writer stores them), device formats turned into NCHW / NCDHW / ND with padding
removed by :func:`opdump.format.device_formats.to_host`. A format that module does not
know is kept as the device array, with a warning. Listing a dump converts nothing:
:func:`host_header` answers shape and dtype from the bin header.

Guarantees: the dump folder is never written; the temporary folder is removed when the
process exits; a malformed file raises :class:`~opdump.format.ascend_bin.BinFormatError`
(a ValueError naming the file) from whichever read asked for it.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from ...format import ascend_bin, ascend_dtypes
from ...format.device_formats import HOST_FORMATS, UnknownFormat, is_known, to_host


@dataclass(frozen=True)
class BinTensor:
    """One input/output of a bin file, and the shape and dtype its ``.npy`` will have."""

    bin_path: str
    info: ascend_bin.TensorInfo
    shape: Tuple[int, ...]
    dtype: np.dtype


_ENTRIES: Dict[str, BinTensor] = {}
_LOCK = threading.Lock()
_DIR: Optional[str] = None
_COUNT = 0


def _cache_dir() -> str:
    global _DIR
    if _DIR is None:
        _DIR = tempfile.mkdtemp(prefix="opdump-bin-")
        atexit.register(shutil.rmtree, _DIR, True)
    return _DIR


def stored_dtype(info: ascend_bin.TensorInfo) -> np.dtype:
    """The numpy dtype :func:`ascend_bin.load` gives this tensor (uint8 for unknown dtypes)."""
    name = info.dtype
    if name is None:
        return np.dtype(np.uint8)
    return ascend_dtypes.decode(np.zeros(0, np.uint8), name, 0).dtype


def in_host_layout(info: ascend_bin.TensorInfo) -> bool:
    """Whether the tensor is read in its host layout (converted, or dumped in a host format)."""
    if info.dtype is None or not is_known(info.format_name):
        return False
    return bool(info.original_shape) or info.format_name in HOST_FORMATS


def host_shape(info: ascend_bin.TensorInfo) -> Tuple[int, ...]:
    """The shape the converted tensor has: the header's ``original_shape`` when the format is
    one :mod:`~opdump.format.device_formats` converts and it is given, else the device shape
    (as msaccucmp does for an empty host shape); raw bytes of an unknown dtype: ``(size,)``."""
    if info.dtype is None:
        return (info.size,)
    if info.original_shape and is_known(info.format_name):
        return tuple(info.original_shape)
    return tuple(info.shape)


def register(bin_path: str, info: ascend_bin.TensorInfo) -> str:
    """The ``.npy`` path this tensor is read under (nothing is written yet)."""
    global _COUNT
    with _LOCK:
        _COUNT += 1
        base = os.path.basename(bin_path)[:150]
        path = os.path.join(_cache_dir(), f"{_COUNT:07d}.{base}.{info.kind}.{info.index}.npy")
        _ENTRIES[path] = BinTensor(os.fspath(bin_path), info, host_shape(info), stored_dtype(info))
    return path


def entry(path: str) -> Optional[BinTensor]:
    """The bin tensor behind a cache path (None for any other path)."""
    return _ENTRIES.get(path) if _ENTRIES else None


def source(path: str) -> str:
    """Where a tensor is on disk, for people: ``{bin file}:{input|output}.{i}`` for a bin
    tensor (its cache path is temporary), the path itself otherwise."""
    e = entry(path)
    return f"{e.bin_path}:{e.info.kind}.{e.info.index}" if e is not None else path


def host_header(path: str) -> Optional[Tuple[Tuple[int, ...], np.dtype]]:
    """(shape, dtype) of a registered bin tensor, from its bin header; None for other paths."""
    e = entry(path)
    return (e.shape, e.dtype) if e is not None else None


def host_array(bin_path: str, info: ascend_bin.TensorInfo) -> np.ndarray:
    """The tensor in its host layout (module docstring)."""
    raw = info.dtype is None
    a = ascend_bin.load(bin_path, info.kind, info.index, raw=raw)
    if raw:
        warnings.warn(f"{bin_path}: {info.kind} {info.index} has dtype {info.data_type_name}, which opdump "
                      "cannot decode: its bytes are read as uint8", stacklevel=3)
        return a
    if not info.original_shape:
        return a
    try:
        return to_host(a, info.format_name, info.original_shape, info.groups)
    except UnknownFormat:
        warnings.warn(f"{bin_path}: {info.kind} {info.index} is in device format {info.format_name}, which "
                      "opdump does not convert: read in its device layout", stacklevel=3)
        return a
    except ValueError as e:
        raise ascend_bin.BinFormatError(bin_path, f"{info.kind} {info.index}: {e}") from None


def materialize(path: str) -> None:
    """Write the ``.npy`` of a registered bin tensor if it is not there yet (no-op for other paths)."""
    e = entry(path)
    if e is None or os.path.exists(path):
        return
    with _LOCK:
        if os.path.exists(path):
            return
        a = np.ascontiguousarray(host_array(e.bin_path, e.info))
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            np.save(f, a, allow_pickle=False)
        os.replace(tmp, path)
