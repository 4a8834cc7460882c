"""Tensor-pair metrics, computed in float64 over chunks, so a multi-GB pair never sits in
memory whole.  Module-level functions only: they run in compare's worker processes.

Speed (README, "Analysis" > compare; bench/compare_bench.py measures it):

* files are streamed: each ``.npy`` data region is read block by block into buffers that
  are reused (no whole-file allocation, no memory map to fault in, sequential reads when
  the files are not in the page cache), with the header parsed once by compare's index
  (``layout``) instead of once per reader;
* **byte-identical pairs need no metric**: the two data regions are compared block by
  block first (``memcmp``); when they are equal, every metric follows from the count of
  finite elements and ``max|B|`` (a min/max pass in the stored dtype, done while
  comparing): cosine 1, errors 0, shares 1 -- the values the full pass gives for equal
  data (for stored dtypes whose float64 squares cannot overflow: everything but float64);
* otherwise one pass over chunks of ``METRIC_CHUNK`` elements computes every metric,
  with float64 work buffers reused through ``out=`` arguments; the finiteness test of a
  chunk comes from its sums of squares (finite exactly when every element is, for those
  dtypes), and the ``within_*`` counts are skipped when the chunk's largest relative error
  already answers them.

Same numbers as before, to the last digit: the chunk boundaries, the float64 conversion,
the BLAS dot products, numpy's pairwise sums and the order in which chunk results are
added are unchanged (tests/test_compare_speed_equivalence.py checks this against a copy
of the former implementation).  One thing is pinned that was not: the dot products run
on one BLAS thread (:func:`opdump.analysis.blas.single_thread_blas`).  OpenBLAS splits a dot product of more
than 10,000 elements over its threads and adds the parts, so the last digits of cosine,
RMSE and Euclidean distance used to depend on the machine's core count; now they do not,
and two worker processes no longer each spin two BLAS threads on two cores.

Files are opened through :func:`opdump.analysis.reader.npy.npy_layout`: the ``.npy`` header
is read and the size it describes is checked against the file's size before anything is
read or allocated, so a corrupt or truncated file is reported (by path, with the reason)
instead of asking for terabytes or failing half-way.
"""
from __future__ import annotations

import math
import os
import threading
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .common import iter_chunks
from .blas import single_thread_blas
from .reader.npy import Layout, load_checked, npy_layout, truncated

__all__ = ["tensor_metrics", "pair_metrics", "METRIC_KEYS"]

METRIC_KEYS = ("cosine", "max_abs_err", "max_rel_err", "rmse", "euclidean", "within_1e-3", "within_5e-3",
               "mean_abs_err", "max_abs_ref", "nonfinite_mismatch", "n")

METRIC_CHUNK = 1 << 16      # elements per step: float64 work buffers stay in the CPU cache
COMPARE_BLOCK = 1 << 20     # bytes per step of the byte comparison
FIRST_BLOCK = 64 << 10      # bytes of its first step (a differing pair is told early, little read twice)


# --------------------------------------------------------------------------- the metric pass
def _real(a: np.ndarray) -> np.ndarray:
    if np.iscomplexobj(a):
        a = np.ascontiguousarray(a)
        return a.view(a.real.dtype)
    return a


def _squares_safe(dtype: np.dtype) -> bool:
    """float64 squares of any value of this stored dtype, summed over a chunk, stay finite
    (so a finite sum of squares means every element is finite)."""
    return dtype.kind in "biu" or (dtype.kind == "f" and dtype.itemsize <= 4)


_LOCAL = threading.local()


def _work_buffers(m: int):
    """Four float64 buffers and a bool buffer of ``m`` elements, kept per thread for the next
    pair (allocating 2 MB per pair costs page faults; a worker compares thousands)."""
    bufs = getattr(_LOCAL, "bufs", None)
    if bufs is None or bufs[0].size < m:
        bufs = tuple(np.empty(m, np.float64) for _ in range(4)) + (np.empty(m, np.bool_),)
        if m <= METRIC_CHUNK:
            _LOCAL.bufs = bufs
    return tuple(b[:m] for b in bufs)


