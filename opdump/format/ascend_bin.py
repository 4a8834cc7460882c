"""The Ascend toolchain's "bin" dump file, written and read by one codec (README,
"Ascend bin files"; docs/design.md, "Ascend bin files").

A file is::

    offset 0     uint64 little-endian H: the header's length
    offset 8     H bytes: a serialized ``DumpData`` (opdump/format/dump_data.proto) whose
                 ``data`` fields are empty
    offset 8+H   the raw bytes of input[0..n), then output[0..m), then buffer[..], then
                 space[..], each exactly its ``size`` field long
    and nothing else: 8 + H + the sizes == the file's size

Unlike most of :mod:`opdump.format` this module needs numpy (it returns arrays) and,
when used, protobuf (``dump_data_pb2``); ``opdump.format`` itself imports neither, so the
rest of opdump starts without them.

API (pure functions; the only I/O is reading the path given):

* :func:`encode` ``(op_name, inputs, outputs, *, timestamp, formats=None,
  original_shapes=None, sub_formats=None, version="2.0") -> list`` -- the buffers of one
  file, ready for ``os.writev`` (or ``b"".join``).  An input/output is a numpy array (its
  dtype gives the ``DT_*`` value) or a :class:`RawTensor` (device bytes with a torch
  dtype name: bfloat16, float8, complex32, int4 (:func:`pack_int4`), or any other).
  ``formats`` / ``original_shapes`` / ``sub_formats`` are dicts keyed ``("input", i)`` /
  ``("output", i)``; formats are names (``"NC1HWC0"``, ``"FORMAT_ND"``) or enum values.
  Defaults: format ND, original shape = shape, sub_format 0.  ``timestamp`` goes to
  ``dump_time`` (microseconds, as the toolchain writes it).  A torch tensor ``t`` of a
  dtype numpy lacks is passed as ``RawTensor(t.view(torch.int16).numpy(), "bfloat16",
  tuple(t.shape))`` (1-byte types: ``torch.uint8``).  Empty tensors add no buffer; an
  operator with more than ~1000 tensors exceeds ``os.writev``'s IOV_MAX in one call.
* :func:`read_header` ``(path) -> BinDump`` -- op name, timestamp and one
  :class:`TensorInfo` per input/output (data_type, format, shape, original_shape, size,
  byte offset, sub_format), without reading tensor data.
* :func:`load` ``(path, kind, index, *, header=None, raw=False) -> numpy.ndarray`` -- one
  tensor in its device layout (shape = the header's ``shape``), values as
  :mod:`.ascend_dtypes` decodes them (bfloat16/float8 -> float32, int4 -> int8);
  unknown dtypes, or ``raw=True``, give the bytes as 1-D uint8.
* :func:`load_all` ``(path, *, raw=False) -> {"input": [...], "output": [...]}``.
* :class:`BinFormatError` (a ValueError) -- the one error for a malformed file: header
  length beyond the file, a header protobuf cannot parse, sizes that do not add up to the
  file's size, a tensor whose size does not match its shape and dtype; its message names
  the file and the reason.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import ascend_dtypes as adt
from .ascend_dtypes import pack_int4, unpack_int4  # noqa: F401  (part of this module's API)

KINDS = ("input", "output")
_LEN = struct.Struct("<Q")


class BinFormatError(ValueError):
    """A file that is not a well-formed Ascend bin dump file."""

    def __init__(self, path: Any, reason: str):
        self.path, self.reason = os.fspath(path) if path is not None else "<bytes>", reason
        super().__init__(f"{self.path}: not a valid Ascend bin dump file: {reason}")


def _pb():
    from . import dump_data_pb2          # protobuf is imported only by bin users
    return dump_data_pb2


# ---------------------------------------------------------------- names

def format_value(fmt: Union[str, int]) -> int:
    """``"NC1HWC0"`` / ``"FORMAT_NC1HWC0"`` / 3 -> 3 (ValueError for an unknown name)."""
    if isinstance(fmt, (int, np.integer)):
        return int(fmt)
    name = fmt if fmt.startswith("FORMAT_") else "FORMAT_" + fmt
    try:
        return _pb().OutputFormat.Value(name)
    except ValueError:
        raise ValueError(f"unknown Ascend format {fmt!r}") from None


def format_name(value: int) -> str:
    """3 -> ``"NC1HWC0"`` (the enum name without ``FORMAT_``); an unknown value -> its digits."""
    try:
        return _pb().OutputFormat.Name(int(value))[len("FORMAT_"):]
    except ValueError:
        return str(int(value))


def data_type_name(value: int) -> str:
    """27 -> ``"DT_BF16"``; an unknown value -> ``"DT_<value>"``."""
    try:
        return _pb().OutputDataType.Name(int(value))
    except ValueError:
        return f"DT_{int(value)}"


# ---------------------------------------------------------------- descriptions

@dataclass(frozen=True)
class RawTensor:
    """A tensor given as its device bytes: ``data`` (bytes-like or a C-contiguous numpy
    array; all its bytes are written), ``dtype`` (torch dtype name such as ``"bfloat16"``,
    a ``DT_*`` name or value) and ``shape``; optional ``format``, ``original_shape``,
    ``sub_format`` override :func:`encode`'s dicts."""
    data: Any
    dtype: Union[str, int]
    shape: Tuple[int, ...]
    format: Optional[Union[str, int]] = None
    original_shape: Optional[Tuple[int, ...]] = None
    sub_format: Optional[int] = None


