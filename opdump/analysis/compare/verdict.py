"""Metrics -> verdicts, per tensor pair.

Two questions are answered for every compared pair:

* **identical?** -- bit-equal, or within the same-dtype tolerance: max abs error
  <= ``max(same_rtol, eps(dtype)) * max|B|`` (fp32: 1e-6 of the largest reference value,
  about 8 ulps; fp16/bf16: one ulp of it; integers and bools: exact). Statistics-only pairs:
  equal MD5, or every statistic's difference within that tolerance of the larger of its own
  magnitude and the tensors' largest (``max(|max|, |min|)`` of both rows), as the tensor
  rule measures against max|B|: a reordered sum's ``min`` of -0.0095563 against -0.0095563
  (1.6e-6 of itself, 1e-7 of max|B| 0.153) is identical, as its tensor is. Used for the
  *first difference* when A and B hold the same dtypes.
* **verdict** -- thresholds for any precision (MindStudio Probe's rule, refined):

  - ``diverged`` when NaN/Inf sit at different places; ``cosine < 0.9``;
    ``cosine < 0.99 and max_abs_err > 1e-3``; ``max_abs_err > 1 and > 1e-2 * max|b|``
    (the ``abs > 1`` clause scaled for large values); never when ``max_abs_err <= 1e-6``.
    When exactly one side is all zeros, cosine is undefined and ``max_abs_err > 1e-3`` decides.
  - ``warning``: not diverged, but ``cosine < 0.999`` or ``max_abs_err > 1e-3``.
  - ``pass`` otherwise; ``identical`` noted in ``reason`` when bit-equal.
  - statistics-only pairs: equal MD5 -> pass; NaN/Inf on one side only -> diverged; else
    the largest relative difference of max/min/avg/l2norm (avg's against the tensors' largest
    magnitude, :func:`_magnitude`): > 1e-2 diverged, > 1e-3 warning.
  - ``nondeterministic``: a random operator's output that would be diverged.
  - precision compares (A and B hold different floating dtypes): an output whose error is at
    or below ``eps(lower-precision dtype) × max|input|`` over its operator call's floating
    inputs (B's values: ``max_abs_ref``, or the statistics' max/min) is rounding noise of
    its inputs: ``warning``, not ``diverged`` (nor ``nondeterministic``).  Applied after the
    verdicts here, once per compare path, by :mod:`.noise_floor` (which states the rule and
    its guarantees); same-dtype compares are unchanged.
  - ``skipped``: undefined values (outputs of ``empty*``, the overwritten input of
    ``fill_``/``zero_``/``copy_``…), never compared.
  - ``unmatched``: one side only, or tensors whose element counts differ (a user mapping
    may pair them; they are never *diverged*), or a tensor file against statistics only.
  - ``unreadable``: a file of the pair cannot be read (named in ``reason``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..common import is_garbage, is_random_op, stats_nonfinite
from .pairs import Pair
from .stat_columns import judge_statistics as judge_columns

#: the same answers as :func:`is_garbage` / :func:`is_random_op` (pure functions of their
#: arguments), looked up once per distinct operator type (twice per pair on 100,000 pairs)
_garbage = lru_cache(maxsize=8192)(is_garbage)
_random_op = lru_cache(maxsize=4096)(is_random_op)

__all__ = ["Thresholds", "verdict_for_metrics", "stats_verdict", "same_dtype_tolerance", "judge_pair",
           "judge_metrics", "judge_statistics"]


@dataclass(frozen=True)
class Thresholds:
    """Verdict thresholds (see the module documentation)."""

    cos_fail: float = 0.9              # cosine below this: diverged
    cos_strict: float = 0.99           # cosine below this and max_abs_err above abs_with_cos: diverged
    abs_with_cos: float = 1e-3
    abs_fail: float = 1.0              # max_abs_err above this (and above abs_fail_scale * max|b|): diverged
    abs_fail_scale: float = 1e-2
    atol: float = 1e-6                 # max_abs_err at or below this never diverges
    cos_warn: float = 0.999            # cosine below this: warning
    abs_warn: float = 1e-3             # max_abs_err above this: warning
    stat_fail: float = 1e-2            # statistics relative difference above this: diverged
    stat_warn: float = 1e-3
    stat_atol: float = 1e-6
    same_rtol: float = 1e-6            # same dtypes: identical when max_abs_err <= max(same_rtol, eps) * max|b|


def verdict_for_metrics(m: Dict[str, Any], th: Thresholds = Thresholds()) -> Tuple[str, str]:
    """(verdict, reason) for the metrics of one tensor pair."""
    if m.get("unreadable"):
        return "unreadable", m.get("error") or "cannot read"
    if m.get("error"):
        return "unmatched", m["error"]
    mism = int(m.get("nonfinite_mismatch") or 0)
    if mism:
        return "diverged", f"NaN/Inf at {mism} different positions"
    n = m.get("n") or 0
    if n == 0:
        return "pass", "empty or all non-finite alike"
    cos = m.get("cosine", float("nan"))
    mae = m.get("max_abs_err", 0.0)
    ref = m.get("max_abs_ref", 0.0) or 0.0
    if mae == 0.0:
        return "pass", "identical"
    if mae <= th.atol:
        return "pass", f"max abs error {mae:.3g} <= {th.atol:g}"
    reasons = []
    if math.isnan(cos):
        if mae > th.abs_with_cos:
            reasons.append(f"one side all zeros, max abs error {mae:.3g} > {th.abs_with_cos:g}")
    else:
        if cos < th.cos_fail:
            reasons.append(f"cosine {cos:.6f} < {th.cos_fail:g}")
        elif cos < th.cos_strict and mae > th.abs_with_cos:
            reasons.append(f"cosine {cos:.6f} < {th.cos_strict:g} and max abs error {mae:.3g} > {th.abs_with_cos:g}")
    if mae > th.abs_fail and mae > th.abs_fail_scale * ref:
        reasons.append(f"max abs error {mae:.3g} > {th.abs_fail:g} (max|ref| {ref:.3g})")
    if reasons:
        return "diverged", "; ".join(reasons)
    if (not math.isnan(cos) and cos < th.cos_warn) or mae > th.abs_warn:
        return "warning", f"cosine {cos:.6f}, max abs error {mae:.3g}"
    return "pass", ""


def same_dtype_tolerance(dtype: Optional[str], th: Thresholds = Thresholds()) -> float:
    """Relative tolerance (of max|B|) under which two same-dtype tensors count as identical."""
    s = str(dtype or "").lower()
    if "bfloat16" in s or s == "bf16":
        return max(th.same_rtol, 2.0 ** -7)
    if "float16" in s or s in ("half", "f2"):
        return max(th.same_rtol, float(np.finfo(np.float16).eps))
    if "float" in s or "double" in s or "complex" in s:
        return th.same_rtol
    return 0.0          # integers, bools: exact


_tolerance_memo = lru_cache(maxsize=1024)(same_dtype_tolerance)


def _tolerance(dtype: Optional[str], th: Thresholds) -> float:
    """:func:`same_dtype_tolerance`, once per distinct (dtype, thresholds)."""
    try:
        return _tolerance_memo(dtype, th)
    except TypeError:                       # unhashable: the plain function
        return same_dtype_tolerance(dtype, th)


_STATS_FOR_COMPARE = ("max", "min", "avg", "l2norm")


def _magnitude(ra: Dict[str, Any], rb: Dict[str, Any]) -> float:
    """The largest finite ``|max|``/``|min|`` of the two rows (0.0 when none): what ``avg``'s
    difference is measured against.  Why not ``|avg|`` itself: the mean of a zero-mean tensor
    (a centred weight, a normalised activation, a gradient) is ~0, so the rounding of a bf16
    run against an fp32 one was a "100 %" difference; ``|avg| <= max(|max|, |min|)`` always,
    and the rounding of a sum scales with its terms, not with its result."""
    m = 0.0
    for row in (ra, rb):
        for k in ("max", "min"):
            try:
                v = abs(float(row.get(k)))
            except (TypeError, ValueError):
                continue
            if v > m and not math.isinf(v):       # NaN never compares greater
                m = v
    return m


def stats_verdict(ra: Dict[str, Any], rb: Dict[str, Any], th: Thresholds) -> Tuple[str, str, Dict[str, Any]]:
    """(verdict, reason, {"stat_max_rel_diff": …}) of two statistics rows."""
    ma, mb = ra.get("md5"), rb.get("md5")
    if isinstance(ma, str) and isinstance(mb, str) and ma and mb and ma == mb:
        return "pass", "identical (MD5)", {"stat_max_rel_diff": 0.0, "stat_rel_diff_all": 0.0}
    return _stats_verdict(ra, rb, th, stats_nonfinite(ra), stats_nonfinite(rb))


def _stats_verdict(ra: Dict[str, Any], rb: Dict[str, Any], th: Thresholds, na: Optional[bool],
                   nb: Optional[bool]) -> Tuple[str, str, Dict[str, Any]]:
    """:func:`stats_verdict` with the rows' NaN/Inf flags already known."""
    out: Dict[str, Any] = {}
    ma, mb = ra.get("md5"), rb.get("md5")
    if isinstance(ma, str) and isinstance(mb, str) and ma and mb and ma == mb:
        return "pass", "identical (MD5)", {"stat_max_rel_diff": 0.0, "stat_rel_diff_all": 0.0}
    if na is not None and nb is not None and na != nb:
        return "diverged", "NaN/Inf in " + ("A only" if na else "B only"), out
    worst, worst_k, worst_all = 0.0, None, 0.0
    scale = _magnitude(ra, rb)
    for k in _STATS_FOR_COMPARE:
        try:
            a, b = float(ra.get(k)), float(rb.get(k))
        except (TypeError, ValueError):
            continue
        if math.isnan(a) or math.isnan(b):
            if math.isnan(a) != math.isnan(b) and not (na or nb):
                return "diverged", f"{k}: {a} vs {b}", out
            continue
        if math.isinf(a) or math.isinf(b):
            if a != b:
                worst, worst_k, worst_all = float("inf"), k, float("inf")
            continue
        d = abs(a - b)
        if d == 0.0:
            continue
        rel_scale = d / max(abs(a), abs(b), scale)     # identity: against the tensors' magnitude
        rel = rel_scale if k == "avg" else d / max(abs(a), abs(b))
        worst_all = max(worst_all, rel_scale)
        if d <= th.stat_atol:
            continue
        if rel > worst:
            worst, worst_k = rel, k
    out["stat_max_rel_diff"] = worst
    out["stat_rel_diff_all"] = worst_all
    if worst_k is None:
        if any(k in ra and k in rb for k in _STATS_FOR_COMPARE):
            return "pass", "statistics agree", out
        return "pass", "no comparable statistics", out
    msg = f"{worst_k} differs by {worst:.3g} (relative)"
    if worst > th.stat_fail:
        return "diverged", msg, out
    if worst > th.stat_warn:
        return "warning", msg, out
    return "pass", msg, out


