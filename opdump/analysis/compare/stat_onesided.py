"""The tensors left without a partner in a column-wise statistics compare (:mod:`.stat_pairs`,
pairs made by :mod:`.stat_match`): their table rows, sort keys and what the summary says of
them, as the per-row stages make them.

The per-row stages give an unpaired tensor (``Pair(a, None)`` or ``Pair(None, b)``) the
verdict ``unmatched``, the reason ``only in A``/``only in B`` (`` (front-end operator)``
after it when its rule is ``front-end``), no mode, no metrics, ``identical`` None; its table
row takes rank, graph, type, kind, io, slot and call from its one tensor, the other side's
columns None; it sorts by :meth:`.pairs.Pair.sort_key` (A's tensors first, B's alone after
them).  :func:`summary_lists` gives ``compare``'s ``_result`` lists of unmatched and front-end
operators and the warning when most operators are unmatched.
"""
from __future__ import annotations

from itertools import compress, repeat
from operator import and_, eq
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from .frontend import RULE_FRONT_END
from .stat_calls import row_keys
from .stat_gather import take_cells as _take

__all__ = ["add_one_sided", "summary_lists", "unmatched_warning", "call_counts", "MIN_MATCHED_SHARE"]

#: when fewer than this share of the operators of A, and of B, are matched, the result warns
#: (one side mostly matched is a subset, e.g. a compiled model against the whole eager step)
MIN_MATCHED_SHARE = 0.5

_NONE_KEYS = ("op_type_b", "io_b", "slot_b", "kind_b", "rank_b", "graph_b", "op_file_b", "call_b")


def _ints(v: List[Any]) -> List[Any]:
    return v if not (set(map(type, v)) - {int}) else [int(x) for x in v]


def add_one_sided(c: Dict[str, list], keys: Dict[str, list], s: int, sa, sb, ai: np.ndarray, bi: np.ndarray,
                  rules: np.ndarray, its_a: List[Optional[int]], its_b: List[Optional[int]], dtypes, shapes) -> None:
    """Append to the pair columns ``c`` (already judged) the rows of side pair ``s`` whose
    tensor has no partner (``ai`` or ``bi`` -1), and their sort keys to ``keys`` (``flag``,
    ``it``, ``rank``, ``order``: :meth:`.pairs.Pair.sort_key`).  ``its_*``: each row's
    iteration; ``dtypes``/``shapes``: the cells as the pair columns hold them."""
    for only_a, frame, rows, its in ((True, sa, ai[bi < 0], its_a), (False, sb, bi[ai < 0], its_b)):
        rl = rules[bi < 0] if only_a else rules[ai < 0]
        n = len(rows)
        if not n:
            continue
        rl = rl.tolist()
        it = list(map(its.__getitem__, rows.tolist()))
        none = [None] * n
        ident = {k: _ints(_take(frame, k, rows)) for k in ("rank", "graph", "slot", "call", "order")}
        for k in ("op_type", "kind", "io"):
            ident[k] = _take(frame, k, rows)
        for k in ("rank", "graph", "slot", "call", "op_type", "kind", "io", "order"):
            c[k] += ident[k]
        op = _take(frame, "op", rows)
        dt, sh = dtypes(_take(frame, "dtype", rows)), shapes(_take(frame, "shape", rows))
        for key_a, key_b, values in (("iteration", "iteration_b", it), ("op", "op_b", op), ("dtype_a", "dtype_b", dt),
                                     ("shape_a", "shape_b", sh), ("row_a", "row_b", rows.tolist())):
            c[key_a] += values if only_a else none
            c[key_b] += none if only_a else values
        if only_a:
            c["op_file"] += _take(frame, "op_file", rows)
            for k in _NONE_KEYS:
                c[k] += none
        else:
            c["op_file"] += none
            for k, src in zip(_NONE_KEYS, ("op_type", "io", "slot", "kind", "rank", "graph", "op_file", "call")):
                c[k] += ident[src] if src in ident else _take(frame, src, rows)
        c["has_a"] += [only_a] * n
        c["has_b"] += [not only_a] * n
        c["side"] += [s] * n
        c["match"] += rl
        base = "only in A" if only_a else "only in B"
        c["verdict"] += ["unmatched"] * n
        c["reason"] += [base + " (front-end operator)" if r == RULE_FRONT_END else base for r in rl]
        c["mode"] += [""] * n
        c["metrics"] += [{} for _ in range(n)]
        c["identical"] += none
        c["same"] += [False] * n
        keys["flag"] += [0 if only_a else 1] * n
        keys["it"] += it
        keys["rank"] += ident["rank"]
        keys["order"] += ident["order"]


def summary_lists(c: Dict[str, list]):
    """``(unmatched_a, unmatched_b, front_end_a, front_end_b)`` of table-ordered pair columns,
    as ``compare``'s ``_result`` lists them (operators first seen first; an operator with an
    unmatched tensor is not listed as front-end)."""
    has_a, has_b = c.get("has_a"), c.get("has_b")
    if has_a is None or all(has_a) and all(has_b):
        return [], [], [], []
    un: List[Dict[str, None]] = [{}, {}]
    front: List[Dict[str, None]] = [{}, {}]
    for x, y, rule, oa, ob in zip(has_a, has_b, c["match"], c["op"], c["op_b"]):
        if x and not y:
            (front[0] if rule == RULE_FRONT_END else un[0]).setdefault(oa, None)
        elif y and not x:
            (front[1] if rule == RULE_FRONT_END else un[1]).setdefault(ob, None)
    return (list(un[0]), list(un[1]), [o for o in front[0] if o not in un[0]],
            [o for o in front[1] if o not in un[1]])


def unmatched_warning(ops: Dict[str, int]) -> List[str]:
    """``compare``'s warning when most operators of both sides are unmatched."""
    share = max(ops["matched_a"] / ops["calls_a"] if ops["calls_a"] else 1.0,
                ops["matched_b"] / ops["calls_b"] if ops["calls_b"] else 1.0)
    if share < MIN_MATCHED_SHARE:
        return [f"most operators are unmatched ({ops['matched_a']} of {ops['calls_a']} in A, "
                f"{ops['matched_b']} of {ops['calls_b']} in B matched): A and B may come from different "
                "models or programs"]
    return []


def call_counts(c: Dict[str, list], n: int, keys_of: Optional[Callable[[], List[tuple]]] = None):
    """``compare``'s operator counts of pair columns: (calls of A, calls of A with a matched
    pair, the same of B), calls named by (rank, iteration, graph, file name, call).

    ``keys_of``: A's call keys (:class:`.stat_calls._KeysOnce`: those tuples of A's columns,
    made once for the summary); B's calls are counted on :func:`.stat_calls.row_keys` of its
    columns (equal exactly where the tuples are, without the constant columns: ~2/3 of the
    tuples' cost on a one-rank, one-graph dump)."""
    has_a, has_b = c.get("has_a") or [True] * n, c.get("has_b") or [True] * n
    both = list(map(and_, has_a, has_b))
    out = []
    for a_side, side, names in ((True, has_a, ("rank", "iteration", "graph", "op_file", "call", "kind")),
                                (False, has_b, ("rank_b", "iteration_b", "graph_b", "op_file_b", "call_b", "kind_b"))):
        here = list(map(and_, side, map(eq, repeat("op"), c[names[-1]])))   # (None == "op": False)
        if a_side and keys_of is not None:
            calls = keys_of()
        else:
            calls = row_keys([c[k] for k in names[:-1]])
        out += [len(set(compress(calls, here))), len(set(compress(calls, map(and_, here, both))))]
    return out
