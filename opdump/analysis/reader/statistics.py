"""Statistics files: reading one ``statistic.csv`` into rows with normalised column names
(the headers MindSpore and opdump write, mapped by :mod:`opdump.format.statistics`),
numbers parsed, shapes normalised to ``(a,b,c)`` whether quoted or not.
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


def _num(v: str) -> float:
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
        return float("nan")


def read_statistic_csv(path: Path) -> List[Dict[str, Any]]:
    """Rows of one statistic.csv as dicts (normalised column names).

    Shapes such as ``(2,3)`` are accepted quoted or not (an unquoted shape spans
    several CSV fields and is glued back together)."""
    rows: List[Dict[str, Any]] = []
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            return rows
        while header and header[-1] == "":
            header.pop()
        shape_i = header.index("Shape") if "Shape" in header else None
        for rec in reader:
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
            for h, v in zip(header, rec):
                key = _STRUCT_COLUMNS.get(h) or STAT_COLUMNS.get(h) or h
                if key in ("task_id", "stream_id", "timestamp", "slot", "data_size"):
                    try:
                        row[key] = int(float(v))
                    except ValueError:
                        row[key] = -1
                elif key in ("op_type", "op", "dtype", "format", "md5"):
                    row[key] = v.strip()
                elif key == "io":
                    row[key] = v.strip().lower()
                elif key == "shape":
                    row[key] = _norm_shape(v)
                else:
                    row[key] = _num(v)
            rows.append(row)
    return rows


def _norm_shape(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        nums = [int(x) for x in v]
    else:
        nums = [int(x) for x in re.findall(r"-?\d+", str(v))]
    return "(" + ",".join(str(n) for n in nums) + ")"

