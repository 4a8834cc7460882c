"""Tensor files: :class:`TensorFile` (one dumped ``.npy``), loading arrays without pickle
(memory-mapped when possible) and reading shape and dtype from the ``.npy`` header only.
File names are split by :mod:`opdump.format.files`, the grammar the writer builds them with.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ...format.files import parse_tensor_name
from .npy import load_array, npy_header


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
        return npy_header(self.path)

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.header()[0]

    def load(self, mmap: bool = True) -> np.ndarray:
        return load_array(self.path, mmap=mmap)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def parse_tensor_filename(name: str) -> Optional[Dict[str, Any]]:
    """The fields of a tensor file name as a dict (op_type, op_file, task_id, stream_id,
    timestamp, io, slot, format, dtype); None when it is not one.  See
    :func:`opdump.format.files.parse_tensor_name`."""
    parsed = parse_tensor_name(name)
    return parsed.as_dict() if parsed is not None else None
