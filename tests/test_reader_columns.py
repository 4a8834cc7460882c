"""Reading statistic rows as columns (opdump/analysis/reader/stat_table.py,
records_columns.py) gives what the per-row reader gave (``OPDUMP_READER_COLUMNS=0``): the
same records table (columns, order, dtypes, every value) and the same ``Iteration.stats``
row dicts (keys in order, values), on generated statistics dumps (the analysis fixture,
the statistics-only MindSpore-layout dump of the compare tests, cells with NaN, inf, -inf,
empty, big integers, exponents, malformed numbers, unknown columns) and the real MindSpore
dump in /work/shared/samples/.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from analysis_fixtures import make_dump
from opdump.analysis.reader import open_dump
from opdump.analysis.reader.stat_table import StatRows
from test_compare_stat_fastpath import write_stats_dump

SAMPLE = Path("/work/shared/samples/mindspore_cpu_mlp")


def _read(path, columns: bool):
    old = os.environ.get("OPDUMP_READER_COLUMNS")
    os.environ["OPDUMP_READER_COLUMNS"] = "1" if columns else "0"
    try:
        d = open_dump(path)
        return d, d.records()
    finally:
        if old is None:
            del os.environ["OPDUMP_READER_COLUMNS"]
        else:
            os.environ["OPDUMP_READER_COLUMNS"] = old


def _same(path) -> pd.DataFrame:
    """Read ``path`` both ways and check everything agrees; returns the records."""
    dn, rn = _read(path, True)
    do, ro = _read(path, False)
    assert list(rn.columns) == list(ro.columns)
    assert list(rn.dtypes) == list(ro.dtypes)
    pd.testing.assert_frame_equal(rn, ro, check_exact=True)
    its_n = [it for r in dn.ranks.values() for it in r.iterations]
    its_o = [it for r in do.ranks.values() for it in r.iterations]
    assert len(its_n) == len(its_o)
    for a, b in zip(its_n, its_o):
        rows_n, rows_o = list(a.stats), list(b.stats)
        assert len(rows_n) == len(rows_o)
        for x, y in zip(rows_n, rows_o):
            assert list(x) == list(y)                       # keys, in order
            assert [repr(v) for v in x.values()] == [repr(v) for v in y.values()]   # nan == nan, types
    assert dn.has_statistics == do.has_statistics
    return rn


def test_columns_are_used_for_statistics(tmp_path):
    """The fast reading is the one taken (else this file would test nothing)."""
    root = write_stats_dump(tmp_path / "s", iterations=(0, 1), nonfinite=True, md5=True)
    d, _ = _read(root, True)
    assert all(isinstance(it.stats, StatRows) for r in d.ranks.values() for it in r.iterations)
    d, _ = _read(root, False)
    assert not any(isinstance(it.stats, StatRows) for r in d.ranks.values() for it in r.iterations)


@pytest.mark.parametrize("kw", [dict(), dict(nonfinite=True, md5=True, calls=2), dict(ranks=(0, 1), swap_ties=True),
                                dict(drop=(1, 3), dtype_of={2: "Float16"}, shape_of={4: (1,)})])
def test_stats_dumps_agree(tmp_path, kw):
    rec = _same(write_stats_dump(tmp_path / "s", **kw))
    assert len(rec) and rec["stat_row"].all()


def test_fixture_statistics_dump_agrees(tmp_path):
    """The analysis fixture's dump: two graphs, parameters, garbage operators, .json listings."""
    _same(make_dump(tmp_path / "a", saved_data="statistic", iterations=(0, 1, 2)))
    _same(make_dump(tmp_path / "b", saved_data="statistic", iterations=(0,), graph_files=("ir",),
                    quote_shape=False, long_names=True))


def test_fixture_full_dump_agrees(tmp_path):
    """Tensors and statistics in one dump: the per-row build (files), same either way."""
    _same(make_dump(tmp_path / "a", saved_data="full", iterations=(0, 1)))


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="the MindSpore sample dump is not on this machine")
def test_mindspore_sample_agrees():
    rec = _same(SAMPLE)
    assert len(rec)


