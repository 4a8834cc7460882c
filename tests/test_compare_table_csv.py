"""The compare table's column-wise CSV writer (opdump/analysis/compare/table_csv.py) writes
the bytes pandas' ``to_csv(index=False, errors="backslashreplace")`` writes."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from opdump.analysis.compare.table_csv import write_table_csv

_TEXT = st.text(alphabet=st.sampled_from(list('ab,"\n\r é\udcff;x0 ')), max_size=6)
_FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.0, 1e-6, 1e16, 1e-300, 123456789012345678.0, 0.1, 2.5e-7]))


def _both(tmp_path, table) -> None:
    a, b = tmp_path / "pandas.csv", tmp_path / "ours.csv"
    table.to_csv(a, index=False, errors="backslashreplace")
    write_table_csv(table, str(b))
    assert b.read_bytes() == a.read_bytes()


@st.composite
def tables(draw):
    n = draw(st.integers(0, 12))
    ints = draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=n, max_size=n))
    floats = draw(st.lists(_FLOAT, min_size=n, max_size=n))
    texts = draw(st.lists(st.one_of(st.none(), _TEXT), min_size=n, max_size=n))
    nullable = draw(st.lists(st.one_of(st.none(), st.integers(-5, 2**40)), min_size=n, max_size=n))
    mixed = draw(st.lists(st.one_of(st.none(), _FLOAT, st.booleans(), st.integers(-3, 3), _TEXT),
                          min_size=n, max_size=n))
    bools = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    df = pd.DataFrame({"i": pd.Series(ints, dtype="int64"), "f": pd.Series(floats, dtype="float64"),
                       "s": pd.Series(texts, dtype="str"), "I": pd.array(nullable, dtype="Int64"),
                       "o": pd.Series(mixed + [], dtype=object), "b": pd.Series(bools, dtype=bool),
                       "na": pd.Series([None] * n, dtype=object)})
    return df


@settings(max_examples=80, deadline=None)
@given(tables())
def test_generated_tables_same_bytes(tmp_path_factory, table):
    _both(tmp_path_factory.mktemp("t"), table)


@pytest.mark.parametrize("frame", [
    pd.DataFrame({"a,b": [1, 2], 'q"': ["x", "y,z"]}),                    # header fields quoted
    pd.DataFrame({"a": pd.Series([], dtype="int64"), "b": pd.Series([], dtype="str")}),   # no rows
    pd.DataFrame({"t": pd.to_datetime(["2020-01-01", None])}),           # a dtype left to pandas
    pd.DataFrame([[1, 2]], columns=["x", "x"]),                          # repeated name: pandas
    pd.DataFrame({"o": [object(), None]}).iloc[:, :0],                   # no columns: pandas
    pd.DataFrame({"f32": np.array([0.1, math.nan], dtype=np.float32)}),  # float32: pandas
])
def test_edge_frames_same_bytes(tmp_path, frame):
    _both(tmp_path, frame)


def test_compare_table_same_bytes(tmp_path):
    """A real compare table (statistics-only dumps written by the test helper)."""
    from opdump.analysis.compare import compare
    from test_compare_stat_fastpath import write_stats_dump   # generated statistics dumps
    a, b = tmp_path / "a", tmp_path / "b"
    write_stats_dump(a, seed=1, nonfinite=True, md5=True)
    write_stats_dump(b, seed=1, perturb=1e-3, nonfinite=True)
    _both(tmp_path, compare(str(a), str(b), progress=False).table)
