"""Which operators produced an operator's inputs, read from the graph listing.

Why: ``opdump triage`` dumps whole tensors of a suspect operator *and of the operators
that fed it*, so the second run shows both sides of the first bad value. The ``.ir``
listing (README, Output layout) writes each call as
``%5(mul) = mul.Tensor(%3, 1.0)`` (eager) or ``%5(mul) = mul.Tensor(%relu, 1.0)`` (graph
mode: FX node names) followed by the operator's full name: ``%3`` is the operator with
index 3 of the same graph, ``%relu`` the one whose node is named ``relu``, ``%paraN_name``
a parameter or buffer (eager listings).

Guarantees: only what the listing states is returned (a graph input ``%input``, an
operator of another graph, a MindSpore listing without references give nothing);
a missing or unreadable listing gives empty lists, never an exception.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .reader import Dump

__all__ = ["Producers", "input_producers"]

_CALL = re.compile(r"^\s*%(?P<idx>\d+)(?:\((?P<node>[^)]*)\))?\s*=\s*[^\s(]+\((?P<args>.*)\)(?:\s*\{.*\})?\s*$")
_FULL = re.compile(r"full_name_with_scope:\s*\((?P<name>.+)\)\s*$")
_OP_REF = re.compile(r"%(?!para\d+_)([A-Za-z_0-9]+)\b")
_PARAM_REF = re.compile(r"%para\d+_([^,()\s]+)")


@dataclass
class Producers:
    """The operators (full names) and parameters (names as the dump writes them) an operator reads."""

    ops: List[str] = field(default_factory=list)
    parameters: List[str] = field(default_factory=list)


def _parse_ir(text: str) -> Dict[str, Producers]:
    """full name -> its producers, for every operator of one ``.ir`` listing."""
    by_ref: Dict[str, str] = {}          # "3" (index) and "relu" (node name) -> full name
    pending: List[tuple] = []            # (full name, op refs, param refs)
    cur: Optional[tuple] = None
    for line in text.splitlines():
        m = _CALL.match(line)
        if m:
            args = m.group("args")
            cur = (m.group("idx"), m.group("node"), _OP_REF.findall(args), _PARAM_REF.findall(args))
            continue
        f = _FULL.search(line)
        if f and cur is not None:
            by_ref[cur[0]] = f.group("name")
            if cur[1] and not cur[1].isdigit():
                by_ref.setdefault(cur[1], f.group("name"))
            pending.append((f.group("name"),) + cur[2:])
            cur = None
    out: Dict[str, Producers] = {}
    for name, refs, params in pending:
        p = out.setdefault(name, Producers())
        for r in refs:
            prod = by_ref.get(r)
            if prod is not None and prod != name and prod not in p.ops:
                p.ops.append(prod)
        for q in params:
            if q not in p.parameters:
                p.parameters.append(q)
    return out


def input_producers(dump: Dump, op: str, rank: Optional[int] = None, graph: Optional[int] = None) -> Producers:
    """The producers of ``op``'s inputs in its graph's ``.ir`` (empty when not known)."""
    cache = dump.__dict__.setdefault("_triage_producers", {})
    for rid in dump.rank_ids:
        if rank is not None and rid != rank:
            continue
        for gid, g in sorted(dump.ranks[rid].graphs.items()):
            if graph is not None and gid != graph:
                continue
            key = (rid, gid)
            if key not in cache:
                try:
                    text = g.ir_path.read_text(encoding="utf-8", errors="replace") if g.ir_path else ""
                    cache[key] = _parse_ir(text)
                except OSError:
                    cache[key] = {}
            if op in cache[key]:
                return cache[key][op]
    return Producers()
