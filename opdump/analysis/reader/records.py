"""The records table: tensors and statistics of every iteration joined, one row per dumped
tensor, in execution order.

Order inside an iteration: graphs by the first timestamp of their operators; inside a
graph, each operator call at its position in *that iteration's* execution order (an
eager graph writes one per iteration; else the graph's), the k-th call of an operator at
its k-th occurrence.  Operators missing from every order are placed after the last known
operator that started before them, in timestamp order; with no order at all, by first
timestamp.  Parameters and constants come last.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, Dict, List, Optional, Tuple

from ...format.files import PARAMETER_TYPE
from ...format.names import op_type_of
from .names_cache import sanitize
from .containers import Graph, Iteration
from .statistics import STAT_COLUMNS
from .records_columns import frame_of_columns

COLUMNS = ["rank", "net", "graph", "iteration", "order", "exec_index", "op", "op_file", "op_type", "kind",
           "io", "slot", "call", "dtype", "format", "timestamp", "task_id", "stream_id", "path", "nbytes",
           "stat_row", "shape", "data_size"]
_STAT_SKIP = frozenset(("op", "op_type", "io", "slot", "call", "dtype", "timestamp", "task_id", "stream_id",
                        "_net", "format"))     # a set: tested for each cell of each statistics row


def execution_positions(it: Iteration, g: Optional[Graph]) -> Dict[str, List[int]]:
    """File-name form of each operator -> its positions in the order that applies to ``it``."""
    pos: Dict[str, List[int]] = {}
    order = it.execution_order or (g.execution_order if g is not None else [])
    if order:
        for i, fn in enumerate(order):
            pos.setdefault(sanitize(fn), []).append(i)
    elif g is not None:
        for o in g.ops:
            pos.setdefault(o.file_name, []).append(o.index or 0)
    return pos


def iteration_rows(rid: int, it: Iteration, g: Optional[Graph]) -> List[Dict[str, Any]]:
    """The rows of one iteration folder: its files, joined with its statistic rows."""
    rows: Dict[Tuple[str, str, int, int], Dict[str, Any]] = {}
    for t in it.files:
        rows[(t.op_file, t.io, t.slot, t.call)] = {
            "rank": rid, "net": it.net, "graph": it.graph, "iteration": it.iteration,
            "op": t.op, "op_file": t.op_file, "op_type": t.op_type, "kind": t.kind,
            "io": t.io, "slot": t.slot, "call": t.call, "dtype": t.dtype, "format": t.format,
            "timestamp": t.timestamp, "task_id": t.task_id, "stream_id": t.stream_id,
            "path": t.path, "nbytes": t.nbytes, "stat_row": False,
        }
    for s in it.stats:
        fn = s.get("op", "")
        of = sanitize(fn)
        key = (of, s.get("io", ""), s.get("slot", 0), s.get("call", 0))
        r = rows.get(key)
        if r is None:
            ptype = s.get("op_type", "") or op_type_of(fn)
            kind = "op"
            if ptype == PARAMETER_TYPE:
                kind = "constant" if it.iteration is None else "parameter"
            r = rows[key] = {
                "rank": rid, "net": it.net, "graph": it.graph, "iteration": it.iteration,
                "op": fn if kind == "op" else f"{PARAMETER_TYPE}.{of}", "op_file": of,
                "op_type": ptype, "kind": kind,
                "io": s.get("io", ""), "slot": s.get("slot", 0), "call": s.get("call", 0),
                "dtype": s.get("dtype"), "format": s.get("format", "DefaultFormat"),
                "timestamp": s.get("timestamp", 0), "task_id": s.get("task_id", 0),
                "stream_id": s.get("stream_id", 0), "path": None, "nbytes": 0,
            }
        elif not r.get("dtype") and s.get("dtype"):
            r["dtype"] = s.get("dtype")
        r["stat_row"] = True
        for k, v in s.items():
            if k not in _STAT_SKIP:
                r[k] = v
    out = list(rows.values())
    assign_exec_index(out, execution_positions(it, g))
    return out


def build_records(ranks):
    """The records DataFrame of ``ranks`` ({rank id: Rank}); see :meth:`.dump.Dump.records`.
    A statistics-only dump read as columns is built without a dict per row
    (:mod:`.records_columns`, the same table)."""
    import numpy as np
    import pandas as pd
    df = frame_of_columns(ranks, _STAT_SKIP, execution_positions)    # statistics-only dumps
    if df is None:
        out = []
        for rid in sorted(ranks):
            rank = ranks[rid]
            for it in rank.iterations:
                out.extend(iteration_rows(rid, it, rank.graphs.get(it.graph)))
        df = pd.DataFrame(out)
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    # graph order inside an iteration: by the first timestamp of its operators
    df["_it"] = df["iteration"].fillna(1 << 62).astype("int64")
    df["_ts_op"] = df["timestamp"].where(df["kind"] == "op").astype("float64")
    df["_gstart"] = df.groupby(["rank", "_it", "graph"])["_ts_op"].transform("min").fillna(float("inf"))
    kinds = df["kind"].to_numpy(dtype=object)          # op, parameter, constant, other: the sort's order
    df["_kind"] = np.select([kinds == "op", kinds == "parameter", kinds == "constant"], [0, 1, 2], 3)
    df["_io"] = (df["io"] != "input").astype(int)
    df = df.sort_values(["rank", "_it", "_kind", "_gstart", "graph", "exec_index", "call", "_io", "slot", "op"],
                        kind="mergesort")
    df["order"] = df.groupby(["rank", "_it"]).cumcount()
    stat_cols = [c for c in dict.fromkeys(STAT_COLUMNS.values()) if c in df.columns]
    extra = [c for c in df.columns if c not in COLUMNS and not c.startswith("_") and c not in stat_cols]
    df = df[COLUMNS + stat_cols + extra].reset_index(drop=True)
    df["iteration"] = df["iteration"].astype("Int64")
    return df


def assign_exec_index(rows: List[Dict[str, Any]], exec_pos: Dict[str, List[int]]) -> None:
    """exec_index per row: the op's position in the execution order (k-th call -> k-th
    occurrence).  Operators missing from it go after the last known operator whose first
    timestamp is not later than theirs, spread evenly before the next position in the
    order of their first timestamps; with no order at all, the first timestamps order
    every call."""
    known: List[Tuple[int, float]] = []
    unknown = []
    for r in rows:
        if r["kind"] != "op":
            r["exec_index"] = float("nan")
            continue
        pos = exec_pos.get(r["op_file"])
        if pos:
            r["exec_index"] = float(pos[min(r["call"], len(pos) - 1)])
            known.append((r["timestamp"], r["exec_index"]))
        else:
            unknown.append(r)
    if not unknown:
        return
    first: Dict[Tuple[str, int], int] = {}
    for r in unknown:
        k = (r["op_file"], r["call"])
        first[k] = min(first.get(k, r["timestamp"]), r["timestamp"])
    calls = sorted(first, key=lambda k: (first[k], k))
    if not known:
        index = {k: float(i) for i, k in enumerate(calls)}
    else:
        known.sort()
        ts = [k[0] for k in known]
        best: List[float] = []            # running max of the known positions, in timestamp order
        for _, i in known:
            best.append(max(best[-1], i) if best else i)
        groups: Dict[float, List[Tuple[str, int]]] = {}
        for k in calls:
            j = bisect_right(ts, first[k])
            groups.setdefault(best[j - 1] if j else -1.0, []).append(k)
        index = {}
        for before, group in groups.items():
            for n, k in enumerate(group, 1):
                index[k] = before + n / (len(group) + 1)
    for r in unknown:
        r["exec_index"] = index[(r["op_file"], r["call"])]
