"""Dump file names: building and parsing them, and the long-name map (``mapping.csv``).

Why: the writer builds these names and the reader splits them again; both use this
module, so the grammar exists once (docs/design.md, "File names").

Grammar (every field after ``op_name`` is free of dots)::

    {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{input|output}.{slot}.{format}.{dtype}.npy
    Parameter.{name}.0.0.{timestamp}.output.0.DefaultFormat.{dtype}.npy        (parameters, constants)
    {op_type}.{op_name}.json                                                   (kernel arguments)
    {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}                      (Ascend protobuf, unconverted)

``op_type`` and ``op_name`` are :func:`~opdump.format.names.sanitize`-d, so they hold no
dot.  A name longer than :data:`MAX_NAME_BYTES` is stored under random digits plus its
extension, and ``{mapped},{original}`` is appended to ``mapping.csv`` in its folder.

Guarantees: for every :class:`TensorName` the writer can build (sanitized names, ints
>= 0, a format and dtype without dots), ``parse_tensor_name(name.build()) == name``;
:func:`parse_mapping` returns every ``(mapped, original)`` pair :func:`mapping_line`
wrote, whatever the original holds (commas, unicode).
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Dict, Optional

from .dtypes import looks_like_dtype
from .names import file_stem, sanitize

MAX_NAME_BYTES = 255
NPY = "npy"
DEFAULT_FORMAT = "DefaultFormat"
IO_KINDS = ("input", "output")
PARAMETER_TYPE = "Parameter"
MAPPING_FILE = "mapping.csv"
STATISTIC_FILE = "statistic.csv"

#: an Ascend bin (DumpData protobuf) dump file: ``{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}``,
#: no extension (opdump's ACL layout writes these names too: :mod:`.acl_layout`)
BIN_NAME_RE = re.compile(r"^(?P<op_type>[^.]+)\.(?P<op_name>[^.]+)\.(?P<task_id>\d+)\.(?P<stream_id>\d+)"
                         r"\.(?P<timestamp>\d+)$")

#: the full tensor file name (``{op_type}.{op_name}.{task}.{stream}.{timestamp}.{io}.{slot}.{format}.{dtype}.npy``)
#: with ASCII digits, as one expression: the names :func:`parse_tensor_name` parses by its first
#: (nine-token) form, for readers that scan tens of thousands of files (its groups are the nine
#: fields in order; ``analysis/reader/names_fast.py``; tests check it against that function)
FULL_TENSOR_NAME_RE = re.compile(
    r"([^.]*)\.(.*)\.(-?[0-9]+)\.(-?[0-9]+)\.([0-9]+)\.(" + "|".join(re.escape(k) for k in IO_KINDS)
    + r")\.([0-9]+)\.([^.]*)\.([^.]*)\." + re.escape(NPY), re.DOTALL)


@dataclass(frozen=True)
class TensorName:
    """The fields of one tensor file name (``op_type``/``op_name`` in their file-name form)."""

    op_type: str
    op_name: str
    task_id: int
    stream_id: int
    timestamp: int
    io: str                         # input | output
    slot: int
    format: str = DEFAULT_FORMAT
    dtype: Optional[str] = None     # None: an older name without the dtype field
    ext: str = NPY

    def build(self) -> str:
        dtype = f".{self.dtype}" if self.dtype is not None else ""
        return (f"{self.op_type}.{self.op_name}.{self.task_id}.{self.stream_id}.{self.timestamp}."
                f"{self.io}.{self.slot}.{self.format}{dtype}.{self.ext}")

    @property
    def is_parameter(self) -> bool:
        return self.op_type == PARAMETER_TYPE

    def as_dict(self) -> Dict[str, object]:
        return {"op_type": self.op_type, "op_file": self.op_name, "task_id": self.task_id,
                "stream_id": self.stream_id, "timestamp": self.timestamp, "io": self.io,
                "slot": self.slot, "format": self.format, "dtype": self.dtype}


# ---------------------------------------------------------------- building
def tensor_file_name(stem: str, task_id: int, stream_id: int, timestamp: int,
                     io: str, slot: int, fmt: str, dtype: str, ext: str = NPY) -> str:
    """``{stem}.{task}.{stream}.{ts}.{io}.{slot}.{format}.{dtype}.npy``; ``stem`` is
    ``{op_type}.{op_name}`` already sanitized (:func:`~opdump.format.names.file_stem`).
    A plain f-string: it runs once per dumped tensor."""
    return f"{stem}.{task_id}.{stream_id}.{timestamp}.{io}.{slot}.{fmt}.{dtype}.{ext}"


def operator_file_name(op_type: str, full_name: str, task_id: int, stream_id: int, timestamp: int,
                       io: str, slot: int, dtype: str, fmt: str = DEFAULT_FORMAT) -> str:
    """The file name of one input/output of the operator ``full_name``."""
    return tensor_file_name(file_stem(op_type, full_name), task_id, stream_id, timestamp, io, slot, fmt, dtype)


def parameter_file_name(name: str, timestamp: int, dtype: str, ext: str = NPY) -> str:
    """``Parameter.{name}.0.0.{ts}.output.0.DefaultFormat.{dtype}.npy`` as MindSpore writes it."""
    return f"{PARAMETER_TYPE}.{sanitize(name)}.0.0.{timestamp}.output.0.{DEFAULT_FORMAT}.{dtype}.{ext}"


def constant_name(index: int) -> str:
    """The parameter name of a graph's ``index``-th lifted constant (``data-{index}``)."""
    return f"data-{int(index)}"