@dataclass(frozen=True)
class TensorInfo:
    """One input or output as the header describes it; ``offset`` is where its bytes
    start in the file."""
    kind: str
    index: int
    data_type: int
    format: int
    shape: Tuple[int, ...]
    original_shape: Tuple[int, ...]
    size: int
    offset: int
    sub_format: int = 0

    @property
    def data_type_name(self) -> str:
        return data_type_name(self.data_type)

    @property
    def format_name(self) -> str:
        return format_name(self.format)

    @property
    def dtype(self) -> Optional[str]:
        """torch dtype name (``"bfloat16"``), None for a ``DT_*`` without one."""
        return adt.torch_name_of(self.data_type)

    @property
    def groups(self) -> int:
        """Convolution groups of a FRACTAL_Z weight (``sub_format`` when > 1)."""
        return self.sub_format if self.sub_format > 1 else 1

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def expected_size(self) -> Optional[int]:
        """Bytes ``shape`` and ``data_type`` call for; None for an unknown dtype."""
        return adt.nbytes(self.dtype, self.count)


@dataclass(frozen=True)
class BinDump:
    """A bin file's header: what :func:`read_header` returns."""
    path: str
    op_name: str
    timestamp: int
    version: str
    inputs: Tuple[TensorInfo, ...]
    outputs: Tuple[TensorInfo, ...]
    header_length: int
    file_size: int
    message: Any = field(default=None, repr=False, compare=False)   # the parsed DumpData

    def tensors(self, kind: str) -> Tuple[TensorInfo, ...]:
        if kind not in KINDS:
            raise ValueError(f"kind must be 'input' or 'output', not {kind!r}")
        return self.inputs if kind == "input" else self.outputs

    def load(self, kind: str, index: int, raw: bool = False) -> np.ndarray:
        return load(self.path, kind, index, header=self, raw=raw)


# ---------------------------------------------------------------- encode

def _dt_value(dtype: Union[str, int]) -> int:
    if isinstance(dtype, (int, np.integer)):
        return int(dtype)
    name = str(dtype).replace("torch.", "")
    if name in adt.DT_OF_TORCH:
        return adt.DT_OF_TORCH[name]
    if name.startswith("DT_"):
        return _pb().OutputDataType.Value(name)
    raise ValueError(f"no Ascend DT_ type for dtype {dtype!r}")


def _as_bytes(data: Any) -> memoryview:
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        return memoryview(data.reshape(-1).view(np.uint8))
    return memoryview(data).cast("B")


def _describe(t: Any) -> Tuple[int, Tuple[int, ...], memoryview, RawTensor]:
    """(DT value, shape, bytes, overrides) of an input/output."""
    if isinstance(t, RawTensor):
        return _dt_value(t.dtype), tuple(int(d) for d in t.shape), _as_bytes(t.data), t
    a = np.asarray(t)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    try:
        dt = adt.DT_OF_TORCH[a.dtype.name]
    except KeyError:
        raise ValueError(f"no Ascend DT_ type for numpy dtype {a.dtype}; pass a RawTensor") from None
    return dt, tuple(a.shape), _as_bytes(a), RawTensor(None, dt, a.shape)


def _fill(msg, dt: int, shape, data: memoryview, over: RawTensor, key, formats, original_shapes,
          sub_formats) -> None:
    msg.data_type = dt
    fmt = over.format if over.format is not None else (formats or {}).get(key, "ND")
    msg.format = format_value(fmt)
    msg.shape.dim.extend(shape)
    orig = over.original_shape if over.original_shape is not None else (original_shapes or {}).get(key, shape)
    msg.original_shape.dim.extend(int(d) for d in orig)
    sub = over.sub_format if over.sub_format is not None else (sub_formats or {}).get(key, 0)
    msg.sub_format = int(sub)
    msg.size = data.nbytes


def encode(op_name: str, inputs: Sequence[Any], outputs: Sequence[Any], *, timestamp: int,
           formats: Optional[Mapping] = None, original_shapes: Optional[Mapping] = None,
           sub_formats: Optional[Mapping] = None, version: str = "2.0") -> List[Any]:
    """The buffers of one bin file (module docstring): ``[length, header, data...]``."""
    pb = _pb()
    dd = pb.DumpData(version=version, dump_time=int(timestamp), op_name=op_name)
    datas: List[memoryview] = []
    for kind, items, repeated in (("input", inputs, dd.input), ("output", outputs, dd.output)):
        for i, t in enumerate(items):
            dt, shape, data, over = _describe(t)
            _fill(repeated.add(), dt, shape, data, over, (kind, i), formats, original_shapes, sub_formats)
            datas.append(data)
    header = dd.SerializeToString()
    return [_LEN.pack(len(header)), header] + [d for d in datas if d.nbytes]


