"""The precision-noise rule (:mod:`.noise_floor`) on the columns of a statistics-only
compare: no :class:`.pairs.Pair` record made.

Why: a bf16-autocast run against an fp32 one has a diverged pair in most operator calls, and
:func:`.noise_floor.demote_columns` made a Pair (two Tensors with their row dicts) for every
pair of those calls before judging them row by row: ~0.5 s of a 4.8 s statistics compare
of MobileBERT (150,000 rows a side).  Here the bound of each call and the error of each
output pair are computed over numpy columns; Python objects are made only for the
fingerprints of the pairs that can carry a demotion (the outputs demoted, the candidate
inputs of the same calls), then the value-moving calls' outputs (``op_type`` column;
:func:`.noise_floor.moves_values`) as :func:`.noise_floor.demote_noise` reads them.

When: every pair that holds a candidate verdict and both sides is a statistics pair
(``mode`` ``statistics``), and the pairs know their side frames and rows (``sp.sides``,
``row_a``/``row_b``/``side`` columns, as :class:`.stat_pairs.StatPairs` has them).  Otherwise
(tensor-file pairs) :func:`.noise_floor.demote_columns` runs as before.

Guarantee (tests/test_compare_noise_columns.py checks it against :func:`.noise_floor.demote_noise`
on generated columns, NaN/Inf/None/text cells, counts 0/1, repeated fingerprints): the
same verdicts and reasons, to the text, as :func:`.noise_floor.demote_columns`.  The floats
are the same IEEE operations (abs, subtraction, division by a correctly rounded square
root, the maximum), in float64 as Python's floats are.
"""
from __future__ import annotations

import math
from itertools import compress
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .noise_floor import (CANDIDATE_VERDICTS, NO_DATA_VERDICTS, _eps, carried_reason, compared_dtypes, demote_columns,
                          lowest_precision, moved_reason, moves_values)
from .stat_calls import _call_keys

__all__ = ["demote_stat_columns"]

_STATS = ("max", "min", "avg", "l2norm")
_FINGER = _STATS + ("count", "md5")


def _as_float(v: Any) -> Tuple[float, bool]:
    """(float(v), True), or (nan, False) where ``float(v)`` raises (None, text, pd.NA)."""
    try:
        return float(v), True
    except (TypeError, ValueError):
        return math.nan, False


class _Cells:
    """A side frame's cells as its row dicts hold them (``Series.tolist()``: what
    :func:`.fields.make_tensors` puts in ``Tensor.row``), taken at the rows asked for."""

    def __init__(self, sides):
        self.sides = sides

    def column(self, s: int, tag: int, col: str):
        frame = self.sides[s][tag]
        return frame[col] if col in frame.columns else None

    def take(self, s: int, tag: int, col: str, rows: List[int]) -> Optional[list]:
        """The cells of ``col`` at ``rows`` (None: no such column)."""
        ser = self.column(s, tag, col)
        if ser is None:
            return None
        dt = ser.dtype
        if isinstance(dt, np.dtype) and dt.kind in "ifbO":          # numpy's tolist: Series.tolist's cells
            return ser.to_numpy()[np.asarray(rows, dtype=np.int64)].tolist()
        return ser.iloc[rows].tolist()

    def floats(self, side: np.ndarray, rows: np.ndarray, tag: int, col: str) -> Tuple[np.ndarray, np.ndarray]:
        """(value, convertible) of ``col`` at (``side``, ``rows``), float64; a missing column:
        not convertible (``row.get`` is None)."""
        val = np.full(len(rows), np.nan)
        ok = np.zeros(len(rows), dtype=bool)
        for s in np.unique(side).tolist():
            at = np.flatnonzero(side == s)
            ser = self.column(s, tag, col)
            if ser is None:
                continue
            dt = ser.dtype
            r = rows[at]
            if isinstance(dt, np.dtype) and dt.kind in "if":     # every cell a Python float/int
                val[at] = ser.to_numpy()[r].astype(np.float64)
                ok[at] = True
                continue
            got = [_as_float(x) for x in self.take(s, tag, col, r.tolist())]
            val[at] = [v for v, _ in got]
            ok[at] = [k for _, k in got]
        return val, ok


