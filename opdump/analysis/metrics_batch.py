"""The tensor metrics of many small pairs at once (compare's worker task for small pairs).

A dump of tens of thousands of 2 KB tensors used to cost one Python round of ~15 numpy
calls, four system calls per file and a fresh ``bytes`` per file for every pair.  Here a
batch of pairs is read into two buffers (one ``preadv`` per file, see
:func:`opdump.analysis.reader.npy.read_regions`), and for every group of pairs with the
same stored dtypes:

* the element-wise work is done once over the whole group: float64 conversion, ``|a-b|``,
  ``|b|``, ``|a-b|/|b|``, the finiteness test, the byte comparison;
* what is exact whatever the grouping -- maxima, counts -- is reduced per pair with
  ``ufunc.reduceat``;
* what depends on the order of additions -- the dot products (BLAS) and ``sum`` of
  ``|a-b|`` (numpy's pairwise sum) -- is still one call per pair on exactly the float64
  elements of that pair, each pair starting on a 64-byte boundary, as
  :class:`opdump.analysis.metrics._Accumulator` makes it on its single chunk;
* byte-identical pairs (same dtype, finite) skip the dot products: their metrics follow
  from the element count and ``max|B|`` (:func:`opdump.analysis.metrics._identical_result`).

Guarantee: every pair's dict equals :func:`opdump.analysis.metrics.pair_metrics` of the
same files to the last digit (tests/test_compare_batch_metrics.py checks it on the cases
of tests/test_compare_speed_equivalence.py).  Pairs this path does not cover -- more
than one metric chunk, an element count that differs, a dtype that is not plain numbers,
no known layout, a non-finite element, a file that cannot be read -- take the per-pair
path of :mod:`opdump.analysis.metrics` (the unreadable ones with its error texts).
Memory: two raw buffers and four float64 arrays of the batch's size (pool.py caps a
batch at a few MB).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .blas import single_thread_blas
from .metrics import (METRIC_CHUNK, READ_AHEAD, _dtype_name, _identical_result, _small_metrics, _squares_safe, _streamable,
                      _task, metrics_dict)
from .reader.npy import Layout, read_regions, will_need

__all__ = ["batch_metrics", "batchable"]

ALIGN = 8                   # float64 elements: each pair starts on a 64-byte boundary


_PLAIN: Dict[np.dtype, bool] = {}


def _plain(layout: Layout) -> bool:
    """:func:`opdump.analysis.metrics._streamable`, its dtype part looked up once per dtype."""
    p = _PLAIN.get(layout[1])
    if p is None:
        p = _PLAIN[layout[1]] = _streamable(((), layout[1], 0, False))
    return p and not (layout[3] and len(layout[0]) > 1)


def batchable(la: Optional[Layout], lb: Optional[Layout], chunk: int = METRIC_CHUNK) -> bool:
    """Two known layouts this module compares: plain numbers, the same number of elements,
    at least one and at most one metric chunk."""
    if la is None or lb is None:
        return False
    n = math.prod(la[0])
    return 0 < n <= chunk and n == math.prod(lb[0]) and _plain(la) and _plain(lb)


def batch_metrics(tasks: Sequence[tuple], read=read_regions) -> List[Tuple[Any, Dict[str, Any]]]:
    """(index, metrics) of every task ``(index, path A, path B, bytes, layout A, layout B)``,
    the metrics :func:`opdump.analysis.metrics.pair_metrics` gives (see the module).  ``read``:
    how a group's data regions are read (:func:`.reader.npy.read_regions`' contract; the
    compare's early workers pass one serving files they already hold whole)."""
    out: List[Tuple[Any, Dict[str, Any]]] = []
    groups: Dict[Tuple[np.dtype, np.dtype], List[tuple]] = {}
    alone = []
    for t in tasks:
        la = t[4] if len(t) > 4 else None
        lb = t[5] if len(t) > 5 else None
        if batchable(la, lb):
            groups.setdefault((la[1], lb[1]), []).append(t)
        else:
            alone.append(t)
    if len(alone) > 1:          # cold cache: the next pairs' files load while this one is computed
        will_need([r for t in alone[1:] for r in ((t[1], 0, READ_AHEAD), (t[2], 0, READ_AHEAD))])
    for t in alone:
        out.append(_task(t))
    with single_thread_blas(), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for (da, db), group in groups.items():
            out += _group(group, da, db, read)
    return out


_WORK = {}                  # per process: float64 and bool work arrays, grown to the largest batch


def _work(n: int):
    """Four float64 arrays and a bool array of ``n`` elements, reused from batch to batch
    (fresh multi-MB arrays per batch cost page faults)."""
    w = _WORK.get("w")
    if w is None or w[0].size < n:
        w = _WORK["w"] = tuple(np.empty(n, np.float64) for _ in range(4)) + (np.empty(n, np.bool_),)
    return tuple(x[:n] for x in w)


