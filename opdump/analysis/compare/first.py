"""Where A and B part: the **first difference** (same dtypes) and the **first divergence**
(thresholds), walked in A's execution order (iteration, graph run order, execution order).

* First difference -- used when every compared pair holds the same dtype on both sides:
  the earliest operator call whose inputs are identical (bit-for-bit or within the
  same-dtype tolerance, see :mod:`.verdict`) and whose outputs are not: this operator
  computes differently. When the earliest call that differs at all already has a differing
  input, the difference entered from outside the dumped operators (a parameter, a graph
  input, an operator not dumped or unmatched); that call is named, with its input and the
  parameters that differ. A random operator whose outputs alone differ is listed as
  nondeterministic, and the search then only accepts operators whose inputs are identical.
* First divergence -- the earliest operator with a ``diverged`` tensor; parameters are
  reported apart (``diverged_parameters``). Its cause says whether its inputs matched.

Both carry the operator's source line and the size of the difference.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from ..common import is_random_op
from .pairs import Pair, on_disk

__all__ = ["first_divergence", "first_difference", "calls_in_order"]

SourceOf = Callable[[Pair], Tuple[str, str]]


def calls_in_order(pairs: List[Pair]) -> List[List[Pair]]:
    """A's operator calls (pairs grouped by call), in execution order (``pairs`` is sorted)."""
    groups: Dict[tuple, List[Pair]] = {}
    order: List[tuple] = []
    for p in pairs:
        a = p.a
        if a is None or a.kind != "op":
            continue
        k = (a.rank,) + a.call_key
        if k not in groups:
            groups[k] = []
            order.append(k)
        groups[k].append(p)
    return [groups[k] for k in order]


def _size(p: Pair) -> str:
    m = p.metrics
    if p.mode == "statistics":
        return f"statistics differ by {m.get('stat_rel_diff_all', 0.0):.3g} (relative)"
    mae, ref = m.get("max_abs_err"), m.get("max_abs_ref") or 0.0
    parts = []
    if m.get("nonfinite_mismatch"):
        parts.append(f"NaN/Inf at {m['nonfinite_mismatch']} different positions")
    if mae is not None and mae == mae:
        parts.append(f"max abs error {mae:.3g}" + (f" ({mae / ref:.3g} of max|B| {ref:.3g})" if ref else ""))
    if m.get("max_rel_err") is not None and m["max_rel_err"] == m["max_rel_err"]:
        parts.append(f"max rel error {m['max_rel_err']:.3g}")
    cos = m.get("cosine")
    if cos is not None and cos == cos:
        parts.append(f"cosine {cos:.9f}")
    return ", ".join(parts) or (p.reason or "differs")


def _info(p: Pair, source_of: SourceOf, cause: str, reason: str) -> Dict[str, Any]:
    a = p.a
    assert a is not None
    src, code = source_of(p)
    m = p.metrics
    return {
        "rank": a.rank, "iteration": a.iteration, "graph": a.graph, "op": a.op,
        "op_b": p.b.op if p.b is not None else None, "op_type": a.op_type, "io": a.io, "slot": a.slot,
        "order": a.order, "reason": reason, "cause": cause, "source": src, "code": code,
        "cosine": m.get("cosine"), "max_abs_err": m.get("max_abs_err"), "max_rel_err": m.get("max_rel_err"),
        "max_abs_ref": m.get("max_abs_ref"), "path_a": on_disk(a.path) if a.path else a.path,
        "path_b": on_disk(p.b.path) if p.b is not None and p.b.path else None,
    }


def _differing_parameters(pairs: List[Pair], at, shape=None) -> List[str]:
    """Parameters (and buffers) that differ as ``at``'s iteration used them, on ``at``'s rank:
    a parameter that differs only after a later update is no cause of an earlier difference."""
    out = []
    for p in pairs:
        if p.a is None or p.a.kind == "op" or p.identical is not False:
            continue
        if p.a.rank != at.rank or p.a.iteration != at.iteration:
            continue
        if shape is not None and p.a.shape != shape:
            continue
        if p.a.op not in out:
            out.append(p.a.op)
    return out


def first_difference(pairs: List[Pair], source_of: SourceOf) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """(first difference or None, random operators that differ before it)."""
    nondet: List[str] = []
    random_seen = False
    for call in calls_in_order(pairs):
        ins = [p for p in call if p.a.io == "input" and p.identical is not None]
        outs = [p for p in call if p.a.io == "output" and p.identical is not None]
        in_diff = [p for p in ins if not p.identical]
        out_diff = [p for p in outs if not p.identical]
        if not in_diff and not out_diff:
            continue
        op = call[0].a
        if not in_diff and is_random_op(op.op_type):
            if op.op not in nondet:
                nondet.append(op.op)
            random_seen = True
            continue
        if not in_diff:
            if ins:
                cause = "inputs identical, outputs differ: this operator computes differently"
            else:
                cause = "outputs differ (its inputs were not dumped or not compared)"
            p = out_diff[0]
            return _info(p, source_of, cause, f"output.{p.a.slot}: {_size(p)}"), nondet
        if random_seen:
            continue
        p = in_diff[0]
        params = _differing_parameters(pairs, p.a, p.a.shape) or _differing_parameters(pairs, p.a)
        cause = (f"input.{p.a.slot} already differs when this operator runs: it comes from "
                 + (f"a parameter that differs ({', '.join(params[:3])})" if params
                    else "a graph input, a parameter, or an operator that was not dumped or not matched"))
        info = _info(p, source_of, cause, f"input.{p.a.slot}: {_size(p)}")
        info["parameters"] = params
        return info, nondet
    return None, nondet


def first_divergence(pairs: List[Pair], source_of: SourceOf) -> Tuple[Optional[Dict[str, Any]], List[str], List[str]]:
    """(first diverging operator or None, random operators that differ before it, diverged parameters)."""
    first: Optional[Pair] = None
    nondet: List[str] = []
    params: List[str] = []
    for p in pairs:
        a = p.a
        if a is None:
            continue
        if p.verdict == "nondeterministic" and first is None and a.op not in nondet:
            nondet.append(a.op)
        if p.verdict != "diverged":
            continue
        if a.kind != "op":
            if a.op not in params:
                params.append(a.op)
            continue
        if first is None:
            first = p
    if first is None:
        return None, nondet, params
    fa = first.a
    same_call = [p for p in pairs if p.a is not None and p.a.rank == fa.rank and p.a.call_key == fa.call_key]
    bad_in = [p for p in same_call if p.a.io == "input" and p.verdict == "diverged"]
    ok_in = [p for p in same_call if p.a.io == "input" and p.verdict in ("pass", "warning")]
    if bad_in:
        cause = ("input " + ", ".join(f"input.{p.a.slot}" for p in bad_in)
                 + " already differs (from a parameter, a graph input, or an operator not dumped)")
    elif ok_in:
        cause = "inputs match, output differs: this operator computes differently"
    elif any(p.a.io == "input" for p in same_call):
        cause = "output differs (its inputs were not compared: unmatched or without data)"
    else:
        cause = "output differs (inputs not dumped)"
    return _info(first, source_of, cause, first.reason), nondet, params
