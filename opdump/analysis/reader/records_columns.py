"""The records table of a statistics-only dump, or of a dump of tensor files, built from
columns (:func:`frame_of_columns`), without a dict per row.

Why: :func:`.records.build_records` built one dict per statistic row, then a DataFrame
from those dicts: ~2 s of a 136,000-row compare.

When it applies (None otherwise, and the per-row build runs): every iteration folder read
has either no tensor file and its statistic rows as :class:`.stat_table.StatColumns`, no
row carrying ``stat_errors``/``stat_skipped``, or tensor files and no statistic row (a
tensor dump: 32,700 files a side cost ~0.2 s of dicts and their conversion); and
(operator file name, io, slot, call) is unique inside each folder (the per-row build
merges repeated keys into one row).  ``OPDUMP_READER_COLUMNS=0`` turns it off.

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
from .stat_table import StatRows, columns_enabled

__all__ = ["frame_of_columns", "exec_index_columns", "typed_array"]

_NAN = float("nan")


def frame_of_columns(ranks, skip, positions):
    """The unsorted records DataFrame of ``ranks`` from columns, or None (module doc).
    ``skip``: the statistic keys the records do not copy; ``positions(it, g)``: the
    execution positions of an iteration (:func:`.records.execution_positions`)."""
    parts: List[Tuple[int, Dict[str, List[Any]]]] = []
    memo = _Memo(positions)
    for rid in sorted(ranks):
        rank = ranks[rid]
        for it in rank.iterations:
            if it.has_files():                        # without making the file objects (.file_columns)
                if it.stats or not columns_enabled():
                    return None                       # files and statistics rows joined: per row
                part = _file_columns(rid, it, rank.graphs.get(it.graph), memo)
                if part is None:
                    return None
                parts.append(part)
                continue
            if not it.stats:
                continue
            if not isinstance(it.stats, StatRows) or it.stats.table.extras:
                return None
            part = _iteration_columns(rid, it, rank.graphs.get(it.graph), skip, memo)
            if part is None:
                return None
            parts.append(part)
    if not parts:
        return None
    return _frame(parts)


class _Memo:
    """Answers shared by the folders of one build: the iterations of a dump mostly repeat
    the same rows (names, types, io, slot, call) and the same execution order, so what is
    derived from those alone is derived once (every answer is a pure function of its key)."""

    def __init__(self, positions):
        self.positions = positions
        self.names: Dict[tuple, tuple] = {}           # row columns -> derived columns
        self.orders: Dict[tuple, Dict[str, List[int]]] = {}
        self.exec: Dict[tuple, List[float]] = {}

    def positions_of(self, it, g) -> Tuple[Any, Dict[str, List[int]]]:
        """(key, :func:`.records.execution_positions`) of an iteration: its own order, else
        its graph's."""
        key = ("it", tuple(it.execution_order)) if it.execution_order else ("g", id(g))
        pos = self.orders.get(key)
        if pos is None:
            pos = self.orders[key] = self.positions(it, g)
        return key, pos


def _derived(fns, types_in, ios, slots, calls, in_constants):
    """(operator file names, types, kinds, full names) of a folder's rows, or None when
    (file name, io, slot, call) repeats."""
    n = len(fns)
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
    for fn, of, ty in zip(fns, ofs, types_in):
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
    return ofs, types, kinds, ops


def _iteration_columns(rid, it, g, skip, memo: _Memo) -> Optional[Tuple[int, Dict[str, List[Any]]]]:
    """The columns of one folder's rows, in the per-row build's key order."""
    t = it.stats.table
    n = t.n
    fns = t.get("op", "")
    ios, slots, calls = t.get("io", ""), t.get("slot", 0), t.get("call", 0)
    types_in = t.get("op_type", "")
    in_constants = it.iteration is None
    try:
        key = (tuple(fns), tuple(types_in), tuple(ios), tuple(slots), tuple(calls), in_constants)
        hash(key)
    except TypeError:                             # an unhashable cell: derived here only
        key = None
    entry = memo.names.get(key) if key is not None else None
    if entry is None:
        got = _derived(fns, types_in, ios, slots, calls, in_constants)
        entry = (got,)
        if key is not None:
            memo.names[key] = entry
    got = entry[0]
    if got is None:
        return None
    ofs, types, kinds, ops = got
    cols: Dict[str, Any] = {
        "rank": _Same(rid, n), "net": _Same(it.net, n), "graph": _Same(it.graph, n),
        "iteration": _Same(it.iteration, n),
        "op": list(ops), "op_file": list(ofs), "op_type": list(types), "kind": list(kinds),
        "io": ios, "slot": slots, "call": calls, "dtype": t.get("dtype"),
        "format": t.get("format", "DefaultFormat"), "timestamp": t.get("timestamp", 0),
        "task_id": t.get("task_id", 0), "stream_id": t.get("stream_id", 0), "path": _Same(None, n),
        "nbytes": _Same(0, n), "stat_row": _Same(True, n),
    }
    for k in t.keys:
        if k not in skip:
            cols[k] = t.cols[k]
    pkey, pos = memo.positions_of(it, g)
    ekey = (id(entry), pkey) if key is not None else None
    exec_index = memo.exec.get(ekey) if ekey is not None else None
    if exec_index is None:
        exec_index, timed = exec_index_columns(kinds, ofs, calls, cols["timestamp"], pos, report=True)
        if ekey is not None and not timed:
            memo.exec[ekey] = exec_index          # no operator placed by its timestamp: the same every time
    cols["exec_index"] = list(exec_index)
    return n, cols


