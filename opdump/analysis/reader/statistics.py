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
import re
from pathlib import Path
from typing import Any, Dict, List

from ...format.statistics import BASE_KEYS, HEADER_KEYS, NUMERIC_KEYS

#: statistic.csv header -> column name in the tables of this module (opdump.format.statistics)
STAT_COLUMNS = HEADER_KEYS
_STRUCT_COLUMNS = BASE_KEYS
NUMERIC_STATS = list(NUMERIC_KEYS)


_NUMERIC = frozenset(NUMERIC_KEYS)
_INT_KEYS = ("task_id", "stream_id", "timestamp", "slot", "data_size")


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
    """Rows of one statistic.csv as dicts (normalised column names).

    Shapes such as ``(2,3)`` are accepted quoted or not (an unquoted shape spans
    several CSV fields and is glued back together).  A line the CSV parser refuses (a
    field over the parser's limit, a NUL byte) is skipped and its error, naming the file
    and line, goes into ``stat_skipped`` of the next row read (or the last one; that row's
    own cells are still trusted); a file whose lines are all refused raises ValueError
    naming the file."""
    rows: List[Dict[str, Any]] = []
    refused: List[str] = []
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            return rows
        except csv.Error as e:
            raise ValueError(f"{path}: line {reader.line_num}: not a readable statistic.csv ({e})") from None
        while header and header[-1] == "":
            header.pop()
        shape_i = header.index("Shape") if "Shape" in header else None
        while True:
            try:
                rec = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                refused.append(f"{path}: line {reader.line_num}: unreadable CSV line ({e})")
                if len(refused) > 1000:          # a file of garbage: stop, it is reported
                    break
                continue
            if not rec or all(not x.strip() for x in rec):
                continue
            while len(rec) > len(header) and rec[-1] == "":
                rec = rec[:-1]
            if shape_i is not None and len(rec) > len(header):
                # glue an unquoted "(a,b,c)" back into one field
                j = shape_i
                while j < len(rec) and not rec[j].rstrip().endswith(")"):
                    j += 1
                rec = rec[:shape_i] + [",".join(rec[shape_i:j + 1])] + rec[j + 1:]
            if len(rec) < len(header):
                continue  # torn row (whole files are written, so only a foreign writer's)
            row: Dict[str, Any] = {}
            errors: List[str] = []
            line = reader.line_num
            for h, v in zip(header, rec):
                key = _STRUCT_COLUMNS.get(h) or STAT_COLUMNS.get(h) or h
                if key in _INT_KEYS:
                    try:
                        row[key] = int(float(v))
                    except (ValueError, OverflowError):
                        row[key] = -1
                        errors.append(_cell_error(path, line, h, v))
                elif key in ("op_type", "op", "dtype", "format", "md5"):
                    row[key] = v.strip()
                elif key == "io":
                    row[key] = v.strip().lower()
                elif key == "shape":
                    row[key] = _norm_shape(v)
                elif key in _NUMERIC:
                    try:
                        row[key] = _num(v)
                    except _Malformed:
                        row[key] = None          # unknown, never NaN
                        errors.append(_cell_error(path, line, h, v))
                else:                            # a column this reader does not know: kept as read
                    try:
                        row[key] = _num(v)
                    except _Malformed:
                        row[key] = v.strip()
            if errors:
                row["stat_errors"] = "; ".join(errors)
            if refused:
                row["stat_skipped"], refused = "; ".join(refused), []
            rows.append(row)
    if refused:
        if not rows:
            raise ValueError("; ".join(refused[:3]))
        last = rows[-1]
        last["stat_skipped"] = "; ".join(([last["stat_skipped"]] if last.get("stat_skipped") else []) + refused)
    return rows


def _norm_shape(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        nums = [int(x) for x in v]
    else:
        nums = [int(x) for x in re.findall(r"-?\d+", str(v))]
    return "(" + ",".join(str(n) for n in nums) + ")"

