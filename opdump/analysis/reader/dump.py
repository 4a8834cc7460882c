"""The dump object: the containers (:class:`Rank` -> :class:`Graph` -> :class:`Iteration`)
and :class:`Dump`, which scans a rank's folders (metadata, graph files, execution order,
tensor and statistics folders), maps file names back to operators' full names, and builds
the pandas tables (``ops``, ``tensors``, ``statistics``, ``records``, ``summary``).
"""
from __future__ import annotations

import csv
import json
import os
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .files import _RAW_RE, TensorFile, _npy_header, parse_tensor_filename
from .names import kind_of_name, op_type_of, sanitize, scope_of
from .ops import OpInfo
from .sources import SourceFrame, parse_ir
from .statistics import STAT_COLUMNS, _read_statistic_csv


@dataclass
class Iteration:
    rank: int
    net: str
    graph: int
    iteration: Optional[int]
    path: Path
    files: List[TensorFile] = field(default_factory=list)
    stats: List[Dict[str, Any]] = field(default_factory=list)
    kernel_args: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # op_file -> args
    raw_files: List[str] = field(default_factory=list)   # Ascend protobuf ("bin") files, not converted


@dataclass
class Graph:
    rank: int
    graph_id: int
    kind: Optional[str] = None
    ops: List[OpInfo] = field(default_factory=list)
    execution_order: List[str] = field(default_factory=list)
    iterations_run: List[int] = field(default_factory=list)
    ir_path: Optional[Path] = None
    json_path: Optional[Path] = None

    def op(self, name: str) -> Optional[OpInfo]:
        for o in self.ops:
            if o.full_name == name or o.file_name == name:
                return o
        return None


@dataclass
class Rank:
    rank_id: int
    path: Path
    data_dump: Dict[str, Any] = field(default_factory=dict)
    config: Dict[str, Any] = field(default_factory=dict)
    manifest: Optional[Dict[str, Any]] = None
    graphs: Dict[int, Graph] = field(default_factory=dict)
    iterations: List[Iteration] = field(default_factory=list)
    name_map: Dict[str, str] = field(default_factory=dict)    # file-name form -> full name

    @property
    def complete(self) -> Optional[bool]:
        """``manifest.json``'s ``complete`` (opdump dumps); None when unknown (e.g. MindSpore)."""
        if self.manifest is None:
            return None
        v = self.manifest.get("complete")
        return bool(v) if v is not None else None


_GRAPH_FILE_RE = re.compile(r"^ms_output_trace_code_graph_(\d+)\.(ir|json)$")
_EXEC_RE = re.compile(r"^ms_execution_order_graph_(\d+)\.csv$")
_GEXEC_RE = re.compile(r"^ms_global_execution_order_graph_(\d+)\.csv$")
_SPECIAL_DIRS = {".dump_metadata", "graphs", "execution_order"}


