"""The compare table written as CSV column by column (:func:`write_table_csv`), the bytes
``DataFrame.to_csv(path, index=False, errors="backslashreplace")`` writes.

Why: pandas' writer turned every cell of a 100,000-row table (34 columns) into a Python
object row by row: 0.8 s of a 5 s statistics-only compare.  Here each column becomes its
text once (a float64 column through the same ``astype(str)`` pandas uses, the text of a
repeated string quoted once), and the rows are joined in one step.

Guarantee: byte for byte pandas' output for the dtypes handled here (int64, bool,
float64, nullable Int64, the ``str`` dtype, object columns of str/int/float/bool/None
cells); a frame with any other dtype or cell is written by pandas itself.
tests/test_compare_table_csv.py compares both writers on generated tables (NaN, Inf,
None, quotes, commas, line breaks, undecodable names).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from .stat_cells import per_distinct

__all__ = ["write_table_csv", "column_texts"]

_ROW = None          # a csv writer over a buffer: pandas' dialect (QUOTE_MINIMAL, "\n" line end)
_PLAIN = None        # the ASCII characters that never make that writer quote a field


def _writer_quote(s: str) -> str:
    """One field as pandas' csv writer writes it: the writer itself is asked (which
    characters force quotes depends on the Python version)."""
    global _ROW
    if _ROW is None:
        import csv
        import io
        buf = io.StringIO()
        _ROW = (buf, csv.writer(buf, lineterminator="\n"))
    buf, w = _ROW
    buf.seek(0)
    buf.truncate()
    w.writerow((s, ""))
    return buf.getvalue()[:-2]                        # the row less ",\n"


def _plain_chars() -> frozenset:
    """ASCII characters the writer leaves unquoted wherever they stand in a field."""
    out = set()
    for i in range(128):
        c = chr(i)
        if all(_writer_quote(f) == f for f in (c, "a" + c, c + "a", "a" + c + "b", c + c)):
            out.add(c)
    return frozenset(out)


def _quote(s: str) -> str:
    """One field as pandas' csv writer writes it: as is when it is ASCII of characters the
    writer never quotes (checked against the writer once per process), else the writer's text."""
    global _PLAIN
    if _PLAIN is None:
        _PLAIN = _plain_chars()
    if s and s.isascii() and _PLAIN.issuperset(s):
        return s
    return _writer_quote(s)


def _object_texts(values: List[Any]) -> Optional[List[str]]:
    """The fields of an object (or ``str``) column: None/NaN/NA empty, a str as is, a number
    or bool as ``str()`` gives it (csv's rule); None when a cell is of another type."""
    import pandas as pd
    if _all_plain(values):                             # str cells only, none quoted
        return list(map(str, values))
    na = pd.NA
    memo: Dict[Any, str] = {}
    out: List[str] = []
    append = out.append
    for v in values:
        t = type(v)
        if t is str:
            s = memo.get(v)
            if s is None:
                s = memo[v] = _quote(v)
            append(s)
        elif v is None or v is na:
            append("")
        elif t is float:
            append("" if v != v else repr(v))        # NaN is missing (pandas' na_rep)
        elif t is int or t is bool:
            append(str(v))
        else:
            return None
    return out


def column_texts(col) -> Optional[List[str]]:
    """The CSV fields of one column (a Series) as pandas writes them, or None when its dtype
    is not one this writer knows."""
    dt = col.dtype
    kind = getattr(dt, "kind", None)
    name = str(dt)
    if isinstance(dt, np.dtype):
        if kind in "iu" or kind == "b":
            return _by_distinct(col, str)
        if kind == "f" and dt == np.float64:
            return _float_texts(col.to_numpy())
        if kind == "O":
            if col.isna().all():                          # None/NaN everywhere: empty fields
                return [""] * len(col)
            return _object_texts(col.tolist())
        return None
    if name == "str":                                  # NA empty, a string quoted
        return _str_texts(col)
    if name == "Int64":                                # NA empty; an int's str
        return _by_distinct(col, str)
    return None