class _Accumulator:
    """Every metric of a pair, chunk by chunk, in float64 (reused work buffers)."""

    def __init__(self, chunk: int, squares_safe: bool):
        m = max(1, chunk)
        self.bufa, self.bufb, self.bufd, self.buft, self.bools = _work_buffers(m)
        self.squares_safe = squares_safe
        self.dot = self.na2 = self.nb2 = self.ssq = self.sabs = 0.0
        self.max_abs = self.max_rel = self.max_ref = 0.0
        self.w1 = self.w5 = self.n = self.mism = 0

    def add(self, ca: np.ndarray, cb: np.ndarray) -> None:
        k = ca.size
        xa, xb, d, t = self.bufa[:k], self.bufb[:k], self.bufd[:k], self.buft[:k]
        xa[...] = ca
        xb[...] = cb
        if self.squares_safe:
            saa, sbb = float(np.dot(xa, xa)), float(np.dot(xb, xb))
            finite = math.isfinite(saa) and math.isfinite(sbb)
        else:
            finite = bool(np.isfinite(xa).all()) and bool(np.isfinite(xb).all())
        if not finite:
            fa, fb = np.isfinite(xa), np.isfinite(xb)
            both = fa & fb
            neither = ~fa & ~fb
            same = neither & ((np.isnan(xa) & np.isnan(xb)) | (xa == xb))
            self.mism += int(k - both.sum() - same.sum())
            xa, xb = xa[both], xb[both]
            k = xa.size
            if k == 0:
                return
            d, t = d[:k], t[:k]
            saa, sbb = float(np.dot(xa, xa)), float(np.dot(xb, xb))
        elif not self.squares_safe:
            saa, sbb = float(np.dot(xa, xa)), float(np.dot(xb, xb))
        np.subtract(xa, xb, out=d)
        np.abs(d, out=d)
        self.dot += float(np.dot(xa, xb))
        self.na2 += saa
        self.nb2 += sbb
        self.ssq += float(np.dot(d, d))
        self.sabs += float(d.sum())
        self.max_abs = max(self.max_abs, float(d.max()))
        np.abs(xb, out=t)
        self.max_ref = max(self.max_ref, float(t.max()))
        np.divide(d, t, out=t)                 # 0/0 -> NaN (an exact zero: relative error 0)
        mr = float(np.fmax.reduce(t))
        if mr == mr:
            self.max_rel = max(self.max_rel, mr)
        # within: elements whose relative error is below the bound or NaN (0/0)
        b = self.bools[:k]
        for lim in (1e-3, 5e-3):
            if mr != mr or mr < lim:
                w = k                          # no element reaches the bound
            else:
                w = k - int(np.count_nonzero(np.greater_equal(t, lim, out=b)))
            if lim == 1e-3:
                self.w1 += w
            else:
                self.w5 += w
        self.n += k

    def result(self) -> Dict[str, Any]:
        return metrics_dict(self.n, self.dot, self.na2, self.nb2, self.ssq, self.sabs, self.max_abs, self.max_rel,
                            self.max_ref, self.w1, self.w5, self.mism)


def metrics_dict(n: int, dot: float, na2: float, nb2: float, ssq: float, sabs: float, max_abs: float,
                 max_rel: float, max_ref: float, w1: int, w5: int, mism: int) -> Dict[str, Any]:
    """The metrics from the sums and extremes of the pass (the one place they are derived)."""
    if na2 == 0.0 and nb2 == 0.0:
        cos = 1.0 if n else float("nan")
    elif na2 == 0.0 or nb2 == 0.0:
        cos = float("nan")
    else:
        cos = dot / math.sqrt(na2 * nb2)
        cos = max(-1.0, min(1.0, cos))
    return {
        "n": n, "cosine": cos, "max_abs_err": max_abs if n else float("nan"),
        "max_rel_err": max_rel if n else float("nan"),
        "rmse": math.sqrt(ssq / n) if n else float("nan"), "euclidean": math.sqrt(ssq),
        "mean_abs_err": sabs / n if n else float("nan"),
        "within_1e-3": w1 / n if n else float("nan"), "within_5e-3": w5 / n if n else float("nan"),
        "max_abs_ref": max_ref, "nonfinite_mismatch": mism,
    }


def _identical_result(n: int, max_ref: float) -> Dict[str, Any]:
    """The metrics the full pass gives for two equal arrays with ``n`` finite elements whose
    largest magnitude is ``max_ref`` (stored dtype with safe squares: the sums of squares are
    equal, finite and neither over- nor underflow when multiplied, so ``s / sqrt(s*s)`` is
    exactly 1)."""
    nan = float("nan")
    return {
        "n": n, "cosine": 1.0 if n else nan, "max_abs_err": 0.0 if n else nan, "max_rel_err": 0.0 if n else nan,
        "rmse": 0.0 if n else nan, "euclidean": 0.0, "mean_abs_err": 0.0 if n else nan,
        "within_1e-3": 1.0 if n else nan, "within_5e-3": 1.0 if n else nan,
        "max_abs_ref": max_ref, "nonfinite_mismatch": 0,
    }


