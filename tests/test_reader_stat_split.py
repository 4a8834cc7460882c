"""The statistic.csv splitter (opdump/analysis/reader/stat_split.py): where it splits a
text, the fields are the csv module's, and the reader built on it reads files as the
csv-module reader did.

* generated texts (hypothesis): fields with commas, quotes, doubled quotes, spaces, line
  breaks, NUL and carriage returns, empty cells, NaN/Inf text, odd names, rows of other
  widths, blank lines -- ``split_columns`` either returns None or exactly
  ``csv.reader``'s fields, column by column;
* the plain files MindSpore and opdump write (a quoted shape) are split, not sent back
  to the csv module (else the speed-up is gone unnoticed);
* ``read_statistic_columns`` with the splitter gives what it gives with the splitter
  turned off, on generated statistic.csv files with quoting and malformed cells.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from opdump.analysis.reader import stat_split
from opdump.analysis.reader import statistics as S
from opdump.analysis.reader.stat_split import split_columns

_CELL = st.one_of(
    st.sampled_from(["", " ", "nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-0.0", "true", "x,y",
                     '"(2,3)"', "(2,3)", '"a""b"', '"a"b', 'a"b', '""', '"', "Default/a-op1", "a\nb",
                     '"a\nb"', "\r", "a\x00b", "\x01", "é", "Float32", "  padded  "]),
    st.text(alphabet=st.sampled_from(list('ab,"() \n\r.-0123456789')), max_size=8),
)


def _csv_fields(text: str):
    return list(csv.reader(io.StringIO(text, newline="")))


def _check(text: str) -> bool:
    """split_columns agrees with csv.reader on ``text`` (True: it split it)."""
    try:
        recs = _csv_fields(text)
    except csv.Error:
        recs = None
    got = split_columns(text)
    if got is None:
        return False
    assert recs is not None, repr(text)
    header, cols, n = got
    assert header == recs[0]
    assert n == len(recs) - 1
    rows = recs[1:]
    assert all(len(r) == len(header) for r in rows)
    assert [list(c) for c in cols] == [list(x) for x in zip(*rows)] if rows else True
    assert all(isinstance(c, tuple) for c in cols)
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example([["", "", ""], ["", "", ""], [""]], True)       # a last row '""' with no line end: a row, not the end
@given(st.lists(st.lists(_CELL, min_size=1, max_size=5), min_size=1, max_size=6), st.booleans())
def test_split_is_the_csv_module_or_none(rows, quote_all):
    if quote_all:
        rows = [['"' + c.replace('"', '""') + '"' for c in r] for r in rows]
    text = "\n".join(",".join(r) for r in rows)
    _check(text)
    _check(text + "\n")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet="abc-/_.", min_size=1, max_size=6),
                          st.lists(st.integers(0, 9), max_size=3),
                          st.sampled_from(["1.5", "nan", "-inf", "", "1e-300"])), min_size=1, max_size=8))
def test_plain_statistic_files_are_split_here(rows):
    lines = ["Op Type,Op Name,Shape,Max Value"]
    for name, dims, v in rows:
        shape = "(" + ",".join(map(str, dims)) + ")"
        lines.append(f'Add,{name},"{shape}",{v}' if len(dims) > 1 else f"Add,{name},{shape},{v}")
    assert _check("\n".join(lines) + "\n")


def test_texts_it_leaves_to_the_csv_module():
    for text in ['a,b\n"x\ny",1\n',          # a line break inside quotes
                 'a,b\n"x""y",1\n',          # a doubled quote
                 'a,b\n"x"y,1\n',            # text after the closing quote
                 'a,b\nx"y,1\n',             # a quote inside an unquoted field
                 'a,b\r\n1,2\r\n',           # carriage returns
                 'a,b\n1,2\n\n3,4\n',        # a blank line
                 'a,b\n1,2,3\n',             # a row wider than the header
                 'a,b\n1\0,2\n',             # a NUL
                 'a,b\n',                    # no row
                 'a,b,c\n"",""\n""',           # a last row '""' (one empty field), no line end
                 'a\n""\n']:                  # a row of one quoted empty field
        assert split_columns(text) is None, repr(text)


_HEADER = ["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size", "Data Type",
           "Shape", "Max Value", "Min Value", "L2Norm Value", "Mystery"]
_NAME = st.text(alphabet=st.sampled_from(list("ab/-_.,\" é")), min_size=0, max_size=10)
_NUM = st.sampled_from(["1.5", "-2", "nan", "NaN", "inf", "-inf", "", " 3 ", "1e400", "true", "NOT_A_NUMBER"])


def _quoted(v: str) -> str:
    return '"' + v.replace('"', '""') + '"' if any(c in v for c in ',"\n') else v


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_NAME, st.sampled_from(["input", "output", " OUTPUT "]), st.integers(0, 3),
                          st.lists(st.integers(0, 40), max_size=3), st.booleans(), _NUM, _NUM, _NUM, _NAME),
                min_size=1, max_size=12))
def test_reader_reads_what_the_csv_module_reader_read(tmp_path, monkeypatch, rows):
    lines = [",".join(_HEADER)]
    for k, (name, io_, slot, dims, quote_shape, mx, mn, l2, extra) in enumerate(rows):
        shape = "(" + ",".join(map(str, dims)) + ")"
        shape = f'"{shape}"' if quote_shape or len(dims) > 1 else shape
        lines.append(",".join(["Add", _quoted("Default/" + name), "0", "0", str(100 + k), io_, str(slot), "8",
                               "Float32", shape, mx, mn, l2, _quoted(extra)]))
    p = tmp_path / "statistic.csv"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    got = S.read_statistic_columns(Path(p), {})
    monkeypatch.setattr(S, "split_columns", lambda *a, **k: None)   # the csv module alone
    ref = S.read_statistic_columns(Path(p), {})
    monkeypatch.undo()
    assert got[0] == ref[0] and got[2] == ref[2] and got[3] == ref[3]
    for x, y in zip(got[1], ref[1]):
        assert len(x) == len(y)
        for u, v in zip(x, y):
            assert type(u) is type(v) and (u == v or (isinstance(u, float) and math.isnan(u) and math.isnan(v)))


def test_a_dump_file_is_split_without_the_csv_module(tmp_path, monkeypatch):
    """The common file (quoted shapes) goes through the splitter: csv.reader is not called."""
    p = tmp_path / "statistic.csv"
    p.write_text(",".join(_HEADER) + "\n"
                 'Parameter,w,0,0,1,output,0,16,Float32,"(2,2)",1.5,-1.5,2.0,x\n'
                 "Add,Default/add-op1,0,0,2,input,0,8,Float32,(2),nan,inf,-inf,\n", encoding="utf-8")
    called = []
    real = csv.reader
    monkeypatch.setattr(S.csv, "reader", lambda *a, **k: called.append(1) or real(*a, **k))
    keys, cols, n, extras = S.read_statistic_columns(Path(p), {})
    assert not called and n == 2 and not extras
    assert dict(zip(keys, cols))["shape"] == ["(2,2)", "(2)"]
    assert stat_split.split_columns(p.read_text()) is not None


@pytest.mark.parametrize("text", ["", "a\n", "\n\n"])
def test_short_texts(text):
    assert split_columns(text) is None
