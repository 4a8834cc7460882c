"""The table of a statistics-only compare held as columns of Python cells
(:func:`frame_of_cells` makes the DataFrame of them) and written as CSV straight from those
cells (:func:`write_cells_csv`), with no DataFrame built.

Why: the statistics path (:mod:`.stat_pairs`) has its table as lists; building the
DataFrame (~0.09 s of CPU for 100,000 rows, pandas inferring each column) only for the
CSV writer to turn its columns back into Python objects and text was the last frame of
an ``opdump compare`` of statistics: the command writes the CSV and prints the summary,
neither needs the frame.

Cells: an ordered dict, column name -> (kind, payload): ``("order", n)`` the row numbers
0..n-1, ``("Int64", cells)`` ints or None (pandas' nullable ``Int64``), ``("none", n)`` n
Nones, ``("cells", cells)`` any cells (one of int/float/bool: that array, else objects,
pandas' ``infer_objects`` deciding).

Guarantee: :func:`write_cells_csv` writes the bytes
``table_csv.write_table_csv(frame_of_cells(cells))`` writes (so pandas' ``to_csv`` bytes):
each column's fields are decided on the whole column by the rules
:func:`.table_csv.column_texts` applies to the column :func:`frame_of_cells` makes -- an
int64/bool column ``str`` of each cell, a float64 column numpy's ``astype(str)`` with NaN
empty, a column of str and None cells the quoted string or empty (whether pandas infers
``str`` or keeps objects) -- and any other column is inferred by pandas alone (a
one-column frame: ``infer_objects`` works column by column) and handed to
``column_texts``.  A column ``column_texts`` refuses returns False: the caller writes the
frame.  tests/test_compare_stat_csv.py compares both on generated columns.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..reader.records_columns import typed_array
from .csv_halves import rows_text, write_slices_in_halves
from .stat_cells import per_distinct
from .table_csv import _by_distinct, _quote, column_texts

__all__ = ["frame_of_cells", "write_cells_csv", "cells_length"]

Cells = Dict[str, Tuple[str, Any]]


def cells_length(cells: Cells) -> int:
    """The number of rows of ``cells`` (0 for no column)."""
    for kind, v in cells.values():
        return v if kind in ("order", "none") else len(v)
    return 0


def _column(kind: str, v: Any, pd):
    """One column as :func:`frame_of_cells` puts it in the frame (before ``infer_objects``)."""
    if kind == "order":
        return np.arange(v, dtype=np.int64)
    if kind == "Int64":
        return pd.array(v, dtype="Int64")
    if kind == "none":
        return np.full(v, None, dtype=object)
    n = len(v)
    arr = typed_array(v) if n else None       # one of int/float/bool: infer_objects' array
    return arr if arr is not None else np.fromiter(v, dtype=object, count=n)


def frame_of_cells(cells: Cells, pd=None):
    """The DataFrame of ``cells`` (module doc): columns in their order, object columns
    inferred by ``infer_objects``."""
    if pd is None:
        import pandas as pd
    cols = {k: _column(kind, v, pd) for k, (kind, v) in cells.items()}
    return pd.DataFrame(cols, columns=list(cells)).infer_objects()   # object columns only


def _str_texts(v: List[Any]) -> Optional[Dict[Any, str]]:
    """The field of each distinct cell of a column of str and None cells (None for any
    other column).  Types are checked on the distinct cells: a cell of another type that
    equals a str is a str subclass (its field is its text either way); None equals only
    itself, a float (NaN) or number no str."""
    try:
        seen = dict.fromkeys(v)
    except TypeError:                           # an unhashable cell
        return None
    for x in seen:
        if type(x) is str:
            seen[x] = _quote(x)
        elif x is None:
            seen[x] = ""
        else:
            return None
    return seen


_BOOL_FIELDS = {True: "True", False: "False", None: ""}


def _with_none(v: List[Any]) -> Optional[Plan]:
    """The plan of a column of bools and Nones (a statistics compare's ``identical``), made
    here instead of by pandas, or None for any other column: pandas keeps such a column as
    objects, whose fields are ``str`` of a bool and empty for None.  The types are those of
    every cell (``type() is``: no subclass).  170,000 cells: ~14 ms against pandas' ~22 ms
    (inferring the column, then the object writer).  (Floats with None stay with pandas: its
    inference of float64 in C beats checking the cells' types here.)"""
    if set(map(type, v)) == {bool, type(None)}:
        return ("fn", lambda lo, hi: list(map(_BOOL_FIELDS.__getitem__, v[lo:hi])))
    return None


def _int_field(x: Any) -> str:
    return "" if x is None else str(x)


def _constant(v: List[Any]) -> bool:
    """Every cell equal to the first (for cells whose equal values write the same text:
    str/None, or ints only, or bools only -- not floats, where 0.0 == -0.0)."""
    return bool(v) and v.count(v[0]) == len(v)


Plan = Tuple[str, Any]          # ("const", the field of every row) or ("fn", fields(lo, hi))


def _plan(name: str, kind: str, v: Any) -> Optional[Plan]:
    """How the CSV fields of one column are made, as :func:`.table_csv.column_texts` writes
    the frame's column (module doc): one text for every row, or ``fields(lo, hi)`` for rows
    lo..hi; None when it refuses that column."""
    if kind == "order":
        return ("fn", lambda lo, hi: list(map(str, range(lo, hi))))
    if kind == "none":
        return ("const", "")
    if kind == "Int64" and set(map(type, v)) <= {int, type(None)}:
        if _constant(v):
            return ("const", "" if v[0] is None else str(v[0]))
        return ("fn", lambda lo, hi: per_distinct(_int_field, v[lo:hi]))
    if kind == "cells":
        arr = typed_array(v) if len(v) else None
        if arr is not None and arr.dtype.kind in "ib":              # Python ints (or bools) only: str of each
            if _constant(v):
                return ("const", str(v[0]))
            return ("fn", lambda lo, hi: _by_distinct(arr[lo:hi], str))  # the frame writer's own step
        if arr is not None and arr.dtype == np.float64:
            def floats(lo: int, hi: int) -> List[str]:
                part = arr[lo:hi]
                txt = part.astype(str).astype(object)               # pandas' own conversion (no float_format)
                txt[np.isnan(part)] = ""
                return txt.tolist()
            return ("fn", floats)
        if arr is None:
            texts = _str_texts(v)
            if texts is not None:
                if len(texts) == 1:
                    return ("const", next(iter(texts.values())))
                return ("fn", lambda lo, hi: list(map(texts.__getitem__, v[lo:hi])))
            mixed = _with_none(v)
            if mixed is not None:
                return mixed
    import pandas as pd                                              # any other column: pandas infers it
    col = frame_of_cells({name: (kind, v)}, pd)[name]
    txt = column_texts(col)
    if txt is None:
        return None
    return ("fn", lambda lo, hi: txt[lo:hi])


def _merged(plans: List[Plan]) -> List[Plan]:
    """Runs of adjacent one-text columns as one column of their texts joined by commas
    (fewer fields to join a row: the same row text)."""
    out: List[Plan] = []
    for p in plans:
        if p[0] == "const" and out and out[-1][0] == "const":
            out[-1] = ("const", out[-1][1] + "," + p[1])
        else:
            out.append(p)
    return out


class _Fields:
    """``fields(lo, hi)`` of the whole table: the plans made on first use, in the process
    that uses them (the parent and the :mod:`.csv_halves` child each make theirs, at the
    same time); None when a column is refused."""

    def __init__(self, cells: Cells):
        self.cells = cells
        self.plans: Optional[List[Plan]] = None
        self.refused = False

    def __call__(self, lo: int, hi: int) -> Optional[List[List[str]]]:
        if self.plans is None and not self.refused:
            plans = []
            for name, (kind, v) in self.cells.items():
                p = _plan(name, kind, v)
                if p is None:
                    self.refused = True
                    return None
                plans.append(p)
            self.plans = _merged(plans)
        if self.refused:
            return None
        m = hi - lo
        return [[p[1]] * m if p[0] == "const" else p[1](lo, hi) for p in self.plans]


def write_cells_csv(cells: Cells, path: str) -> bool:
    """Write ``cells`` (no index) as CSV at ``path``, the bytes of the frame's CSV (module
    doc), the second half of the rows made by a forked child when :mod:`.csv_halves` says
    so.  False (the file's content undefined): a column it does not write; the caller
    writes the frame."""
    n = cells_length(cells)
    if not n or not all(isinstance(c, str) for c in cells):
        return False
    fields_of = _Fields(cells)
    header = ",".join(_quote(c) for c in cells)
    with open(path, "w", encoding="utf-8", errors="backslashreplace", newline="") as f:
        f.write(header + "\n")
        done = write_slices_in_halves(n, f, fields_of)
        if done is None:
            cols = fields_of(0, n)
            if cols is None:
                return False
            f.write(rows_text(cols))
        return done is not False