def tensor_metrics(a: np.ndarray, b: np.ndarray, chunk: int = METRIC_CHUNK) -> Dict[str, Any]:
    """Metrics of ``a`` (compared) against ``b`` (reference), flattened, in float64.

    Non-finite values: positions where both hold the same NaN/±Inf agree; any other
    position where either is non-finite counts in ``nonfinite_mismatch``.  The error
    metrics use the positions where both are finite.  ``max_rel_err`` and the
    ``within_*`` shares use ``|a-b| / |b|`` (0 where both are 0, inf where only b is 0).
    ``cosine`` is NaN when exactly one side is all zeros, 1 when both are."""
    a, b = _real(a), _real(b)
    out: Dict[str, Any] = {"shape_a": tuple(a.shape), "shape_b": tuple(b.shape),
                           "np_dtype_a": str(a.dtype), "np_dtype_b": str(b.dtype)}
    if a.size != b.size:
        out.update({"error": f"element count differs: {a.size} vs {b.size}", "n": 0})
        return out
    acc = _Accumulator(min(chunk, max(1, a.size)), _squares_safe(a.dtype) and _squares_safe(b.dtype))
    with single_thread_blas(), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for ca, cb in zip(iter_chunks(a, chunk), iter_chunks(b, chunk)):
            acc.add(ca, cb)
    out.update(acc.result())
    return out


# --------------------------------------------------------------------------- files
def _streamable(layout: Layout) -> bool:
    """Data read straight from the file in C order: plain numbers, not complex, not a
    multi-dimensional Fortran-order array (those go through ``np.load``)."""
    shape, dtype, _offset, fortran = layout
    return dtype.kind in "biuf" and dtype.fields is None and not dtype.subdtype and not (fortran and len(shape) > 1)


class _Data:
    """The data region of one ``.npy`` file, read in order into reused buffers."""

    def __init__(self, path: str, layout: Layout):
        self.path, (self.shape, self.dtype, self.offset, _f) = path, layout
        self.count = math.prod(self.shape)
        self.nbytes = self.count * self.dtype.itemsize
        self.f = open(path, "rb", buffering=0)
        if os.fstat(self.f.fileno()).st_size < self.offset + self.nbytes:
            self.f.close()
            raise truncated(self.offset + self.nbytes, os.path.getsize(path), self.shape, self.dtype)
        if _SEQUENTIAL is not None:          # a larger readahead window (cold cache)
            try:
                os.posix_fadvise(self.f.fileno(), 0, 0, _SEQUENTIAL)
            except OSError:      # pragma: no cover - advice only
                pass
        self.rewind()

    def rewind(self) -> None:
        self.f.seek(self.offset)
        self.pos, self.advised = self.offset, self.offset

    def _advise(self, upto: int) -> None:
        """Keep ``READ_AHEAD`` bytes beyond ``upto`` announced to the kernel (WILLNEED), so a
        cold file streams from disk while the previous chunks are computed on."""
        if _WILLNEED is None or self.advised >= self.offset + self.nbytes or upto + READ_AHEAD // 2 < self.advised:
            return
        start, self.advised = self.advised, upto + READ_AHEAD
        try:
            os.posix_fadvise(self.f.fileno(), start, self.advised - start, _WILLNEED)
        except OSError:          # pragma: no cover - advice only
            pass

    def read_into(self, buf: bytearray, nbytes: int) -> memoryview:
        self._advise(self.pos + nbytes)
        self.pos += nbytes
        view = memoryview(buf)[:nbytes]
        got = 0
        while got < nbytes:
            r = self.f.readinto(view[got:])
            if not r:
                raise ValueError(f"{self.path}: the file ended after {self.offset + got} bytes (truncated while read)")
            got += r
        return view

    def close(self) -> None:
        self.f.close()


def _block_stats(x: np.ndarray) -> Tuple[int, float]:
    """(finite elements, largest finite magnitude as float64, 0 when none) of a block."""
    if x.size == 0:
        return 0, 0.0
    if x.dtype.kind == "f":
        mx, mn = x.max(), x.min()
        if not (math.isfinite(float(mx)) and math.isfinite(float(mn))):
            fin = np.isfinite(x)
            k = int(np.count_nonzero(fin))
            if k == 0:
                return 0, 0.0
            y = x[fin]
            mx, mn = y.max(), y.min()
            return k, max(abs(float(mx)), abs(float(mn)))
        return x.size, max(abs(float(mx)), abs(float(mn)))
    mx, mn = x.max(), x.min()
    return x.size, max(abs(float(mx)), abs(float(mn)))


