"""(Run by tests/test_compare_stat_csv.py in a fresh pytest process: the child is forked only
in a process with no other Python thread.)  The statistics compare's table written from its
cells with the second half of the rows made by a forked child
(opdump/analysis/compare/stat_csv.py through csv_halves.py): pandas' bytes for the frame
the cells make, on 30,000 generated rows of every column kind and on a 21,000-row
statistics compare (the per-row stages' CSV, written through their frame, the reference);
a child that dies costs only its half."""
from __future__ import annotations

import importlib
import os
import threading

import pytest

from opdump.analysis.compare import compare
from opdump.analysis.compare.stat_csv import cells_length, frame_of_cells, write_cells_csv

import test_compare_stat_csv as unit
from test_compare_stat_fastpath import write_stats_dump

halves = importlib.import_module("opdump.analysis.compare.csv_halves")


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    assert threading.active_count() == 1, threading.enumerate()
    monkeypatch.setenv("OPDUMP_COMPARE_PARALLEL_OPEN", "1")
    monkeypatch.setattr(unit, "N", 30_000)
    halves.last_mode = ""


def test_halves_of_cells_are_the_frames_bytes(tmp_path):
    cells = unit._columns(7)
    assert write_cells_csv(cells, str(tmp_path / "cells.csv"))
    assert halves.last_mode == "child"
    assert (tmp_path / "cells.csv").read_bytes() == unit._pandas(frame_of_cells(cells), tmp_path / "pandas.csv")
    assert not [p for p in os.listdir(tmp_path) if ".rows." in p]


def test_a_child_that_dies_costs_only_its_half(tmp_path, monkeypatch):
    def dying(n, h, part, fields_of):
        os._exit(9)
    monkeypatch.setattr(halves, "_child", dying)
    cells = unit._columns(8)
    assert write_cells_csv(cells, str(tmp_path / "cells.csv"))
    assert halves.last_mode == "here"
    assert (tmp_path / "cells.csv").read_bytes() == unit._pandas(frame_of_cells(cells), tmp_path / "pandas.csv")


def test_statistics_compare_csv_in_halves_is_the_per_row_stages_csv(tmp_path, monkeypatch):
    its = tuple(range(32))
    a = write_stats_dump(tmp_path / "a", iterations=its, blocks=30, nonfinite=True, md5=True)
    b = write_stats_dump(tmp_path / "b", iterations=its, blocks=30, nonfinite=True, md5=True, seed=0,
                         perturb=1e-3, swap_ties=True)
    monkeypatch.setenv("OPDUMP_COMPARE_FAST", "0")
    old = compare(str(a), str(b), progress=False)
    monkeypatch.setenv("OPDUMP_COMPARE_FAST", "1")
    new = compare(str(a), str(b), progress=False)
    assert cells_length(new._cells) > 20_000 and new._frame is None
    halves.last_mode = ""
    new.to_csv(tmp_path / "new.csv")
    assert halves.last_mode == "child" and new._frame is None          # the cells' CSV, not the frame's
    old.to_csv(tmp_path / "old.csv")
    assert (tmp_path / "new.csv").read_bytes() == (tmp_path / "old.csv").read_bytes()
    assert (tmp_path / "new.csv").read_bytes() == unit._pandas(old.table, tmp_path / "pandas.csv")
    assert new.summary() == old.summary() and new.to_dict() == old.to_dict()
