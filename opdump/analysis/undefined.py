"""Inputs whose contents are undefined, decided from the graph listing (README, compare:
*skipped*): what :func:`opdump.analysis.common.is_garbage` cannot see from a row's operator
type alone.

* An ``out=`` destination: the tensor an ``out`` overload (``mul.out``, ``max.dim_max``…)
  writes is dumped among its inputs, holding whatever it held before (DDP's reducer writes
  each gradient bucket with ``mul.out``).  The destinations are the overload's keyword-only
  written arguments, last in every such schema: the input slots after ``inputs - outputs``.
* The output of an ``empty*`` operator used before anything wrote it (``inv =
  torch.empty_like(perm); inv[perm] = arange``: ``index_put_``'s destination), known from
  the listing's per-input ``producers``.

Guarantee: needs no ``torch`` (the out overloads are listed here, taken from torch's
schemas: an overload whose keyword-only arguments are written); a listing without
``overload``/``producers`` (older dumps, MindSpore's) makes no input undefined.
"""
from __future__ import annotations

from typing import Any, Dict, FrozenSet, Optional, Tuple

from .common import EMPTY_OPS, base_op_type

__all__ = ["is_out_overload", "undefined_input_slots", "UndefinedInputs"]

#: out overloads whose name is neither ``out`` nor ``*_out`` (torch 2.x's aten schemas with a
#: keyword-only written argument); ``a`` only for ``geqrf`` (``mT.a`` is no out overload)
_OUT_NAMES = frozenset({
    "grad_input", "output", "values", "U", "result", "out_mode", "dim_values", "out_", "dim_max", "dim_min",
    "OutTensor", "OutScalar_Self", "OutScalar_Other", "inverse", "L", "X", "Q", "eigvals", "sign",
    "values_stable", "eigenvalues", "out_rcond_tensor", "out_tol_tensor",
})
_OUT_PAIRS = frozenset({("geqrf", "a")})


def is_out_overload(op_type: Any, overload: Any) -> bool:
    """Does ``op_type.overload`` write keyword-only destinations (an ``out=`` call)?"""
    if not isinstance(overload, str) or not overload:
        return False
    return (overload == "out" or overload.endswith("_out") or overload in _OUT_NAMES
            or (str(op_type), overload) in _OUT_PAIRS)


def undefined_input_slots(info: Any, producer_type) -> FrozenSet[int]:
    """Input slots of the operator ``info`` (a reader ``OpInfo``) holding undefined values.
    ``producer_type(full_name)``: the operator type of a listed operator, or None."""
    slots = set()
    n_in, n_out = len(info.inputs or ()), len(info.outputs or ())
    if is_out_overload(info.op_type, info.overload) and 0 < n_out <= n_in:
        slots.update(range(n_in - n_out, n_in))
    for slot, ref in enumerate(info.producers or ()):
        if ref is not None and base_op_type(producer_type(ref[0])) in EMPTY_OPS:
            slots.add(slot)
    return frozenset(slots)


class UndefinedInputs:
    """``(rank, graph, op full name, io, slot) -> bool`` over one dump's listings, worked
    out once per operator; :attr:`none` is True when no listed operator has such an input
    (the common case: callers then skip the per-row test)."""

    def __init__(self, dump: Any):
        self.dump = dump
        self.cache: Dict[Tuple[Any, Any, str], FrozenSet[int]] = {}
        self.none = not any(o.overload or o.producers for o in dump.op_infos()) or not any(
            self._slots(o.rank, o.graph, o.full_name) for o in dump.op_infos())

    def _slots(self, rank: Any, graph: Any, op: str) -> FrozenSet[int]:
        key = (rank, graph, op)
        got = self.cache.get(key)
        if got is None:
            info = self.dump.op_info(op, rank=rank, graph=graph)

            def producer_type(name: str) -> Optional[str]:
                p = self.dump.op_info(name, rank=rank, graph=graph)
                return p.op_type if p is not None else None
            got = self.cache[key] = (undefined_input_slots(info, producer_type) if info is not None
                                     else frozenset())
        return got

    def __call__(self, rank: Any, graph: Any, op: Any, io: Any, slot: Any) -> bool:
        if self.none or io != "input" or not isinstance(op, str):
            return False
        try:
            return int(slot) in self._slots(rank, graph, op)
        except (TypeError, ValueError):
            return False


def or_undefined(garbage: list, undefined: Optional[UndefinedInputs], c: Dict[str, list], suffix: str = "") -> list:
    """``garbage`` (one bool per pair, from :func:`opdump.analysis.common.is_garbage`) with
    the pairs whose side (``suffix`` ``""``: A's columns, ``"_b"``: B's) is an undefined
    input set too; the same list when ``undefined`` has none.  When the rank and graph
    columns hold one value each (the common case) only the rows of operators that have an
    undefined input slot are asked, found once per distinct operator name (0.07 -> 0.013 s
    of CPU a side on a 146,600-pair statistics compare); else every row is asked."""
    if undefined is None or undefined.none:
        return garbage
    rank, graph, op, io, slot = (c[k + suffix] for k in ("rank", "graph", "op", "io", "slot"))
    n = len(op)
    if not n or n != len(garbage) or rank.count(rank[0]) != n or graph.count(graph[0]) != n:
        return [g or undefined(*key) for g, key in zip(garbage, zip(rank, graph, op, io, slot))]
    r0, g0 = rank[0], graph[0]
    has = {o: isinstance(o, str) and bool(undefined._slots(r0, g0, o)) for o in set(op)}
    out = list(garbage)
    for i, o in enumerate(op):                  # undefined(...) is False on the other rows
        if has[o]:
            out[i] = out[i] or undefined(rank[i], graph[i], o, io[i], slot[i])
    return out


def undefined_pair(p: Any, ua: Optional[UndefinedInputs], ub: Optional[UndefinedInputs]) -> bool:
    """Is either tensor of the compare pair ``p`` an undefined input?"""
    for t, u in ((p.a, ua), (p.b, ub)):
        if t is not None and u is not None and getattr(t, "kind", "op") == "op" and u(
                t.rank, t.graph, t.op, t.io, t.slot):
            return True
    return False
