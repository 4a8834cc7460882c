"""The statistics columns of many judged pairs read from the records tables their tensors
came from (``Tensor.record``, set by :func:`.fields.make_tensors`), one gather per column,
instead of one ``row.get(key)`` per pair and key.

Why: :func:`.stat_columns.judge_statistics` read 13 keys of both rows of every pair from the
row dicts (2.6 million ``dict.get`` on MobileBERT's 159,000 pairs: ~0.5 s) and converted
each list to float64.

Guarantee: the same (values, known) per key as ``column_of_values([row.get(key) ...])``:
each row dict is its records table's row as Python objects (``tolist``), so a float64 or
int64 column gathered by position holds the same numbers (every cell known, NaN a known
float as ``float(nan)`` is); a column of any other dtype goes through ``column_of_values``
cell by cell; a column the table lacks is unknown everywhere (``row.get`` gives None).  The
MD5 cells are the same objects, and "both rows hold one of max/min/avg/l2norm" is a
property of the two tables' columns (every row dict has its table's columns as keys).
Applies only when every A tensor comes from one table and every B tensor from one table
(one rank pair); None otherwise (the caller reads the row dicts).
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np

__all__ = ["gathered_columns", "take_cells"]


def _one_source(tensors) -> Optional[Tuple[Any, np.ndarray]]:
    """(records table, row positions) when every tensor came from one table, else None."""
    src = None
    rows: List[int] = []
    append = rows.append
    for t in tensors:
        rec = t.__dict__.get("record")
        if rec is None:
            return None
        if rec[0] is not src:
            if src is not None:
                return None
            src = rec[0]
        append(rec[1])
    if src is None:
        return None
    return src.frame, np.asarray(rows, dtype=np.int64)


def take_cells(frame, col: str, rows: np.ndarray) -> List[Any]:
    """``frame[col]`` at ``rows`` as Python objects (None for a column the frame lacks), the
    cells ``tolist`` put in the row dicts (the column-wise paths' one cell reader)."""
    if col not in frame.columns:
        return [None] * len(rows)
    ser = frame[col]
    if isinstance(ser.dtype, np.dtype):
        return ser.to_numpy()[rows].tolist()          # int/float/bool/object: the same Python objects
    return ser.to_numpy(dtype=object)[rows].tolist()


def _column(frame, key: str, rows: np.ndarray, column_of_values: Callable) -> Tuple[np.ndarray, np.ndarray]:
    """(values, known) of ``key`` at ``rows`` (module doc)."""
    n = len(rows)
    if key not in frame.columns:                      # row.get(key): None everywhere
        return np.full(n, np.nan), np.zeros(n, dtype=bool)
    dt = frame[key].dtype
    if isinstance(dt, np.dtype) and dt.kind in "if":  # every cell a number: known
        return frame[key].to_numpy()[rows].astype(np.float64), np.ones(n, dtype=bool)
    return column_of_values(take_cells(frame, key, rows))


def gathered_columns(pairs, values: Tuple[str, ...],
                     column_of_values: Callable) -> Optional[Tuple[Callable, Callable, list, list, list]]:
    """(column_a(key), column_b(key), md5 of A, md5 of B, has_any per pair) of ``pairs`` read
    from their records tables (module doc), or None when the tensors do not all come from
    one table a side.  ``values``: the keys of which both rows must hold one for ``has_any``;
    ``column_of_values``: :func:`.stat_columns.column_of_values` (passed in: that module
    imports this one)."""
    a = _one_source(p.a for p in pairs)
    if a is None:
        return None
    b = _one_source(p.b for p in pairs)
    if b is None:
        return None
    (fa, ra), (fb, rb) = a, b

    def column(frame, rows):
        def f(key):
            return _column(frame, key, rows, column_of_values)
        return f
    any_k = any(k in fa.columns and k in fb.columns for k in values)
    return (column(fa, ra), column(fb, rb), take_cells(fa, "md5", ra), take_cells(fb, "md5", rb),
            [any_k] * len(pairs))
