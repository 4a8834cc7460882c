"""The noise floor of a precision compare: a ``diverged`` verdict that is only the rounding
of the operator's inputs is demoted to ``warning`` (README "Analysis", compare).

Why: a bf16 run against an fp32 one rounds every input by up to one ulp of its scale, and
an output whose true value is ~0 (the mean of a normalised tensor: ~1e-8 in fp32, ~1e-4 in
bf16) then holds only that rounding, so its cosine is noise (< 0.9: ``diverged``) although
its error is far below one bf16 ulp of the inputs (a LayerNorm's mean on a ConvNeXt, found
by a hold-out trial).

The rule, per operator call of A (its rank, iteration, graph, file name and call):

* the compare is a *precision* compare when one of its compared floating pairs holds
  different dtypes in A and B; ``eps`` is the machine epsilon of the lowest precision among
  those pairs' dtypes (bf16 ``2**-7``, fp16 ``2**-10``, fp32 ``2**-23``…), for every call:
  under autocast the values an fp32 operator receives (a LayerNorm, a softmax: autocast
  runs them in fp32 on both sides) were rounded to bf16 upstream, so the rounding they carry
  is bf16's although this call's dtypes are the same (a ConvNeXt's downsampling LayerNorm,
  bf16 autocast vs fp32: its mean was named the first divergence);
* ``bound = eps × max|input|`` over the call's compared floating inputs, on B's (the
  reference's) side: a tensor pair's ``max_abs_ref``, a statistics pair's ``max(|max|, |min|)``
  (finite values only);
* an output pair of the call whose verdict is ``diverged`` (or ``nondeterministic``), with no
  NaN/Inf mismatch, and whose error is at or below ``bound`` is rounding noise of its inputs:
  its verdict becomes ``warning``, its reason says so.  The error of a tensor pair is its
  ``max_abs_err``; of a statistics pair the largest element-wise error its statistics prove,
  ``max(|Δmax|, |Δmin|, |Δavg|, |Δl2norm| / sqrt(count))``;
* an input pair (of any later call of the same rank and iteration) with a ``diverged``
  verdict and exactly the values of an output demoted here (same shape, dtypes and metrics,
  or same statistics on both sides) is that same tensor, consumed: it is demoted too, its
  reason naming the output;
* an operator that only moves values (:data:`VALUE_MOVING`: the views -- ``view``,
  ``expand``, ``t``, ``transpose``, ``permute``, ``slice``, ``select``… -- and ``clone``,
  ``contiguous``, ``copy_``) cannot compute differently: a candidate output of such a call
  whose inputs hold no candidate verdict and one of which was demoted here (same dtypes as
  the output) is demoted with it, and carries to later inputs as a demoted output does
  (a view of a view: until nothing changes).  Its own bound would be the noise values'
  scale, far below their noise (hold-out trial 5: a backward ``expand`` of a bf16 Qwen2
  was named the first divergence).  An input diverged beyond its bound keeps its call's
  outputs diverged: the first divergence is then the producer, not the view.

Guarantees: a compare whose pairs all hold the same dtypes, a call without a compared
floating input, and any error above the bound are left as they are; only verdicts change
(``diverged``/``nondeterministic`` -> ``warning``) and their reasons, never metrics nor
``identical``.  Every compare path runs :func:`demote_noise` on :class:`.pairs.Pair` records
after its verdicts and before the first difference/divergence, the summary and the table:
``compare``'s per-row stages on all its pairs, the column-wise paths (:mod:`.stat_pairs`'
``column_summary``, shared by the statistics and tensor-file paths) through
:func:`demote_columns`, on the pairs of the calls holding a candidate -- the only pairs
the rule reads -- so both give the same verdicts; statistics pairs by the same rule over
numpy columns (:mod:`.noise_columns`, checked against :func:`demote_columns`).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..common import base_op_type
from .kernels import VIEW_OPS
from .pairs import Pair

__all__ = ["VALUE_MOVING", "moves_values", "eps_of", "lowest_precision", "compared_dtypes", "demote_noise", "demote_columns", "CANDIDATE_VERDICTS"]

#: the verdicts the rule may demote
CANDIDATE_VERDICTS = frozenset(("diverged", "nondeterministic"))
NO_DATA_VERDICTS = frozenset(("skipped", "unreadable", "unmatched"))
_STATS = ("max", "min", "avg", "l2norm")
#: operators that only move their input's values (the views inductor makes of a buffer,
#: :data:`.kernels.VIEW_OPS`, and the copies that keep the dtype): their outputs cannot
#: compute differently from their inputs (module doc)
VALUE_MOVING = VIEW_OPS | frozenset(("clone", "contiguous", "copy", "copy_", "detach_", "alias_copy",
                                     "view_copy", "expand_copy", "permute_copy", "t_copy", "transpose_copy"))
_base_type = lru_cache(maxsize=4096)(base_op_type)


def eps_of(dtype: Any) -> Optional[Tuple[float, str]]:
    """(machine epsilon, short name) of a floating dtype name (MindSpore ``BFloat16`` or numpy
    ``bfloat16`` alike), None for any other (integers, bools, unknown)."""
    s = str(dtype or "").lower()
    if not s or s in ("none", "nan"):
        return None
    if "bfloat16" in s or s == "bf16":
        return 2.0 ** -7, "bf16"
    if "float8" in s:
        return (2.0 ** -2, "fp8") if "e5m2" in s else (2.0 ** -3, "fp8")
    if "float16" in s or s in ("half", "f2", "fp16"):
        return 2.0 ** -10, "fp16"
    if "float64" in s or "double" in s or "complex128" in s or s in ("f8", "fp64"):
        return 2.0 ** -52, "fp64"
    if "float" in s or "complex" in s or s in ("f4", "fp32"):
        return 2.0 ** -23, "fp32"
    return None


_eps_memo = lru_cache(maxsize=256)(eps_of)


def _eps(dtype: Any) -> Optional[Tuple[float, str]]:
    """:func:`eps_of`, once per distinct dtype name (the plain function for an unhashable one)."""
    try:
        return _eps_memo(dtype)
    except TypeError:
        return eps_of(dtype)


def _dtypes(p: Pair) -> Tuple[Any, Any]:
    return p.a.dtype, p.b.dtype


def _finite(x: Any) -> Optional[float]:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _scale(p: Pair) -> Optional[float]:
    """max|B| of a compared pair (finite), None when unknown."""
    if p.mode == "statistics":
        vals = [abs(v) for v in (_finite(p.b.row.get(k)) for k in ("max", "min")) if v is not None]
        return max(vals) if vals else None
    return _finite(p.metrics.get("max_abs_ref"))


def _stat_error(p: Pair) -> Optional[float]:
    """The largest element-wise error the statistics of a pair prove (module doc), None when
    a statistic is NaN/Inf on one side or none is comparable."""
    ra, rb = p.a.row, p.b.row
    worst, seen = 0.0, False
    for k in _STATS:
        a, b = ra.get(k), rb.get(k)
        try:
            a, b = float(a), float(b)
        except (TypeError, ValueError):
            continue
        if not (math.isfinite(a) and math.isfinite(b)):
            if a == b or (a != a and b != b):
                continue
            return None
        d = abs(a - b)
        if k == "l2norm":
            n = _finite(rb.get("count")) or _finite(ra.get("count"))
            if n and n > 1:
                d /= math.sqrt(n)
        worst, seen = max(worst, d), True
    return worst if seen else None


def _error(p: Pair) -> Optional[float]:
    if p.mode == "statistics":
        return _stat_error(p)
    if p.metrics.get("nonfinite_mismatch"):
        return None
    return _finite(p.metrics.get("max_abs_err"))


def _fingerprint(p: Pair) -> tuple:
    """What identifies the values of a pair: the same tensor consumed later gives the same."""
    da, db = _dtypes(p)
    shape = tuple(p.a.shape) if p.a.shape is not None else None
    if p.mode == "statistics":
        keys = _STATS + ("count", "md5")
        return ("s", shape, da, db, tuple(repr(p.a.row.get(k)) for k in keys),
                tuple(repr(p.b.row.get(k)) for k in keys))
    m = p.metrics
    return ("t", shape, da, db) + tuple(repr(m.get(k)) for k in ("max_abs_err", "max_abs_ref", "cosine", "n"))


def _compared(p: Pair) -> bool:
    return p.a is not None and p.b is not None and p.a.kind == "op" and p.mode in ("tensor", "statistics") \
        and p.verdict not in NO_DATA_VERDICTS


def compared_dtypes(dtype_a: Sequence[Any], dtype_b: Sequence[Any], kind: Sequence[Any], mode: Sequence[Any],
                    verdict: Sequence[Any]) -> Iterable[Tuple[Any, Any]]:
    """(A dtype, B dtype) of the compared operator pairs, from the columns of a column-wise
    compare: the pairs :func:`_compared` keeps, for :func:`lowest_precision`."""
    return ((da, db) for da, db, k, m, v in zip(dtype_a, dtype_b, kind, mode, verdict)
            if k == "op" and m in ("tensor", "statistics") and v not in NO_DATA_VERDICTS)


def lowest_precision(dtype_pairs: Iterable[Tuple[Any, Any]]) -> Optional[Tuple[float, str]]:
    """(eps, name) of the lowest precision among (A dtype, B dtype) pairs whose floating
    precisions differ; None when none does (not a precision compare)."""
    low: Optional[Tuple[float, str]] = None
    for da, db in set(dtype_pairs):
        ea, eb = _eps(da), _eps(db)
        if ea is None or eb is None or ea[0] == eb[0]:
            continue
        e = max(ea, eb)
        low = e if low is None or e[0] > low[0] else low
    return low


def demote_noise(pairs: Sequence[Pair], low: Optional[Tuple[float, str]] = None,
                 carry: Optional[Dict[tuple, Tuple[Pair, float, str]]] = None) -> List[int]:
    """Apply the rule (module doc) to ``pairs`` in place; the positions of the pairs demoted.
    ``pairs`` in any order; a call's pairs and the outputs its inputs carry must all be there.
    ``low``: the compare's lowest precision (:func:`lowest_precision`) when ``pairs`` are not
    all its pairs; by default found among ``pairs``.  ``carry``: the outputs demoted by earlier
    calls on other pairs of the same iterations (the online compare judges an iteration in
    batches), read and extended here; by default none."""
    if low is None:
        low = lowest_precision(_dtypes(p) for p in pairs if _compared(p))
    if low is None:                                 # not a precision compare
        return []
    want = {(p.a.rank,) + p.a.call_key for p in pairs if p.verdict in CANDIDATE_VERDICTS and _compared(p)}
    if not want:                                    # nothing diverged: nothing to read
        return []
    calls: Dict[tuple, List[int]] = {}
    for i, p in enumerate(pairs):
        if p.a is not None and p.a.kind == "op":
            key = (p.a.rank,) + p.a.call_key
            if key in want and _compared(p):
                calls.setdefault(key, []).append(i)
    done: List[int] = []
    carried = carry if carry is not None else {}    # (rank, iteration, fingerprint) -> (output, bound, name)
    pending_inputs: List[int] = []
    bounds: Dict[int, Tuple[float, str]] = {}            # position demoted -> (bound, precision) it was judged by
    for key, members in calls.items():
        group = [pairs[i] for i in members]
        if not any(p.verdict in CANDIDATE_VERDICTS for p in group):
            continue
        for i, p in zip(members, group):
            if p.verdict in CANDIDATE_VERDICTS and p.a.io == "input":
                pending_inputs.append(i)
        scales = [s for s in (_scale(p) for p in group if p.a.io == "input" and _eps(p.b.dtype) is not None)
                  if s is not None]
        if not scales:
            continue
        bound = low[0] * max(scales)
        for i, p in zip(members, group):
            if p.a.io != "output" or p.verdict not in CANDIDATE_VERDICTS:
                continue
            err = _error(p)
            if err is None or err > bound:
                continue
            was = p.reason or p.verdict
            p.verdict = "warning"
            what = "max abs error" if p.mode != "statistics" else "max abs error its statistics show"
            p.reason = (f"{what} {err:.3g} is below the inputs' {low[1]} rounding "
                        f"(eps × max|input| = {bound:.3g}): rounding noise, not a divergence (was: {was})")
            done.append(i)
            bounds[i] = (bound, low[1])
            carried.setdefault((p.a.rank, p.a.iteration, _fingerprint(p)), (p, bound, low[1]))
    if carried:
        _demote_carried_inputs(pairs, pending_inputs, carried, bounds, done)
    _carry_through_moves(pairs, calls, pending_inputs, carried, bounds, done)
    return sorted(done)


def moves_values(op_type: Any) -> bool:
    """Whether an operator only moves its input's values (:data:`VALUE_MOVING`)."""
    return _base_type(op_type) in VALUE_MOVING