#: a tensor file's attributes copied into its row, in the per-row build's key order
_FILE_FIELDS = ("op", "op_file", "op_type", "kind", "io", "slot", "call", "dtype", "format", "timestamp", "task_id",
                "stream_id", "path", "nbytes")


def _file_columns(rid, it, g, memo: _Memo) -> Optional[Tuple[int, Dict[str, List[Any]]]]:
    """The columns of a folder of tensor files without statistics rows, in the per-row build's
    key order (:func:`.records.iteration_rows`); None when (file name, io, slot, call)
    repeats (the per-row build keeps one row of such files)."""
    fc = it.file_columns                              # the scan's columns (.file_columns), else objects
    files = it.files if fc is None else None
    n = len(files) if fc is None else fc.n
    cols: Dict[str, Any] = {"rank": _Same(rid, n), "net": _Same(it.net, n), "graph": _Same(it.graph, n),
                            "iteration": _Same(it.iteration, n)}
    for k in _FILE_FIELDS:
        cols[k] = [getattr(t, k) for t in files] if fc is None else fc.cols[k]
    if len(set(zip(cols["op_file"], cols["io"], cols["slot"], cols["call"]))) != n:
        return None
    cols["stat_row"] = _Same(False, n)
    _, pos = memo.positions_of(it, g)
    cols["exec_index"] = exec_index_columns(cols["kind"], cols["op_file"], cols["call"], cols["timestamp"], pos)
    return n, cols


def exec_index_columns(kinds: List[str], op_files: List[str], calls: List[int], timestamps: List[Any],
                       exec_pos: Dict[str, List[int]], report: bool = False):
    """:func:`.records.assign_exec_index` over columns: the same value per row.  With
    ``report``: (values, whether a row was placed by its timestamp)."""
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
        return (out, False) if report else out
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
    return (out, True) if report else out


_TYPED = {int: "int64", float: "float64", bool: "bool"}


class _Same:
    """A folder's column holding one value ``n`` times (rank, graph, iteration…), kept as
    that value: :func:`_frame` makes the typed array without a list of ``n`` cells."""

    __slots__ = ("value", "n")

    def __init__(self, value: Any, n: int):
        self.value, self.n = value, n

    def cells(self) -> List[Any]:
        return [self.value] * self.n


def _same_array(parts: List[Any]):
    """The array :func:`typed_array` makes of the cells of ``parts`` when every part is a
    :class:`_Same` whose value is of one and the same type among int (fitting int64), float
    and bool; else None."""
    import numpy as np
    if not parts or not all(type(p) is _Same for p in parts):
        return None
    t = type(parts[0].value)
    dt = _TYPED.get(t)
    if dt is None or any(type(p.value) is not t for p in parts):
        return None
    if t is int and not all(-(1 << 63) <= p.value < (1 << 63) for p in parts):
        return None                        # beyond int64: pandas decides
    if len(parts) == 1:
        return np.full(parts[0].n, parts[0].value, dtype=dt)
    return np.concatenate([np.full(p.n, p.value, dtype=dt) for p in parts])


def typed_array(cells: List[Any]):
    """``cells`` as pandas' ``convert_object_array`` converts them when they are all of one
    type among int (int64 when every one fits), float and bool -- the same array built
    directly; None for any other column (converted by pandas)."""
    import numpy as np
    if not cells:
        return None
    first = type(cells[0])
    dt = _TYPED.get(first)
    if dt is None:
        return None                        # a column of text (or mixed): pandas decides
    types = set(map(type, cells))
    if len(types) != 1:
        return None
    try:
        return np.fromiter(cells, dtype=dt, count=len(cells))
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
        arr = _same_array([cols.get(k) for _, cols in parts])
        if arr is not None:
            out[k] = arr
            continue
        cells: List[Any] = []
        for n, cols in parts:
            c = cols.get(k)
            if c is None:
                cells.extend([_NAN] * n)
            else:
                cells.extend(c.cells() if type(c) is _Same else c)
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
