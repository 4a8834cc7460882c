"""Where a run's difference from its reference began, for the online compare (README,
"Online compare": where the difference began).

Why: the first divergence alone names the first operator whose difference crossed the
thresholds.  A small difference -- an inline bf16 cast that gives only ``warning`` verdicts
-- grows over the following operators and steps until an innocent later operator (a
backward matmul, the optimizer's update) crosses them, and would be blamed.  The offline
compare's first-difference rule (:func:`opdump.analysis.compare.first.first_difference`,
applied when both sides hold the same dtypes) names where it began; this module applies it
to one batch of the online compare and names the run-only operator that produced the
differing input.

Guarantees: the same rule and condition as ``opdump compare`` (same dtypes on every compared
pair of the batch, else no origin); the producer is named only when its output equals the
origin's differing input statistic for statistic (max, min, mean, l2norm ...), so a guess is
never reported as one.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from ..analysis.compare.first import first_difference
from ..analysis.compare.pairs import Pair, Tensor
from ..format.statistics import CATEGORIES

__all__ = ["describe_origin", "first_difference_of", "producer_of"]

SourceOf = Callable[[Pair], Tuple[str, str]]


def describe_origin(origin: Dict[str, Any]) -> str:
    """Where the run's first difference appeared (and the run-only operator it came from)."""
    text = (f"iteration {origin.get('iteration')}, {origin.get('op')} "
            f"({origin.get('source') or 'source unknown'}), {origin.get('io')}.{origin.get('slot')}")
    prod = origin.get("producer")
    if prod:
        text += (f", from {prod.get('op')} ({prod.get('source') or 'source unknown'}), "
                 "an operator the reference does not have")
    return text


def first_difference_of(pairs: List[Pair], source_of: SourceOf) -> Union[Dict[str, Any], None, bool]:
    """The batch's first difference (with its ``producer`` when its input differs), None when
    the batch has none, False when a compared pair holds different dtypes (the rule does
    not apply: first divergence only, as offline)."""
    compared = [p for p in pairs if p.b is not None and (p.identical is not None or p.verdict not in
                                                         (None, "unmatched", "unreadable"))]
    if any(not p.same_dtype for p in compared):
        return False
    if not any(p.identical is False for p in compared):
        return None
    info = first_difference(pairs, source_of)[0]
    if info is None:
        return None
    if info.get("io") == "input":
        info["producer"] = producer_of(pairs, info, source_of)
    return {k: v for k, v in info.items() if v is not None and k not in ("path_a", "path_b")}


def producer_of(pairs: List[Pair], info: Dict[str, Any], source_of: SourceOf) -> Optional[Dict[str, Any]]:
    """The latest earlier operator only the run has whose output holds exactly the
    statistics of the origin's differing input (the inserted cast), or None."""
    target = next((p.a for p in pairs if p.a.kind == "op" and p.a.op == info["op"] and p.a.io == "input"
                   and p.a.slot == info["slot"]), None)
    if target is None:
        return None
    keys = [c.key for c in CATEGORIES.values() if c.kind in ("element", "computed") and c.key in target.row]

    def stats(t: Tensor):
        vals = tuple(t.row.get(k) for k in keys)
        return None if not vals or any(v is None or v != v for v in vals) else vals
    want = stats(target)
    if want is None:
        return None
    for p in reversed(pairs):
        a = p.a
        if (p.b is None and a.kind == "op" and a.io == "output" and a.order < target.order
                and a.dtype == target.dtype and stats(a) == want):
            src, code = source_of(p)
            return {"op": a.op, "op_type": a.op_type, "slot": a.slot, "source": src, "code": code}
    return None
