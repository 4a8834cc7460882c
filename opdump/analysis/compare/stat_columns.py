"""Statistics-only pairs judged column-wise: every statistics pair of a compare at once,
numpy over the columns (max, min, avg, l2norm, the NaN/Inf counts), instead of one Python
call per pair.

Why: a statistics-only compare of 100,000+ rows spent a quarter of its time in the
per-pair verdict (:func:`.verdict._stats_verdict` and
:func:`opdump.analysis.common.stats_nonfinite`, each a dozen dict look-ups and float
conversions per row).

Guarantee: the same verdict, reason, metrics (same keys, same Python floats, to the last
digit) and ``identical`` as :func:`.verdict.judge_pair` gives pair by pair -- the rules
below are that function's, step by step, in the same order (the first statistic that
decides wins, ties to the first in ``max, min, avg, l2norm`` order, an Inf mismatch to
the last); tests/test_compare_stat_columns.py checks it against the per-pair code on
generated rows (NaN, Inf, missing and malformed cells, MD5, counts).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .pairs import Pair
from .stat_cells import per_distinct

__all__ = ["judge_statistics", "judge_columns", "nonfinite_codes", "nonfinite_codes_of", "column_of_values"]

_VALUES = ("max", "min", "avg", "l2norm")            # verdict._STATS_FOR_COMPARE, in its order
_COUNTS = ("nan_count", "positive_inf_count", "negative_inf_count")
_NUMBER_TYPES = frozenset({float, int, type(None)})


def _f(v: Any) -> Optional[float]:
    """``float(v)``, None when it is not a number (:func:`opdump.analysis.common.stats_nonfinite`'s rule)."""
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _column(rows: Sequence[Dict[str, Any]], key: str) -> Tuple[np.ndarray, np.ndarray]:
    """(values, known) of ``key`` over ``rows``: ``common._f`` of each cell (float, or None
    when missing or not a number), as float64 with ``known`` False where it is None."""
    return column_of_values([r.get(key) for r in rows])


def column_of_values(vals: List[Any]) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`_column` of the cells ``vals`` (one per row; None where the row lacks the key)."""
    if not set(map(type, vals)) <= _NUMBER_TYPES:
        vals = [_f(v) for v in vals]
    obj = np.empty(len(vals), dtype=object)
    obj[:] = vals
    known = np.not_equal(obj, None)
    arr = obj.astype(np.float64)                     # None -> NaN, masked by ``known``
    return arr, known.astype(bool)


def nonfinite_codes(rows: Sequence[Dict[str, Any]], columns: Optional[Dict[str, Tuple]] = None) -> np.ndarray:
    """:func:`opdump.analysis.common.stats_nonfinite` of every row: 1 (True), 0 (False),
    -1 (None: cannot tell).  ``columns``: :func:`_column` of the value keys, when already read."""
    return nonfinite_codes_of(lambda k: _column(rows, k), len(rows), columns)


def nonfinite_codes_of(column, n: int, columns: Optional[Dict[str, Tuple]] = None) -> np.ndarray:
    """:func:`nonfinite_codes` with ``column(key)`` giving :func:`_column` of a key."""
    columns = columns or {}
    count, kc = column("count")
    size, ks = column("data_size")
    empty = (kc & (count == 0)) | (ks & (size == 0))
    any_pos = np.zeros(n, bool)
    have_all = np.ones(n, bool)
    for k in _COUNTS:
        v, kv = column(k)
        known = kv & ~np.isnan(v)
        any_pos |= known & (v > 0)
        have_all &= known
    any_inf = np.zeros(n, bool)
    any_nan = np.zeros(n, bool)
    any_known = np.zeros(n, bool)
    for k in _VALUES:
        v, kv = columns[k] if k in columns else column(k)
        any_inf |= kv & np.isinf(v)
        any_nan |= kv & np.isnan(v)
        any_known |= kv
    out = np.where(have_all | any_known, 0, -1)
    out = np.where(any_nan, np.where(have_all, 0, 1), out)
    out = np.where(any_inf | any_pos, 1, out)
    return np.where(empty, 0, out).astype(np.int8)


def judge_statistics(pairs: List[Pair], th, tolerance, random_rule) -> None:
    """Judge statistics-only ``pairs`` (both sides have a statistics row, no file) as
    :func:`.verdict.judge_pair` does: verdict, reason, metrics, ``identical``.
    ``tolerance(dtype)`` is :func:`.verdict.same_dtype_tolerance`, ``random_rule(p)`` the
    random-operator rule (passed in: this module is below :mod:`.verdict`)."""
    if not pairs:
        return
    from .stat_gather import gathered_columns          # columns read from the records tables
    got = gathered_columns(pairs, _VALUES, column_of_values)
    if got is not None:
        column_a, column_b, md5_a, md5_b, has_any = got
    else:                                                 # the row dicts, pair by pair
        ra = [p.a.row for p in pairs]
        rb = [p.b.row for p in pairs]
        has_any = [any(k in x and k in y for k in _VALUES) for x, y in zip(ra, rb)]
        md5_a, md5_b = [x.get("md5") for x in ra], [y.get("md5") for y in rb]

        def column_a(k):
            return _column(ra, k)

        def column_b(k):
            return _column(rb, k)
    same = [p.same_dtype for p in pairs]
    out = judge_columns(column_a, column_b, len(pairs), md5_a, md5_b, has_any, same,
                        [p.a.dtype for p in pairs], th, tolerance)
    for p, v, why, extra, ident in zip(pairs, *out):
        p.mode = "statistics"
        p.metrics.update(extra)
        p.verdict, p.reason = v, why
        p.identical = ident
        random_rule(p)


def judge_columns(column_a, column_b, n: int, md5_a: List[Any], md5_b: List[Any], has_any: List[bool],
                  same_dtype: List[bool], dtype_a: List[Any], th, tolerance):
    """The column core of :func:`judge_statistics`: ``column_a(key)``/``column_b(key)`` give
    :func:`_column` of a key over A's/B's rows (pair by pair), ``md5_*`` the MD5 cells,
    ``has_any`` whether both rows hold one of max/min/avg/l2norm, ``same_dtype`` and
    ``dtype_a`` what :class:`.pairs.Pair` says.  Returns (verdicts, reasons, metrics dicts,
    identical) lists, before the random-operator rule."""
    col_a = {k: column_a(k) for k in _VALUES}
    col_b = {k: column_b(k) for k in _VALUES}
    na, nb = nonfinite_codes_of(column_a, n, col_a), nonfinite_codes_of(column_b, n, col_b)
    no_md5 = md5_a.count(None) == n or md5_b.count(None) == n        # no MD5 column: nothing to read
    md5 = np.zeros(n, bool) if no_md5 else np.fromiter(
        (isinstance(ma, str) and isinstance(mb, str) and bool(ma) and bool(mb) and ma == mb
         for ma, mb in zip(md5_a, md5_b)), dtype=bool, count=n)
    nf_diverged = ~md5 & (na >= 0) & (nb >= 0) & (na != nb)
    live = ~md5 & ~nf_diverged
    either_nf = (na == 1) | (nb == 1)
    worst = np.zeros(n)
    worst_all = np.zeros(n)
    worst_k = np.full(n, -1, np.int8)
    nan_k = np.full(n, -1, np.int8)                   # the statistic whose NaN on one side decides
    values = []
    scale = _magnitude(col_a, col_b, n)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for ki, k in enumerate(_VALUES):
            a, ka = col_a[k]
            b, kb = col_b[k]
            values.append((a, b))
            both = live & ka & kb
            nan_a, nan_b = np.isnan(a), np.isnan(b)
            has_nan = both & (nan_a | nan_b)
            decides = has_nan & (nan_a != nan_b) & ~either_nf
            nan_k[decides] = ki
            live &= ~decides
            fin = both & ~has_nan
            inf = fin & (np.isinf(a) | np.isinf(b))
            inf_diff = inf & (a != b)
            worst[inf_diff] = np.inf
            worst_all[inf_diff] = np.inf
            worst_k[inf_diff] = ki
            d = np.abs(a - b)
            own = np.maximum(np.abs(a), np.abs(b))
            rel_scale = d / np.maximum(own, scale)      # identity: against the tensors' magnitude
            rel = rel_scale if k == "avg" else d / own
            differ = fin & ~inf & (d != 0.0)
            worst_all = np.where(differ, np.maximum(worst_all, rel_scale), worst_all)
            upd = differ & ~(d <= th.stat_atol) & (rel > worst)
            worst = np.where(upd, rel, worst)
            worst_k[upd] = ki
    return _results(n, md5, nf_diverged, nan_k, worst, worst_all, worst_k, na, nb, values, md5_a, md5_b,
                    has_any, same_dtype, dtype_a, th, tolerance)


def _magnitude(col_a, col_b, n: int) -> np.ndarray:
    """:func:`.verdict._magnitude` of every pair: the largest finite ``|max|``/``|min|`` of
    its two rows, 0.0 when none."""
    m = np.zeros(n)
    with np.errstate(invalid="ignore"):
        for col in (col_a, col_b):
            for k in ("max", "min"):
                v, known = col[k]
                v = np.abs(v)
                use = known & np.isfinite(v) & (v > m)
                m = np.where(use, v, m)
    return m


def _results(n, md5, nf_diverged, nan_k, worst, worst_all, worst_k, na, nb, values, md5_a, md5_b, has_any,
             same_dtype, dtype_a, th, tolerance):
    """The per-pair lists of :func:`judge_columns` from its columns, the rules of the
    per-pair code case by case (in its order: MD5, NaN/Inf on one side, a NaN statistic,
    then the worst relative difference), each case filled over its rows at once."""
    wk, nk = worst_k.tolist(), nan_k.tolist()
    worst_l, worst_all_l = worst.tolist(), worst_all.tolist()
    case = np.where(md5, 0, np.where(nf_diverged, 1, np.where(nan_k >= 0, 2, 3)))
    verdicts: List[Any] = [None] * n
    reasons: List[Any] = [None] * n
    extras: List[Any] = [None] * n
    for i in np.flatnonzero(case == 0).tolist():
        verdicts[i], reasons[i] = "pass", "identical (MD5)"
        extras[i] = {"stat_max_rel_diff": 0.0, "stat_rel_diff_all": 0.0}
    for i in np.flatnonzero(case == 1).tolist():
        verdicts[i], reasons[i], extras[i] = "diverged", "NaN/Inf in " + ("A only" if na[i] == 1 else "B only"), {}
    for i in np.flatnonzero(case == 2).tolist():
        k = nk[i]
        verdicts[i], extras[i] = "diverged", {}
        reasons[i] = f"{_VALUES[k]}: {float(values[k][0][i])} vs {float(values[k][1][i])}"
    rest = case == 3
    for i in np.flatnonzero(rest & (worst_k < 0)).tolist():
        verdicts[i] = "pass"
        reasons[i] = "statistics agree" if has_any[i] else "no comparable statistics"
    fail, warn = th.stat_fail, th.stat_warn
    for i in np.flatnonzero(rest & (worst_k >= 0)).tolist():
        w = worst_l[i]
        reasons[i] = f"{_VALUES[wk[i]]} differs by {w:.3g} (relative)"
        verdicts[i] = "diverged" if w > fail else "warning" if w > warn else "pass"
    for i in np.flatnonzero(rest).tolist():
        extras[i] = {"stat_max_rel_diff": worst_l[i], "stat_rel_diff_all": worst_all_l[i]}
    # identical (verdict._stats_identical): MD5 on both sides decides; else NaN/Inf codes
    # that disagree; else the largest difference within the dtype's tolerance
    both_md5 = np.zeros(n, bool) if md5_a.count(None) == n or md5_b.count(None) == n else np.fromiter(
        (isinstance(ma, str) and isinstance(mb, str) and bool(ma) and bool(mb) for ma, mb in zip(md5_a, md5_b)),
        dtype=bool, count=n)
    tol = np.asarray(per_distinct(tolerance, list(dtype_a)), dtype=np.float64).reshape(n)  # once per dtype
    diff = np.where(rest, worst_all, 0.0)
    with np.errstate(invalid="ignore"):
        within = diff <= tol
    ident = np.where(both_md5, md5, np.where((na >= 0) & (nb >= 0) & (na != nb), False, within)).tolist()
    identical = [x if s else None for x, s in zip(ident, same_dtype)]
    return verdicts, reasons, extras, identical
