"""The records of a dump of tensor files built from columns
(opdump/analysis/reader/records_columns.py, ``_file_columns``) equal the per-row build's
(``OPDUMP_READER_COLUMNS=0``): columns, their order and dtypes, every value -- on generated
tensor dumps (two ranks, parameters, a mapped long-name folder), operators missing from the
execution order (placed by timestamp), the real MindSpore sample; and folders the columns
cannot take (files and statistics rows together) go to the per-row build with the same
result.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pandas as pd

from analysis_fixtures import MS_SAMPLE, make_dump
from opdump.analysis.reader import open_dump
from opdump.analysis.reader import records as records_mod


def _read(path, columns: bool):
    old = os.environ.get("OPDUMP_READER_COLUMNS")
    os.environ["OPDUMP_READER_COLUMNS"] = "1" if columns else "0"
    try:
        return open_dump(path).records()
    finally:
        if old is None:
            del os.environ["OPDUMP_READER_COLUMNS"]
        else:
            os.environ["OPDUMP_READER_COLUMNS"] = old


def _same(monkeypatch, path) -> tuple:
    """(records, whether the columns build answered) after checking both builds agree."""
    seen = []
    real = records_mod.frame_of_columns

    def spy(*a, **k):
        r = real(*a, **k)
        seen.append(r is not None)
        return r
    monkeypatch.setattr(records_mod, "frame_of_columns", spy)
    new = _read(path, True)
    used = bool(seen and seen[-1])
    old = _read(path, False)
    assert list(new.columns) == list(old.columns)
    assert list(new.dtypes) == list(old.dtypes)
    pd.testing.assert_frame_equal(new, old, check_exact=True)
    return new, used


def test_tensor_dumps_agree(monkeypatch, tmp_path):
    root = tmp_path / "t"
    for r in (0, 1):
        make_dump(root, iterations=(0, 1, 2), rank=r)
    rec, used = _same(monkeypatch, root)
    assert used and len(rec) and rec["path"].notna().all() and (rec["kind"] == "parameter").any()
    rec, used = _same(monkeypatch, make_dump(tmp_path / "long", iterations=(0,), long_names=True))
    assert used and len(rec)


def test_operators_missing_from_the_order_agree(monkeypatch, tmp_path):
    """An execution order that lists none of the backward graph's operators: they are
    placed by their timestamps."""
    root = make_dump(tmp_path / "o", iterations=(0, 1))
    (root / "rank_0" / "execution_order" / "ms_execution_order_graph_1.csv").write_text(
        "NodeExecutionOrder-FullNameWithScope\n")
    rec, used = _same(monkeypatch, root)
    assert used and rec.loc[rec["graph"] == 1, "exec_index"].notna().all()


def test_mindspore_sample_agrees(monkeypatch):
    rec, used = _same(monkeypatch, MS_SAMPLE)
    assert len(rec)


def test_files_with_statistics_rows_go_per_row(monkeypatch, tmp_path):
    """Files with statistics rows (a full dump): joined row by row, as before."""
    rec, used = _same(monkeypatch, make_dump(tmp_path / "full", iterations=(0,), saved_data="full"))
    assert not used and len(rec)


def test_a_second_call_of_one_file_name_agrees(monkeypatch, tmp_path):
    """Two files of one operator's tensor one timestamp apart: calls 0 and 1."""
    root = make_dump(tmp_path / "dup", iterations=(0,))
    folder = root / "rank_0" / "Net" / "0" / "0"
    f = sorted(p for p in folder.iterdir() if p.name.endswith(".npy"))[0]
    parts = f.name.split(".")
    parts[4] = str(int(parts[4]) + 1)
    shutil.copy(f, folder / ".".join(parts))
    np.save(folder / ".".join(parts), np.zeros(3, np.float32))
    rec, used = _same(monkeypatch, root)
    assert used and (rec["call"] == 1).sum() == 1
