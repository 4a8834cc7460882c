"""Tensors of Ascend ``bin`` dump files, read as the ``.npy`` files the rest of the analysis
reads (README, "Analysis").

Why a cache: one bin file holds every input and output of an operator, in the device
format the kernel used (NC1HWC0, FRACTAL_NZ, ...) and the device's dtype encoding (bf16 as
2 bytes, int4 two to a byte). Compare, watch, overflow and triage stream tensors out of
``.npy`` files by path (:mod:`.npy`); rather than teach each of them a second file format,
a bin tensor gets a path of its own, a ``.npy`` in a per-process temporary folder, written
(whole, temp + rename) the first time anything reads it. The values are exactly what
``opdump convert`` saves (:func:`opdump.analysis.convert.decode_file`, the one decoder:
bfloat16/float8 -> float32, int4 -> int8, device formats to NCHW / NCDHW / ND with padding
removed, plain layouts and formats it cannot convert kept as dumped, with a warning).
All tensors of a file are written when the first is read (one read of the file). Listing
a dump converts nothing: :func:`host_header` answers shape and dtype from the bin header.

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
from typing import Dict, List, Optional, Tuple

import numpy as np

from ...format import ascend_bin, ascend_dtypes
from ...format.device_formats import HOST_FORMATS, is_known
from ..convert import PLAIN_FORMATS, decode_file
from ..whole_files import save_npy


@dataclass(frozen=True)
class BinTensor:
    """One input/output of a bin file, and the shape and dtype its ``.npy`` will have."""

    bin_path: str
    info: ascend_bin.TensorInfo
    shape: Tuple[int, ...]
    dtype: np.dtype


_ENTRIES: Dict[str, BinTensor] = {}
_BY_FILE: Dict[str, List[str]] = {}      # bin file -> its registered cache paths
_LOCK = threading.Lock()
_DIR: Optional[str] = None
_COUNT = 0


def _cache_dir() -> str:
    global _DIR
    if _DIR is None:
        _DIR = tempfile.mkdtemp(prefix="opdump-bin-")
        atexit.register(shutil.rmtree, _DIR, True)
    return _DIR


def is_absent(info: ascend_bin.TensorInfo) -> bool:
    """A slot without a tensor (``DT_UNDEFINED``, no bytes: how opdump's bin writer marks a
    ``None`` argument); it has no record, as in an ``.npy`` dump."""
    return info.data_type == 0 and info.size == 0


def stored_dtype(info: ascend_bin.TensorInfo) -> np.dtype:
    """The numpy dtype the tensor is read as (uint8 for dtypes numpy has no equivalent for)."""
    name = info.dtype
    if name is None:
        return np.dtype(np.uint8)
    return ascend_dtypes.decode(np.zeros(0, np.uint8), name, 0).dtype


def converted(info: ascend_bin.TensorInfo) -> bool:
    """Whether the tensor is turned from a device format into its host layout."""
    fmt = info.format_name
    return (info.dtype is not None and fmt not in PLAIN_FORMATS and bool(info.original_shape)
            and is_known(fmt))


def in_host_layout(info: ascend_bin.TensorInfo) -> bool:
    """Converted, or dumped in a host layout (ND, NCHW, NCDHW, ...): the records' format is
    then ``DefaultFormat``; otherwise the format's own name (NHWC, an unconverted one)."""
    return info.dtype is not None and (converted(info) or info.format_name in HOST_FORMATS)


def host_shape(info: ascend_bin.TensorInfo) -> Tuple[int, ...]:
    """The shape the tensor is read with: ``original_shape`` when converted, else the
    dumped shape; ``(size,)`` for the raw bytes of a dtype numpy has no equivalent for."""
    if info.dtype is None:
        return (info.size,)
    return tuple(info.original_shape) if converted(info) else tuple(info.shape)


def register(bin_path: str, info: ascend_bin.TensorInfo) -> str:
    """The ``.npy`` path this tensor is read under (nothing is written yet)."""
    global _COUNT
    bin_path = os.fspath(bin_path)
    with _LOCK:
        _COUNT += 1
        base = os.path.basename(bin_path)[:150]
        path = os.path.join(_cache_dir(), f"{_COUNT:07d}.{base}.{info.kind}.{info.index}.npy")
        _ENTRIES[path] = BinTensor(bin_path, info, host_shape(info), stored_dtype(info))
        _BY_FILE.setdefault(bin_path, []).append(path)
    return path


def entry(path: str) -> Optional[BinTensor]:
    """The bin tensor behind a cache path (None for any other path)."""
    return _ENTRIES.get(path) if _ENTRIES else None


def source(path: str) -> str:
    """Where a tensor is on disk, for people: ``{bin file}:{input|output}.{i}`` for a bin
    tensor (its cache path is temporary), the path itself otherwise."""
    e = entry(path)
    return f"{e.bin_path}:{e.info.kind}.{e.info.index}" if e is not None else path


def sources(paths: List[str]) -> List[str]:
    """:func:`source` of each path: the list itself when no bin tensor is registered (the
    common case: a compare table's 65,000 paths are not looked up one by one)."""
    if not _ENTRIES:
        return paths
    return [source(p) for p in paths]


def host_header(path: str) -> Optional[Tuple[Tuple[int, ...], np.dtype]]:
    """(shape, dtype) of a registered bin tensor, from its bin header; None for other paths."""
    e = entry(path)
    return (e.shape, e.dtype) if e is not None else None


def materialize(path: str) -> None:
    """Write the ``.npy`` files of the bin file behind ``path`` if they are not there yet
    (no-op for any other path)."""
    e = entry(path)
    if e is None or os.path.exists(path):
        return
    with _LOCK:
        if os.path.exists(path):
            return
        arrays = {(kind, i): a for kind, i, a in decode_file(e.bin_path, "host", warn=_warn)}
        for p in _BY_FILE.get(e.bin_path, []):
            pe = _ENTRIES[p]
            a = arrays.get((pe.info.kind, pe.info.index))
            if a is not None and not os.path.exists(p):
                save_npy(p, a)


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=4)