def _finite(val: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """``noise_floor._finite``: the value where convertible and finite, else NaN."""
    return np.where(ok & np.isfinite(val), val, np.nan)


def _errors(cells: _Cells, side, ra, rb) -> np.ndarray:
    """``noise_floor._stat_error`` per pair (NaN for None)."""
    m = len(ra)
    worst = np.zeros(m)
    seen = np.zeros(m, dtype=bool)
    unknown = np.zeros(m, dtype=bool)
    n_b = _finite(*cells.floats(side, rb, 1, "count"))
    n_a = _finite(*cells.floats(side, ra, 0, "count"))
    n = np.where(np.isnan(n_b) | (n_b == 0), n_a, n_b)       # finite(b) or finite(a)
    for k in _STATS:
        a, oka = cells.floats(side, ra, 0, k)
        b, okb = cells.floats(side, rb, 1, k)
        both = oka & okb
        fin = np.isfinite(a) & np.isfinite(b)
        with np.errstate(invalid="ignore"):
            same_nonfinite = (a == b) | (np.isnan(a) & np.isnan(b))
        unknown |= both & ~fin & ~same_nonfinite
        use = both & fin
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.abs(a - b)
            if k == "l2norm":
                div = use & (n > 1)
                d = np.where(div, d / np.sqrt(np.where(div, n, 1.0)), d)
        worst = np.where(use, np.maximum(worst, np.where(use, d, 0.0)), worst)
        seen |= use
    return np.where(seen & ~unknown, worst, np.nan)


def _scales(cells: _Cells, side, rb) -> np.ndarray:
    """``noise_floor._scale`` of statistics pairs: max(|max|, |min|) of B, finite ones (NaN: None)."""
    mx = np.abs(_finite(*cells.floats(side, rb, 1, "max")))
    mn = np.abs(_finite(*cells.floats(side, rb, 1, "min")))
    return np.fmax(mx, mn)


def demote_stat_columns(sp, keys_of=None) -> None:
    """The rule on ``sp.cols`` (``verdict``/``reason`` changed in place), column-wise when the
    module doc's condition holds, else by :func:`.noise_floor.demote_columns`.  ``keys_of``:
    a callable giving A's call keys (:class:`.stat_calls._KeysOnce`, shared with the summary
    that reads the same keys after this; the rule changes no column they are made of)."""
    c = sp.cols
    if keys_of is None:
        def keys_of():
            return _call_keys(c)
    verdicts, reasons = c["verdict"], c["reason"]
    n = len(verdicts)
    is_cand = np.fromiter(map(CANDIDATE_VERDICTS.__contains__, verdicts), dtype=bool, count=n)
    if not is_cand.any() or all(c["same"]):
        return
    has_a, has_b = c.get("has_a"), c.get("has_b")
    kind, mode = c["kind"], c["mode"]
    compared = (np.fromiter(map("op".__eq__, kind), dtype=bool, count=n)
                & np.fromiter(map(("tensor", "statistics").__contains__, mode), dtype=bool, count=n)
                & ~np.fromiter(map(NO_DATA_VERDICTS.__contains__, verdicts), dtype=bool, count=n))
    if has_a is not None:
        compared &= np.fromiter(map(bool, has_a), dtype=bool, count=n) & np.fromiter(map(bool, has_b), dtype=bool,
                                                                                     count=n)
    stat = np.fromiter(map("statistics".__eq__, mode), dtype=bool, count=n)
    if (compared & ~stat).any() or not hasattr(sp, "sides") or "row_a" not in c:
        demote_columns(verdicts, reasons, c["same"], keys_of, sp.tensors,
                       lambda: compared_dtypes(c["dtype_a"], c["dtype_b"], kind, mode, verdicts))
        return
    low = lowest_precision(compress(zip(c["dtype_a"], c["dtype_b"]), compared.tolist()))
    if low is None:
        return
    cand = np.flatnonzero(is_cand & compared).tolist()
    keys = keys_of()
    want = set(map(keys.__getitem__, cand))
    if not want:
        return
    calls: Dict[tuple, List[int]] = {}
    for i in np.flatnonzero(compared).tolist():
        if keys[i] in want:
            calls.setdefault(keys[i], []).append(i)
    idx = [i for members in calls.values() for i in members]          # the rule's reading order
    call_no = np.asarray([j for j, members in enumerate(calls.values()) for _ in members], dtype=np.int64)
    side = np.asarray([c["side"][i] for i in idx], dtype=np.int64)
    ra = np.asarray([c["row_a"][i] for i in idx], dtype=np.int64)
    rb = np.asarray([c["row_b"][i] for i in idx], dtype=np.int64)
    io = [c["io"][i] for i in idx]
    is_in = np.fromiter((x == "input" for x in io), dtype=bool, count=len(idx))
    is_out = np.fromiter((x == "output" for x in io), dtype=bool, count=len(idx))
    at_cand = np.fromiter((verdicts[i] in CANDIDATE_VERDICTS for i in idx), dtype=bool, count=len(idx))
    eps_b = np.fromiter((_eps(c["dtype_b"][i]) is not None for i in idx), dtype=bool, count=len(idx))
    cells = _Cells(sp.sides)
    scale = np.where(is_in & eps_b, _scales(cells, side, rb), np.nan)
    top = np.full(len(calls), np.nan)
    has = ~np.isnan(scale)
    np.fmax.at(top, call_no[has], scale[has])                          # max(scales) per call, NaN: none
    bound = low[0] * top[call_no]
    out_at = np.flatnonzero(is_out & at_cand & ~np.isnan(bound))
    err = np.full(len(idx), np.nan)
    if len(out_at):
        err[out_at] = _errors(cells, side[out_at], ra[out_at], rb[out_at])
    with np.errstate(invalid="ignore"):
        demoted = np.flatnonzero(is_out & at_cand & ~np.isnan(err) & (err <= bound)).tolist()
    if not demoted:
        return
    carried: Dict[tuple, Tuple[int, float]] = {}
    bounds: Dict[int, float] = {}                       # pair demoted -> the bound it was judged by
    for j, fp in zip(demoted, _fingerprints(c, cells, [idx[j] for j in demoted])):
        i, e, bd = idx[j], float(err[j]), float(bound[j])
        was = reasons[i] or verdicts[i]
        verdicts[i] = "warning"
        reasons[i] = (f"max abs error its statistics show {e:.3g} is below the inputs' {low[1]} rounding "
                      f"(eps × max|input| = {bd:.3g}): rounding noise, not a divergence (was: {was})")
        bounds[i] = bd
        carried.setdefault(fp, (i, bd))
    inputs = [idx[j] for j in np.flatnonzero(is_in & at_cand).tolist()]
    _carry_inputs(c, cells, inputs, carried, bounds, low[1])
    op_type = c.get("op_type")
    moving = [m for m in calls.values() if moves_values(op_type[m[0]])] if op_type is not None else []
    changed = bool(moving)
    while changed:                                      # noise_floor._carry_through_moves
        changed = False
        for members in moving:
            ins = [i for i in members if c["io"][i] == "input"]
            if any(verdicts[i] in CANDIDATE_VERDICTS for i in ins):
                continue
            for i in members:
                if c["io"][i] != "output" or verdicts[i] not in CANDIDATE_VERDICTS:
                    continue
                dt = (c["dtype_a"][i], c["dtype_b"][i])
                src = next((j for j in ins if j in bounds and (c["dtype_a"][j], c["dtype_b"][j]) == dt), None)
                if src is None:
                    continue
                bd = bounds[src]
                reasons[i] = moved_reason(c["slot"][src], bd, low[1], reasons[i] or verdicts[i])
                verdicts[i] = "warning"
                bounds[i] = bd
                carried.setdefault(_fingerprints(c, cells, [i])[0], (i, bd))
                changed = True
        if changed:
            _carry_inputs(c, cells, inputs, carried, bounds, low[1])


def _carry_inputs(c, cells: "_Cells", inputs: List[int], carried: Dict[tuple, Tuple[int, float]],
                  bounds: Dict[int, float], name: str) -> None:
    """The candidate ``inputs`` holding the values of an output in ``carried``: demoted."""
    verdicts, reasons = c["verdict"], c["reason"]
    heads = {fp[:5] for fp in carried}                  # an input can match only with these
    todo = [i for i in inputs if verdicts[i] in CANDIDATE_VERDICTS and _head(c, i) in heads]
    for i, fp in zip(todo, _fingerprints(c, cells, todo)):
        src = carried.get(fp)
        if src is None:
            continue
        o, bd = src
        reasons[i] = carried_reason(c["op"][o], c["slot"][o], bd, name, reasons[i] or verdicts[i])
        verdicts[i] = "warning"
        bounds[i] = bd


def _head(c, i: int) -> tuple:
    """The first fields of :func:`_fingerprints`' key: rank, iteration, shape text, dtypes."""
    return (c["rank"][i], c["iteration"][i], c["shape_a"][i], c["dtype_a"][i], c["dtype_b"][i])


def _fingerprints(c, cells: _Cells, ids: List[int]) -> List[tuple]:
    """Per statistics pair of ``ids``: :func:`_head` + ``noise_floor._fingerprint``'s
    statistics (``repr`` of each row cell of max, min, avg, l2norm, count, md5; the shape
    by its text: one text per shape tuple)."""
    if not ids:
        return []
    m = len(ids)
    parts: List[List[str]] = []
    sides = [c["side"][i] for i in ids]
    for tag, rows_key in ((0, "row_a"), (1, "row_b")):
        rows = [c[rows_key][i] for i in ids]
        for k in _FINGER:
            out: List[str] = ["None"] * m
            for s in dict.fromkeys(sides):
                at = [j for j in range(m) if sides[j] == s]
                vals = cells.take(s, tag, k, [rows[j] for j in at])
                if vals is not None:
                    for j, v in zip(at, map(repr, vals)):
                        out[j] = v
            parts.append(out)
    return [_head(c, i) + (tuple(p[:6]), tuple(p[6:])) for i, p in zip(ids, zip(*parts))]
