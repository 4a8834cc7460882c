"""Helpers of the statistics-only compare that replace per-row loops, and the pickled form of
statistic rows (issue 25):

* ``per_distinct`` gives the plain loop's answers (NaN objects that are not one object,
  unhashable cells, 1 / 1.0 / True, None) and calls ``f`` once per distinct cell;
* ``iterations_of`` gives the loop's ints for an ``Int64`` column, None where an
  iteration is missing (``pd.NA``: the rows of lifted constants);
* a dump's statistic rows survive a pickle round trip (compare's parallel open sends B
  pickled): the same row dicts and records table, pickled again as it came, the cells
  unpacked only when used.
"""
from __future__ import annotations

import math
import pickle

import pandas as pd
from hypothesis import given, settings, strategies as st

from opdump.analysis.compare.stat_cells import iterations_of, per_distinct
from opdump.analysis.reader import open_dump
from test_compare_stat_fastpath import write_stats_dump

_CELLS = st.lists(st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True),
                            st.sampled_from(["Float32", "float32", "", "(2,3)"]),
                            st.just(float("nan")), st.builds(lambda: [1])), max_size=30)


def _same(x, y) -> bool:
    return type(x) is type(y) and (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)))


@settings(max_examples=300, deadline=None)
@given(_CELLS)
def test_per_distinct_is_the_loop(cells):
    def f(v):
        return ("f", type(v).__name__ if not isinstance(v, (bool, int, float)) else float(v) == 1.0, repr(v)[:3])
    got = per_distinct(f, cells)
    want = [f(v) for v in cells]
    assert len(got) == len(want)
    for x, y in zip(got, want):
        assert x[0] == y[0] and x[1] == y[1]       # repr(v) may be an equal cell's (1 vs 1.0 vs True)


def test_per_distinct_calls_f_once_per_distinct_cell():
    seen = []
    out = per_distinct(lambda v: seen.append(v) or v.upper(), ["a", "b", "a", "a", "b"])
    assert out == ["A", "B", "A", "A", "B"] and seen == ["a", "b"]


def test_iterations_of_int64_and_other_columns():
    assert iterations_of(pd.Series(pd.array([3, 1, 2], dtype="Int64"))) == [3, 1, 2]
    assert all(type(v) is int for v in iterations_of(pd.Series(pd.array([3, 1], dtype="Int64"))))
    assert iterations_of(pd.Series([1.0, float("nan"), None], dtype=object)) == [1, None, None]
    assert iterations_of(pd.Series(pd.array([3, None], dtype="Int64"))) == [3, None]    # pd.NA: None


def test_statistic_rows_survive_a_pickle_round_trip(tmp_path):
    root = write_stats_dump(tmp_path / "d")
    d = open_dump(root)
    rec = d.records()
    blob = pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL)
    d2 = pickle.loads(blob)
    table = d2.ranks[0].iterations[0].stats.table
    assert table._cols is None                   # not unpacked yet
    packed = table._packed
    assert table.__getstate__()[-1] is packed    # pickled again as it came, still packed
    assert table._cols is None
    d3 = pickle.loads(pickle.dumps(d2, protocol=pickle.HIGHEST_PROTOCOL))
    pd.testing.assert_frame_equal(d2.records(), rec)
    pd.testing.assert_frame_equal(d3.records(), rec)
    for ia, ib in list(zip(d.ranks[0].iterations, d2.ranks[0].iterations)) + list(zip(d.ranks[0].iterations,
                                                                                      d3.ranks[0].iterations)):
        ra, rb = list(ia.stats), list(ib.stats)
        assert len(ra) == len(rb) and len(ra) > 0
        for x, y in zip(ra, rb):
            assert list(x) == list(y)
            assert all(_same(x[k], y[k]) for k in x)
    t = d2.ranks[0].iterations[1].stats.table
    t.calls = [7] * t.n                          # setting a column unpacks first, then keeps the new value
    assert t.calls == [7] * t.n and t.cols["op"] == d.ranks[0].iterations[1].stats.table.cols["op"]