def _read_json(path: Path) -> Optional[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            v = json.load(f)
        return v if isinstance(v, dict) else {"value": v}
    except (OSError, ValueError):
        return None


def _read_lines_csv(path: Path) -> List[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return []


class Dump:
    """A dump on disk (opdump's or MindSpore's): ranks -> graphs -> iterations -> tensors.

    Object access: ``dump.ranks``, ``dump.graph(g)``, ``dump.iterations``, ``dump.tensor_files()``;
    tables (pandas): ``dump.tensors()``, ``dump.ops()``, ``dump.statistics()``,
    ``dump.records()`` (tensors and statistics joined, in execution order),
    ``dump.summary()``.
    """

    def __init__(self, path: os.PathLike, rank_dirs: List[Tuple[int, Path]], loose: bool = False,
                 acl: Optional[Dict[int, List[Tuple[str, int, int, Path]]]] = None):
        self.path = Path(path)
        self.loose = loose
        self.layout = "acl" if acl else ("folder" if loose else "mindspore")
        self.ranks: Dict[int, Rank] = {}
        for rid, rp in rank_dirs:
            self.ranks[rid] = self._scan_rank(rid, rp)
        for rid, entries in sorted((acl or {}).items()):
            rank = Rank(rid, self.path)
            for net, gid, itn, ip in entries:
                rank.graphs.setdefault(gid, Graph(rid, gid))
                it = Iteration(rid, net, gid, itn, ip)
                self._scan_iteration(it)
                rank.iterations.append(it)
            self._resolve_names(rank)
            self.ranks[rid] = rank
        self._records = None

    # ------------------------------------------------------------------ scanning
    def _scan_rank(self, rid: int, rp: Path) -> Rank:
        rank = Rank(rid, rp)
        if self.loose:
            it = Iteration(rid, "", 0, 0, rp)
            self._scan_iteration(it)
            rank.iterations.append(it)
            rank.graphs[0] = Graph(rid, 0)
            self._resolve_names(rank)
            return rank
        md = rp / ".dump_metadata"
        rank.data_dump = _read_json(md / "data_dump.json") or {}
        rank.config = _read_json(md / "config.json") or {}
        rank.manifest = _read_json(md / "manifest.json")
        # graphs
        gdir = rp / "graphs"
        if gdir.is_dir():
            for e in sorted(os.scandir(gdir), key=lambda e: e.name):
                m = _GRAPH_FILE_RE.match(e.name)
                if not m:
                    continue
                g = rank.graphs.setdefault(int(m.group(1)), Graph(rid, int(m.group(1))))
                if m.group(2) == "json":
                    g.json_path = Path(e.path)
                else:
                    g.ir_path = Path(e.path)
        edir = rp / "execution_order"
        if edir.is_dir():
            for e in os.scandir(edir):
                m = _EXEC_RE.match(e.name)
                if m:
                    g = rank.graphs.setdefault(int(m.group(1)), Graph(rid, int(m.group(1))))
                    lines = _read_lines_csv(Path(e.path))
                    if lines and lines[0].startswith("NodeExecutionOrder"):
                        lines = lines[1:]
                    g.execution_order = lines
                    continue
                m = _GEXEC_RE.match(e.name)
                if m:
                    g = rank.graphs.setdefault(int(m.group(1)), Graph(rid, int(m.group(1))))
                    its = []
                    for ln in _read_lines_csv(Path(e.path)):
                        try:
                            its.append(int(ln.split(",")[0]))
                        except ValueError:
                            pass
                    g.iterations_run = its
        for g in rank.graphs.values():
            self._load_graph_ops(g)
        # data folders
        for net_e in sorted(os.scandir(rp), key=lambda e: e.name):
            if not net_e.is_dir() or net_e.name in _SPECIAL_DIRS or net_e.name.startswith("."):
                continue
            for g_e in sorted(os.scandir(net_e.path), key=lambda e: e.name):
                if not (g_e.is_dir() and g_e.name.isdigit()):
                    continue
                gid = int(g_e.name)
                rank.graphs.setdefault(gid, Graph(rid, gid))
                for i_e in sorted(os.scandir(g_e.path), key=lambda e: (not e.name.isdigit(), int(e.name) if e.name.isdigit() else 0, e.name)):
                    if not i_e.is_dir():
                        continue
                    if i_e.name.isdigit():
                        itn: Optional[int] = int(i_e.name)
                    elif i_e.name == "constants":
                        itn = None
                    else:
                        continue
                    it = Iteration(rid, net_e.name, gid, itn, Path(i_e.path))
                    self._scan_iteration(it)
                    rank.iterations.append(it)
        self._resolve_names(rank)
        return rank

    def _load_graph_ops(self, g: Graph) -> None:
        ops: List[OpInfo] = []
        if g.json_path is not None:
            data = _read_json(g.json_path) or {}
            g.kind = data.get("kind") or g.kind
            for o in data.get("ops", []) or []:
                fn = o.get("full_name")
                if not fn:
                    continue
                srcs = []
                for s in o.get("source", []) or []:
                    try:
                        srcs.append(SourceFrame(str(s.get("file", "")), int(s.get("line", 0)),
                                                s.get("line_end"), None, None, str(s.get("code", "") or "").strip()))
                    except (TypeError, ValueError):
                        pass
                ops.append(OpInfo(g.rank, g.graph_id, fn, o.get("op_type") or op_type_of(fn),
                                  o.get("scope") if o.get("scope") is not None else scope_of(fn),
                                  kind_of_name(fn, g.kind), None, srcs,
                                  list(o.get("inputs", []) or []), list(o.get("outputs", []) or []),
                                  dict(o.get("args", {}) or {})))
        elif g.ir_path is not None:
            try:
                parsed = parse_ir(g.ir_path)
            except OSError:
                parsed = []
            for o in parsed:
                fn = o["full_name"]
                ops.append(OpInfo(g.rank, g.graph_id, fn, op_type_of(fn), scope_of(fn), kind_of_name(fn, g.kind),
                                  None, o["sources"], o["inputs"], o["outputs"]))
        by_name = {o.full_name: o for o in ops}
        if g.execution_order:
            ordered: List[OpInfo] = []
            for i, fn in enumerate(g.execution_order):
                o = by_name.get(fn)
                if o is None:
                    o = OpInfo(g.rank, g.graph_id, fn, op_type_of(fn), scope_of(fn), kind_of_name(fn, g.kind))
                    by_name[fn] = o
                if o.index is None:
                    o.index = i
                    ordered.append(o)
            g.ops = ordered
        else:
            for i, o in enumerate(ops):
                o.index = i
            g.ops = ops

    def _scan_iteration(self, it: Iteration) -> None:
        mapping: Dict[str, str] = {}
        mp = it.path / "mapping.csv"
        if mp.is_file():
            with open(mp, newline="", encoding="utf-8", errors="replace") as f:
                for rec in csv.reader(f):
                    if len(rec) >= 2:
                        mapping[rec[0].strip()] = rec[1].strip()
        files: List[TensorFile] = []
        for e in os.scandir(it.path):
            name = e.name
            if name == "statistic.csv":
                for row in _read_statistic_csv(Path(e.path)):
                    row["_net"] = it.net
                    it.stats.append(row)
                continue
            if name.endswith(".json") and not name.endswith(".npy.json"):
                parts = name[:-5].split(".", 1)
                if len(parts) == 2:
                    d = _read_json(Path(e.path))
                    if d is not None:
                        it.kernel_args[parts[1]] = d
                continue
            if not name.endswith(".npy"):
                if _RAW_RE.match(name):
                    it.raw_files.append(e.path)
                continue
            parsed = parse_tensor_filename(mapping.get(name, name))
            if parsed is None:
                base = mapping.get(name[:-4]) or mapping.get(name)
                parsed = parse_tensor_filename(base) if base else None
                if parsed is None and base and not base.endswith(".npy"):
                    parsed = parse_tensor_filename(base + ".npy")
            if parsed is None:
                continue
            kind = "op"
            if parsed["op_type"] == "Parameter":
                kind = "constant" if it.iteration is None else "parameter"
            try:
                size = e.stat().st_size
            except OSError:
                size = 0
            files.append(TensorFile(e.path, it.rank, it.net, it.graph, it.iteration,
                                    parsed["op_type"], parsed["op_file"], parsed["op_file"],
                                    parsed["task_id"], parsed["stream_id"], parsed["timestamp"],
                                    parsed["io"], parsed["slot"], parsed["format"], parsed["dtype"],
                                    kind, size))
        files.sort(key=lambda t: (t.timestamp, t.op_file, t.io != "input", t.slot))
        counters: Dict[Tuple[str, str, int], int] = {}
        for t in files:
            k = (t.op_file, t.io, t.slot)
            t.call = counters.get(k, 0)
            counters[k] = t.call + 1
        it.files = files
        # statistics: calls in timestamp order
        it.stats.sort(key=lambda r: (r.get("timestamp", 0)))
        sc: Dict[Tuple[str, str, int], int] = {}
        for r in it.stats:
            k = (sanitize(r.get("op", "")), r.get("io", ""), r.get("slot", 0))
            r["call"] = sc.get(k, 0)
            sc[k] = r["call"] + 1

    def _resolve_names(self, rank: Rank) -> None:
        """Give each file its operator's full name (sanitise known names and match)."""
        global_map: Dict[str, str] = {}
        per_graph: Dict[int, Dict[str, str]] = {}
        for g in rank.graphs.values():
            m = per_graph.setdefault(g.graph_id, {})
            for o in g.ops:
                m.setdefault(o.file_name, o.full_name)
                global_map.setdefault(o.file_name, o.full_name)
        for it in rank.iterations:
            m = per_graph.setdefault(it.graph, {})
            for r in it.stats:
                fn = r.get("op", "")
                if fn and "/" in fn:
                    m.setdefault(sanitize(fn), fn)
                    global_map.setdefault(sanitize(fn), fn)
        # older dumps name files by the last segment only (seed: Conv2D.Conv2D-op12.….npy)
        short: Dict[str, Optional[str]] = {}
        for fn in set(global_map.values()):
            last = fn.rsplit("/", 1)[-1]
            short[last] = fn if last not in short else None
        for k, v in short.items():
            if v is not None:
                global_map.setdefault(k, v)
        rank.name_map = global_map
        for it in rank.iterations:
            m = per_graph.get(it.graph, {})
            for r in it.stats:
                fn = r.get("op", "")
                if fn and "/" not in fn and r.get("op_type") != "Parameter":
                    r["op"] = m.get(fn) or global_map.get(fn) or m.get(sanitize(fn)) or fn
            for t in it.files:
                if t.kind == "op":
                    t.op = m.get(t.op_file) or global_map.get(t.op_file) or t.op_file
                else:
                    t.op = "Parameter." + t.op_file if t.kind == "parameter" else "constants/Parameter." + t.op_file

    # ------------------------------------------------------------------ objects
    @property
    def rank_ids(self) -> List[int]:
        return sorted(self.ranks)

    @property
    def iterations(self) -> List[int]:
        s = set()
        for r in self.ranks.values():
            s.update(it.iteration for it in r.iterations if it.iteration is not None)
        return sorted(s)

    @property
    def graph_ids(self) -> List[int]:
        s = set()
        for r in self.ranks.values():
            s.update(r.graphs)
        return sorted(s)

    def graph(self, graph_id: int, rank: Optional[int] = None) -> Graph:
        r = self.ranks[rank if rank is not None else self.rank_ids[0]]
        return r.graphs[graph_id]

    def op_infos(self, rank: Optional[int] = None) -> Iterator[OpInfo]:
        for rid in self.rank_ids:
            if rank is not None and rid != rank:
                continue
            for gid in sorted(self.ranks[rid].graphs):
                yield from self.ranks[rid].graphs[gid].ops

    def op_info(self, name: str, rank: Optional[int] = None, graph: Optional[int] = None) -> Optional[OpInfo]:
        """The operator named ``name`` (full name or its file-name form)."""
        idx = self.__dict__.get("_op_index")
        if idx is None:
            idx = {}
            for o in self.op_infos():
                for nm in (o.full_name, o.file_name):
                    idx.setdefault((o.rank, o.graph, nm), o)
                    idx.setdefault((o.rank, None, nm), o)
                    idx.setdefault((None, None, nm), o)
            self._op_index = idx
        o = idx.get((rank, graph, name))
        if o is None and graph is not None:
            o = idx.get((rank, None, name))
        return o

    def tensor_files(self, rank: Optional[int] = None, iteration: Optional[int] = None) -> Iterator[TensorFile]:
        for rid in self.rank_ids:
            if rank is not None and rid != rank:
                continue
            for it in self.ranks[rid].iterations:
                if iteration is not None and it.iteration != iteration:
                    continue
                yield from it.files

    @property
    def has_tensors(self) -> bool:
        return any(it.files for r in self.ranks.values() for it in r.iterations)

    @property
    def has_statistics(self) -> bool:
        return any(it.stats for r in self.ranks.values() for it in r.iterations)

    @property
    def complete(self) -> Optional[bool]:
        vals = [r.complete for r in self.ranks.values()]
        if any(v is False for v in vals):
            return False
        if vals and all(v is True for v in vals):
            return True
        return None

    def __repr__(self) -> str:
        return (f"Dump({str(self.path)!r}, ranks={self.rank_ids}, graphs={self.graph_ids}, "
                f"iterations={self.iterations})")

    # ------------------------------------------------------------------ tables
    def ops(self):
        """One row per operator per graph: rank, graph, index, full_name, op_type, scope, kind,
        file, line, code (the user's innermost frame), frames (all, as text)."""
        import pandas as pd
        rows = []
        for o in self.op_infos():
            fr = o.user_frame
            rows.append({
                "rank": o.rank, "graph": o.graph, "index": o.index, "full_name": o.full_name,
                "op_type": o.op_type, "scope": o.scope, "kind": o.kind,
                "file": fr.file if fr else None, "line": fr.line if fr else None,
                "code": fr.code if fr else None,
                "frames": " | ".join(str(f) for f in o.sources),
            })
        cols = ["rank", "graph", "index", "full_name", "op_type", "scope", "kind", "file", "line", "code", "frames"]
        return pd.DataFrame(rows, columns=cols)

    def tensors(self, with_shape: bool = True):
        """One row per ``.npy`` file: rank, net, graph, iteration, op, op_type, kind, io, slot,
        call, dtype, shape, format, nbytes, timestamp, task_id, stream_id, order, path."""
        import pandas as pd
        rec = self.records()
        df = rec[rec["path"].notna()].copy()
        if with_shape:
            shapes = []
            for p in df["path"]:
                try:
                    shapes.append(_npy_header(p)[0])
                except (OSError, ValueError):
                    shapes.append(None)
            df["shape"] = ["(" + ",".join(str(x) for x in s) + ")" if s is not None else None for s in shapes]
        cols = ["rank", "net", "graph", "iteration", "order", "op", "op_type", "kind", "io", "slot", "call",
                "dtype", "shape", "format", "nbytes", "timestamp", "task_id", "stream_id", "path"]
        return df[[c for c in cols if c in df.columns]].reset_index(drop=True)

    def summary(self):
        """Per rank / graph / iteration (``"constants"`` for constants/): ops, parameters,
        tensors (files), stat_rows, bytes."""
        import pandas as pd
        rec = self.records()
        cols = ["rank", "graph", "iteration", "ops", "parameters", "tensors", "stat_rows", "bytes"]
        if rec.empty:
            return pd.DataFrame(columns=cols)
        rows = []
        its = rec["iteration"].astype("object").where(rec["iteration"].notna(), "constants")
        for (rk, g, it), grp in rec.assign(_it=its).groupby(["rank", "graph", "_it"], sort=False):
            rows.append({"rank": int(rk), "graph": int(g), "iteration": it,
                         "ops": grp.loc[grp["kind"] == "op", "op_file"].nunique(),
                         "parameters": grp.loc[grp["kind"] != "op", "op_file"].nunique(),
                         "tensors": int(grp["path"].notna().sum()),
                         "stat_rows": int(grp["stat_row"].fillna(False).astype(bool).sum()),
                         "bytes": int(grp["nbytes"].fillna(0).sum())})
        df = pd.DataFrame(rows, columns=cols)
        order = [1 << 60 if it == "constants" else int(it) for it in df["iteration"]]
        return df.assign(_o=order).sort_values(["rank", "_o", "graph"]).drop(columns="_o").reset_index(drop=True)

    def statistics(self):
        """All statistic.csv rows: rank, net, graph, iteration, op, op_type, io, slot, call, order,
        dtype, shape, data_size, timestamp, task_id, stream_id and the statistics
        (max, min, avg, count, …, l2norm; see :data:`STAT_COLUMNS`)."""
        rec = self.records()
        if "stat_row" not in rec.columns:
            return rec.iloc[0:0]
        df = rec[rec["stat_row"]].copy()
        return df.drop(columns=["stat_row", "path", "nbytes"], errors="ignore").reset_index(drop=True)

    def records(self):
        """Tensors and statistics joined, one row per dumped tensor, in execution order.

        Columns: rank, net, graph, iteration, order (0.. within rank+iteration; constants
        last), exec_index, op (full name when known), op_file, op_type, kind
        (op/parameter/constant), io, slot, call, dtype, format, timestamp, task_id, stream_id,
        path (None when only statistics exist), nbytes, stat_row (the row has statistics),
        shape (from statistics) and the statistic columns present."""
        if self._records is None:
            self._records = self._build_records()
        return self._records

    def _build_records(self):
        import pandas as pd
        out = []
        for rid in self.rank_ids:
            rank = self.ranks[rid]
            for it in rank.iterations:
                g = rank.graphs.get(it.graph)
                exec_pos: Dict[str, List[int]] = {}
                if g is not None:
                    for i, fn in enumerate(g.execution_order):
                        exec_pos.setdefault(sanitize(fn), []).append(i)
                    if not g.execution_order:
                        for o in g.ops:
                            exec_pos.setdefault(o.file_name, []).append(o.index or 0)
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
                        if ptype == "Parameter":
                            kind = "constant" if it.iteration is None else "parameter"
                        r = rows[key] = {
                            "rank": rid, "net": it.net, "graph": it.graph, "iteration": it.iteration,
                            "op": fn if kind == "op" else "Parameter." + of, "op_file": of,
                            "op_type": ptype, "kind": kind,
                            "io": s.get("io", ""), "slot": s.get("slot", 0), "call": s.get("call", 0),
                            "dtype": s.get("dtype"), "format": s.get("format", "DefaultFormat"),
                            "timestamp": s.get("timestamp", 0), "task_id": s.get("task_id", 0),
                            "stream_id": s.get("stream_id", 0), "path": None, "nbytes": 0,
                        }
                    else:
                        if (not r.get("dtype")) and s.get("dtype"):
                            r["dtype"] = s.get("dtype")
                    r["stat_row"] = True
                    for k, v in s.items():
                        if k in ("op", "op_type", "io", "slot", "call", "dtype", "timestamp", "task_id",
                                 "stream_id", "_net", "format"):
                            continue
                        r[k] = v
                _assign_exec_index(list(rows.values()), exec_pos)
                out.extend(rows.values())
        cols = ["rank", "net", "graph", "iteration", "order", "exec_index", "op", "op_file", "op_type", "kind",
                "io", "slot", "call", "dtype", "format", "timestamp", "task_id", "stream_id", "path", "nbytes",
                "stat_row", "shape", "data_size"]
        df = pd.DataFrame(out)
        if df.empty:
            return pd.DataFrame(columns=cols)
        for c in cols:
            if c not in df.columns:
                df[c] = None
        # graph order inside an iteration: by the first timestamp of its operators
        df["_it"] = df["iteration"].fillna(1 << 62).astype("int64")
        df["_ts_op"] = df["timestamp"].where(df["kind"] == "op").astype("float64")
        df["_gstart"] = df.groupby(["rank", "_it", "graph"])["_ts_op"].transform("min").fillna(float("inf"))
        df["_kind"] = df["kind"].map({"op": 0, "parameter": 1, "constant": 2}).fillna(3)
        df["_io"] = (df["io"] != "input").astype(int)
        df = df.sort_values(["rank", "_it", "_kind", "_gstart", "graph", "exec_index", "call", "_io", "slot", "op"],
                            kind="mergesort")
        df["order"] = df.groupby(["rank", "_it"]).cumcount()
        stat_cols = [c for c in dict.fromkeys(STAT_COLUMNS.values()) if c in df.columns]
        extra = [c for c in df.columns if c not in cols and not c.startswith("_") and c not in stat_cols]
        df = df[cols + stat_cols + extra].reset_index(drop=True)
        df["iteration"] = df["iteration"].astype("Int64")
        return df


def _assign_exec_index(rows: List[Dict[str, Any]], exec_pos: Dict[str, List[int]]) -> None:
    """exec_index per row: the op's position in the execution order (k-th call -> k-th
    occurrence); operators missing from it are placed by timestamp among the known ones."""
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
    if not known:
        # no execution order: order op calls by their first timestamp
        first: Dict[Tuple[str, int], int] = {}
        for r in unknown:
            k = (r["op_file"], r["call"])
            first[k] = min(first.get(k, r["timestamp"]), r["timestamp"])
        ranks = {k: i for i, k in enumerate(sorted(first, key=lambda k: (first[k], k)))}
        for r in unknown:
            r["exec_index"] = float(ranks[(r["op_file"], r["call"])])
        return
    known.sort()
    ts = [k[0] for k in known]
    idx = [k[1] for k in known]
    first_ts: Dict[Tuple[str, int], int] = {}
    for r in unknown:
        k = (r["op_file"], r["call"])
        first_ts[k] = min(first_ts.get(k, r["timestamp"]), r["timestamp"])
    for r in unknown:
        t = first_ts[(r["op_file"], r["call"])]
        j = bisect_right(ts, t)
        before = max(idx[:j]) if j else -1.0
        r["exec_index"] = before + 0.5 + (t % 1000) * 1e-7
