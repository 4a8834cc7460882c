"""Rank consistency of a data-parallel dump: ``opdump compare --ranks DUMP`` (README,
Analysis: rank consistency).

In data parallelism (DDP, FSDP's replicated parts, Horovod) every rank must hold the same
parameters and buffers, and the same gradients once they are all-reduced; activations differ
(each rank sees its own batch). A rank with a different seed or a buffer nobody
synchronises (``broadcast_buffers=False`` with a running statistic) trains silently apart.

What is compared, rank 0 (the lowest rank) against each other rank, through the compare
package's public :func:`~opdump.analysis.compare.compare` (same matching, same
identical-within-tolerance rule):

* parameters and buffers (``Parameter.*`` files/rows): the values each rank's forward used;
* the optimizer's operators (scope ``Default/optimizer-*``): their inputs are the
  parameters, the all-reduced gradients and the optimizer state, their outputs the update;

* the outputs of collectives that give every rank the same tensor (all-reduce, broadcast,
  all-gather: DDP's gradient buckets after the all-reduce) over the whole world, recorded
  from the completed work: those ``collectives.json`` (written by the eager capture,
  :mod:`opdump.capture.eager.collectives`) lists as ``replicated``, ``complete`` and with
  ``group_size`` equal to ``world_size`` on both ranks of the pair.  Collectives over a
  sub-group (tensor/pipeline parallel groups) differ across groups by design and are left
  out, as are those of dumps without that file (graph mode, older dumps), whose outputs
  may have been captured before the reduction completed.

Guarantees: every such tensor whose ranks differ is listed (rank pair, iteration, name,
io/slot, size of the difference) in execution order; ``first`` is the earliest, so the
first rank pair that differs is named; a tensor only one rank dumped is listed as
``missing``. Nothing else of the dump is judged.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Union

from ..format.layout import COLLECTIVES_JSON
from .reader import Dump, open_dump

__all__ = ["RankDifference", "RankReport", "check_ranks", "is_replicated", "replicated_collectives"]


def is_replicated(op: Any, kind: Any) -> bool:
    """Must this tensor be identical on every data-parallel rank? (see module doc)"""
    if kind is not None and kind != "op":
        return True
    name = str(op or "")
    if any(part.startswith("optimizer-") for part in name.split("/")[:2]):     # Default/optimizer-SGD/…
        return True
    return False


@dataclass
class RankDifference:
    rank_a: int
    rank_b: int
    iteration: Optional[int]
    op: str
    op_type: str
    kind: str
    io: str
    slot: int
    detail: str
    order: int = 0
    source: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)

    def line(self) -> str:
        return (f"ranks {self.rank_a} vs {self.rank_b}, iteration {self.iteration}: {self.op} "
                f"{self.io}.{self.slot}: {self.detail}")


@dataclass
class RankReport:
    path: str
    ranks: List[int]
    compared: int = 0                                  # tensor pairs compared
    collectives: int = 0                               # ...of them, collective outputs
    differences: List[RankDifference] = field(default_factory=list)
    missing: List[RankDifference] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not self.differences and not self.missing

    @property
    def first(self) -> Optional[RankDifference]:
        return self.differences[0] if self.differences else (self.missing[0] if self.missing else None)

    def names(self) -> List[str]:
        """Every operator/parameter where ranks differ, in execution order."""
        out: List[str] = []
        for d in self.differences + self.missing:
            if d.op not in out:
                out.append(d.op)
        return out

    def to_dict(self) -> Dict[str, Any]:
        f = self.first
        return {"path": self.path, "ranks": self.ranks, "compared": self.compared, "collectives": self.collectives,
                "consistent": self.consistent,
                "first": f.to_dict() if f else None, "first_pair": [f.rank_a, f.rank_b] if f else None,
                "names": self.names(), "differences": [d.to_dict() for d in self.differences],
                "missing": [d.to_dict() for d in self.missing], "notes": self.notes}

    def summary(self, limit: int = 30) -> str:
        lines = [f"dump: {self.path}", f"ranks: {', '.join(map(str, self.ranks))}; "
                 f"{self.compared} replicated tensor pairs compared (parameters, buffers, "
                 "the optimizer's operators" + (f", {self.collectives} collective outputs" if self.collectives
                                                else "") + ")"]
        lines += [f"note: {n}" for n in self.notes]
        if self.consistent:
            lines.append("consistent: every replicated tensor is identical across ranks")
            return "\n".join(lines)
        f = self.first
        assert f is not None
        lines.append(f"first rank pair that differs: {f.rank_a} and {f.rank_b}, iteration {f.iteration}, {f.op} "
                     f"{f.io}.{f.slot}" + (f" ({f.source})" if f.source else ""))
        names = self.names()
        lines.append(f"{len(names)} operator(s)/parameter(s) differ across ranks:")
        for d in (self.differences + self.missing)[:limit]:
            lines.append(f"  {d.line()}")
        rest = len(self.differences) + len(self.missing) - limit
        if rest > 0:
            lines.append(f"  … {rest} more (--json lists them all)")
        return "\n".join(lines)


def _f(v: Any) -> Optional[float]:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _detail(r: Dict[str, Any]) -> str:
    parts = []
    if _f(r.get("nonfinite_mismatch")):
        parts.append(f"NaN/Inf at {int(_f(r['nonfinite_mismatch']))} different positions")
    mae = _f(r.get("max_abs_err"))
    if mae is not None:
        parts.append(f"max abs difference {mae:.3g}")
    sd = _f(r.get("stat_max_rel_diff"))
    if sd is not None and mae is None:
        parts.append(f"statistics differ by {sd:.3g} (relative)")
    cos = _f(r.get("cosine"))
    if cos is not None:
        parts.append(f"cosine {cos:.9f}")
    return ", ".join(parts) or str(r.get("reason") or "differs")


def replicated_collectives(path: Union[str, os.PathLike]) -> Dict[int, set]:
    """{rank: {(iteration, operator name)}} of the collectives whose outputs must agree across
    every rank, from the dump's ``collectives.json`` files (module doc); unreadable files are
    skipped (their collectives are not judged)."""
    out: Dict[int, set] = {}
    for root, _dirs, files in os.walk(path):
        if COLLECTIVES_JSON not in files:
            continue
        try:
            with open(os.path.join(root, COLLECTIVES_JSON), encoding="utf-8") as f:
                doc = json.load(f)
            rank = doc.get("rank")
            if rank is None:
                rank = next(int(p[5:]) for p in reversed(os.path.normpath(root).split(os.sep))
                            if p.startswith("rank_") and p[5:].isdigit())
            it = int(doc["iteration"])
            names = out.setdefault(int(rank), set())
            for c in doc.get("collectives", ()):
                size, world = c.get("group_size"), c.get("world_size")
                if c.get("replicated") is True and c.get("complete") is True and size is not None and size == world:
                    names.add((it, str(c["op"])))
        except (OSError, ValueError, TypeError, KeyError, StopIteration, AttributeError):
            continue
    return out


def check_ranks(dump: Union[str, os.PathLike, Dump], *, iterations: Optional[Iterable[int]] = None,
                workers: Optional[int] = None, progress: bool = True) -> RankReport:
    """Compare the replicated tensors of every rank with the lowest rank's (module doc)."""
    from .compare import CompareError, compare
    d = dump if isinstance(dump, Dump) else open_dump(dump)
    ranks = d.rank_ids
    rep = RankReport(str(d.path), ranks)
    if len(ranks) < 2:
        raise ValueError(f"{d.path}: {len(ranks)} rank(s) in the dump; rank consistency needs two or more")
    base = ranks[0]
    its = None if iterations is None else [int(i) for i in iterations]
    exact = replicated_collectives(d.path)
    for other in ranks[1:]:
        try:
            res = compare(d, d, rank=base, rank_b=other, iterations=its, workers=workers, progress=progress)
        except CompareError as e:
            rep.notes.append(f"rank {other}: {e}")
            continue
        for r in res.table.to_dict("records"):
            a_side = r.get("op") is not None and r.get("op") == r.get("op")
            op = r["op"] if a_side else r.get("op_b")
            it = r.get("iteration")
            it = None if it is None or it != it or type(it).__name__ == "NAType" else int(it)
            collective = (r.get("io") == "output" and (it, str(op)) in exact.get(base, ())
                          and (it, str(op)) in exact.get(other, ()))
            if not (collective or is_replicated(op, r.get("kind"))):
                continue
            diff = RankDifference(base, other, it, str(op), str(r.get("op_type") or ""), str(r.get("kind") or ""),
                                  str(r.get("io") or ""), int(r.get("slot") or 0), "", int(r.get("order") or 0),
                                  str(r.get("source") or ""))
            verdict = r.get("verdict")
            if verdict == "unmatched":
                side = base if a_side else other
                diff.detail = f"only rank {side} dumped it"
                rep.missing.append(diff)
                continue
            if verdict in ("skipped", "unreadable"):
                continue
            rep.compared += 1
            rep.collectives += collective
            if r.get("identical") is False or (r.get("identical") is None and verdict in ("diverged", "warning")):
                diff.detail = _detail(r)
                rep.differences.append(diff)
    key = (lambda x: (-1 if x.iteration is None else x.iteration, x.order, x.rank_b))
    rep.differences.sort(key=key)
    rep.missing.sort(key=key)
    return rep
