"""An iteration's ``statistic.csv`` rows kept as columns (:class:`StatColumns`), with the
per-row dicts the reader has always offered as a view over them (:class:`StatRows`).

Why: a statistics-only dump of 136,000 rows spent seconds building, sorting, renaming and
joining one dict per row before the records table existed; the same steps on columns
are one pass of plain list operations per column.

Guarantees: ``StatRows`` yields, row for row, the dicts the per-row reader built (the
cells of :func:`.statistics.read_statistic_csv` in the file's column order, then
``stat_errors`` / ``stat_skipped`` where a row has them, then ``_net`` and ``call``), in
the same order (timestamp order, stable), with the same full names after
:func:`.scan.resolve_names`; tests/test_reader_columns.py checks it on generated and real
dumps against ``OPDUMP_READER_COLUMNS=0`` (the per-row reader, kept for that check).
"""
from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from typing import Any, Dict, Iterator, List, Optional

from .names_cache import sanitize

__all__ = ["StatColumns", "StatRows", "columns_enabled", "share_cells"]


def columns_enabled() -> bool:
    """False when ``OPDUMP_READER_COLUMNS=0``: statistic rows are read as dicts, one per row
    (the reader before columns; kept so tests can check that both agree)."""
    return os.environ.get("OPDUMP_READER_COLUMNS", "1") != "0"


class StatColumns:
    """The statistic rows of one iteration folder, column by column.

    ``keys``: the file's normalised column names in order (a name once, at its first place);
    ``cols``: name -> list of cells; ``extras``: row -> {``stat_errors``/``stat_skipped``: text};
    ``net``: the ``_net`` of every row; ``calls``: each row's call counter (the k-th row of one
    (operator file name, io, slot) in timestamp order), filled by :meth:`number_calls`."""

    __slots__ = ("keys", "_cols", "n", "extras", "net", "_calls", "_packed", "_out")

    def __init__(self, keys: List[str], columns: List[List[Any]], n: int, extras: Dict[int, Dict[str, str]],
                 net: str):
        cols: Dict[str, List[Any]] = {}
        for k, c in zip(keys, columns):
            cols[k] = list(c)                       # a repeated name: first place, last value
        self.keys = list(cols)
        self._cols = cols
        self.n = n
        self.extras = extras
        self.net = net
        self._calls: List[int] = [0] * n
        self._packed: Optional[bytes] = None
        self._out: Optional[tuple] = None           # (shared cells, place) while pickled with its dump

    # Pickled (compare's parallel open sends the dump B a forked child read, compare/open_pair.py),
    # the cells travel as one nested pickle, unpacked on first use: compare reads B's records, not
    # these rows, and unpickling them was ~0.045 s of 0.07 s on the command's serial path
    # (100,280 rows).  The cells come back equal, their types kept.  Pickled with its dump
    # (:func:`share_cells`), every table's cells go into one nested pickle shared by the tables
    # (:class:`_SharedCells`): one pickle per table re-sent each table's strings (the names,
    # types, shapes every iteration repeats) -- 0.06 s of the child's 0.09 s pickle for a
    # 100,280-row dump, against 0.023 s as one.
    def __getstate__(self):
        packed = self._packed
        if packed is None:
            packed = self._out
            if packed is None:
                packed = pickle.dumps((self._cols, self._calls), protocol=pickle.HIGHEST_PROTOCOL)
        return (self.keys, self.n, self.extras, self.net, packed)

    def __setstate__(self, state) -> None:
        self.keys, self.n, self.extras, self.net, self._packed = state
        self._cols = self._calls = None
        self._out = None

    def _unpack(self) -> None:
        packed = self._packed
        if isinstance(packed, tuple):                   # (shared cells, this table's place)
            self._cols, self._calls = packed[0].take(packed[1])
        else:
            self._cols, self._calls = pickle.loads(packed)
        self._packed = None

    @property
    def cols(self) -> Dict[str, List[Any]]:
        """Column name -> list of cells."""
        if self._cols is None:
            self._unpack()
        return self._cols

    @cols.setter
    def cols(self, value: Dict[str, List[Any]]) -> None:
        if self._cols is None:
            self._unpack()
        self._cols = value

    @property
    def calls(self) -> List[int]:
        """Each row's call counter (:meth:`number_calls`)."""
        if self._cols is None:
            self._unpack()
        return self._calls

    @calls.setter
    def calls(self, value: List[int]) -> None:
        if self._cols is None:
            self._unpack()
        self._calls = value

    def get(self, key: str, default: Any = None) -> List[Any]:
        """The column ``key`` as the rows would give it (``row.get(key, default)`` per row)."""
        if key == "call":
            return self.calls
        if key == "_net":
            return [self.net] * self.n
        c = self.cols.get(key)
        if c is not None:
            return c
        if self.extras and key in ("stat_errors", "stat_skipped"):
            return [self.extras.get(i, {}).get(key, default) for i in range(self.n)]
        return [default] * self.n

    def sort_by_timestamp(self) -> None:
        """Rows in timestamp order (stable), as ``list.sort(key=timestamp)`` on the rows."""
        ts = self.cols.get("timestamp")
        if ts is None or self.n < 2:
            return
        order = sorted(range(self.n), key=ts.__getitem__)
        if order == list(range(self.n)):
            return
        for k, c in self.cols.items():
            self.cols[k] = [c[i] for i in order]
        if self.extras:
            where = {old: new for new, old in enumerate(order)}
            self.extras = {where[i]: e for i, e in self.extras.items()}

    def number_calls(self, memo: Optional[Dict[tuple, List[int]]] = None) -> None:
        """``calls``: per (sanitised operator name, io, slot), 0, 1, 2… in row order.
        ``memo``: answers for earlier tables by their (names, ios, slots) -- the iterations
        of one dump mostly repeat the same rows, so most tables are one look-up."""
        ops, ios, slots = self.get("op", ""), self.get("io", ""), self.get("slot", 0)
        key = None
        if memo is not None:
            try:
                key = ("calls", tuple(ops), tuple(ios), tuple(slots))
                hit = memo.get(key)
            except TypeError:                       # an unhashable cell: numbered below
                key = hit = None
            if hit is not None:
                self.calls[:] = hit
                return
        names: Dict[str, str] = {}
        counters: Dict[tuple, int] = {}
        calls = self.calls
        for i, (op, io, slot) in enumerate(zip(ops, ios, slots)):
            of = names.get(op)
            if of is None:
                of = names[op] = sanitize(op)
            k = (of, io, slot)
            c = counters.get(k, 0)
            calls[i] = c
            counters[k] = c + 1
        if key is not None:
            memo[key] = list(calls)

    def row(self, i: int) -> Dict[str, Any]:
        """Row ``i`` as the per-row reader's dict."""
        d = {k: c[i] for k, c in self.cols.items()}
        e = self.extras.get(i) if self.extras else None
        if e:
            d.update(e)
        d["_net"] = self.net
        d["call"] = self.calls[i]
        return d