def kernel_args_file_name(op_type: str, full_name: str) -> str:
    """``{op_type}.{op_name}.json``: an operator's non-tensor arguments (``save_kernel_args``)."""
    return f"{file_stem(op_type, full_name)}.json"


def too_long(file_name: str) -> bool:
    return len(file_name.encode("utf-8")) > MAX_NAME_BYTES


# ---------------------------------------------------------------- parsing
def parse_tensor_name(name: str) -> Optional[TensorName]:
    """Split a tensor file name; None when it is not one.

    Accepts the full form above, the older form without the dtype field, and
    msaccucmp's ``….{io}.{slot}.{AxB}.npy`` (a dtype-looking token in the format
    position is taken as the dtype).  Names written by other tools whose ``op_name``
    holds dots are joined back.
    """
    if not name.endswith("." + NPY):
        return None
    toks = name[:-len(NPY) - 1].split(".")
    if len(toks) >= 9 and toks[-4] in IO_KINDS and toks[-3].isdigit():
        io_idx, fmt, dtype = len(toks) - 4, toks[-2], toks[-1]
    elif len(toks) >= 8 and toks[-3] in IO_KINDS and toks[-2].isdigit():
        io_idx, fmt, dtype = len(toks) - 3, toks[-1], None
        if looks_like_dtype(fmt):
            dtype = fmt
    else:
        return None
    if io_idx < 5:
        return None
    ts, stream, task = toks[io_idx - 1], toks[io_idx - 2], toks[io_idx - 3]
    if not (ts.isdigit() and stream.lstrip("-").isdigit() and task.lstrip("-").isdigit()):
        return None
    return TensorName(toks[0], ".".join(toks[1:io_idx - 3]), int(task), int(stream), int(ts),
                      toks[io_idx], int(toks[io_idx + 1]), fmt, dtype)


def parse_kernel_args_name(name: str) -> Optional[str]:
    """The ``op_name`` of an ``{op_type}.{op_name}.json`` file; None for other names."""
    if not name.endswith(".json") or name.endswith(".npy.json"):
        return None
    parts = name[:-5].split(".", 1)
    return parts[1] if len(parts) == 2 else None


def is_raw_name(name: str) -> bool:
    """An Ascend bin (DumpData protobuf) dump file."""
    return bool(BIN_NAME_RE.match(name))


# ---------------------------------------------------------------- mapping.csv
def mapped_file_name(file_name: str) -> str:
    """The random short name a too-long ``file_name`` is stored under (36 digits + its extension)."""
    ext = file_name.rsplit(".", 1)[-1]
    return f"{secrets.randbelow(10 ** 18):018d}{secrets.randbelow(10 ** 18):018d}.{ext}"


def mapping_line(mapped: str, original: str) -> str:
    """One ``mapping.csv`` line: ``{mapped},{original}`` (the original is written as is)."""
    return f"{mapped},{original}\n"


def parse_mapping(text: str) -> Dict[str, str]:
    """``mapping.csv`` -> {mapped: original}.  Splits at the first comma only (an original
    name may hold commas) and on ``\\n`` only (it may hold other line separators)."""
    out: Dict[str, str] = {}
    for line in text.split("\n"):
        line = line.rstrip("\r")
        mapped, sep, original = line.partition(",")
        if sep and mapped.strip():
            out[mapped.strip()] = original
    return out


def resolve_mapped(name: str, mapping: Dict[str, str]) -> Optional[TensorName]:
    """Parse a tensor file name found on disk, through ``mapping`` when it is a mapped one."""
    original = mapping.get(name)
    if original is None and name.endswith("." + NPY):
        original = mapping.get(name[:-len(NPY) - 1])
    if original is not None:
        parsed = parse_tensor_name(original)
        if parsed is None and not original.endswith("." + NPY):
            parsed = parse_tensor_name(original + "." + NPY)
        if parsed is not None:
            return parsed
    return parse_tensor_name(name)