def moved_reason(slot: Any, bound: float, name: str, was: Any) -> str:
    """The reason of a value-moving operator's output demoted with its input (module doc)."""
    return (f"the values of its input.{slot}, moved (this operator only moves values), below the {name} "
            f"rounding of their producer's inputs (eps × max|input| = {bound:.3g}): rounding noise, not a "
            f"divergence (was: {was})")


def _carry_through_moves(pairs: Sequence[Pair], calls: Dict[tuple, List[int]], pending_inputs: List[int],
                         carried: Dict[tuple, Tuple[Pair, float, str]], bounds: Dict[int, Tuple[float, str]],
                         done: List[int]) -> None:
    """The module doc's last rule: a value-moving call's candidate outputs take the verdict of
    its demoted input, and what they carry reaches the inputs of later calls, until nothing
    changes (a chain of views: view -> expand -> t)."""
    moving = [m for m in calls.values() if moves_values(pairs[m[0]].a.op_type)]
    changed = bool(moving) and bool(bounds)
    while changed:
        changed = False
        for members in moving:
            ins = [i for i in members if pairs[i].a.io == "input"]
            if any(pairs[i].verdict in CANDIDATE_VERDICTS for i in ins):
                continue                            # an input diverged beyond its bound: not noise
            for i in members:
                p = pairs[i]
                if p.a.io != "output" or p.verdict not in CANDIDATE_VERDICTS:
                    continue
                src = next((j for j in ins if j in bounds and _dtypes(pairs[j]) == _dtypes(p)), None)
                if src is None:
                    continue
                bound, name = bounds[src]
                p.reason = moved_reason(pairs[src].a.slot, bound, name, p.reason or p.verdict)
                p.verdict = "warning"
                bounds[i] = (bound, name)
                done.append(i)
                carried.setdefault((p.a.rank, p.a.iteration, _fingerprint(p)), (p, bound, name))
                changed = True
        if changed:
            _demote_carried_inputs(pairs, pending_inputs, carried, bounds, done)


