"""The records table of a statistics-only dump built from columns (:func:`frame_of_columns`),
without a dict per row.

Why: :func:`.records.build_records` built one dict per statistic row, then a DataFrame
from those dicts: ~2 s of a 136,000-row compare.

When it applies (None otherwise, and the per-row build runs): every iteration folder read
has no tensor file and its statistic rows as :class:`.stat_table.StatColumns`, no row
carries ``stat_errors``/``stat_skipped``, and (operator file name, io, slot, call) is unique
inside each folder (the per-row build merges repeated keys into one row).

Guarantee: the DataFrame handed to the shared finishing step is the one the per-row build
makes -- the same columns in the same order, each converted from the same Python objects
by pandas' own conversion of a list of dicts (``convert_object_array``, per column); the
per-row build's order of columns (first seen over the rows) is reproduced iteration by
iteration.  tests/test_reader_columns.py compares the two builds.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, Dict, List, Optional, Tuple

from ...format.files import PARAMETER_TYPE
from ...format.names import op_type_of
from .names_cache import sanitize
from .stat_table import StatRows

__all__ = ["frame_of_columns", "exec_index_columns", "typed_array"]

_NAN = float("nan")


def frame_of_columns(ranks, skip, positions):
    """The unsorted records DataFrame of ``ranks`` from columns, or None (module doc).
    ``skip``: the statistic keys the records do not copy; ``positions(it, g)``: the
    execution positions of an iteration (:func:`.records.execution_positions`)."""
    parts: List[Tuple[int, Dict[str, List[Any]]]] = []
    for rid in sorted(ranks):
        rank = ranks[rid]
        for it in rank.iterations:
            if it.files:
                return None
            if not it.stats:
                continue
            if not isinstance(it.stats, StatRows) or it.stats.table.extras:
                return None
            part = _iteration_columns(rid, it, rank.graphs.get(it.graph), skip, positions)
            if part is None:
                return None
            parts.append(part)
    if not parts:
        return None
    return _frame(parts)


def _iteration_columns(rid, it, g, skip, positions) -> Optional[Tuple[int, Dict[str, List[Any]]]]:
    """The columns of one folder's rows, in the per-row build's key order."""
    t = it.stats.table
    n = t.n
    fns = t.get("op", "")
    ios, slots, calls = t.get("io", ""), t.get("slot", 0), t.get("call", 0)
    names: Dict[str, str] = {}
    ofs = []
    for fn in fns:
        of = names.get(fn)
        if of is None:
            of = names[fn] = sanitize(fn)
        ofs.append(of)
    if len(set(zip(ofs, ios, slots, calls))) != n:
        return None                               # repeated keys: the per-row build merges them
    cache: Dict[Tuple[Any, str], Tuple[str, str, str]] = {}
    types, kinds, ops = [], [], []
    in_constants = it.iteration is None
    for fn, of, ty in zip(fns, ofs, t.get("op_type", "")):
        r = cache.get((ty, fn))
        if r is None:
            ptype = ty or op_type_of(fn)
            kind = "op"
            if ptype == PARAMETER_TYPE:
                kind = "constant" if in_constants else "parameter"
            r = cache[(ty, fn)] = (ptype, kind, fn if kind == "op" else f"{PARAMETER_TYPE}.{sanitize(fn)}")
        types.append(r[0])
        kinds.append(r[1])
        ops.append(r[2])
    cols: Dict[str, List[Any]] = {
        "rank": [rid] * n, "net": [it.net] * n, "graph": [it.graph] * n, "iteration": [it.iteration] * n,
        "op": ops, "op_file": ofs, "op_type": types, "kind": kinds,
        "io": ios, "slot": slots, "call": calls, "dtype": t.get("dtype"),
        "format": t.get("format", "DefaultFormat"), "timestamp": t.get("timestamp", 0),
        "task_id": t.get("task_id", 0), "stream_id": t.get("stream_id", 0), "path": [None] * n,
        "nbytes": [0] * n, "stat_row": [True] * n,
    }
    for k in t.keys:
        if k not in skip:
            cols[k] = t.cols[k]
    cols["exec_index"] = exec_index_columns(kinds, ofs, calls, cols["timestamp"], positions(it, g))
    return n, cols


def exec_index_columns(kinds: List[str], op_files: List[str], calls: List[int], timestamps: List[Any],
                       exec_pos: Dict[str, List[int]]) -> List[float]:
    """:func:`.records.assign_exec_index` over columns: the same value per row."""
    out: List[float] = [_NAN] * len(kinds)
    known: List[Tuple[Any, float]] = []
    unknown: List[int] = []
    for i, (kind, of, call) in enumerate(zip(kinds, op_files, calls)):
        if kind != "op":
            continue
        pos = exec_pos.get(of)
        if pos:
            v = out[i] = float(pos[min(call, len(pos) - 1)])
            known.append((timestamps[i], v))
        else:
            unknown.append(i)
    if not unknown:
        return out
    first: Dict[Tuple[str, int], Any] = {}
    for i in unknown:
        k = (op_files[i], calls[i])
        ts = timestamps[i]
        first[k] = min(first.get(k, ts), ts)
    order = sorted(first, key=lambda k: (first[k], k))
    if not known:
        index = {k: float(i) for i, k in enumerate(order)}
    else:
        known.sort()
        ts_known = [k[0] for k in known]
        best: List[float] = []
        for _, v in known:
            best.append(max(best[-1], v) if best else v)
        groups: Dict[float, List[Tuple[str, int]]] = {}
        for k in order:
            j = bisect_right(ts_known, first[k])
            groups.setdefault(best[j - 1] if j else -1.0, []).append(k)
        index = {}
        for before, group in groups.items():
            for m, k in enumerate(group, 1):
                index[k] = before + m / (len(group) + 1)
    for i in unknown:
        out[i] = index[(op_files[i], calls[i])]
    return out


_TYPED = {int: "int64", float: "float64", bool: "bool"}


def typed_array(cells: List[Any]):
    """``cells`` as pandas' ``convert_object_array`` converts them when they are all of one
    type among int (int64 when every one fits), float and bool -- the same array built
    directly; None for any other column (converted by pandas)."""
    import numpy as np
    types = set(map(type, cells))
    if len(types) != 1:
        return None
    dt = _TYPED.get(next(iter(types)))
    if dt is None:
        return None
    try:
        return np.array(cells, dtype=dt)
    except OverflowError:                  # an int beyond int64: pandas decides (uint64, object)
        return None


def _frame(parts: List[Tuple[int, Dict[str, List[Any]]]]):
    """One DataFrame of the folders' columns, converted as ``pandas.DataFrame(list of dicts)``
    converts: columns in first-seen order, a key a folder lacks NaN there, each column's
    objects through pandas' ``convert_object_array`` (one type of int/float/bool: the same
    array built directly, :func:`typed_array`)."""
    import numpy as np
    import pandas as pd
    from pandas.core.internals.construction import convert_object_array
    order: Dict[str, None] = {}
    for _, cols in parts:
        for k in cols:
            order.setdefault(k, None)
    out: Dict[str, Any] = {}
    generic: List[str] = []
    arrays = []
    for k in order:
        cells: List[Any] = []
        for n, cols in parts:
            c = cols.get(k)
            if c is None:
                cells.extend([_NAN] * n)
            else:
                cells.extend(c)
        arr = typed_array(cells)
        if arr is not None:
            out[k] = arr
            continue
        obj = np.empty(len(cells), dtype=object)
        obj[:] = cells
        generic.append(k)
        arrays.append(obj)
    if arrays:
        out.update(zip(generic, convert_object_array(arrays, dtype=None)))
    return pd.DataFrame({k: out[k] for k in order}, copy=False)
