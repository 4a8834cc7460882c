"""``.npy`` files read without pickle: the one header parser of the analysis side.

``npy_header`` reads shape and dtype only (listings, indexes); ``npy_layout`` also
checks the size the header describes against the file's before anything is read or
allocated, so a corrupt or truncated file is reported with its reason instead of
asking for terabytes (compare, overflow, watch and triage load through it).  Both parse
the header numpy writes for plain dtypes with one regular expression (``np.lib.format``
runs ``ast.literal_eval``: ~0.2 ms a file) and fall back to numpy's own parser.
"""
from __future__ import annotations

import math
import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from . import bincache

#: (shape, dtype, data offset, fortran order) of a ``.npy`` file
Layout = Tuple[Tuple[int, ...], np.dtype, int, bool]

MMAP_MIN_BYTES = 4 << 20    # smaller files are read in one go (cheaper than mapping them)


_HEADER = re.compile(r"\{'descr': '([<>|=]?[a-zA-Z][a-zA-Z0-9]*)', 'fortran_order': (True|False), "
                     r"'shape': \(((?:\d+, )*\d*,?)\), \}[ ]*\n?$")
_DTYPES: Dict[str, np.dtype] = {}


def _fast_header(raw: bytes) -> Optional[Tuple[Tuple[int, ...], bool, np.dtype, int]]:
    """(shape, fortran, dtype, data offset) of the header numpy writes for a plain dtype, parsed
    with one regular expression (``np.lib.format`` runs ``ast.literal_eval``: ~0.2 ms a file);
    None for anything else (then numpy's own parser reads it)."""
    if raw[:6] != b"\x93NUMPY" or len(raw) < 10:
        return None
    major = raw[6]
    if major == 1:
        hlen, start = int.from_bytes(raw[8:10], "little"), 10
    elif major == 2 and len(raw) >= 12:
        hlen, start = int.from_bytes(raw[8:12], "little"), 12
    else:
        return None
    if raw[7] != 0 or start + hlen > len(raw):
        return None
    key = raw[:start + hlen]
    hit = _SEEN.get(key)
    if hit is not None:                 # the same header bytes as an earlier file: same layout
        return hit
    parsed = _parse_header(raw, start, hlen)
    if parsed is not None and len(_SEEN) < _SEEN_MAX:
        _SEEN[key] = parsed
    return parsed


#: header bytes -> parsed layout: files of one shape and dtype share their header byte for
#: byte (tens of thousands of files of a few shapes in a many-small-tensors dump), so the
#: regular expression runs once per distinct header.  Bounded; values are immutable tuples.
_SEEN: Dict[bytes, Tuple[Tuple[int, ...], bool, np.dtype, int]] = {}
_SEEN_MAX = 8192


def _parse_header(raw: bytes, start: int, hlen: int) -> Optional[Tuple[Tuple[int, ...], bool, np.dtype, int]]:
    """:func:`_fast_header`'s parse of the header text (no memo)."""
    try:
        text = raw[start:start + hlen].decode("latin1")
    except UnicodeDecodeError:  # pragma: no cover - latin1 decodes any byte
        return None
    m = _HEADER.match(text)
    if m is None:
        return None
    descr = m.group(1)
    dtype = _DTYPES.get(descr)
    if dtype is None:
        try:
            dtype = np.dtype(descr)
        except TypeError:
            return None
        if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or len(_DTYPES) > 256:
            return None
        _DTYPES[descr] = dtype
    shape = tuple(int(x) for x in m.group(3).replace(",", " ").split())
    return shape, m.group(2) == "True", dtype, start + hlen


def _read_header(path: str) -> Tuple[Layout, int]:
    """The header's layout and the file's size; ValueError when the header cannot be read."""
    bincache.materialize(path)          # a tensor of an Ascend bin file: its .npy, written on first read
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        fast = _fast_header(os.pread(fd, 512, 0))
    finally:
        os.close(fd)
    if fast is not None:                # shape already a tuple of ints, fortran a bool
        shape, fortran, dtype, offset = fast
        return (shape, dtype, offset, fortran), size
    else:
        with open(path, "rb") as f:
            try:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                else:        # 3.0: a 2.0 header in UTF-8
                    shape, fortran, dtype = np.lib.format._read_array_header(f, version)
            except (ValueError, EOFError, SyntaxError, TypeError) as e:
                raise ValueError(f"not a readable .npy header ({e})") from None
            offset = f.tell()
    return (tuple(int(x) for x in shape), dtype, offset, bool(fortran)), size


_NAMES: Dict[np.dtype, str] = {}


def dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, looked up once per dtype (numpy builds the text on every call: ~7 us,
    twice per pair on a compare of 100,000 files)."""
    name = _NAMES.get(dtype)
    if name is None:
        name = str(dtype)
        if len(_NAMES) < 1024:
            _NAMES[dtype] = name
    return name


def truncated(need: int, size: int, shape, dtype) -> ValueError:
    """The error of a file shorter than its header says."""
    return ValueError(f"truncated or corrupt: the header describes {need} bytes "
                      f"(shape {tuple(shape)}, {dtype}), the file has {size}")


def npy_header(path: str) -> Tuple[Tuple[int, ...], np.dtype]:
    """(shape, dtype) of a ``.npy`` file from its header (the data is neither read nor checked)."""
    known = bincache.host_header(path)  # a tensor of an Ascend bin file: from the bin header
    if known is not None:
        return known
    (shape, dtype, _offset, _fortran), _size = _read_header(path)
    return shape, dtype


def npy_layout(path: str) -> Layout:
    """(shape, dtype, data offset, fortran order) of a ``.npy`` file whose size holds the data
    its header describes. Raises ValueError with the reason otherwise (bad magic, unreadable
    header, object dtype, file shorter than the header says)."""
    layout, size = _read_header(path)
    shape, dtype, offset, _fortran = layout
    if dtype.hasobject:
        raise ValueError("holds Python objects (never unpickled)")
    need = offset + math.prod(shape) * dtype.itemsize
    if size < need:
        raise truncated(need, size, shape, dtype)
    return layout


def npy_layouts_sized(paths: List[str], sizes: List[int]) -> List[object]:
    """:func:`npy_layout` of each path given the file's size as the folder scan read it
    (``os.stat``, a moment earlier): one ``open``/``pread``/``close`` per file instead of four
    system calls (~25% of a header index of 65,000 small files).  Each entry is the layout
    or the exception :func:`npy_layout` raises (never raised here).  A size unknown (0), a
    tensor of an Ascend bin file, or a header the fast parser does not read go through
    :func:`npy_layout` itself."""
    out: List[object] = []
    for path, size in zip(paths, sizes):
        try:
            fast = None
            if size > 0 and bincache.entry(path) is None:
                fd = os.open(path, os.O_RDONLY)
                try:
                    fast = _fast_header(os.pread(fd, 512, 0))
                finally:
                    os.close(fd)
            if fast is None:
                out.append(npy_layout(path))
                continue
            shape, fortran, dtype, offset = fast
            need = offset + math.prod(shape) * dtype.itemsize
            if size < need:
                raise truncated(need, size, shape, dtype)
            out.append((shape, dtype, offset, fortran))
        except Exception as e:  # noqa: BLE001 - reported by the caller, never raised
            out.append(e)
    return out


def checked_header(path: str) -> Tuple[Tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of a checked ``.npy`` file (see :func:`npy_layout`)."""
    return npy_layout(path)[:3]


def load_array(path: str, mmap: bool = True) -> np.ndarray:
    """``np.load`` without pickle, memory-mapped when possible (empty arrays cannot be)."""
    bincache.materialize(path)
    if mmap:
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError:
            pass
    return np.load(path, allow_pickle=False)


def load_checked(path: str) -> np.ndarray:
    """The array of a checked ``.npy`` file, memory-mapped when large (never unpickled)."""
    npy_layout(path)
    big = os.path.getsize(path) >= MMAP_MIN_BYTES
    return load_array(path, mmap=big)


_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)


def read_regions(jobs: List[Tuple[str, Layout, memoryview]]) -> List[Optional[Exception]]:
    """Read the data region of each ``(path, layout, target)`` into ``target`` (a writable
    byte view of exactly the region's size): one ``preadv`` per file into memory the caller
    reuses, no allocation per file.  Every file is opened and announced to the kernel
    (``posix_fadvise(WILLNEED)``) before the first is read, so on a cold cache the reads of
    a whole batch of small files are queued at once instead of one after the other.

    Returns, per job, None or the exception that file gives (never raises for one file):
    ``OSError`` from opening/reading, or the ``ValueError`` of :func:`truncated` when the
    file is shorter than its header says (its size is checked again: it may have changed
    since the header was read)."""
    errs: List[Optional[Exception]] = [None] * len(jobs)
    fds: List[int] = []
    for i, (path, layout, view) in enumerate(jobs):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            errs[i] = e
            fds.append(-1)
            continue
        fds.append(fd)
        if _WILLNEED is not None and view.nbytes:
            try:
                os.posix_fadvise(fd, layout[2], view.nbytes, _WILLNEED)
            except OSError:        # pragma: no cover - advice only
                pass
    try:
        for i, (path, layout, view) in enumerate(jobs):
            fd = fds[i]
            if fd < 0:
                continue
            try:
                need, got = view.nbytes, 0
                while got < need:
                    r = os.preadv(fd, [view[got:]], layout[2] + got)
                    if r <= 0:
                        break
                    got += r
                if got < need:
                    shape, dtype, offset = layout[0], layout[1], layout[2]
                    size = os.fstat(fd).st_size
                    if size < offset + need:
                        errs[i] = truncated(offset + need, size, shape, dtype)
                    else:
                        errs[i] = ValueError(f"truncated or corrupt: {got} of {need} data bytes could be read")
            except OSError as e:
                errs[i] = e
    finally:
        for fd in fds:
            if fd >= 0:
                os.close(fd)
    return errs


def will_need(regions: List[Tuple[str, int, int]]) -> None:
    """Tell the kernel that ``(path, offset, length)`` regions are about to be read
    (``posix_fadvise(WILLNEED)``): on a cold cache their reads start in the background,
    all queued at once, while the caller still computes on earlier files.  Advice only:
    errors are ignored, nothing is read here."""
    if _WILLNEED is None:
        return
    for path, offset, length in regions:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, offset, length, _WILLNEED)
        except OSError:          # pragma: no cover - advice only
            pass
        finally:
            os.close(fd)