def _identical(da: _Data, db: _Data) -> Optional[Dict[str, Any]]:
    """The metrics of two byte-identical data regions; None at the first differing byte."""
    size = da.dtype.itemsize
    block = max(size, COMPARE_BLOCK // size * size)
    ba, bb = _raw(0, min(block, max(1, da.nbytes))), _raw(1, min(block, max(1, da.nbytes)))
    n, max_ref, left = 0, 0.0, da.nbytes
    step_max = max(size, FIRST_BLOCK // size * size)    # a pair that differs mostly differs early
    while left > 0:
        step = min(step_max, block, left)
        step_max = block
        da.read_into(ba, step)
        db.read_into(bb, step)
        if not _same_bytes(ba, bb, step):
            return None
        k, r = _block_stats(np.frombuffer(bb, dtype=db.dtype, count=step // db.dtype.itemsize))
        n += k
        max_ref = max(max_ref, r)
        left -= step
    return _identical_result(n, max_ref)


SMALL_BYTES = 1 << 20       # data regions up to this size are read whole (one pread)
READ_AHEAD = 8 << 20        # bytes of a streamed file announced to the kernel ahead of the reads
_SEQUENTIAL = getattr(os, "POSIX_FADV_SEQUENTIAL", None)
_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
_DTYPE_NAMES: Dict[np.dtype, str] = {}


def _dtype_name(d: np.dtype) -> str:
    name = _DTYPE_NAMES.get(d)
    if name is None:
        name = _DTYPE_NAMES[d] = str(d)
    return name


def _raw(slot: int, nbytes: int) -> bytearray:
    """A byte buffer of at least ``nbytes`` kept per thread and slot (0: A, 1: B) for the next
    pair: a fresh 1 MB ``bytearray`` per pair is a memset and page faults, thousands of times."""
    bufs = getattr(_LOCAL, "raw", None)
    if bufs is None:
        bufs = _LOCAL.raw = [bytearray(), bytearray()]
    if len(bufs[slot]) < nbytes:
        bufs[slot] = bytearray(nbytes)
    return bufs[slot]


def _same_bytes(ba, bb, n: Optional[int] = None) -> bool:
    """The first ``n`` bytes (all, when None) of two buffers are equal (a ``memcmp`` for whole
    ``bytes``/``bytearray``; numpy's comparison for views and prefixes: a ``memoryview``'s
    own ``==`` unpacks byte by byte)."""
    if n is None:
        if isinstance(ba, (bytes, bytearray)) and isinstance(bb, (bytes, bytearray)):
            return ba == bb
        n = len(memoryview(ba))
        if n != len(memoryview(bb)):
            return False
    elif n == len(ba) == len(bb):
        return ba == bb
    if n == 0:
        return True
    return bool(np.array_equal(np.frombuffer(ba, np.uint8, n), np.frombuffer(bb, np.uint8, n)))


def _read_whole(path: str, layout: Layout, slot: int = 0) -> memoryview:
    """The data region of a small ``.npy`` file (size checked again: it may have changed),
    read into this thread's buffer ``slot`` (valid until the next read into that slot)."""
    shape, dtype, offset, _f = layout
    nbytes = math.prod(shape) * dtype.itemsize
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < offset + nbytes:
            raise truncated(offset + nbytes, size, shape, dtype)
        view = memoryview(_raw(slot, nbytes))[:nbytes]
        got = 0
        while got < nbytes:
            r = os.preadv(fd, [view[got:]], offset + got)
            if r <= 0:
                break
            got += r
    finally:
        os.close(fd)
    if got != nbytes:
        raise ValueError(f"truncated or corrupt: {got} of {nbytes} data bytes could be read")
    return view


def _small_metrics(ra: bytes, rb: bytes, la: Layout, lb: Layout, chunk: int) -> Dict[str, Any]:
    """Metrics of two data regions held in memory (same numbers as the streamed pass)."""
    dta, dtb = la[1], lb[1]
    safe = _squares_safe(dta) and _squares_safe(dtb)
    if dta == dtb and safe and _same_bytes(ra, rb):
        return _identical_result(*_block_stats(np.frombuffer(rb, dtype=dtb)))
    a, b = np.frombuffer(ra, dtype=dta), np.frombuffer(rb, dtype=dtb)
    acc = _Accumulator(min(chunk, max(1, a.size)), safe)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for s in range(0, a.size, chunk):
            acc.add(a[s:s + chunk], b[s:s + chunk])
    return acc.result()


def _stream_metrics(da: _Data, db: _Data, chunk: int) -> Dict[str, Any]:
    count = da.count
    m = min(chunk, max(1, count))
    acc = _Accumulator(m, _squares_safe(da.dtype) and _squares_safe(db.dtype))
    ra, rb = _raw(0, m * da.dtype.itemsize), _raw(1, m * db.dtype.itemsize)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for s in range(0, count, chunk):
            k = min(chunk, count - s)
            ca = np.frombuffer(da.read_into(ra, k * da.dtype.itemsize), dtype=da.dtype)
            cb = np.frombuffer(db.read_into(rb, k * db.dtype.itemsize), dtype=db.dtype)
            acc.add(ca, cb)
    return acc.result()


def _legacy_pair(path_a: str, path_b: str, chunk: int) -> Dict[str, Any]:
    """Through ``np.load`` (complex, Fortran order, structured dtypes)."""
    arrays = []
    for p in (path_a, path_b):
        try:
            arrays.append(load_checked(p))
        except Exception as e:  # noqa: BLE001 - one bad file must not stop the comparison
            return {"error": f"cannot read {p}: {e}", "unreadable": p, "n": 0}
    a, b = arrays
    try:
        return tensor_metrics(a, b, chunk)
    except Exception as e:  # noqa: BLE001
        return {"error": f"cannot compare: {type(e).__name__}: {e}", "unreadable": path_a, "n": 0}
    finally:
        del a, b, arrays


def pair_metrics(path_a: str, path_b: str, chunk: int = METRIC_CHUNK, layout_a: Optional[Layout] = None,
                 layout_b: Optional[Layout] = None) -> Dict[str, Any]:
    """:func:`tensor_metrics` of two ``.npy`` files (the same numbers), byte-identical data
    answered without a metric pass. ``layout_a``/``layout_b``: the files' :func:`npy_layout`
    when already known. A file that cannot be read gives ``{"error": reason, "unreadable":
    path}`` instead of raising (any reason)."""
    layouts = []
    for p, lay in ((path_a, layout_a), (path_b, layout_b)):
        try:
            layouts.append(lay if lay is not None else npy_layout(p))
        except Exception as e:  # noqa: BLE001 - one bad file must not stop the comparison
            return {"error": f"cannot read {p}: {e}", "unreadable": p, "n": 0}
    la, lb = layouts
    if not (_streamable(la) and _streamable(lb)):
        return _legacy_pair(path_a, path_b, chunk)
    out: Dict[str, Any] = {"shape_a": la[0], "shape_b": lb[0], "np_dtype_a": _dtype_name(la[1]),
                           "np_dtype_b": _dtype_name(lb[1])}
    ca, cb = math.prod(la[0]), math.prod(lb[0])
    if ca != cb:
        out.update({"error": f"element count differs: {ca} vs {cb}", "n": 0})
        return out
    if ca * max(la[1].itemsize, lb[1].itemsize) <= SMALL_BYTES:
        raw = []
        for slot, (p, lay) in enumerate(((path_a, la), (path_b, lb))):
            try:
                raw.append(_read_whole(p, lay, slot))
            except Exception as e:  # noqa: BLE001
                return {"error": f"cannot read {p}: {e}", "unreadable": p, "n": 0}
        try:
            with single_thread_blas():
                out.update(_small_metrics(raw[0], raw[1], la, lb, chunk))
        except Exception as e:  # noqa: BLE001
            return {"error": f"cannot compare: {type(e).__name__}: {e}", "unreadable": path_a, "n": 0}
        return out
    opened = []
    try:
        for p, lay in ((path_a, la), (path_b, lb)):
            try:
                opened.append(_Data(p, lay))
            except Exception as e:  # noqa: BLE001
                return {"error": f"cannot read {p}: {e}", "unreadable": p, "n": 0}
        da, db = opened
        try:
            with single_thread_blas():
                m = None
                if da.dtype == db.dtype and _squares_safe(da.dtype):
                    m = _identical(da, db)
                    if m is None:
                        da.rewind()
                        db.rewind()
                if m is None:
                    m = _stream_metrics(da, db, chunk)
        except Exception as e:  # noqa: BLE001
            return {"error": f"cannot compare: {type(e).__name__}: {e}", "unreadable": path_a, "n": 0}
        out.update(m)
        return out
    finally:
        for d in opened:
            d.close()


def _task(args) -> Any:
    """(index, path A, path B, bytes, layout A, layout B) -> (index, metrics)."""
    idx, pa, pb = args[:3]
    la = args[4] if len(args) > 4 else None
    lb = args[5] if len(args) > 5 else None
    return idx, pair_metrics(pa, pb, METRIC_CHUNK, la, lb)


def _batch(tasks) -> Any:
    """Several small pairs in one worker call (one round trip instead of many)."""
    return [_task(t) for t in tasks]
