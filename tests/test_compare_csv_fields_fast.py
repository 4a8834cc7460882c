"""The column-wise CSV writer's whole-column shortcuts (opdump/analysis/compare/table_csv.py):
a text column whose every cell is a non-empty str the writer never quotes is written as
is, and float64 cells through ``repr`` -- each still byte for byte what pandas'
``to_csv(index=False, errors="backslashreplace")`` writes, including the columns where the
shortcut must not apply (one cell needing quotes, empty, missing, non-ASCII, not a str)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from opdump.analysis.compare import table_csv
from opdump.analysis.compare.table_csv import write_table_csv

PATHS = [f"/tmp/dump/rank_0/Net/0/{i}/mm.Default_fc{i}-Linear_mm-op{i}.0.0.17954712.output.0.DefaultFormat.Float32.npy"
         for i in range(300)]


def _same(tmp_path, table) -> None:
    a, b = tmp_path / "pandas.csv", tmp_path / "ours.csv"
    table.to_csv(a, index=False, errors="backslashreplace")
    write_table_csv(table, str(b))
    assert b.read_bytes() == a.read_bytes()


_LAST = [None, "plain_name-1.0", "with,comma", 'with"quote', "with space", "line\nbreak", "", "é", "\udcff",
         np.str_("numpy_str")]


@pytest.mark.parametrize("dtype,last", [("str", x) for x in _LAST] + [(object, x) for x in _LAST + [3, 2.5, True]])
def test_text_columns(tmp_path, dtype, last):
    """The last cell decides: the shortcut (all plain) or the per-cell quoting."""
    values = PATHS + [last]
    _same(tmp_path, pd.DataFrame({"p": pd.Series(values, dtype=dtype), "q": pd.Series(values[::-1], dtype=dtype)}))


def test_plain_check():
    assert table_csv._all_plain(PATHS)
    for bad in (["a", ""], ["a", "b,c"], ["a", None], ["a", 1], ["a", "é"], [], ['a"']):
        assert not table_csv._all_plain(bad), bad


def test_float_columns(tmp_path):
    rng = np.random.default_rng(7)
    parts = [rng.standard_normal(5000), rng.standard_normal(5000) * 10.0 ** rng.integers(-320, 308, 5000),
             rng.integers(-2**60, 2**60, 2000).astype(np.float64), np.round(rng.random(2000), 3),
             rng.random(2000).astype(np.float32).astype(np.float64),
             np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e16, 1e15, 9999999999999998.0, 1e-5, 1e-4, 5e-324,
                       2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 1 / 3, 1e22, 1e21, 1e-7])]
    v = np.concatenate(parts)
    rng.shuffle(v)
    _same(tmp_path, pd.DataFrame({"f": v, "nan": np.full(len(v), np.nan), "g": v[::-1].copy()}))
    zeros = np.array([0.0, 1.0, -0.0, 1.0, 0.0, -0.0, np.nan, 0.5] * 50)   # -0.0 after 0.0 and before
    _same(tmp_path, pd.DataFrame({"z": zeros, "r": zeros[::-1].copy(), "p": np.abs(zeros)}))
    assert table_csv._float_texts(zeros)[:3] == ["0.0", "1.0", "-0.0"]
    assert table_csv._float_texts(v) == [("" if x != x else s) for x, s in zip(v.tolist(), v.astype(str).tolist())]