# ---------------------------------------------------------------- read

def _infos(kind: str, items, start: int) -> Tuple[Tuple[TensorInfo, ...], int]:
    out = []
    for i, m in enumerate(items):
        out.append(TensorInfo(kind, i, int(m.data_type), int(m.format), tuple(m.shape.dim),
                              tuple(m.original_shape.dim), int(m.size), start, int(m.sub_format)))
        start += int(m.size)
    return tuple(out), start


def parse_header(path: Any, head: bytes, file_size: int) -> BinDump:
    """:func:`read_header` on bytes already read: ``head`` holds at least the first
    ``8 + H`` bytes of a file of ``file_size`` bytes."""
    if file_size <= 8 or len(head) < 8:
        raise BinFormatError(path, f"{file_size} bytes, too short for the 8-byte header length")
    (h,) = _LEN.unpack_from(head)
    if h > file_size - 8:
        raise BinFormatError(path, f"header length {h} is beyond the file ({file_size} bytes)")
    if len(head) < 8 + h:
        raise BinFormatError(path, f"file shorter than its header ({len(head)} of {8 + h} bytes)")
    pb = _pb()
    dd = pb.DumpData()
    try:
        dd.ParseFromString(bytes(head[8:8 + h]))
    except Exception as exc:           # google.protobuf.message.DecodeError and friends
        raise BinFormatError(path, f"header is not a DumpData protobuf ({exc})") from None
    start = 8 + h
    inputs, end = _infos("input", dd.input, start)
    outputs, end = _infos("output", dd.output, end)
    end += sum(int(b.size) for b in dd.buffer) + sum(int(s.size) for s in dd.space)
    if end != file_size:
        raise BinFormatError(path, f"sizes do not add up: 8 + header {h} + data {end - start} = {end} "
                                   f"bytes, the file has {file_size}")
    return BinDump(os.fspath(path), dd.op_name, int(dd.dump_time), dd.version, inputs, outputs, h,
                   file_size, dd)


def read_header(path: Any) -> BinDump:
    """The header of the bin file at ``path`` (checked: module docstring); no tensor data read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            first = f.read(8)
            if len(first) == 8 and size > 8:
                (h,) = _LEN.unpack(first)
                if h <= size - 8:
                    first += f.read(h)
    except OSError as exc:
        raise BinFormatError(path, f"cannot read ({exc.strerror or exc})") from None
    return parse_header(path, first, size)


def _read(path: Any, offset: int, size: int) -> np.ndarray:
    buf = np.empty(size, np.uint8)
    with open(path, "rb") as f:
        f.seek(offset)
        got = f.readinto(memoryview(buf)) if size else 0
    if got != size:
        raise BinFormatError(path, f"file ends inside a tensor (read {got} of {size} bytes at {offset})")
    return buf


def decode_tensor(path: Any, info: TensorInfo, raw_bytes: np.ndarray, raw: bool = False) -> np.ndarray:
    """A tensor's bytes (uint8, ``info.size`` of them) -> :func:`load`'s array."""
    name = info.dtype
    if raw or name is None:
        return raw_bytes
    need = info.expected_size
    if need != info.size:
        raise BinFormatError(path, f"{info.kind} {info.index}: size {info.size} bytes, but shape "
                                   f"{list(info.shape)} of {info.data_type_name} needs {need}")
    return adt.decode(raw_bytes, name, info.count).reshape(info.shape)


def load(path: Any, kind: str, index: int, *, header: Optional[BinDump] = None, raw: bool = False) -> np.ndarray:
    """One input or output of a bin file, in its device layout (module docstring)."""
    header = header or read_header(path)
    items = header.tensors(kind)
    if not 0 <= index < len(items):
        raise IndexError(f"{os.fspath(path)}: no {kind} {index} (the file has {len(items)})")
    info = items[index]
    return decode_tensor(path, info, _read(path, info.offset, info.size), raw)


def load_all(path: Any, *, raw: bool = False) -> Dict[str, List[np.ndarray]]:
    """Every input and output: ``{"input": [...], "output": [...]}`` (one read of the file)."""
    header = read_header(path)
    end = max((t.offset + t.size for t in header.inputs + header.outputs), default=0)
    start = 8 + header.header_length
    data = _read(path, start, max(end - start, 0))
    return {kind: [decode_tensor(path, t, data[t.offset - start:t.offset - start + t.size], raw)
                   for t in header.tensors(kind)] for kind in KINDS}
