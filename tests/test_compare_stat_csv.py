"""The statistics compare's table held as cells (opdump/analysis/compare/stat_csv.py,
stat_result.py): the CSV written straight from the cells is the bytes pandas writes for
the frame the cells make (``frame_of_cells``), column kind by column kind -- constant and
varying ints, bools, floats (-0.0, NaN, Inf, 1e16), ints or floats mixed with None or
bools, str with quotes/commas/line breaks/undecodable bytes, str subclasses, all None,
nullable ints, unhashable and unknown cells; and the lazy result reads as the eager one
(table, counts, CSV, a table changed after reading).  The halves written by a forked child
are checked in ``stat_csv_halves_cases.py`` (a fresh process); the whole statistics
compare against the per-row stages in test_compare_stat_fastpath.py."""
from __future__ import annotations

import random
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest

from opdump.analysis.compare.result import CompareResult
from opdump.analysis.compare.stat_csv import cells_length, frame_of_cells, write_cells_csv
from opdump.analysis.compare.stat_result import StatCompareResult, with_cells
from opdump.analysis.compare.table_csv import write_table_csv

N = 400
WORDS = ['a', 'b,c', 'q"uote', 'line\nbreak', '\r', 'é', 'bad\udcff', '', ' sp ', 'Default/x-op1']
FLOATS = [0.0, -0.0, 1e-6, 1e16, float("nan"), float("inf"), -float("inf"), 0.1, 2.5e-7, 123456789012345678.0]