def _group(group: List[tuple], da: np.dtype, db: np.dtype, read=read_regions) -> List[Tuple[Any, Dict[str, Any]]]:
    counts = [math.prod(t[4][0]) for t in group]
    starts_l = []
    pos = 0
    for k in counts:
        starts_l.append(pos)
        pos += -(-k // ALIGN) * ALIGN
    total = pos + ALIGN                     # one pad after the last pair: every segment end is an index
    raw_a, raw_b = bytearray(total * da.itemsize), bytearray(total * db.itemsize)   # zeros: pads agree
    mva, mvb = memoryview(raw_a), memoryview(raw_b)
    isa, isb = da.itemsize, db.itemsize
    jobs = []
    for t, s, k in zip(group, starts_l, counts):
        jobs.append((t[1], t[4], mva[s * isa:(s + k) * isa]))
        jobs.append((t[2], t[5], mvb[s * isb:(s + k) * isb]))
    errs = read(jobs)
    seg = np.empty(2 * len(group), np.intp)             # [start0, end0, start1, end1, ...]: even results
    seg[0::2] = starts_l                                # are the pairs, odd ones the pads between them
    seg[1::2] = np.asarray(starts_l, np.intp) + np.asarray(counts, np.intp)

    def per_pair(ufunc, x, **kw):
        return ufunc.reduceat(x, seg, **kw)[0::2].tolist()

    xa, xb, d, t, ge = _work(total)
    np.copyto(xa, np.frombuffer(raw_a, da), casting="unsafe")     # the float64 conversion of xa[...] = ca
    np.copyto(xb, np.frombuffer(raw_b, db), casting="unsafe")
    np.subtract(xa, xb, out=d)
    np.abs(d, out=d)
    np.abs(xb, out=t)
    max_ref = per_pair(np.maximum, t)       # NaN/Inf where B has one
    max_abs = per_pair(np.maximum, d)       # NaN/Inf where A has one (or |a-b| overflows: float64)
    np.divide(d, t, out=t)                  # 0/0 -> NaN (an exact zero: relative error 0)
    max_rel = per_pair(np.fmax, t)
    top = max((x for x in max_rel if x == x), default=0.0)
    ge1 = per_pair(np.add, np.greater_equal(t, 1e-3, out=ge), dtype=np.intp) if top >= 1e-3 else None
    ge5 = per_pair(np.add, np.greater_equal(t, 5e-3, out=ge), dtype=np.intp) if top >= 5e-3 else None
    safe = _squares_safe(da) and _squares_safe(db)
    name_a, name_b = _dtype_name(da), _dtype_name(db)
    isfinite, dot, add = math.isfinite, np.dot, np.add.reduce
    out: List[Tuple[Any, Dict[str, Any]]] = []
    for i, task in enumerate(group):
        idx, la, lb = task[0], task[4], task[5]
        ea, eb = errs[2 * i], errs[2 * i + 1]
        if ea is not None or eb is not None:
            p, e = (task[1], ea) if ea is not None else (task[2], eb)
            out.append((idx, {"error": f"cannot read {p}: {e}", "unreadable": p, "n": 0}))
            continue
        k, s = counts[i], starts_l[i]
        m = {"shape_a": la[0], "shape_b": lb[0], "np_dtype_a": name_a, "np_dtype_b": name_b}
        mabs, mref = max_abs[i], max_ref[i]
        if isfinite(mabs) and isfinite(mref):
            if mabs == 0.0 and safe:
                # equal values, all finite, squares that cannot overflow: the pass would find
                # cosine s/sqrt(s*s) = 1 and every error 0 -- the byte-identical result
                m.update(_identical_result(k, max(0.0, mref)))
                out.append((idx, m))
                continue
            e = s + k
            va, vb, vd = xa[s:e], xb[s:e], d[s:e]
            saa, sbb = float(dot(va, va)), float(dot(vb, vb))
            if isfinite(saa) and isfinite(sbb) or not safe:
                mr = max_rel[i]
                m.update(metrics_dict(0 + k, 0.0 + float(dot(va, vb)), 0.0 + saa, 0.0 + sbb,
                                      0.0 + float(dot(vd, vd)), 0.0 + float(add(vd)), max(0.0, mabs),
                                      max(0.0, mr) if mr == mr else 0.0, max(0.0, mref),
                                      0 + (k - ge1[i] if ge1 is not None else k),
                                      0 + (k - ge5[i] if ge5 is not None else k), 0))
                out.append((idx, m))
                continue
        # NaN/Inf in the pair: the per-pair pass on this pair's bytes
        ra, rb = bytes(mva[s * isa:(s + k) * isa]), bytes(mvb[s * isb:(s + k) * isb])
        try:
            m.update(_small_metrics(ra, rb, la, lb, METRIC_CHUNK))
        except Exception as e:  # noqa: BLE001 - as pair_metrics reports it
            m = {"error": f"cannot compare: {type(e).__name__}: {e}", "unreadable": task[1], "n": 0}
        out.append((idx, m))
    return out
