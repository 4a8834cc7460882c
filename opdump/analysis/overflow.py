"""The first NaN / Inf / overflow of a dump (README, Analysis: overflow).

Operators are visited in execution order (iteration, then graph -- graphs of an
iteration in the order they ran --, then the execution-order CSV).  A tensor's
finiteness comes from its statistics when they tell (NaN/Inf counts, or
max/min/avg/l2norm being NaN/Inf), else from its data (memory-mapped, chunked).
Only floating tensors count.

The **origin** is the first operator whose output holds NaN/Inf while its
floating inputs are finite: that operator overflowed.  When the first tensor
holding NaN/Inf is an operator's *input* (a weight, a graph input, or the output
of an operator that was not dumped), the origin is reported as ``kind="input"``
on that operator; when it comes from a NaN non-tensor *argument*
(``x + float("nan")``), as ``kind="argument"``.  Operators after the origin whose
outputs hold NaN/Inf are the *affected* ones (victims), listed up to
``max_affected``.  Operators after the origin that overflowed on their own -- outputs
NaN/Inf, floating inputs dumped and finite (another ``exp`` that overflows in the same
step, a backward operator, every entry of an overflow-only dump after the first) -- are
not victims of the origin: they are listed apart, in :attr:`OverflowReport.more_origins`
(up to ``max_affected`` as well).

**Inf on purpose.**  Models make ``-inf`` deliberately: attention masks
(``scalar_tensor(-inf)``, ``masked_fill(…, -inf)``, ``full(…, finfo.min)`` in a
narrower dtype).  The capture flags an operator whose non-tensor argument is
Inf/NaN or a float type's extreme (``nonfinite_args`` in the listing): its inputs
count as non-finite, so it is never an overflow origin.  Its Inf outputs (no
NaN) are *on purpose*, and so are the Inf outputs (no NaN) of an operator whose
non-finite inputs are all on purpose (the mask flowing through ``where``,
``add``, ``expand``…).  A tensor is recognised downstream by its signature
(dtype, shape and NaN/+Inf/-Inf counts, or max/min without counts).  An operator
that turns on-purpose inputs into NaN (a fully masked softmax row) is an origin.

Undefined values are ignored (see :mod:`.common`): outputs of ``empty``/
``empty_like``/``empty_strided``/``new_empty`` and the destination input of
wholesale-overwrite operators (``fill_``, ``zero_``, ``copy_``, ``uniform_``,
``normal_`` …).

**Bad input.**  A tensor file that cannot be read (truncated, garbage, a header
describing more bytes than the file holds: checked before anything is allocated) and
a statistics row with malformed cells are listed in :attr:`OverflowReport.unreadable`
as ``(path, reason)``; the rest is analysed.  Such a tensor's finiteness is unknown
(counted in ``unknown_tensors``), never "finite" and never "NaN".  When no floating
tensor is left to scan, :attr:`OverflowReport.nothing` says so (the CLI exits 2).
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .common import (array_nonfinite, is_float_row, is_garbage, nothing_to_analyse, read_error, stat_errors_of,
                     table_stat_problems,
                     stats_nonfinite, progress_bar)
from .reader.npy import load_checked
from .reader import Dump
from ..debug.origin import ARGUMENT, INPUT, ON_PURPOSE, OPERATOR, judge    # the rule op_debug_mode 3 uses too

__all__ = ["OverflowEvent", "OverflowReport", "find_overflow", "listed_not_dumped"]


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
    signature: Optional[tuple] = None  # recognises the same tensor as another operator's input
    has_nan: bool = False

    def inf_only(self) -> bool:
        """Non-finite with Inf values and no NaN (what a mask holds)."""
        return bool(self.nonfinite) and not self.has_nan

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
    kind: str                          # operator | input | argument
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
    #: later operators that overflowed on their own (finite inputs), after the origin
    more_origins: List[OverflowEvent] = field(default_factory=list)
    per_rank: Dict[int, Optional[OverflowEvent]] = field(default_factory=dict)
    scanned_tensors: int = 0
    unknown_tensors: int = 0           # finiteness could not be told (no stats, no data)
    method: str = ""                   # statistics | tensors | statistics+tensors
    #: files that could not be read, and statistics rows with malformed cells: (path, reason)
    unreadable: List[Tuple[str, str]] = field(default_factory=list)
    #: set when there was nothing to analyse: the one line saying so (and where it looked)
    nothing: Optional[str] = None

    @property
    def found(self) -> bool:
        return self.origin is not None


def _count(row: Dict[str, Any], key: str) -> Optional[int]:
    v = row.get(key)
    try:
        return int(v) if v is not None and v == v else None
    except (TypeError, ValueError):
        return None


def _state(row: Dict[str, Any], use_tensors: bool, unreadable: List[Tuple[str, str]]) -> TensorState:
    st = TensorState(row["io"], int(row["slot"]), row.get("dtype"), None, path=row.get("path"))
    shape = row.get("shape")
    bad_stats = stat_errors_of(row)         # reported by find_overflow (table_stat_problems)
    if row.get("stat_row") is True and bad_stats is None:
        nf = stats_nonfinite(row)
        if nf is not None:
            st.nonfinite, st.source = nf, "statistics"
            if nf:
                st.nan, st.pos_inf, st.neg_inf = (_count(row, "nan_count"), _count(row, "positive_inf_count"),
                                                  _count(row, "negative_inf_count"))
                if st.nan is not None:
                    st.has_nan = st.nan > 0
                else:       # no NaN count: a NaN max/min/avg says there is NaN
                    st.has_nan = any(_is_nan(row.get(k)) for k in ("max", "min", "avg", "l2norm"))
                st.signature = (st.dtype, str(shape), st.nan, st.pos_inf, st.neg_inf,
                                None if st.nan is not None else (str(row.get("max")), str(row.get("min"))))
            return st
    p = row.get("path")
    if use_tensors and isinstance(p, str):
        try:
            c = array_nonfinite(load_checked(p))   # header checked against the file size first
        except Exception as e:  # noqa: BLE001 - one bad file is reported, the rest analysed
            unreadable.append((p, read_error(e)))
            return st                       # finiteness unknown
        st.source = "tensor"
        if c is not None:
            st.nonfinite = (c["nan"] + c["pos_inf"] + c["neg_inf"]) > 0
            st.nan, st.pos_inf, st.neg_inf = c["nan"], c["pos_inf"], c["neg_inf"]
            st.has_nan = c["nan"] > 0
            st.signature = (st.dtype, str(c.get("shape", shape)), st.nan, st.pos_inf, st.neg_inf, None)
        else:
            st.nonfinite = False
    return st


def _is_nan(v: Any) -> bool:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return False
    return x != x


def find_overflow(dump: Dump, rank: Optional[int] = None, iterations: Optional[Iterable[int]] = None,
                  max_affected: int = 5, use_tensors: bool = True, progress: bool = True) -> OverflowReport:
    """Find the first operator that produced NaN/Inf (see module doc).

    ``iterations``: restrict to these; ``use_tensors``: read tensor data when statistics
    cannot tell (off: statistics only)."""
    rec = dump.records()
    report = OverflowReport(None)
    if rec.empty:
        report.nothing = nothing_to_analyse(dump, "tensor files or statistics rows")
        return report
    report.unreadable.extend(table_stat_problems(rec))
    if rank is not None:
        rec = rec[rec["rank"] == rank]
    if iterations is not None:
        its = set(int(i) for i in iterations)
        rec = rec[rec["iteration"].isin(its)]
    rec = rec[rec["iteration"].notna()]
    # only floating tensors, no garbage
    if not rec.empty:      # (a boolean list selects nothing from an empty frame: pandas raises)
        rec = rec[[is_float_row(d, p, report.unreadable) for d, p in zip(rec["dtype"], rec["path"])]]
    if not rec.empty:
        rec = rec[[not is_garbage(t, io, s) for t, io, s in zip(rec["op_type"], rec["io"], rec["slot"])]]
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
        more: List[OverflowEvent] = []         # later operators that overflowed on their own
        seen_bad = False
        iteration, on_purpose = None, set()     # signatures of the iteration's on-purpose Inf tensors
        i = 0
        while i < len(rows):
            j = i
            key = (rows[i]["iteration"], rows[i]["graph"], rows[i]["op_file"], rows[i]["call"])
            while j < len(rows) and (rows[j]["iteration"], rows[j]["graph"], rows[j]["op_file"], rows[j]["call"]) == key:
                j += 1
            group = rows[i:j]
            i = j
            if origin is not None and max(len(affected), len(more)) >= max_affected:
                break
            states = [_state(r, use_tensors, report.unreadable) for r in group]
            if bar is not None:
                bar.update(len(group))
            report.scanned_tensors += len(states)
            report.unknown_tensors += sum(1 for s in states if s.nonfinite is None)
            methods.update(s.source for s in states if s.source)
            g0 = group[0]
            if g0["kind"] != "op":
                continue   # parameters are reached through the operators that read them
            if g0["iteration"] != iteration:
                iteration, on_purpose = g0["iteration"], set()
            bad_in = [s for s in states if s.io == "input" and s.nonfinite]
            bad_out = [s for s in states if s.io == "output" and s.nonfinite]
            if not bad_in and not bad_out:
                continue
            info = dump.op_info(g0["op"], rank=rk, graph=int(g0["graph"]))
            flagged = info is not None and info.nonfinite_args
            unexplained = [s for s in bad_in if not (s.inf_only() and s.signature in on_purpose)]
            verdict = judge(bool(bad_in), bool(unexplained), bool(bad_out), any(s.has_nan for s in bad_out), flagged)
            if verdict == ON_PURPOSE:
                # Inf made on purpose (a mask), or an on-purpose Inf passed along: not an origin
                on_purpose.update(s.signature for s in bad_out if s.signature is not None)
                continue
            ev = OverflowEvent(rk, int(g0["iteration"]), int(g0["graph"]), g0["op"], g0["op_type"],
                               int(g0["order"]), "operator", bad_out or bad_in,
                               any(s.io == "input" for s in states))
            if info is not None:
                ev.source, ev.code = info.source, info.code
            if origin is None:
                if verdict in (ARGUMENT, OPERATOR):    # argument: a NaN came in as a non-tensor argument
                    ev.kind = verdict
                    origin = ev
                elif verdict == INPUT and not seen_bad:
                    ev.kind = "input"
                    ev.tensors = unexplained + bad_out
                    origin = ev
                seen_bad = True
                continue
            if verdict in (ARGUMENT, OPERATOR) and ev.inputs_checked:
                ev.kind = verdict                   # finite inputs: an origin of its own, not a victim
                more.append(ev)
            elif bad_out:
                affected.append(ev)
        report.per_rank[rk] = origin
        if origin is not None:
            first_events.append((origin.iteration, rk, origin, affected, more))
    if bar is not None:
        bar.close()
    if report.scanned_tensors == 0 and not report.unreadable:
        sel = [f"rank {rank}"] if rank is not None else []
        sel += [f"iterations {sorted(set(int(i) for i in iterations))}"] if iterations is not None else []
        report.nothing = nothing_to_analyse(dump, "floating tensors" + (f" ({', '.join(sel)})" if sel else ""))
    report.unreadable = list(dict.fromkeys(report.unreadable))
    report.method = "+".join(sorted(methods)) if methods else ""
    if first_events:
        first_events.sort(key=lambda t: (t[0], t[1]))
        _, _, report.origin, report.affected, report.more_origins = first_events[0]
    return report


def listed_not_dumped(dump: Dump, rank: Optional[int] = None,
                      iterations: Optional[Iterable[int]] = None) -> List[Dict[str, Any]]:
    """The overflowing operators an overflow-only dump (``op_debug_mode`` 3) listed in its
    ``overflow.json`` summaries but did not dump (past ``overflow_number``), in execution order:
    dicts of the summary's entry plus ``rank``, ``graph`` and ``iteration``.

    Why: they have no tensor file and no statistics row, so :func:`find_overflow` cannot see
    them; a limited watch (``overflow_number`` 1) would otherwise show the user one origin and
    hide a second operator that overflowed on its own (a backward ``cosh``), or say "nothing to
    analyse" for an iteration whose overflows were all past the limit.  An unreadable summary
    is skipped (it proves nothing)."""
    wanted = None if iterations is None else {int(i) for i in iterations if not isinstance(i, tuple)}
    out: List[Dict[str, Any]] = []
    for rk, r in sorted(dump.ranks.items()):
        if rank is not None and rk != rank:
            continue
        for p in glob.glob(os.path.join(glob.escape(str(r.path)), "**", "overflow.json"), recursive=True):
            try:
                with open(p, encoding="utf-8") as f:
                    body = json.load(f)
                it, events = int(body["iteration"]), list(body["overflows"])
            except Exception:  # noqa: BLE001 - an unreadable summary proves nothing
                continue
            if wanted is not None and it not in wanted:
                continue
            graph = os.path.basename(os.path.dirname(os.path.dirname(p)))
            for e in events:
                if isinstance(e, dict) and e.get("dumped") is False:
                    out.append({**e, "rank": rk, "iteration": it,
                                "graph": int(graph) if graph.isdigit() else graph})
    # execution order: iteration, then the watch's order (one counter per session)
    out.sort(key=lambda e: (e["rank"], e["iteration"], str(e["graph"]), int(e.get("order") or 0)))
    return out


def describe_listed(e: Dict[str, Any]) -> str:
    """One line for an entry of :func:`listed_not_dumped`."""
    outs = []
    for o in e.get("outputs") or []:
        counts = [f"{o[k]} {w}" for k, w in (("nan", "NaN"), ("pos_inf", "+Inf"), ("neg_inf", "-Inf")) if o.get(k)]
        outs.append(f"output.{o.get('slot')}: " + ", ".join(counts or ["non-finite"]))
    where = f"iteration {e['iteration']}, graph {e['graph']}" + (f", {e['source']}" if e.get("source") else "")
    return f"{e.get('op')}  ({where})" + (f"  {'; '.join(outs)}" if outs else "")