def judge_pair(p: Pair, th: Thresholds, statistics: Optional[list] = None) -> bool:
    """Decide what can be decided before reading data. Returns True when the pair still
    needs its tensor metrics (``p.mode == "tensor"``).  With ``statistics`` (a list), a
    statistics-only pair is appended to it instead of being judged here: judge them all at
    once with :func:`judge_statistics` (same results, column-wise)."""
    if p.a is None or p.b is None:
        p.verdict = "unmatched"
        p.reason = "only in A" if p.b is None else "only in B"
        if p.rule == "front-end":           # .frontend: one side only because of the front end
            p.reason += " (front-end operator)"
        return False
    a, b = p.a, p.b
    try:
        garbage = _garbage(a.op_type, a.io, a.slot) or _garbage(b.op_type, b.io, b.slot)
    except TypeError:                       # an unhashable field: the plain function
        garbage = is_garbage(a.op_type, a.io, a.slot) or is_garbage(b.op_type, b.io, b.slot)
    if garbage:
        p.verdict, p.reason = "skipped", "undefined values (uninitialised or overwritten)"
        return False
    if a.problem or b.problem:
        for t, side in ((a, "A"), (b, "B")):
            if t.problem and t.path:
                p.mode, p.verdict, p.reason = "tensor", "unreadable", f"cannot read {t.path}: {t.problem}"
                return False
    sa, sb = a.shape, b.shape
    if sa is not None and sb is not None and sa != sb and math.prod(sa) != math.prod(sb):
        p.verdict = "unmatched"
        p.reason = f"element count differs: {math.prod(sa)} vs {math.prod(sb)} (not compared)"
        return False
    if a.path and b.path:
        p.mode = "tensor"
        return True
    if a.has_stats and b.has_stats:
        p.mode = "statistics"
        if statistics is not None:
            statistics.append(p)
            return False
        na, nb = stats_nonfinite(a.row), stats_nonfinite(b.row)     # once per pair (was twice)
        v, why, extra = _stats_verdict(a.row, b.row, th, na, nb)
        p.metrics.update(extra)
        p.verdict, p.reason = v, why
        p.identical = _stats_identical(a.row, b.row, extra, a.dtype, th, na, nb) if p.same_dtype else None
        _random(p)
        return False
    p.verdict, p.reason = "unmatched", "no data to compare on one side (tensor vs statistics)"
    return False


