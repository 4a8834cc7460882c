"""The first NaN / Inf / overflow of a dump (SPEC F31, F21's definition).

Operators are visited in execution order (iteration, then graph -- graphs of an
iteration in the order they ran --, then the execution-order CSV).  A tensor's
finiteness comes from its statistics when they tell (NaN/Inf counts, or
max/min/avg/l2norm being NaN/Inf), else from its data (memory-mapped, chunked).
Only floating tensors count.

The **origin** is the first operator whose output holds NaN/Inf while its
floating inputs are finite: that operator overflowed.  When the first tensor
holding NaN/Inf is an operator's *input* (a weight, a graph input, or the output
of an operator that was not dumped), the origin is reported as ``kind="input"``
on that operator.  Operators after the origin whose outputs hold NaN/Inf are
the *affected* ones (victims), listed up to ``max_affected``.

Undefined values are ignored (F30a): outputs of ``empty``/``empty_like``/
``empty_strided``/``new_empty`` and the destination input of wholesale-overwrite
operators (``fill_``, ``zero_``, ``copy_``, ``uniform_``, ``normal_`` …).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

from .common import array_nonfinite, is_float_row, is_garbage, stats_nonfinite, progress_bar
from .reader import Dump

__all__ = ["OverflowEvent", "OverflowReport", "find_overflow"]


@dataclass
class TensorState:
    io: str
    slot: int
    dtype: Optional[str]
    nonfinite: Optional[bool]          # None: could not tell
    nan: Optional[int] = None
    pos_inf: Optional[int] = None
    neg_inf: Optional[int] = None
    source: str = ""                  # statistics | tensor
    path: Optional[str] = None

    def describe(self) -> str:
        parts = []
        if self.nan:
            parts.append(f"{self.nan} NaN")
        if self.pos_inf:
            parts.append(f"{self.pos_inf} +Inf")
        if self.neg_inf:
            parts.append(f"{self.neg_inf} -Inf")
        what = ", ".join(parts) if parts else "NaN/Inf"
        return f"{self.io}.{self.slot}: {what}"


@dataclass
class OverflowEvent:
    rank: int
    iteration: Optional[int]
    graph: int
    op: str
    op_type: str
    order: int
    kind: str                          # operator | input
    tensors: List[TensorState] = field(default_factory=list)   # the NaN/Inf tensors
    inputs_checked: bool = True
    source: str = ""                   # file:line of the user's frame
    code: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return {
            "rank": self.rank, "iteration": self.iteration, "graph": self.graph, "op": self.op,
            "op_type": self.op_type, "order": self.order, "kind": self.kind, "source": self.source,
            "code": self.code, "tensors": [t.describe() for t in self.tensors],
            "paths": [t.path for t in self.tensors if t.path],
        }


@dataclass
class OverflowReport:
    origin: Optional[OverflowEvent]
    affected: List[OverflowEvent] = field(default_factory=list)
    per_rank: Dict[int, Optional[OverflowEvent]] = field(default_factory=dict)
    scanned_tensors: int = 0
    unknown_tensors: int = 0           # finiteness could not be told (no stats, no data)
    method: str = ""                   # statistics | tensors | statistics+tensors

    @property
    def found(self) -> bool:
        return self.origin is not None


def _state(row: Dict[str, Any], use_tensors: bool) -> TensorState:
    st = TensorState(row["io"], int(row["slot"]), row.get("dtype"), None, path=row.get("path"))
    if row.get("stat_row") is True:
        nf = stats_nonfinite(row)
        if nf is not None:
            st.nonfinite, st.source = nf, "statistics"
            if nf:
                def _c(k):
                    v = row.get(k)
                    try:
                        return int(v) if v == v and v is not None else None
                    except (TypeError, ValueError):
                        return None
                st.nan, st.pos_inf, st.neg_inf = _c("nan_count"), _c("positive_inf_count"), _c("negative_inf_count")
            return st
    p = row.get("path")
    if use_tensors and isinstance(p, str):
        try:
            c = array_nonfinite(p)
        except (OSError, ValueError):
            c = None
        if c is not None:
            st.nonfinite = (c["nan"] + c["pos_inf"] + c["neg_inf"]) > 0
            st.nan, st.pos_inf, st.neg_inf = c["nan"], c["pos_inf"], c["neg_inf"]
            st.source = "tensor"
        else:
            st.nonfinite = False
            st.source = "tensor"
    return st


def find_overflow(dump: Dump, rank: Optional[int] = None, iterations: Optional[Iterable[int]] = None,
                  max_affected: int = 5, use_tensors: bool = True, progress: bool = True) -> OverflowReport:
    """Find the first operator that produced NaN/Inf (see module doc).

    ``iterations``: restrict to these; ``use_tensors``: read tensor data when statistics
    cannot tell (off: statistics only)."""
    rec = dump.records()
    report = OverflowReport(None)
    if rec.empty:
        return report
    if rank is not None:
        rec = rec[rec["rank"] == rank]
    if iterations is not None:
        its = set(int(i) for i in iterations)
        rec = rec[rec["iteration"].isin(its)]
    rec = rec[rec["iteration"].notna()]
    # only floating tensors, no garbage
    is_float = [is_float_row(d, p) for d, p in zip(rec["dtype"], rec["path"])]
    rec = rec[is_float]
    keep = [not is_garbage(t, io, s) for t, io, s in zip(rec["op_type"], rec["io"], rec["slot"])]
    rec = rec[keep]
    methods = set()
    bar = progress_bar(progress, len(rec), "overflow scan", "tensor")
    records = rec.to_dict("records")
    # group rows by rank, then by op call (contiguous in order)
    by_rank: Dict[int, List[Dict[str, Any]]] = {}
    for r in records:
        by_rank.setdefault(int(r["rank"]), []).append(r)
    first_events = []
    for rk in sorted(by_rank):
        rows = sorted(by_rank[rk], key=lambda r: (int(r["iteration"]), int(r["order"])))
        origin: Optional[OverflowEvent] = None
        affected: List[OverflowEvent] = []
        seen_bad = False
        i = 0
        while i < len(rows):
            j = i
            key = (rows[i]["iteration"], rows[i]["graph"], rows[i]["op_file"], rows[i]["call"])
            while j < len(rows) and (rows[j]["iteration"], rows[j]["graph"], rows[j]["op_file"], rows[j]["call"]) == key:
                j += 1
            group = rows[i:j]
            i = j
            if origin is not None and len(affected) >= max_affected:
                break
            states = [_state(r, use_tensors) for r in group]
            if bar is not None:
                bar.update(len(group))
            report.scanned_tensors += len(states)
            report.unknown_tensors += sum(1 for s in states if s.nonfinite is None)
            methods.update(s.source for s in states if s.source)
            g0 = group[0]
            is_param = g0["kind"] != "op"
            bad_in = [s for s in states if s.io == "input" and s.nonfinite]
            bad_out = [s for s in states if s.io == "output" and s.nonfinite]
            has_inputs = any(s.io == "input" for s in states)
            if is_param:
                continue   # parameters are reached through the operators that read them
            if not bad_in and not bad_out:
                continue
            ev = OverflowEvent(rk, int(g0["iteration"]), int(g0["graph"]), g0["op"], g0["op_type"],
                               int(g0["order"]), "operator", bad_out or bad_in, has_inputs)
            info = dump.op_info(g0["op"], rank=rk, graph=int(g0["graph"]))
            if info is not None:
                ev.source, ev.code = info.source, info.code
            if origin is None:
                if bad_out and not bad_in:
                    origin = ev
                elif bad_in and not seen_bad:
                    ev.kind = "input"
                    ev.tensors = bad_in + bad_out
                    origin = ev
                seen_bad = True
                continue
            if bad_out:
                affected.append(ev)
        report.per_rank[rk] = origin
        if origin is not None:
            first_events.append((origin.iteration, rk, origin, affected))
    if bar is not None:
        bar.close()
    report.method = "+".join(sorted(methods)) if methods else ""
    if first_events:
        first_events.sort(key=lambda t: (t[0], t[1]))
        _, _, report.origin, report.affected = first_events[0]
    return report
