"""``opdump convert``: Ascend bin dump files -> one ``.npy`` per input/output (README,
"opdump convert").

Why: a bin file (opdump's ``file_format: "bin"`` or the Ascend toolchain's) holds device
bytes in device formats; numpy, opdump's reader and the user's own scripts want host
tensors.  This module reads each file with the one codec
(:mod:`opdump.format.ascend_bin`) and turns device formats back into host layouts with
:mod:`opdump.format.device_formats`, in numpy only (no Ascend toolkit).

Guarantees:

* Each input/output ``i`` of file ``F`` becomes ``{out}/F.{input|output}.{i}.{d0xd1x…}.npy``
  (the saved array's shape, msaccucmp's naming; a 0-d tensor has an empty shape field);
  files found under a folder keep their sub-folder below ``out``.  A name over 255 bytes
  is stored under random digits, with ``{mapped},{original}`` appended to ``mapping.csv``.
* ``layout="host"`` (the CLI's ``-f NCHW``, the default): NC1HWC0, NDC1HWC0, FRACTAL_Z
  (``sub_format`` = groups), FRACTAL_Z_3D, FRACTAL_NZ, C1HWNCoC0 and the other formats
  device_formats knows become NCHW / NCDHW / ND of the header's ``original_shape``,
  padding removed; plain layouts (ND, NCHW, NHWC…) are saved as they are.  A format it
  cannot convert (unknown, or an empty ``original_shape``) is saved as it is, with one
  warning per tensor.  ``layout="device"`` converts no format.
* Values: bfloat16 and float8 as float32, int4 as int8, complex32 as complex64 (exact);
  a dtype with no numpy equivalent keeps its bytes as uint8, with a warning.  A slot
  without a tensor (``DT_UNDEFINED``, no bytes: opdump's bin writer marks a ``None``
  argument so) gets no file, as a ``None`` gets none in an ``.npy`` dump.
* A malformed file (header beyond the file, sizes not adding up, bad protobuf, a size
  that does not match shape and dtype) is an error naming the file and the reason, and
  none of its ``.npy`` files is written: every tensor of a file is decoded before the
  first is saved.  Each ``.npy`` is written whole (temporary name, then rename).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Tuple

import numpy as np

from ..format import ascend_bin as ab
from .whole_files import save_npy
from ..format.files import MAPPING_FILE, is_raw_name, mapped_file_name, mapping_line, too_long

LAYOUTS = ("host", "device")
#: formats whose bytes already are the host layout (nothing to convert, nothing to warn)
PLAIN_FORMATS = frozenset({"NCHW", "NHWC", "ND", "NC", "NCL", "MD", "CN", "NCDHW", "NDHWC", "DHWCN",
                           "DHWNC", "HWCN", "CHWN", "RESERVED", "NULL", "ALL", "MAX"})
#: files under a folder that are never bin dump files
_NOT_BIN = (".npy", ".csv", ".json", ".txt", ".ir", ".pb", ".log", ".dot", ".proto", ".py", ".bin.npy")


@dataclass
class ConvertReport:
    """What :func:`convert` did: files written, warnings, errors ``(path, reason)``, and
    files under a folder skipped as not bin dump files."""
    written: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    errors: List[Tuple[str, str]] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)
    converted_files: int = 0


def shape_text(shape) -> str:
    """``(2, 3, 4)`` -> ``2x3x4`` (msaccucmp's shape field)."""
    return "x".join(str(int(d)) for d in shape)


def output_name(file_name: str, kind: str, index: int, shape) -> str:
    """``F.input.0.2x3.npy``: the name a tensor of bin file ``F`` is saved under."""
    return f"{file_name}.{kind}.{index}.{shape_text(shape)}.npy"


def _host(info: ab.TensorInfo, array: np.ndarray, warn: Callable[[str], None], where: str) -> np.ndarray:
    """``array`` (device layout) in its host layout, or as it is with a warning."""
    fmt = info.format_name
    if fmt in PLAIN_FORMATS:
        return array
    if not info.original_shape:
        warn(f"{where}: format {fmt} with an empty original shape; saved in the device layout {list(array.shape)}")
        return array
    from ..format import device_formats as df          # numpy-heavy; only where a format needs it
    c0 = 64 if info.dtype == "int4" else None
    try:
        return df.to_host(array, fmt, info.original_shape, groups=info.groups, c0=c0)
    except df.UnknownFormat:
        warn(f"{where}: format {fmt} is not converted; saved in the device layout {list(array.shape)}")
    except ValueError as exc:
        warn(f"{where}: format {fmt} not converted ({exc}); saved in the device layout {list(array.shape)}")
    return array


def decode_file(path: str, layout: str = "host",
                warn: Callable[[str], None] = lambda m: None) -> List[Tuple[str, int, np.ndarray]]:
    """Every tensor of one bin file as ``(kind, index, array)``, converted per ``layout``.
    Raises :class:`~opdump.format.ascend_bin.BinFormatError` for a malformed file."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    header = ab.read_header(path)
    arrays = ab.load_all(path)
    out = []
    for kind in ab.KINDS:
        for info, array in zip(header.tensors(kind), arrays[kind]):
            where = f"{path} {kind} {info.index}"
            if info.data_type == 0 and info.size == 0:
                continue                          # DT_UNDEFINED, no bytes: a slot without a tensor
            if info.dtype is None:
                warn(f"{where}: dtype {info.data_type_name} has no numpy equivalent; its {info.size} bytes "
                     f"saved as uint8")
            elif layout == "host":
                array = _host(info, array, warn, where)
            if not array.flags.c_contiguous:
                array = array.copy(order="C")     # not ascontiguousarray: it makes a 0-d array 1-d
            out.append((kind, info.index, array))
    return out


def _candidates(src: str) -> Iterator[Tuple[str, str, bool]]:
    """``(path, folder relative to src, must_be_bin)`` of each file to convert."""
    if not os.path.isdir(src):
        yield src, "", True
        return
    for root, dirs, files in os.walk(src):
        dirs.sort()
        rel = os.path.relpath(root, src)
        for name in sorted(files):
            if name.startswith(".") or name.lower().endswith(_NOT_BIN):
                continue
            yield os.path.join(root, name), "" if rel == "." else rel, is_raw_name(name) or name.isdigit()


def _target(out_dir: str, name: str) -> str:
    """Where ``name`` is saved in ``out_dir`` (a mapped name for one over 255 bytes)."""
    if not too_long(name):
        return os.path.join(out_dir, name)
    mapped = mapped_file_name(name)
    with open(os.path.join(out_dir, MAPPING_FILE), "a", encoding="utf-8") as f:
        f.write(mapping_line(mapped, name))
    return os.path.join(out_dir, mapped)


def convert(src: str, out: str, *, layout: str = "host",
            save: Optional[Callable[[str, np.ndarray], None]] = None) -> ConvertReport:
    """Convert the bin file ``src``, or every bin file under the folder ``src``, into ``out``
    (created).  ``save(path, array)`` writes one ``.npy`` whole (default: numpy's format
    through a temporary file).  Errors of single files are collected, not raised; a
    missing ``src`` raises FileNotFoundError."""
    if not os.path.exists(src):
        raise FileNotFoundError(f"{src}: no such file or folder")
    save = save or save_npy
    report = ConvertReport()
    for path, rel, must in _candidates(src):
        if not must:                      # a file of another kind under the folder is skipped
            try:
                ab.read_header(path)
            except ab.BinFormatError:
                report.skipped.append(path)
                continue
        try:
            tensors = decode_file(path, layout, report.warnings.append)
        except ab.BinFormatError as exc:
            report.errors.append((path, exc.reason))
            continue
        out_dir = os.path.join(out, rel)
        os.makedirs(out_dir, exist_ok=True)
        base = os.path.basename(path)
        for kind, index, array in tensors:
            target = _target(out_dir, output_name(base, kind, index, array.shape))
            save(target, array)
            report.written.append(target)
        report.converted_files += 1
    return report