class StatRows(Sequence):
    """``Iteration.stats``: the rows of a :class:`StatColumns` as dicts, built on first use
    (after the reader has finished naming; kept, so a row changed by its user stays changed)."""

    __slots__ = ("table", "_rows")

    def __init__(self, table: Optional[StatColumns]):
        self.table = table
        self._rows: Optional[List[Dict[str, Any]]] = None

    def _all(self) -> List[Dict[str, Any]]:
        if self._rows is None:
            t = self.table
            self._rows = [t.row(i) for i in range(t.n)] if t is not None else []
        return self._rows

    def __len__(self) -> int:
        if self._rows is not None:
            return len(self._rows)
        return self.table.n if self.table is not None else 0

    def __getitem__(self, i):
        return self._all()[i]

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return iter(self._all())

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"StatRows({len(self)} rows)"


class _SharedCells:
    """The cells of several :class:`StatColumns`, pickled as one nested pickle (a table's
    strings once for all tables, not once per table) and unpickled on first use.

    Made by :func:`share_cells` from live tables (their cells as they are when pickled); come
    back from a pickle as the packed bytes, which :meth:`take` unpacks once for every table.
    Each table takes its own (cols, calls): lists of its own, as its own pickle gave them."""

    __slots__ = ("tables", "data", "cells")

    def __init__(self, tables: List[StatColumns]):
        self.tables: Optional[List[StatColumns]] = tables
        self.data: Optional[bytes] = None
        self.cells: Optional[list] = None

    def __getstate__(self) -> bytes:
        if self.data is not None:
            return self.data                          # still packed: sent again as it came
        if self.tables is not None:
            cells = [(t.cols, t.calls) for t in self.tables]
        else:
            cells = self.cells
        return pickle.dumps(cells, protocol=pickle.HIGHEST_PROTOCOL)

    def __setstate__(self, data: bytes) -> None:
        self.tables, self.data, self.cells = None, data, None

    def take(self, i: int):
        """Table ``i``'s (cols, calls)."""
        if self.cells is None:
            self.cells = pickle.loads(self.data)
            self.data = None
        return self.cells[i]


def share_cells(ranks) -> None:
    """Before ``ranks`` ({rank id: Rank}) are pickled: their statistic tables' cells go into
    one shared nested pickle (:class:`_SharedCells`); a table still packed from an earlier
    pickle keeps its own packing."""
    tables = [it.stats.table for rank in ranks.values() for it in rank.iterations
              if isinstance(it.stats, StatRows) and it.stats.table is not None and it.stats.table._cols is not None]
    if len(tables) < 2:
        return
    shared = _SharedCells(tables)
    for i, t in enumerate(tables):
        t._out = (shared, i)