def judge_statistics(pairs: List[Pair], th: Thresholds) -> None:
    """Judge the statistics-only pairs :func:`judge_pair` set aside, all at once
    (:mod:`.stat_columns`): the results :func:`judge_pair` gives pair by pair."""
    judge_columns(pairs, th, lambda dtype: same_dtype_tolerance(dtype, th), _random)


def judge_metrics(p: Pair, m: Dict[str, Any], th: Thresholds) -> None:
    """Verdict of a tensor pair from its metrics."""
    v, why = verdict_for_metrics(m, th)
    p.metrics.update({k: v_ for k, v_ in m.items() if not isinstance(v_, (tuple, list))})
    if v == "unreadable":
        p.verdict, p.reason = v, why
        return
    if v != "unmatched" and p.a is not None and p.b is not None and p.a.shape and p.b.shape \
            and p.a.shape != p.b.shape:
        why = (why + "; " if why else "") + f"shapes differ {p.a.shape_text()} vs {p.b.shape_text()} (compared flat)"
    p.verdict, p.reason = v, why
    if v != "unmatched" and p.same_dtype:
        mae, ref = m.get("max_abs_err", 0.0), m.get("max_abs_ref", 0.0) or 0.0
        mae = 0.0 if mae != mae else mae          # NaN: no finite element to differ
        p.identical = (not m.get("nonfinite_mismatch")
                       and mae <= _tolerance(p.a.dtype if p.a else None, th) * ref)
    _random(p)


def _is_random(op_type) -> bool:
    try:
        return _random_op(op_type)
    except TypeError:                       # unhashable: the plain function
        return is_random_op(op_type)


def _random(p: Pair) -> None:
    if p.verdict == "diverged" and p.a is not None and p.a.io == "output" and _is_random(p.a.op_type):
        p.verdict = "nondeterministic"
        p.reason = "random operator: " + (p.reason or "")


def _stats_identical(ra, rb, extra, dtype, th: Thresholds, na: Optional[bool], nb: Optional[bool]) -> bool:
    ma, mb = ra.get("md5"), rb.get("md5")
    if isinstance(ma, str) and isinstance(mb, str) and ma and mb:
        return ma == mb
    d = extra.get("stat_rel_diff_all", 0.0) or 0.0
    if na is not None and nb is not None and na != nb:
        return False
    return d <= same_dtype_tolerance(dtype, th)
