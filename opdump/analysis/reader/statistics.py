"""Statistics files: reading one ``statistic.csv`` into rows with normalised column names
(the headers MindSpore and opdump write, mapped by :mod:`opdump.format.statistics`),
numbers parsed, shapes normalised to ``(a,b,c)`` whether quoted or not.

Malformed cells are errors, not values: a numeric cell that is not a number
(``NOT_A_NUMBER`` in ``Max Value``) becomes None (unknown) and the row carries
``stat_errors``, one line naming the file, the row (line number in the file) and the
column, which the analysis reports.  The cells MindSpore writes are valid: numbers,
``nan``, ``inf``, ``-inf``, ``true``/``false``, and empty cells (a category that was not
computed, read as NaN).
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...format.statistics import BASE_KEYS, HEADER_KEYS, NUMERIC_KEYS
from .stat_split import split_columns

#: statistic.csv header -> column name in the tables of this module (opdump.format.statistics)
STAT_COLUMNS = HEADER_KEYS
_STRUCT_COLUMNS = BASE_KEYS
NUMERIC_STATS = list(NUMERIC_KEYS)


_NUMERIC = frozenset(NUMERIC_KEYS)
_INT_KEYS = ("task_id", "stream_id", "timestamp", "slot", "data_size")
_EXACT = 1 << 53            # every int up to this size is a float exactly


class _Malformed(Exception):
    """A cell that is not a number where the column holds numbers."""


def _num(v: str) -> float:
    """A numeric cell: empty -> NaN (not computed); ``true``/``false`` -> 1/0; a number,
    ``nan``, ``inf``, ``-inf`` -> its float; anything else raises :class:`_Malformed`."""
    v = v.strip()
    if not v:
        return float("nan")
    lv = v.lower()
    if lv == "true":
        return 1.0
    if lv == "false":
        return 0.0
    try:
        return float(v)
    except ValueError:
        raise _Malformed(v) from None


def _cell_error(path: Path, line: int, column: str, value: str) -> str:
    shown = value if len(value) <= 40 else value[:40] + "…"
    return f"{path}: line {line}, column {column!r}: {shown!r} is not a number"


def read_statistic_csv(path: Path) -> List[Dict[str, Any]]:
    """Rows of one statistic.csv as dicts (normalised column names): the rows of
    :func:`read_statistic_columns`, one dict per row, ``stat_errors`` / ``stat_skipped`` last
    where a row has them."""
    keys, columns, n, extras = read_statistic_columns(path)
    rows = [dict(zip(keys, vals)) for vals in zip(*columns)] if keys else [{} for _ in range(n)]
    for i, extra in extras.items():
        rows[i].update(extra)
    return rows


def read_statistic_columns(path: Path, memo: Optional[Dict[tuple, List[Any]]] = None
                           ) -> Tuple[List[str], List[List[Any]], int, Dict[int, Dict[str, str]]]:
    """One statistic.csv as columns: (keys, columns, number of rows, extras), ``keys[j]`` the
    normalised name of ``columns[j]`` (as read; a key may repeat where two headers map to one
    name: a row dict keeps the first one's place and the last one's value), ``extras`` row
    index -> ``{"stat_errors": …, "stat_skipped": …}`` for the rows that carry them.

    Shapes such as ``(2,3)`` are accepted quoted or not (an unquoted shape spans
    several CSV fields and is glued back together).  A line the CSV parser refuses (a
    field over the parser's limit, a NUL byte) is skipped and its error, naming the file
    and line, goes into ``stat_skipped`` of the next row read (or the last one; that row's
    own cells are still trusted); a file whose lines are all refused raises ValueError
    naming the file.

    The cells are converted column by column (one converter per column, numbers through
    ``float`` over the whole column, the per-cell rules only where that fails): a
    100,000-row compare reads its statistics several times faster than cell by cell.  A
    well-formed file (every row as wide as the header, no blank row, every cell valid) is
    parsed in one call of the CSV reader; any other takes the row-by-row loop below, which
    alone knows line numbers (:func:`_read_well_formed`).

    ``memo``: the converted cells of earlier files' columns by (column, cells) -- the files
    of one dump repeat their names, types, io, slots and shapes iteration after iteration,
    so those are converted once (a column's conversion depends on its cells alone)."""
    fast = _read_well_formed(path, memo)
    if fast is not None:
        return fast
    recs: List[List[str]] = []
    lines: List[int] = []
    skipped: Dict[int, List[str]] = {}       # index of the next row read -> refused lines before it
    refused: List[str] = []
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            return [], [], 0, {}
        except csv.Error as e:
            raise ValueError(f"{path}: line {reader.line_num}: not a readable statistic.csv ({e})") from None
        while header and header[-1] == "":
            header.pop()
        width = len(header)
        shape_i = header.index("Shape") if "Shape" in header else None
        while True:
            try:
                for rec in reader:
                    n = len(rec)
                    if n != width or not n:
                        if not rec or all(not x.strip() for x in rec):
                            continue
                        while len(rec) > width and rec[-1] == "":
                            rec = rec[:-1]
                        if shape_i is not None and len(rec) > width:
                            # glue an unquoted "(a,b,c)" back into one field
                            j = shape_i
                            while j < len(rec) and not rec[j].rstrip().endswith(")"):
                                j += 1
                            rec = rec[:shape_i] + [",".join(rec[shape_i:j + 1])] + rec[j + 1:]
                        if len(rec) < width:
                            continue  # torn row (whole files are written, so only a foreign writer's)
                    elif not rec[0].strip() and not "".join(rec).strip():
                        continue      # a blank line
                    if refused:
                        skipped[len(recs)], refused = refused, []
                    recs.append(rec)
                    lines.append(reader.line_num)
                break
            except csv.Error as e:
                refused.append(f"{path}: line {reader.line_num}: unreadable CSV line ({e})")
                if len(refused) > 1000:          # a file of garbage: stop, it is reported
                    break
    if refused:
        if not recs:
            raise ValueError("; ".join(refused[:3]))
        skipped.setdefault(len(recs) - 1, []).extend(refused)
    if not recs:
        return [], [], 0, {}
    keys = [_STRUCT_COLUMNS.get(h) or STAT_COLUMNS.get(h) or h for h in header]
    errors: Dict[int, List[str]] = {}
    columns = [_convert_column(path, h, k, col, lines, errors)
               for h, k, col in zip(header, keys, zip(*(r[:width] for r in recs)))]
    extras: Dict[int, Dict[str, str]] = {}
    last = {k: c for k, c in zip(keys, columns)}         # a repeated key: its last column's value
    for i, errs in errors.items():
        extras.setdefault(i, {})["stat_errors"] = "; ".join(errs)
    for i, lines_refused in skipped.items():
        ex = extras.setdefault(i, {})
        prev = ex.get("stat_skipped", last["stat_skipped"][i] if "stat_skipped" in last else None)
        ex["stat_skipped"] = "; ".join(([prev] if prev else []) + lines_refused)
    return keys, columns, len(recs), extras


class _NeedLines(Exception):
    """A cell error to report: its line number is needed (the row-by-row loop knows it)."""


class _NoLines:
    def __getitem__(self, i):
        raise _NeedLines


#: columns whose cells change from file to file (not worth remembering)
_UNREPEATED = frozenset(("timestamp", "max", "min", "avg", "l2norm", "md5", "finite_max", "finite_min"))


def _read_well_formed(path: Path, memo: Optional[Dict[tuple, List[Any]]] = None
                      ) -> Optional[Tuple[List[str], List[List[Any]], int, Dict[int, Dict[str, str]]]]:
    """:func:`read_statistic_columns` of a well-formed file in one pass of the CSV reader,
    or None (a row of another width, a blank row, a refused line, a malformed cell: the
    row-by-row loop decides, with line numbers).  The cells are converted by the same
    :func:`_convert_column`, so the result is the loop's."""
    got = _split_well_formed(path)
    if got is None:
        return None
    header, cols, n = got
    if not all(map(str.strip, cols[0])):        # any(not x.strip() ...) in one C-level pass
        return None                              # maybe a blank row: the loop skips those
    keys = [_STRUCT_COLUMNS.get(h) or STAT_COLUMNS.get(h) or h for h in header]
    errors: Dict[int, List[str]] = {}
    try:
        if memo is None:
            columns = [_convert_column(path, h, k, col, _NoLines(), errors) for h, k, col in zip(header, keys, cols)]
        else:
            columns = []
            for h, k, col in zip(header, keys, cols):
                if k in _UNREPEATED:
                    columns.append(_convert_column(path, h, k, col, _NoLines(), errors))
                    continue
                mk = ("column", h, k, col)
                got = memo.get(mk)
                if got is None:
                    got = _convert_column(path, h, k, col, _NoLines(), errors)
                    if errors:
                        return None                      # never reached: a cell error needs lines
                    memo[mk] = got
                columns.append(list(got))
    except _NeedLines:
        return None
    return keys, columns, n, {}


def _header_width(rec: List[str]) -> int:
    """The header's width: its fields less the empty ones it ends with."""
    width = len(rec)
    while width and rec[width - 1].strip() == "":
        width -= 1
    return width


def _split_well_formed(path: Path) -> Optional[Tuple[List[str], List[Sequence[str]], int]]:
    """(stripped header, columns, number of rows) of a file whose rows all have the header's
    width, or None.  Split by :func:`.stat_split.split_columns` (the csv module's fields,
    several times faster) where it handles the text, else by the csv module."""
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    got = split_columns(text, _header_width)
    if got is not None:
        rec, cols, n = got
        return [h.strip() for h in rec[:len(cols)]], cols, n
    try:
        recs = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error:
        return None
    if len(recs) < 2:
        return None
    header = [h.strip() for h in recs[0]]
    while header and header[-1] == "":
        header.pop()
    width = len(header)
    if not width or set(map(len, recs[1:])) != {width}:
        return None
    return header, list(zip(*recs[1:])), len(recs) - 1


def _convert_column(path: Path, header: str, key: str, col: Sequence[str], lines: List[int],
                    errors: Dict[int, List[str]]) -> List[Any]:
    """One column's cells converted by the rule of its key (errors appended per row, in
    column order since columns are converted left to right)."""
    if key in _INT_KEYS:
        try:
            ints = list(map(int, col))          # int(v) is int(float(v)) where both succeed and
            if not ints or (max(ints) <= _EXACT and min(ints) >= -_EXACT):   # float(v) is exact
                return ints
        except ValueError:                      # "1.0", "1e3", "nan": through float below
            pass
        try:
            return list(map(int, map(float, col)))
        except (ValueError, OverflowError):
            out = []
            for i, v in enumerate(col):
                try:
                    out.append(int(float(v)))
                except (ValueError, OverflowError):
                    out.append(-1)
                    errors.setdefault(i, []).append(_cell_error(path, lines[i], header, v))
            return out
    if key in ("op_type", "op", "dtype", "format", "md5"):
        return list(map(str.strip, col))
    if key == "io":
        return list(map(str.lower, map(str.strip, col)))
    if key == "shape":
        seen = {v: _norm_shape(v) for v in set(col)}     # once per distinct text
        return list(map(seen.__getitem__, col))
    try:
        return list(map(float, col))        # float(v) is _num(v) wherever it succeeds
    except ValueError:
        pass
    out = []
    numeric = key in _NUMERIC
    for i, v in enumerate(col):
        try:
            out.append(_num(v))
        except _Malformed:
            if numeric:
                out.append(None)             # unknown, never NaN
                errors.setdefault(i, []).append(_cell_error(path, lines[i], header, v))
            else:                            # a column this reader does not know: kept as read
                out.append(v.strip())
    return out


def _norm_shape(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        nums = [int(x) for x in v]
    else:
        nums = [int(x) for x in re.findall(r"-?\d+", str(v))]
    return "(" + ",".join(str(n) for n in nums) + ")"