def _demote_carried_inputs(pairs: Sequence[Pair], pending_inputs: List[int],
                           carried: Dict[tuple, Tuple[Pair, float, str]], bounds: Dict[int, Tuple[float, str]],
                           done: List[int]) -> None:
    """The candidate inputs among ``pending_inputs`` holding the values of an output demoted
    earlier (``carried``, by fingerprint) are demoted with it."""
    for i in pending_inputs:
        p = pairs[i]
        if p.verdict not in CANDIDATE_VERDICTS:
            continue
        src = carried.get((p.a.rank, p.a.iteration, _fingerprint(p)))
        if src is not None:
            o, bound, name = src
            p.verdict, p.reason = "warning", carried_reason(o.a.op, o.a.slot, bound, name, p.reason or p.verdict)
            bounds[i] = (bound, name)
            done.append(i)


def carried_reason(op: Any, slot: Any, bound: float, name: str, was: Any) -> str:
    """The reason of an input demoted as the values of an output demoted earlier."""
    return (f"the values of {op} output.{slot}, below its inputs' {name} rounding "
            f"(eps × max|input| = {bound:.3g}): rounding noise, not a divergence (was: {was})")


def demote_columns(verdicts: List[Any], reasons: List[Any], same: Sequence[Any], call_keys: Callable[[], List[tuple]],
                   tensors: Callable[[List[int]], List[Pair]],
                   dtype_pairs: Callable[[], Iterable[Tuple[Any, Any]]]) -> None:
    """:func:`demote_noise` on column-wise pairs (``verdicts``/``reasons`` changed in place):
    nothing to do unless a pair holds a candidate verdict and some pair differs in dtype; then
    the compare's lowest precision is found among ``dtype_pairs()`` (the compared operator
    pairs' (A dtype, B dtype), as :func:`demote_noise` would take them), the pairs of the
    calls holding a candidate (``call_keys()``: A's call key per pair) are made
    (``tensors(idx)``: :class:`.pairs.Pair` records, fields as the per-row stages set them)
    and judged by the same function."""
    n = len(verdicts)
    cand = [i for i in range(n) if verdicts[i] in CANDIDATE_VERDICTS]
    if not cand or all(same):
        return
    low = lowest_precision(dtype_pairs())
    if low is None:
        return
    keys = call_keys()
    want = {keys[i] for i in cand}
    idx = [i for i in range(n) if keys[i] in want]
    made = tensors(idx)
    for j in demote_noise(made, low):
        k = idx[j]
        verdicts[k], reasons[k] = made[j].verdict, made[j].reason