def _float_texts(vals: np.ndarray) -> List[str]:
    """The fields of a float64 column: ``astype(str)`` (pandas' own conversion, no
    float_format), NaN empty.  Python's ``repr`` of a float is the same text (both the
    shortest string that reads back as the value, with the same switch to exponent
    notation) at about half the cost; a sample of the column is checked against
    ``astype(str)`` and any difference (another numpy's formatting) takes ``astype(str)``."""
    nan = np.isnan(vals)
    n = len(vals)
    txt = np.empty(n, dtype=object)
    if bool(np.any(np.signbit(vals) & (vals == 0))):   # -0.0: a dict key equal to 0.0
        txt[:] = list(map(repr, vals.tolist()))
    else:                                              # repeated values (1.0, 0.0) formatted once
        txt[:] = per_distinct(repr, vals.tolist())
    if n:
        idx = np.unique(np.linspace(0, n - 1, min(n, 64)).astype(np.intp))
        idx = np.concatenate([idx, np.flatnonzero(~nan)[:16], np.flatnonzero(~nan)[-16:]])
        if vals[idx].astype(str).tolist() != txt[idx].tolist():
            txt = vals.astype(str).astype(object)
    txt[nan] = ""
    return txt.tolist()


_PLAIN_BYTES = None  # _PLAIN as bytes (bytes.translate's table of characters to delete)


def _all_plain(values: List[Any]) -> bool:
    """Whether every value is a non-empty str of characters the writer never quotes -- its
    field is then the value itself -- checked on the whole column at once (one join, one
    ``bytes.translate``) instead of one :func:`_quote` per cell (~3 us a path)."""
    global _PLAIN, _PLAIN_BYTES
    if not values:
        return False
    try:
        big = "".join(values)
    except TypeError:                                  # a cell that is not a str
        return False
    if not big.isascii() or "" in values:
        return False
    if _PLAIN_BYTES is None:
        if _PLAIN is None:
            _PLAIN = _plain_chars()
        _PLAIN_BYTES = "".join(sorted(_PLAIN)).encode("ascii")
    return not big.encode("ascii").translate(None, _PLAIN_BYTES)


def _by_distinct(col, text) -> List[str]:
    """``text`` of each distinct value once (pandas' factorize: a column of one type, so
    equal values are equal cells), NA empty."""
    import pandas as pd
    codes, uniques = pd.factorize(col, use_na_sentinel=True)
    table = np.empty(len(uniques) + 1, dtype=object)
    table[:-1] = [text(v) for v in uniques.tolist()]
    table[-1] = ""                                    # code -1: NA
    return table[codes].tolist()


def _str_texts(col) -> List[str]:
    """The fields of a ``str`` column: each distinct string quoted once, NA empty -- what
    :func:`_by_distinct` gives, found by a dict over the column's Python strings
    (:func:`.stat_cells.per_distinct`) instead of pandas' factorize of strings (~7 ms a
    column of 100,000 rows, about twice this)."""
    def field(v) -> str:                               # a str column holds str, else NA (NaN, pd.NA, None);
        return _quote(str(v)) if isinstance(v, str) else ""   # a str subclass (numpy's str_) kept as given
    values = col.tolist()
    if _all_plain(values):                             # every field the value itself (paths, names)
        return list(map(str, values))
    return per_distinct(field, values)


def _fields(table) -> Optional[List[List[str]]]:
    """The CSV fields of every column of ``table`` (column by column), or None when a
    column name, dtype or cell is not one this writer knows."""
    cols: List[List[str]] = []
    for name in table.columns:
        txt = column_texts(table[name])
        if txt is None or not isinstance(name, str):
            return None
        cols.append(txt)
    return cols


def write_table_csv(table, path: str) -> None:
    """Write ``table`` (no index) as CSV at ``path``: the bytes pandas would write (module
    doc); a dtype or cell this writer does not know hands the whole frame to pandas.  A
    large table's second half of rows is made by a forked child meanwhile when a CPU is
    idle (:mod:`.csv_halves`: the same bytes)."""
    from .csv_halves import rows_text, write_rows_in_halves
    if not len(table.columns) or not table.columns.is_unique or not all(isinstance(c, str) for c in table.columns):
        table.to_csv(path, index=False, errors="backslashreplace")
        return
    header = ",".join(_quote(str(c)) for c in table.columns)
    with open(path, "w", encoding="utf-8", errors="backslashreplace", newline="") as f:
        f.write(header + "\n")
        done = write_rows_in_halves(table, f, _fields)
        if done is None:
            cols = _fields(table)
            if cols is not None and len(table):
                f.write(rows_text(cols))
            done = cols is not None
    if not done:
        table.to_csv(path, index=False, errors="backslashreplace")
