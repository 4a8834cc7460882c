"""The statistic.csv splitter and the csv module's field size limit (issue 25): a text longer
than ``csv.field_size_limit()`` is split here as long as no field is longer than the limit
(the csv module reads it too), and only a field over the limit sends the text back to the
csv module (which refuses that line: the reader reports it).  Before, every text longer
than the limit went to the csv module (the 0.9 MB ``statistic.csv`` files of a MobileBERT
dump: ~15 % slower).  The limit is lowered here (restored after) so the
texts stay small; the rule is the csv module's, read at each call."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opdump.analysis.reader import statistics as S
from opdump.analysis.reader.stat_split import split_columns
from test_reader_stat_split import _CELL, _check


@pytest.fixture
def limit_40():
    old = csv.field_size_limit(40)
    try:
        yield 40
    finally:
        csv.field_size_limit(old)


def _csv(text: str):
    return list(csv.reader(io.StringIO(text, newline="")))


def _rows(shape: str, name: str = "Default/add-op1", n: int = 20) -> str:
    return "Op Type,Op Name,Shape,Max Value\n" + "".join(f"Add,{name}{k:02d},{shape},{k}.5\n" for k in range(n))


def test_long_text_of_short_fields_is_split_here(limit_40):
    text = _rows('"(2,3)"')
    assert len(text) > 40
    got = split_columns(text)
    assert got is not None                         # before: None for any text over the limit
    recs = _csv(text)
    header, cols, n = got
    assert header == recs[0] and n == len(recs) - 1
    assert [list(c) for c in cols] == [list(x) for x in zip(*recs[1:])]


def test_a_field_at_the_limit_is_split_one_over_it_is_left_to_csv(limit_40):
    at = "x" * (40 - 2)                            # name field: 'x'*38 + 2 digits = 40 characters
    text = _rows("(2)", name=at, n=10)
    assert max(len(f) for r in _csv(text) for f in r) == 40
    assert split_columns(text) is not None
    over = _rows("(2)", name=at + "y", n=10)
    with pytest.raises(csv.Error):
        _csv(over)
    assert split_columns(over) is None


def test_a_quoted_field_counts_its_text_between_the_quotes(limit_40):
    inside = "(" + ",".join(["1"] * 19) + ")"      # 39 characters: 41 with its quotes
    text = _rows(f'"{inside}"', n=3)
    assert max(len(f) for r in _csv(text) for f in r) == 39
    got = split_columns(text)
    assert got is not None and got[1][2] == (inside,) * 3
    wide = "(" + ",".join(["1"] * 20) + ")"        # 41 characters
    assert split_columns(_rows(f'"{wide}"', n=3)) is None


def test_a_header_field_over_the_limit_is_left_to_csv(limit_40):
    text = "Op Type,Op Name," + "H" * 41 + "\n" + "".join(f"Add,a{k},1\n" for k in range(5))
    assert split_columns(text) is None


def test_reader_on_a_long_file_as_with_the_csv_module(tmp_path, monkeypatch, limit_40):
    p = tmp_path / "statistic.csv"
    p.write_text("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value\n"
                 + "".join(f'Add,Default/a-op{k},0,0,{100 + k},output,0,8,Float32,"(2,2)",{k}.25\n'
                           for k in range(30))
                 + "Add,Default/b-op1,0,0,200,output,0,8,Float32,(2),nan\n", encoding="utf-8")
    got = S.read_statistic_columns(Path(p), {})
    monkeypatch.setattr(S, "split_columns", lambda *a, **k: None)   # the csv module alone
    ref = S.read_statistic_columns(Path(p), {})
    monkeypatch.undo()
    assert got[0] == ref[0] and got[2] == ref[2] == 31 and got[3] == ref[3] == {}
    for x, y in zip(got[1], ref[1]):
        assert [(type(u), repr(u)) for u in x] == [(type(v), repr(v)) for v in y]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_CELL, min_size=1, max_size=5), min_size=1, max_size=6), st.booleans(),
       st.integers(1, 12))
def test_split_is_the_csv_module_or_none_under_a_low_limit(rows, quote_all, limit):
    """The generated texts of test_reader_stat_split, the limit lowered to a few characters:
    split here exactly where the csv module reads them, and then the same fields."""
    if quote_all:
        rows = [['"' + c.replace('"', '""') + '"' for c in r] for r in rows]
    text = "\n".join(",".join(r) for r in rows)
    old = csv.field_size_limit(limit)
    try:
        _check(text)
        _check(text + "\n")
    finally:
        csv.field_size_limit(old)
