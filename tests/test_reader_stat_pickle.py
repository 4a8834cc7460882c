"""A dump pickled whole (compare's parallel open sends B from a forked child that way) packs
its statistic tables' cells into one nested pickle shared by the tables, not one per table
(issue 25: the child's pickle of a 100,280-row dump 0.096 -> 0.064 s, 28.9 -> 25.9 MB):

* the tables of the loaded dump share one packing and are unpacked only when used;
* every row, cell type and the records table come back as they were, also after a second
  round trip of the loaded (still packed) dump and when one table is unpacked before;
* a table pickled on its own after its dump was pickled, and changed in between, gives its
  own current cells.
"""
from __future__ import annotations

import math
import pickle

import pandas as pd

from opdump.analysis.reader import open_dump
from test_compare_stat_fastpath import write_stats_dump


def _same(x, y) -> bool:
    return type(x) is type(y) and (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)))


def _rows_equal(d1, d2) -> None:
    its1, its2 = d1.ranks[0].iterations, d2.ranks[0].iterations
    assert len(its1) == len(its2) and len(its1) >= 2
    for ia, ib in zip(its1, its2):
        ra, rb = list(ia.stats), list(ib.stats)
        assert len(ra) == len(rb) and len(ra) > 0
        for x, y in zip(ra, rb):
            assert list(x) == list(y)
            assert all(_same(x[k], y[k]) for k in x)


def _round_trip(d):
    return pickle.loads(pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL))


def test_tables_of_a_pickled_dump_share_one_packing(tmp_path):
    d = open_dump(write_stats_dump(tmp_path / "d"))
    rec = d.records()
    d2 = _round_trip(d)
    tables = [it.stats.table for it in d2.ranks[0].iterations if it.stats]
    assert len(tables) >= 2
    assert all(t._cols is None for t in tables)                  # not unpacked yet
    shared = {id(t._packed[0]) for t in tables}
    assert len(shared) == 1                                       # one packing for all tables
    assert [t._packed[1] for t in tables] == list(range(len(tables)))
    pd.testing.assert_frame_equal(d2.records(), rec)
    _rows_equal(d, d2)


def test_second_round_trip_and_partly_unpacked_dumps(tmp_path):
    d = open_dump(write_stats_dump(tmp_path / "d"))
    rec = d.records()
    d2 = _round_trip(d)
    d3 = _round_trip(d2)                                          # still packed: sent as it came
    pd.testing.assert_frame_equal(d3.records(), rec)
    _rows_equal(d, d3)
    d4 = _round_trip(d)
    first = d4.ranks[0].iterations[0].stats.table
    first.calls = [7] * first.n                                   # unpacked and changed before pickling
    d5 = _round_trip(d4)
    assert d5.ranks[0].iterations[0].stats.table.calls == [7] * first.n
    _rows_equal(d4, d5)
    for ia, ib in zip(d.ranks[0].iterations[1:], d5.ranks[0].iterations[1:]):     # the others as read
        for x, y in zip(ia.stats, ib.stats):
            assert list(x) == list(y) and all(_same(x[k], y[k]) for k in x)


def test_a_table_pickled_alone_after_its_dump_gives_its_current_cells(tmp_path):
    d = open_dump(write_stats_dump(tmp_path / "d"))
    pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL)
    t = d.ranks[0].iterations[1].stats.table
    t.calls = [5] * t.n
    t2 = pickle.loads(pickle.dumps(t, protocol=pickle.HIGHEST_PROTOCOL))
    assert t2.calls == [5] * t.n
    assert t2.keys == t.keys and t2.n == t.n
    for k in t.keys:
        assert all(_same(x, y) for x, y in zip(t.cols[k], t2.cols[k]))
