"""A tensor-file compare, column by column: pairs made as a join of the records' columns,
verdicts and table built from columns (:mod:`.tensor_pairs`) instead of one
:class:`.pairs.Tensor` and :class:`.pairs.Pair` per file.

Why: a dump of 32,700 small tensors per side spent ~2 s of one core in per-pair Python
(tensor records, matching, verdicts, table, sorting) around ~0.7 s of metric work.

When it applies (:func:`tensor_compare` returns None otherwise and ``compare`` runs the
per-pair stages): the default matchers (no mapping, no kernel dump); every compared record
of both dumps is a tensor file without a statistics row, with a dtype name; every file's
``.npy`` header reads (an unreadable file is reported by the per-pair stages); and, for
every iteration pair, A's records and B's records are the same sequence of tensors -- the
conditions of :mod:`.stat_fast`, with the shape taken from the headers (what
:class:`.pairs.Tensor` compares).

Guarantee (tests/test_compare_tensor_fast.py checks it against the per-pair stages,
``OPDUMP_COMPARE_FAST=0``): the same table (values, dtypes, row order; the CSV byte for
byte), summary, first difference and first divergence.  Why the pairs are the same: the
argument of :mod:`.stat_fast` (equal sequences align position by position; its join is
:func:`.stat_fast._pair_rank` itself), with the value tie-break's fingerprints of tensor
files -- ``hash`` of the last 64 KiB of each output file, :func:`.match._fingerprint` --
given to that join as a fingerprint column, read only for the calls that tie.
``OPDUMP_COMPARE_FAST=0`` turns this path off (as it does the statistics one).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .pairs import _shape_text
from ..undefined import UndefinedInputs
from .stat_fast import (_dclass, _its, _pair_rank, _positions, _tie_groups, enabled, iteration_pairs_of,
                        usable_sides)

__all__ = ["tensor_compare"]

#: the column the tie-break fingerprints travel in (one of match.STAT_KEYS; absent from tensor records)
_FP_COLUMN = "md5"
_TIE_COLS = ("kind", "graph", "op_file", "call", "op", "op_type", "io", "slot", "shape")


def _usable(rec) -> bool:
    """Tensor files only: a path and a dtype name per row, no statistics row, no fingerprint column."""
    if rec.empty or _FP_COLUMN in rec.columns:
        return False
    paths = rec["path"].tolist()
    if not all(type(p) is str and p for p in paths):
        return False
    if "stat_row" in rec.columns and any(v is True for v in rec["stat_row"].tolist()):
        return False
    return all(type(d) is str and d for d in rec["dtype"].tolist())


def _with_layouts(rec, layouts: Callable[..., List[Any]]):
    """(frame with ``shape`` the header shapes' text, layouts) or None when a header cannot be
    read.  The files' sizes are the scan's (``nbytes``: one system call a file less)."""
    sizes = rec["nbytes"].tolist() if "nbytes" in rec.columns else None
    if sizes is not None and not all(type(x) is int for x in sizes):
        sizes = None
    lays = layouts(rec["path"].tolist(), sizes)
    if any(isinstance(x, Exception) for x in lays):
        return None
    texts = [_shape_text(x[0]) for x in lays]
    rec = rec.copy()
    rec["shape"] = texts                               # Tensor.shape_text() of the header's shape
    return rec, lays


def _tail_hash(path: str) -> Optional[int]:
    from .match import _tail
    try:
        return hash(_tail(path))
    except OSError:
        return None


def _fingerprints(sa, sb, it_a, it_b, it_pairs, tails: Optional[Dict[str, int]] = None) -> bool:
    """Give ``sa``/``sb`` the fingerprint column of the rows the value tie-break looks at (the
    output files of calls that tie, :func:`.stat_fast._tie_groups` on A's rows, and B's rows
    at the same places); False when a file's tail cannot be read (the per-pair stages decide).
    ``tails``: path -> the same hash, from the bytes the workers read (:mod:`.tensor_ahead`);
    other files are read here."""
    tails = tails or {}
    pos_a, pos_b = _positions(it_a), _positions(it_b)
    arr = {c: sa[c].to_numpy(dtype=object) for c in _TIE_COLS}
    dclass = np.empty(len(sa), dtype=object)
    dclass[:] = _dclass(sa)
    need_a: Dict[int, None] = {}
    need_b: Dict[int, None] = {}
    memo: Dict[tuple, list] = {}
    for ia, ib in it_pairs:
        pa = pos_a.get(ia)
        pb = pos_b.get(ib)
        if pa is None or pb is None or len(pa) != len(pb):
            continue                                   # _pair_rank refuses it
        block = [arr[c][pa].tolist() for c in _TIE_COLS] + [dclass[pa].tolist()]
        try:
            key = tuple(tuple(x) for x in block)
            groups = memo.get(key)
        except TypeError:
            key, groups = None, None
        if groups is None:
            groups = _tie_groups(*block)
            if key is not None:
                memo[key] = groups
        for group in groups:
            for _, fp in group:
                for o in fp:
                    need_a[int(pa[o])] = None
                    need_b[int(pb[o])] = None
    for frame, need in ((sa, need_a), (sb, need_b)):
        col: List[Any] = [None] * len(frame)
        paths = frame["path"].tolist()
        for r in need:
            h = tails.get(paths[r])
            if h is None:
                h = _tail_hash(paths[r])
            if h is None:
                return False
            col[r] = h
        frame[_FP_COLUMN] = col
    return True


def tensor_compare(da, db, rank_pairs, iterations, io, include_parameters, thresholds, check_samples,
                   iteration_pairs, sources, layouts, run_metrics, workers=None, parallel_min=64,
                   progress=False) -> Optional[Any]:
    """The :class:`.result.CompareResult` of a tensor-file compare built column-wise, or None
    when this path does not apply (module doc).  ``check_samples``, ``iteration_pairs``,
    ``sources`` and ``layouts`` are ``compare``'s own helpers; ``run_metrics(tasks)`` gives
    the metrics of compare's tasks by index (:func:`.pool.run_pairs`); ``workers`` and
    ``parallel_min`` its pool's, with which the workers start on the files position by
    position before the pairs are made (:mod:`.tensor_ahead`; ``progress``: its bar)."""
    if not enabled():
        return None
    raw = usable_sides(da, db, rank_pairs, io, include_parameters, check_samples, _usable)
    if raw is None:
        return None
    its = []
    for sa, sb in raw:
        it_a, it_b = _its(sa), _its(sb)
        its.append((it_a, it_b, iteration_pairs_of(it_a, it_b, iterations, iteration_pairs)))
    from . import tensor_ahead
    ahead = tensor_ahead.start(raw, [tensor_ahead.positions_of(a, b, p, _positions) for a, b, p in its],
                               workers, parallel_min, progress)
    try:
        return _columns(da, db, raw, its, rank_pairs, thresholds, sources, layouts, run_metrics, ahead)
    finally:
        if ahead is not None:
            ahead.close()


def _columns(da, db, raw, its, rank_pairs, thresholds, sources, layouts, run_metrics, ahead) -> Optional[Any]:
    """:func:`tensor_compare` once the sides are usable: headers, pairs, metrics, result."""
    sides, originals, lays, parts = [], [], [], []
    all_it: List[Tuple[int, int]] = []
    if ahead is not None:                              # the headers the workers read (.tensor_ahead)
        layouts = ahead.layouts(layouts)
    for (sa, sb), (it_a, it_b, it_pairs) in zip(raw, its):
        xa, xb = _with_layouts(sa, layouts), _with_layouts(sb, layouts)
        if xa is None or xb is None:
            return None
        originals.append((sa, sb))                     # the records as Tensor.row holds them
        (sa, la), (sb, lb) = xa, xb
        if not _fingerprints(sa, sb, it_a, it_b, it_pairs, ahead.tails if ahead is not None else None):
            return None
        part = _pair_rank(sa, sb, it_a, it_b, it_pairs)
        if part is None:
            return None
        all_it += [p for p in it_pairs if p[0] is not None and p not in all_it]
        sides.append((sa, sb))
        lays.append((la, lb))
        parts.append(part)
    if not any(len(p[0]) for p in parts):
        return None
    from .tensor_pairs import TensorPairs, finish_tensor_result
    metrics = run_metrics
    if ahead is not None:
        def metrics(tasks):
            got, rest = ahead.take(tasks)
            out = run_metrics(rest) if rest else {}
            out.update(got)
            return out
    tp = TensorPairs.build(sides, originals, lays, parts, thresholds, metrics,
                           (UndefinedInputs(da), UndefinedInputs(db)))
    return finish_tensor_result(da, db, tp, rank_pairs, all_it, thresholds, sources)
