"""(Run by tests/test_compare_csv_halves.py in a fresh pytest process: the child is forked
only in a process with no other Python thread.)  The compare table's CSV with its second
half of rows made by a forked child (opdump/analysis/compare/csv_halves.py): the bytes
pandas writes and the bytes of the one-process writer, on a generated table of 30,000 rows
(quotes, commas, line breaks, undecodable names, NaN/Inf, None, nullable ints); a cell the
writer does not know in either half hands the table to pandas; a child that dies costs only
its half, made here; no child or part file left behind."""
from __future__ import annotations

import importlib
import os
import random
import threading
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest

from opdump.analysis.compare.table_csv import write_table_csv

halves = importlib.import_module("opdump.analysis.compare.csv_halves")

N = 30_000


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    assert threading.active_count() == 1, threading.enumerate()
    monkeypatch.setenv("OPDUMP_COMPARE_PARALLEL_OPEN", "1")
    halves.last_mode = ""


def _table(seed: int = 0) -> pd.DataFrame:
    rnd = random.Random(seed)
    words = ['a', 'b,c', 'q"uote', 'line\nbreak', '\r', 'é', 'bad\udcff', '', ' sp ', 'Default/x-op1']
    floats = [0.0, -0.0, 1e-6, 1e16, float("nan"), float("inf"), -float("inf"), 0.1, 2.5e-7, 123456789012345678.0]
    return pd.DataFrame({
        "order": np.arange(N, dtype=np.int64),
        "op": pd.Series([rnd.choice(words) + str(i % 97) for i in range(N)], dtype="str"),
        "f": np.array([rnd.choice(floats) for _ in range(N)], dtype=np.float64),
        "I": pd.array([None if i % 7 == 0 else i for i in range(N)], dtype="Int64"),
        "o": pd.Series([rnd.choice([None, 1.5, float("nan"), True, 3, "x,y"]) for _ in range(N)], dtype=object),
        "b": np.array([i % 3 == 0 for i in range(N)]),
        "na": pd.Series([None] * N, dtype=object),
    })


def _pandas(table, path) -> bytes:
    table.to_csv(path, index=False, errors="backslashreplace")
    return path.read_bytes()


def _leftovers(tmp_path):
    return [p.name for p in tmp_path.iterdir() if ".rows." in p.name]


def test_halves_write_the_bytes_of_pandas_and_of_one_process(tmp_path, monkeypatch):
    t = _table()
    write_table_csv(t, str(tmp_path / "halves.csv"))
    assert halves.last_mode == "child"
    monkeypatch.setenv("OPDUMP_COMPARE_PARALLEL_OPEN", "0")
    halves.last_mode = ""
    write_table_csv(t, str(tmp_path / "one.csv"))
    assert halves.last_mode == ""
    want = _pandas(t, tmp_path / "pandas.csv")
    assert (tmp_path / "halves.csv").read_bytes() == want
    assert (tmp_path / "one.csv").read_bytes() == want
    assert not _leftovers(tmp_path)


@pytest.mark.parametrize("where", [10, N - 10])
def test_a_cell_it_does_not_know_in_either_half_hands_the_table_to_pandas(tmp_path, where):
    t = _table(1)
    o = t["o"].tolist()
    o[where] = Decimal("1.5")                    # no rule of the column-wise writer: pandas writes it
    t["o"] = pd.Series(o, dtype=object)
    write_table_csv(t, str(tmp_path / "x.csv"))
    assert (tmp_path / "x.csv").read_bytes() == _pandas(t, tmp_path / "pandas.csv")
    assert not _leftovers(tmp_path)


def test_a_child_that_dies_costs_only_its_half(tmp_path, monkeypatch):
    t = _table(2)
    real = halves._child

    def dying(table, h, part, fields):
        os._exit(9)
    monkeypatch.setattr(halves, "_child", dying)
    write_table_csv(t, str(tmp_path / "x.csv"))
    assert halves.last_mode == "here"
    assert (tmp_path / "x.csv").read_bytes() == _pandas(t, tmp_path / "pandas.csv")
    assert not _leftovers(tmp_path)
    monkeypatch.setattr(halves, "_child", real)


def test_small_tables_are_written_here(tmp_path):
    t = _table().iloc[:halves.MIN_ROWS - 1]
    write_table_csv(t, str(tmp_path / "x.csv"))
    assert halves.last_mode == ""
    assert (tmp_path / "x.csv").read_bytes() == _pandas(t, tmp_path / "pandas.csv")


def test_no_child_is_left_behind(tmp_path):
    write_table_csv(_table(3), str(tmp_path / "x.csv"))
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)
