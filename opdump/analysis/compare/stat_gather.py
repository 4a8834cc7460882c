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

__all__ = ["gathered_columns"]


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


def gathered_columns(pairs, values: Tuple[str, ...]) -> Optional[Tuple[Callable, Callable, list, list, list]]:
    """(column_a(key), column_b(key), md5 of A, md5 of B, has_any per pair) of ``pairs`` read
    from their records tables (module doc), or None when the tensors do not all come from
    one table a side.  ``values``: the keys of which both rows must hold one for ``has_any``."""
    a = _one_source(p.a for p in pairs)
    if a is None:
        return None
    b = _one_source(p.b for p in pairs)
    if b is None:
        return None
    from .stat_pairs import _stat_column, _stat_part, _take
    (fa, ra), (fb, rb) = a, b

    def column(frame, rows):
        def f(key):
            return _stat_column([_stat_part(frame, key, rows)], None)
        return f
    any_k = any(k in fa.columns and k in fb.columns for k in values)
    return (column(fa, ra), column(fb, rb), _take(fa, "md5", ra), _take(fb, "md5", rb), [any_k] * len(pairs))
