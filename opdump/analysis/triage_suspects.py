"""The suspects of run 1 of ``opdump triage`` (README, Analysis: triage), found by the
analyses opdump already has -- one implementation each:

* the first NaN/Inf origin: :func:`opdump.analysis.overflow.find_overflow`;
* watchpoint hits: :func:`opdump.analysis.watch.watch`;
* the first difference (same dtypes) or first divergence against a reference dump:
  :func:`opdump.analysis.compare.compare`.

Each gives a :class:`Suspects`: the origin (the operator reported first, with its
iteration and source line), the operators and parameters whose tensors run 2 dumps (the
origin's input producers from the listing included) and the iterations it dumps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from ..format.names import sanitize
from .reader import Dump
from .triage_producers import input_producers

__all__ = ["Origin", "Suspects", "from_overflow", "from_watch", "from_reference"]


@dataclass
class Origin:
    """The operator (or parameter) reported first."""

    op: str
    op_type: str
    iteration: Optional[int]
    rank: int
    graph: Optional[int]
    kind: str                          # operator | input | argument | parameter | hit | difference | divergence
    source: str = ""
    code: str = ""
    detail: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Suspects:
    mode: str                          # overflow | watch | reference
    origin: Optional[Origin] = None
    ops: List[str] = field(default_factory=list)           # full names (run 2's kernels)
    parameters: List[str] = field(default_factory=list)    # parameter names as the dump writes them
    iterations: List[int] = field(default_factory=list)
    rank: int = 0
    notes: List[str] = field(default_factory=list)         # what the analysis said besides the origin
    analysis: Dict[str, Any] = field(default_factory=dict)  # the analysis's own result, as data

    @property
    def found(self) -> bool:
        return self.origin is not None

    @property
    def kernels(self) -> List[str]:
        return list(self.ops) + list(self.parameters)

    def add_op(self, dump: Dump, op: str, rank: int, graph: Optional[int], with_producers: bool = True) -> None:
        if op not in self.ops:
            self.ops.append(op)
        if with_producers:
            prod = input_producers(dump, op, rank=rank, graph=graph)
            for p in prod.ops:
                if p not in self.ops:
                    self.ops.append(p)
            for p in prod.parameters:       # as the dump names it: Parameter.fc1_weight
                self.add_parameter("Parameter." + sanitize(p))

    def add_parameter(self, name: str) -> None:
        if name not in self.parameters:
            self.parameters.append(name)

    def add_iteration(self, it: Optional[int]) -> None:
        if it is not None and int(it) not in self.iterations:
            self.iterations.append(int(it))
            self.iterations.sort()


def _info(dump: Dump, op: str, rank: int, graph: Optional[int]):
    return dump.op_info(op, rank=rank, graph=graph)


def from_overflow(dump: Dump, iterations: Optional[Sequence[int]] = None, progress: bool = True) -> Suspects:
    """The first NaN/Inf origin (its operator and the producers of its inputs)."""
    from .overflow import find_overflow
    rep = find_overflow(dump, iterations=iterations, progress=progress)
    s = Suspects("overflow")
    s.analysis = {"origin": rep.origin.to_dict() if rep.origin else None,
                  "affected": [e.to_dict() for e in rep.affected],
                  "more_origins": [e.to_dict() for e in rep.more_origins], "scanned_tensors": rep.scanned_tensors,
                  "method": rep.method}
    o = rep.origin
    if o is None:
        return s
    s.rank = o.rank
    s.origin = Origin(o.op, o.op_type, o.iteration, o.rank, o.graph, o.kind, o.source, o.code,
                      "; ".join(t.describe() for t in o.tensors))
    s.add_op(dump, o.op, o.rank, o.graph)
    s.add_iteration(o.iteration)
    s.notes += [f"next affected: {e.op} (iteration {e.iteration})" for e in rep.affected]
    s.notes += [f"also overflowed on its own: {e.op} (iteration {e.iteration})" for e in rep.more_origins]
    return s


def from_watch(dump: Dump, conditions: Sequence[str], iterations: Optional[Sequence[int]] = None,
               max_suspects: int = 5, progress: bool = True) -> Suspects:
    """The first ``max_suspects`` watchpoint hits (distinct operators/parameters)."""
    from .watch import watch
    hits = watch(dump, list(conditions), iterations=iterations, progress=progress)
    s = Suspects("watch")
    s.analysis = {"hits": [h.to_dict() for h in hits[:1000]], "total_hits": len(hits)}
    seen: List[str] = []
    for h in hits:
        if h.op in seen or h.rank != (s.origin.rank if s.origin else h.rank):
            continue          # each suspect at its first hit; the first hit's rank
        if len(seen) >= max_suspects:
            break
        seen.append(h.op)
        recs = dump.records()
        kind = recs.loc[(recs["op"] == h.op) & (recs["rank"] == h.rank), "kind"]
        is_param = len(kind) > 0 and kind.iloc[0] != "op"
        info = None if is_param else _info(dump, h.op, h.rank, h.graph)
        if s.origin is None:
            s.rank = h.rank
            s.origin = Origin(h.op, "Parameter" if is_param else (info.op_type if info else ""), h.iteration, h.rank,
                              h.graph, "hit", info.source if info else "", info.code if info else "",
                              f"[{h.condition}] {h.io}.{h.slot}: {h.detail}")
        if is_param:
            s.add_parameter(h.op)
        else:
            s.add_op(dump, h.op, h.rank, h.graph, with_producers=(h.op == s.origin.op))
        s.add_iteration(h.iteration)
        s.add_iteration(h.previous_iteration)
    s.notes += [f"[{h['condition']}] {h['op']} {h['io']}.{h['slot']} iteration {h['iteration']}: {h['detail']}"
                for h in s.analysis["hits"][:20]]
    return s


def from_reference(dump: Dump, reference: str, iterations: Optional[Sequence[int]] = None,
                   progress: bool = True) -> Suspects:
    """Where run 1 first parts from ``reference``: the first difference when both hold the
    same dtypes, else the first diverging operator (compare's rule)."""
    from .compare import RULE_FIRST_DIFFERENCE, CompareError, compare
    try:
        res = compare(dump, reference, iterations=iterations, progress=progress)
    except CompareError as e:
        raise ValueError(f"run 1 cannot be compared with the reference {reference}: {e} (the reference must "
                         "hold statistics of the same program: saved_data 'statistic' or 'full')") from None
    s = Suspects("reference")
    s.analysis = res.to_dict()
    s.notes.append(res.summary())
    use_diff = res.rule == RULE_FIRST_DIFFERENCE and res.first_difference is not None
    fd = res.first_difference if use_diff else res.first_divergence
    if fd is None:
        for p in res.diverged_parameters:
            s.add_parameter(p)
        return s
    s.rank = int(fd["rank"])
    s.origin = Origin(fd["op"], fd.get("op_type") or "", fd.get("iteration"), s.rank, fd.get("graph"),
                      "difference" if use_diff else "divergence", fd.get("source") or "", fd.get("code") or "",
                      f"{fd.get('reason', '')}; cause: {fd.get('cause', '')}")
    s.add_op(dump, fd["op"], s.rank, fd.get("graph"))
    for p in fd.get("parameters") or []:
        s.add_parameter(p)
    s.add_iteration(fd.get("iteration"))
    return s
