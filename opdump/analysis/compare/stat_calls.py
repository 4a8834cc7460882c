"""Operator calls of a compare's pair columns (:mod:`.stat_pairs`' summary and first-report
searches): the (rank, iteration, graph, file name, call) key of each pair built once and
shared, and B's count taken from A's when B's columns equal A's.

Why: on 100,000 statistics pairs each list of key tuples costs ~10 ms and each set of them
~20 ms; the summary built the list three times and the set twice.  Guarantee: the same
counts and keys as building them each time (tests/test_compare_stat_calls.py).
"""
from __future__ import annotations

from itertools import compress
from typing import Callable, List, Optional

__all__ = ["operator_calls", "row_keys", "first_rows"]


def _call_keys(c) -> List[tuple]:
    return list(zip(c["rank"], c["iteration"], c["graph"], c["op_file"], c["call"]))


_CALL = ("rank", "iteration", "graph", "op_file", "call")


class _KeysOnce:
    """:func:`_call_keys` of ``c``, made on the first call and kept (column_summary's
    operator count and both first-report searches read the same list: ~10 ms a build on
    100,000 pairs)."""
    __slots__ = ("c", "keys")

    def __init__(self, c):
        self.c, self.keys = c, None

    def __call__(self) -> List[tuple]:
        if self.keys is None:
            self.keys = _call_keys(self.c)
        return self.keys


def _same_columns(c, names) -> bool:
    """Whether B's columns (``name_b``) hold what A's do, cell by cell (list ``==``: C-level,
    identical objects short-cut): answers worked out from A's columns then hold for B's."""
    return all(c[k] == c[k + "_b"] for k in names)


def operator_calls(c, keys: Optional[Callable[[], List[tuple]]] = None):
    """(A's operator calls, B's operator calls) among pairs that all have both sides: the
    distinct (rank, iteration, graph, file name, call) of the rows of kind ``op``, each side
    its own columns; B's is A's count when its columns equal A's (the usual statistics
    compare: one program twice), without a second set of 100,000 tuples."""
    keys = keys or _KeysOnce(c)
    is_op = list(map("op".__eq__, c["kind"]))
    calls_a = len(set(compress(keys(), is_op)))
    if _same_columns(c, _CALL + ("kind",)):
        return calls_a, calls_a
    return calls_a, len(set(compress(zip(*(c[k + "_b"] for k in _CALL)), map("op".__eq__, c["kind_b"]))))


def row_keys(cols: List[list]) -> list:
    """One key per row standing for ``zip(*cols)``: two rows' keys are equal exactly where
    their tuples are (cell by cell, identical or ``==``), the columns that cannot tell rows
    apart left out -- a constant column (every cell ``==`` the first) and one equal, cell by
    cell, to a column kept before it (B's ``op_b`` beside A's ``op``); one column kept: its
    cells themselves.  Checked with C-level list ``count``/``==``: ~1 ms a column where
    the tuples of eight columns cost ~13 ms to make and ~20 ms to hash on 100,000 rows."""
    n = len(cols[0]) if cols else 0
    kept: List[list] = []
    for col in cols:
        if n and col.count(col[0]) == n:
            continue
        if any(col == k for k in kept):
            continue
        kept.append(col)
    if not kept:
        return [()] * n
    return kept[0] if len(kept) == 1 else list(zip(*kept))


def first_rows(keys: list) -> List[int]:
    """The first row of each distinct key, in first-seen order (``dict.fromkeys`` order)."""
    n = len(keys)
    return sorted(dict(zip(reversed(keys), range(n - 1, -1, -1))).values())