def test_malformed_and_foreign_cells_agree(tmp_path):
    """Malformed numbers (stat_errors), an unknown column, a torn row, an unquoted shape,
    rows out of timestamp order, a bare folder of dump files."""
    d = tmp_path / "loose"
    d.mkdir()
    rows = [
        ["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size", "Data Type", "Shape",
         "Max Value", "Min Value", "Vendor Col"],
        ["Add", "Default/Add-op1", "0", "0", "30", "input", "0", "4", "Float32", "(1)", "1.5", "-1", "x"],
        ["Add", "Default/Add-op1", "0", "0", "10", "output", "0", "4", "Float32", "(1)", "NOT_A_NUMBER", "-1", "2"],
        ["Mul", "Mul-op2", "0", "0", "20", "output", "0", "4", "Float32", "(2", "3)", "inf", "", "3.5"],
        ["Mul", "Mul-op2", "0", "0"],
    ]
    with open(d / "statistic.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    rec = _same(d)
    assert rec["stat_errors"].notna().any()


_cell = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "", " ", "true", "false", "1e308", "1e309", "-0",
                     "4.9e-324", "12345678901234567890123", "0x10", "1_000", "  2.5 "]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(1 << 70), max_value=1 << 70).map(str),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cells=st.lists(st.tuples(_cell, _cell, _cell, st.integers(0, 3)), min_size=1, max_size=12))
def test_cell_text_agrees(tmp_path_factory, cells):
    """Numeric cells of every kind the writers (or a hand edit) produce: same values both ways."""
    root = tmp_path_factory.mktemp("cells")
    it = root / "rank_0" / "Net" / "0" / "0"
    it.mkdir(parents=True)
    with open(it / "statistic.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size",
                    "Data Type", "Shape", "Max Value", "Min Value", "L2Norm Value"])
        for k, (a, b, c, op) in enumerate(cells):
            w.writerow(["Relu", f"Default/net/Relu-op{op}", "0", "0", str(1000 - k % 3), "output", "0", "16",
                        "Float32", "(2,2)", a, b, c])
    rec = _same(root)
    assert len(rec) == len(cells)


def _order_dump(root: Path, timestamps) -> Path:
    """Iterations whose rows (names, io, slot, call) are the same, with Sub and Neg missing
    from the execution order: placed by their timestamps, which differ per iteration
    (``timestamps``: per iteration, the times of Add, Sub, Neg, Mul in file order; on a tie
    the name decides, Neg first)."""
    rdir = root / "rank_0"
    (rdir / "execution_order").mkdir(parents=True)
    (rdir / "execution_order" / "ms_execution_order_graph_0.csv").write_text(
        "NodeExecutionOrder-FullNameWithScope\nDefault/Net/Add-op0\nDefault/Net/Mul-op3\n")
    (rdir / "execution_order" / "ms_global_execution_order_graph_0.csv").write_text(
        "".join(f"{i}\n" for i in range(len(timestamps))))
    names = [("Add", "Default/Net/Add-op0"), ("Sub", "Default/Net/Sub-op1"), ("Neg", "Default/Net/Neg-op2"),
             ("Mul", "Default/Net/Mul-op3")]
    for it, times in enumerate(timestamps):
        d = rdir / "Net" / "0" / str(it)
        d.mkdir(parents=True)
        with open(d / "statistic.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size",
                        "Data Type", "Shape", "Max Value", "Min Value", "L2Norm Value"])
            for (typ, name), ts in zip(names, times):
                w.writerow([typ, name, "0", "0", str(ts), "output", "0", "16", "Float32", "(4)", "1.0", "-1.0", "2.0"])
    return root


def test_same_rows_placed_by_timestamp_agree(tmp_path):
    """Folders with the same rows share what the columns build derives from them
    (records_columns._Memo), except the places of operators missing from the execution
    order, which follow each folder's timestamps: here they swap between iterations."""
    rec = _same(_order_dump(tmp_path / "o", [(10, 12, 12, 20), (10, 11, 12, 20), (10, 12, 12, 20)]))
    places = {it: list(g.sort_values("op")["exec_index"]) for it, g in rec.groupby("iteration")}
    assert places[0] == places[2] != places[1]


def test_repeated_folders_agree(tmp_path):
    """Many iterations of the same rows (the memo's answers reused) and one that differs."""
    root = write_stats_dump(tmp_path / "s", iterations=tuple(range(6)), drop=(4, 2), calls=2)
    rec = _same(root)
    assert rec["iteration"].nunique() == 6
