"""Tensor files: :class:`TensorFile` (one dumped ``.npy``), loading arrays without pickle
(memory-mapped when possible), reading shape and dtype from the ``.npy`` header only, and
splitting dump file names (``{op_type}.{op_name}.{task}.{stream}.{ts}.{io}.{slot}.{format}[.{dtype}].npy``,
and the unconverted Ascend protobuf names) into their fields.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .names import _looks_like_dtype

_RAW_RE = re.compile(r"^[^.]+\.[^.]+\.\d+\.\d+\.\d+$")      # {op_type}.{op_name}.{task}.{stream}.{ts}


@dataclass
class TensorFile:
    """One dumped ``.npy`` file. ``load()`` memory-maps it (never unpickles)."""

    path: str
    rank: int
    net: str
    graph: int
    iteration: Optional[int]            # None for constants/
    op_type: str
    op_file: str                        # op_name as in the file name (sanitised)
    op: str                             # full name when known, else op_file
    task_id: int
    stream_id: int
    timestamp: int
    io: str                             # input | output
    slot: int
    format: str
    dtype: Optional[str]                # MindSpore type name from the file name (None in old dumps)
    kind: str = "op"                    # op | parameter | constant
    nbytes: int = 0
    call: int = 0                       # occurrence of (op, io, slot) in its iteration folder

    def header(self) -> Tuple[Tuple[int, ...], np.dtype]:
        """(shape, stored numpy dtype) from the ``.npy`` header only."""
        return _npy_header(self.path)

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.header()[0]

    def load(self, mmap: bool = True) -> np.ndarray:
        return load_array(self.path, mmap=mmap)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def load_array(path: str, mmap: bool = True) -> np.ndarray:
    """``np.load`` without pickle, memory-mapped when possible (empty arrays cannot be)."""
    if mmap:
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError:
            pass
    return np.load(path, allow_pickle=False)


def _npy_header(path: str) -> Tuple[Tuple[int, ...], np.dtype]:
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:  # pragma: no cover - 3.0 headers are utf8 2.0
            shape, fortran, dtype = np.lib.format._read_array_header(f, version)
    return tuple(shape), dtype


_IO = ("input", "output")


def parse_tensor_filename(name: str) -> Optional[Dict[str, Any]]:
    """Split ``{op_type}.{op_name}.{task}.{stream}.{ts}.{io}.{slot}.{format}[.{dtype}].npy``.

    Returns None when the name does not follow the pattern.  Accepts the older
    form without the dtype field and msaccucmp's ``….{io}.{slot}.{AxB}.npy``.
    """
    if not name.endswith(".npy"):
        return None
    toks = name[:-4].split(".")
    io_idx = None
    if len(toks) >= 9 and toks[-4] in _IO and toks[-3].isdigit():
        io_idx, dtype = len(toks) - 4, toks[-1]
        fmt = toks[-2]
    elif len(toks) >= 8 and toks[-3] in _IO and toks[-2].isdigit():
        io_idx, dtype = len(toks) - 3, None
        fmt = toks[-1]
        if _looks_like_dtype(fmt):  # some writers put dtype where format is
            dtype = fmt
    if io_idx is None or io_idx < 5:
        return None
    ts, stream, task = toks[io_idx - 1], toks[io_idx - 2], toks[io_idx - 3]
    if not (ts.isdigit() and stream.lstrip("-").isdigit() and task.lstrip("-").isdigit()):
        return None
    return {
        "op_type": toks[0],
        "op_file": ".".join(toks[1:io_idx - 3]),
        "task_id": int(task), "stream_id": int(stream), "timestamp": int(ts),
        "io": toks[io_idx], "slot": int(toks[io_idx + 1]),
        "format": fmt, "dtype": dtype,
    }
