"""The table of a compare whose pairs were made and judged one by one (``compare``'s
per-row stages) held as columns (:mod:`.stat_csv` cells) when no tensor of either side has
a file: a statistics-only compare of two runs that differ (fp32 against bf16 autocast:
extra cast operators on one side), which :mod:`.stat_fast` leaves to the per-row stages.

Why: ``_result`` built one list per pair (:meth:`.pairs.Pair.table_values`) and a
DataFrame of them (pandas inferring each column of 159,000 rows), then ``opdump compare``
turned the frame back into Python objects for the CSV: ~2 s of a 13 s compare of
MobileBERT statistics (40 iterations).  Here each column is one list comprehension over
the pairs, and the result is a :class:`.stat_result.StatCompareResult` (the frame made
only when read, the CSV written from the cells).

Guarantee (tests/test_compare_stat_rows.py runs both on generated and real dumps): the
cells make the frame ``_result`` made from ``table_values`` -- the same columns, values,
dtypes and order (``frame_of_cells`` infers each column as pandas infers it from rows of
Python objects) -- and so the same CSV bytes.
"""
from __future__ import annotations

from typing import Any, List, Optional

from .pairs import METRIC_COLUMNS, TABLE_COLUMNS, Pair
from .stat_csv import Cells

__all__ = ["pathless", "table_cells"]


def pathless(pairs: List[Pair]) -> bool:
    """True when no tensor of any pair has a file (a statistics-only compare): the table's
    ``path_a``/``path_b`` are then None everywhere and no metric came from a worker."""
    for p in pairs:
        for t in (p.a, p.b):
            if t is not None:
                v = t.row.get("path")                   # Tensor.path, read inline
                if isinstance(v, str) and v:
                    return False
    return True


def _iteration(v: Any) -> Optional[int]:
    """As ``_result`` makes the ``Int64`` cells: None for None/NaN, else ``int``."""
    return None if v is None or v != v else int(v)


def table_cells(pairs: List[Pair]) -> Cells:
    """The cells of the table of ``pairs`` (already in table order): the columns
    :meth:`.pairs.Pair.table_values` gives row by row, in :data:`.pairs.TABLE_COLUMNS` order,
    ``order`` 0..n-1 and the iterations ``Int64`` as ``_result`` sets them."""
    n = len(pairs)
    side = [p.a if p.a is not None else p.b for p in pairs]
    ta = [p.a for p in pairs]
    tb = [p.b for p in pairs]
    metrics = [p.metrics for p in pairs]
    data = {
        "rank": [t.rank for t in side],
        "graph": [t.graph for t in side],
        "op": [None if t is None else t.op for t in ta],
        "op_b": [None if t is None else t.op for t in tb],
        "op_type": [t.op_type for t in side],
        "kind": [t.kind for t in side],
        "io": [t.io for t in side],
        "slot": [t.slot for t in side],
        "call": [t.call for t in side],
        "match": [p.rule for p in pairs],
        "mode": [p.mode for p in pairs],
        "verdict": [p.verdict for p in pairs],
        "reason": [p.reason for p in pairs],
        "identical": [p.identical for p in pairs],
        "dtype_a": [None if t is None else t.dtype for t in ta],
        "dtype_b": [None if t is None else t.dtype for t in tb],
        "shape_a": [None if t is None else t.shape_text() for t in ta],
        "shape_b": [None if t is None else t.shape_text() for t in tb],
        "source": [p.source for p in pairs],
    }
    present = set().union(*metrics) if metrics else set()     # the metric keys any pair holds
    for k in METRIC_COLUMNS:
        data[k] = [m.get(k) for m in metrics] if k in present else [None] * n
    cells: Cells = {}
    for k in TABLE_COLUMNS:
        if k == "order":
            cells[k] = ("order", n)
        elif k == "iteration":
            cells[k] = ("Int64", [None if t is None else _iteration(t.iteration) for t in ta])
        elif k == "iteration_b":
            cells[k] = ("Int64", [None if t is None else _iteration(t.iteration) for t in tb])
        elif k in ("path_a", "path_b"):
            cells[k] = ("none", n)                  # pathless: on_disk(None) is never called
        else:
            cells[k] = ("cells", data[k])
    return cells