def _columns(seed: int):
    """Column name -> (kind, payload): every kind of column the table can hold, and some it
    should not (the writer must still give pandas' bytes or step aside)."""
    rnd = random.Random(seed)
    pick = lambda xs: [rnd.choice(xs) for _ in range(N)]      # noqa: E731
    return {
        "order": ("order", N),
        "it": ("Int64", [None if i % 7 == 0 else i // 3 for i in range(N)]),
        "it_const": ("Int64", [5] * N),
        "it_none": ("Int64", [None] * N),
        "rank": ("cells", [0] * N),
        "slot": ("cells", pick([0, 1, 2, 1 << 40])),
        "big": ("cells", pick([0, 1 << 70])),                      # beyond int64: pandas decides
        "flag": ("cells", pick([True, False])),
        "flag_const": ("cells", [True] * N),
        "int_bool": ("cells", [1] * (N - 1) + [True]),             # equal values, other types
        "zero_float": ("cells", [0] * (N - 1) + [0.0]),
        "flag_none": ("cells", pick([True, False, None])),
        "f": ("cells", pick(FLOATS)),
        "f_const": ("cells", [-0.0] * N),
        "f_none": ("cells", pick([1.5, None, 2e-9])),
        "i_none": ("cells", pick([1, None, 7])),
        "i_f": ("cells", pick([1, 2.5])),
        "s": ("cells", [rnd.choice(WORDS) + str(i % 13) for i in range(N)]),
        "s_const": ("cells", ["statistics"] * N),
        "s_none": ("cells", pick(["x", None, "y,z"])),
        "s_nan": ("cells", pick(["x", float("nan")])),
        "s_sub": ("cells", pick([np.str_("a"), "a", "b"])),
        "s_num": ("cells", pick(["x", 3, 1.5, True, None])),
        "none": ("none", N),
        "all_none_cells": ("cells", [None] * N),
    }


def _pandas(frame, path) -> bytes:
    frame.to_csv(path, index=False, errors="backslashreplace")
    return path.read_bytes()


@pytest.mark.parametrize("seed", [0, 1])
def test_cells_csv_is_the_frames_csv_column_by_column(seed, tmp_path):
    for name, col in _columns(seed).items():
        cells = {"order": ("order", N), name: col} if name != "order" else {name: col}
        frame = frame_of_cells(cells)
        assert write_cells_csv(cells, str(tmp_path / "cells.csv")), name
        assert (tmp_path / "cells.csv").read_bytes() == _pandas(frame, tmp_path / "pandas.csv"), name


def test_cells_csv_of_all_columns_at_once(tmp_path):
    cells = _columns(3)
    frame = frame_of_cells(cells)
    assert write_cells_csv(cells, str(tmp_path / "cells.csv"))
    want = _pandas(frame, tmp_path / "pandas.csv")
    assert (tmp_path / "cells.csv").read_bytes() == want
    write_table_csv(frame, str(tmp_path / "frame.csv"))
    assert (tmp_path / "frame.csv").read_bytes() == want


@pytest.mark.parametrize("odd", [[[1], [2]], [Decimal("1.5"), None]])
def test_cells_it_does_not_write_hand_the_table_to_the_frame(odd, tmp_path):
    """Unhashable cells, cells no writer rule knows: write_cells_csv steps aside (False), and
    the result's to_csv writes pandas' bytes through the frame."""
    cells = {"order": ("order", 4), "odd": ("cells", (odd * 2)[:4])}
    assert not write_cells_csv(cells, str(tmp_path / "x.csv")) or \
        (tmp_path / "x.csv").read_bytes() == _pandas(frame_of_cells(cells), tmp_path / "p.csv")
    r = with_cells(StatCompareResult("a", "b", None, None), cells)
    r.to_csv(tmp_path / "r.csv")
    assert (tmp_path / "r.csv").read_bytes() == _pandas(frame_of_cells(cells), tmp_path / "p.csv")


def _result(cells):
    return with_cells(StatCompareResult("A", "B", None, None, rule="thresholds"), cells)


def test_lazy_result_reads_as_the_eager_one(tmp_path):
    cells = _columns(4)
    cells["verdict"] = ("cells", random.Random(1).choices(["pass", "diverged", "warning"], k=N))
    eager = CompareResult("A", "B", frame_of_cells(cells), None, rule="thresholds")
    lazy = _result(cells)
    assert lazy.counts == eager.counts and list(lazy.counts) == list(eager.counts)
    assert lazy.summary() == eager.summary()
    lazy.to_csv(tmp_path / "lazy.csv")
    eager.to_csv(tmp_path / "eager.csv")
    assert (tmp_path / "lazy.csv").read_bytes() == (tmp_path / "eager.csv").read_bytes()
    shown = ["it", "s", "slot", "verdict", "none", "f_none", "s_none"]
    pd.testing.assert_frame_equal(lazy.table_columns(shown), eager.table_columns(shown), check_exact=True)
    assert lazy._frame is None                      # neither the CSV, the summary nor the listing made the frame
    pd.testing.assert_frame_equal(lazy.table, eager.table, check_exact=True)
    assert lazy.table is lazy.table and lazy._cells is None     # made once, then kept; the cells let go
    lazy.to_csv(tmp_path / "again.csv")             # now through the frame: the same bytes
    assert (tmp_path / "again.csv").read_bytes() == (tmp_path / "eager.csv").read_bytes()
    assert lazy.counts == eager.counts


def test_a_table_changed_after_reading_is_what_to_csv_writes(tmp_path):
    cells = _columns(5)
    cells["verdict"] = ("cells", ["pass"] * N)
    r = _result(cells)
    r.table.loc[0, "verdict"] = "diverged"          # in place
    r.to_csv(tmp_path / "x.csv")
    assert (tmp_path / "x.csv").read_bytes() == _pandas(r.table, tmp_path / "p.csv")
    assert r.counts == {"pass": N - 1, "diverged": 1}
    r.table = r.table.iloc[:3]                      # assigned
    r.to_csv(tmp_path / "y.csv")
    assert (tmp_path / "y.csv").read_bytes() == _pandas(r.table, tmp_path / "q.csv")


def test_empty_and_lengths():
    assert cells_length({}) == 0
    assert cells_length({"o": ("order", 3)}) == 3 and cells_length({"c": ("cells", [1, 2])}) == 2
    r = _result({"verdict": ("cells", [])})
    assert r.counts == {}


def test_frame_writer_keeps_str_subclass_cells(tmp_path):
    """A ``str`` column holding numpy ``str_`` cells (pandas keeps the objects): the frame
    writer once wrote them empty (it took only exact ``str`` for text)."""
    a = np.empty(4, dtype=object)
    a[:] = [np.str_("a"), "b", np.str_("c,d"), None]
    frame = pd.DataFrame({"i": np.arange(4), "s": a}).infer_objects()
    write_table_csv(frame, str(tmp_path / "w.csv"))
    assert (tmp_path / "w.csv").read_bytes() == _pandas(frame, tmp_path / "p.csv") == b'i,s\n0,a\n1,b\n2,"c,d"\n3,\n'


def test_halves_cases_in_a_fresh_process():
    """The halves made by a forked child (``stat_csv_halves_cases.py``): a process of its own."""
    from fresh_pytest import run_cases_in_fresh_pytest
    run_cases_in_fresh_pytest("stat_csv_halves_cases.py")
