"""Scanning a rank's folders into :class:`~.containers.Rank`: metadata, graph listings,
execution orders, iteration folders (tensor files, ``statistic.csv``, ``mapping.csv``,
kernel arguments, the iteration's own execution order), then mapping every file back to
its operator's full name.  Names and paths follow :mod:`opdump.format`.

Files are mapped back by sanitising the full names the dump knows (the graphs'
execution orders and listings, each iteration's own execution order, ``statistic.csv``)
with the writer's rule and matching: the file-name form is not reversible.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...format import files as ff
from ...format import layout as fl
from ...format.listing import parse_graph_json
from ...format.names import kind_of_name, op_type_of, scope_of
from .names_cache import sanitize
from .names_fast import resolved_fields
from .containers import Graph, Iteration, Rank
from .bins import bin_tensor_files
from .files import TensorFile
from .file_columns import folder_columns
from .ops import OpInfo
from .sources import parse_ir
from .statistics import read_statistic_columns, read_statistic_csv
from .stat_table import StatColumns, StatRows, columns_enabled


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            v = json.load(f)
        return v if isinstance(v, dict) else {"value": v}
    except (OSError, ValueError):
        return None


def _read_text(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return f.read()
    except OSError:
        return ""


def _by_name(entries) -> list:
    return sorted(entries, key=lambda e: e.name)


# ------------------------------------------------------------------ a rank
def scan_rank(rid: int, rp: Path, loose: bool = False) -> Rank:
    """Read the ``rank_N`` folder ``rp`` (``loose``: a bare folder of dump files, read as
    graph 0, iteration 0)."""
    rank = Rank(rid, rp)
    if loose:
        it = Iteration(rid, "", 0, 0, rp)
        scan_iteration(it)
        rank.iterations.append(it)
        rank.graphs[0] = Graph(rid, 0)
        finish_rank(rank)
        return rank
    md = rp / fl.METADATA_DIR
    rank.data_dump = read_json(md / fl.DATA_DUMP_JSON) or {}
    rank.config = read_json(md / fl.CONFIG_JSON) or {}
    rank.manifest = read_json(md / fl.MANIFEST_JSON)
    _scan_graph_files(rank, rp / fl.GRAPHS_DIR)
    _scan_execution_orders(rank, rp / fl.EXECUTION_ORDER_DIR)
    for g in rank.graphs.values():
        load_graph_ops(g)
    memo: Dict[tuple, Any] = {}
    for net_e in _by_name(os.scandir(rp)):
        if not net_e.is_dir() or net_e.name in fl.SPECIAL_DIRS or net_e.name.startswith("."):
            continue
        for g_e in _by_name(os.scandir(net_e.path)):
            if not (g_e.is_dir() and g_e.name.isdigit()):
                continue
            gid = int(g_e.name)
            rank.graphs.setdefault(gid, Graph(rid, gid))
            for i_e in sorted(os.scandir(g_e.path), key=_iteration_key):
                itn = fl.parse_iteration_dir(i_e.name)
                if not i_e.is_dir() or itn is False:
                    continue
                it = Iteration(rid, net_e.name, gid, itn, Path(i_e.path))
                scan_iteration(it, memo)
                rank.iterations.append(it)
    finish_rank(rank)
    return rank


def _iteration_key(e) -> tuple:
    return (not e.name.isdigit(), int(e.name) if e.name.isdigit() else 0, e.name)


#: ``graphs/ms_output_trace_code_graph_{g}.kernels.json`` of a kernel-level graph dump (README,
#: "Kernel-level graph dump"): per kernel its output buffers and the operators they store
KERNELS_FILE_RE = re.compile(r"^ms_output_trace_code_graph_(\d+)\.kernels\.json$")


def _scan_graph_files(rank: Rank, gdir: Path) -> None:
    if not gdir.is_dir():
        return
    for e in _by_name(os.scandir(gdir)):
        m = fl.GRAPH_FILE_RE.match(e.name)
        if not m:
            k = KERNELS_FILE_RE.match(e.name)        # graph_dump "kernels": kernel -> buffers -> operators
            if k:
                rank.graphs.setdefault(int(k.group(1)), Graph(rank.rank_id, int(k.group(1)))).kernels_path = Path(e.path)
            continue
        g = rank.graphs.setdefault(int(m.group(1)), Graph(rank.rank_id, int(m.group(1))))
        if m.group(2) == "json":
            g.json_path = Path(e.path)
        else:
            g.ir_path = Path(e.path)


def _scan_execution_orders(rank: Rank, edir: Path) -> None:
    if not edir.is_dir():
        return
    for e in os.scandir(edir):
        m = fl.EXECUTION_ORDER_RE.match(e.name)
        if m:
            g = rank.graphs.setdefault(int(m.group(1)), Graph(rank.rank_id, int(m.group(1))))
            g.execution_order = fl.parse_execution_order(_read_text(Path(e.path)))
            continue
        m = fl.GLOBAL_EXECUTION_ORDER_RE.match(e.name)
        if m:
            g = rank.graphs.setdefault(int(m.group(1)), Graph(rank.rank_id, int(m.group(1))))
            g.iterations_run = fl.parse_global_execution_order(_read_text(Path(e.path)))


# ------------------------------------------------------------------ a graph's operators
def load_graph_ops(g: Graph) -> None:
    """The graph's operators from its ``.json`` listing (else its ``.ir``), in execution order."""
    ops: List[OpInfo] = []
    if g.json_path is not None:
        kind, parsed = parse_graph_json(read_json(g.json_path) or {})
        g.kind = kind or g.kind
        for o in parsed:
            fn = o["full_name"]
            ops.append(OpInfo(g.rank, g.graph_id, fn, o["op_type"] or op_type_of(fn),
                              o["scope"] if o["scope"] is not None else scope_of(fn),
                              kind_of_name(fn, g.kind), None, o["sources"], o["inputs"], o["outputs"], o["args"],
                              o.get("nonfinite_args", False), o.get("overload"), o.get("producers")))
    elif g.ir_path is not None:
        try:
            parsed = parse_ir(g.ir_path)
        except OSError:
            parsed = []
        for o in parsed:
            fn = o["full_name"]
            ops.append(OpInfo(g.rank, g.graph_id, fn, op_type_of(fn), scope_of(fn), kind_of_name(fn, g.kind),
                              None, o["sources"], o["inputs"], o["outputs"]))
    if g.execution_order:
        by_name = {o.full_name: o for o in ops}
        ordered: List[OpInfo] = []
        for i, fn in enumerate(g.execution_order):
            o = by_name.get(fn)
            if o is None:
                o = by_name[fn] = _bare_op(g, fn)
            if o.index is None:
                o.index = i
                ordered.append(o)
        # listed but not in the graph's order: in opdump's eager listing, an operator of a later
        # iteration (kept); in MindSpore's .ir, a node that runs no kernel (Return, MakeTuple…:
        # kept aside, an operator only if an iteration's own order names it, see finish_rank)
        for o in ops:
            if o.index is None:
                if g.kind == "eager":
                    o.index = len(ordered)
                    ordered.append(o)
                else:
                    g.unordered[o.full_name] = o
        g.ops = ordered
    else:
        for i, o in enumerate(ops):
            o.index = i
        g.ops = ops


def _bare_op(g: Graph, fn: str) -> OpInfo:
    """An operator known only by its full name (no listing entry)."""
    return OpInfo(g.rank, g.graph_id, fn, op_type_of(fn), scope_of(fn), kind_of_name(fn, g.kind))


# ------------------------------------------------------------------ an iteration folder
def scan_iteration(it: Iteration, memo: Optional[Dict[tuple, Any]] = None) -> None:
    """Fill ``it`` from its folder: tensor files (through ``mapping.csv``), statistic rows,
    kernel arguments, unconverted protobuf files and the iteration's own execution order.
    ``memo``: what earlier folders' statistic rows gave (converted columns, call numbers:
    :func:`.statistics.read_statistic_columns`, :meth:`.stat_table.StatColumns.number_calls`)."""
    mapping: Dict[str, str] = {}
    mp = it.path / ff.MAPPING_FILE
    if mp.is_file():
        mapping = ff.parse_mapping(_read_text(mp))
    order_name = fl.execution_order_file_name(it.graph)
    seq: List[Any] = []             # listing order: a .npy entry, or the TensorFiles of a bin file
    npy_ext = "." + ff.NPY
    for e in os.scandir(it.path):
        name = e.name
        if name.endswith(npy_ext) and name != order_name:      # a tensor file: the common case first
            seq.append(e)
            continue
        if name == ff.STATISTIC_FILE:
            if columns_enabled():                    # columns, the rows a view (stat_table)
                it.stats = StatRows(StatColumns(*read_statistic_columns(Path(e.path), memo), it.net))
                continue
            for row in read_statistic_csv(Path(e.path)):
                row["_net"] = it.net
                it.stats.append(row)
            continue
        if name == order_name:
            it.execution_order = fl.parse_execution_order(_read_text(Path(e.path)))
            continue
        op_name = ff.parse_kernel_args_name(name)
        if op_name is not None:
            d = read_json(Path(e.path))
            if d is not None:
                it.kernel_args[op_name] = d
            continue
        if not name.endswith(npy_ext):
            bins = bin_tensor_files(it, e.path, mapping.get(name, name))    # Ascend bin file
            if bins is not None:
                seq.append(bins)
            elif ff.is_raw_name(mapping.get(name, name)):
                it.raw_files.append(e.path)                                 # unreadable bin file
            continue
        seq.append(e)
    fc = folder_columns(it, seq, mapping)
    if fc is not None:
        it.file_columns = fc                         # objects made only if asked for (.file_columns)
    else:
        it.files = _tensor_files(it, seq, mapping)
    # statistics: calls in timestamp order
    if isinstance(it.stats, StatRows):
        it.stats.table.sort_by_timestamp()
        it.stats.table.number_calls(memo)
        return
    it.stats.sort(key=lambda r: (r.get("timestamp", 0)))
    sc: Dict[Tuple[str, str, int], int] = {}
    for r in it.stats:
        k = (sanitize(r.get("op", "")), r.get("io", ""), r.get("slot", 0))
        r["call"] = sc.get(k, 0)
        sc[k] = r["call"] + 1


def _tensor_files(it: Iteration, seq: List[Any], mapping: Dict[str, str]) -> List[TensorFile]:
    """One :class:`TensorFile` per tensor file of ``seq``, sorted and numbered (call)."""
    files: List[TensorFile] = []
    for x in seq:
        if type(x) is list:
            files.extend(x)
        else:
            _add_npy(it, x, x.name, mapping, files)
    files.sort(key=lambda t: (t.timestamp, t.op_file, t.io != "input", t.slot))
    counters: Dict[Tuple[str, str, int], int] = {}
    for t in files:
        k = (t.op_file, t.io, t.slot)
        t.call = counters.get(k, 0)
        counters[k] = t.call + 1
    return files


def _add_npy(it: Iteration, e, name: str, mapping: Dict[str, str], files: List[TensorFile]) -> None:
    """The :class:`TensorFile` of a ``.npy`` folder entry (nothing when its name is not a
    tensor file name); fields parsed by :func:`.names_fast.resolved_fields`."""
    parsed = resolved_fields(name, mapping)
    if parsed is None:
        return
    op_type, op_name, task, stream, ts, io, slot, fmt, dtype = parsed
    kind = "op"
    if op_type == ff.PARAMETER_TYPE:
        kind = "constant" if it.iteration is None else "parameter"
    try:
        size = e.stat().st_size
    except OSError:
        size = 0
    files.append(TensorFile(e.path, it.rank, it.net, it.graph, it.iteration, op_type, op_name, op_name,
                            task, stream, ts, io, slot, fmt, dtype, kind, size))


# ------------------------------------------------------------------ names
def finish_rank(rank: Rank) -> None:
    """Add the operators only an iteration's own order knows to their graph, then map files
    back to full names."""
    for it in rank.iterations:
        if not it.execution_order:
            continue
        g = rank.graphs.setdefault(it.graph, Graph(rank.rank_id, it.graph))
        known = {o.full_name for o in g.ops}
        nxt = max((op.index or 0 for op in g.ops), default=-1) + 1
        for fn in it.execution_order:
            if fn not in known:
                known.add(fn)
                o = g.unordered.pop(fn, None) or _bare_op(g, fn)
                o.index, nxt = nxt, nxt + 1
                g.ops.append(o)
    resolve_names(rank)


def resolve_names(rank: Rank) -> None:
    """Give each file and statistic row its operator's full name (sanitise known names and match)."""
    global_map: Dict[str, str] = {}
    per_graph: Dict[int, Dict[str, str]] = {}
    for g in rank.graphs.values():
        m = per_graph.setdefault(g.graph_id, {})
        for o in g.ops:
            m.setdefault(o.file_name, o.full_name)
            global_map.setdefault(o.file_name, o.full_name)
    for it in rank.iterations:
        m = per_graph.setdefault(it.graph, {})
        if isinstance(it.stats, StatRows):
            for fn in dict.fromkeys(it.stats.table.get("op", "")):     # distinct, first seen first
                if fn and "/" in fn:
                    m.setdefault(sanitize(fn), fn)
                    global_map.setdefault(sanitize(fn), fn)
            continue
        for r in it.stats:
            fn = r.get("op", "")
            if fn and "/" in fn:
                m.setdefault(sanitize(fn), fn)
                global_map.setdefault(sanitize(fn), fn)
    # older dumps name files by the last segment only (Conv2D.Conv2D-op12.….npy)
    short: Dict[str, Optional[str]] = {}
    for fn in set(global_map.values()):
        last = fn.rsplit("/", 1)[-1]
        short[last] = fn if last not in short else None
    for k, v in short.items():
        if v is not None:
            global_map.setdefault(k, v)
    rank.name_map = global_map
    memo: Dict[tuple, List[Any]] = {}
    for it in rank.iterations:
        m = per_graph.get(it.graph, {})
        if isinstance(it.stats, StatRows):
            _resolve_column(it.stats.table, m, global_map, memo)
        for r in ([] if isinstance(it.stats, StatRows) else it.stats):
            fn = r.get("op", "")
            if fn and "/" not in fn and r.get("op_type") != ff.PARAMETER_TYPE:
                r["op"] = m.get(fn) or global_map.get(fn) or m.get(sanitize(fn)) or fn
        if it.file_columns is not None:
            it.file_columns.resolve(m, global_map)          # the same rule, per distinct name
            continue
        for t in it.files:
            if t.kind == "op":
                t.op = m.get(t.op_file) or global_map.get(t.op_file) or t.op_file
            else:
                prefix = "" if t.kind == "parameter" else fl.CONSTANTS_DIR + "/"
                t.op = f"{prefix}{ff.PARAMETER_TYPE}.{t.op_file}"


def _resolve_column(table: StatColumns, m: Dict[str, str], global_map: Dict[str, str],
                    memo: Optional[Dict[tuple, List[Any]]] = None) -> None:
    """:func:`resolve_names`' rule for statistic rows, once per distinct (name, type);
    ``memo``: the names of earlier tables of the same graph map with the same columns."""
    ops = table.cols.get("op")
    if ops is None:
        return
    types = table.get("op_type")
    key = None
    if memo is not None:
        try:
            key = (id(m), tuple(ops), tuple(types))
            hit = memo.get(key)
        except TypeError:
            key = hit = None
        if hit is not None:
            ops[:] = hit
            return
    done: Dict[Tuple[str, Any], str] = {}
    for i, (fn, ty) in enumerate(zip(ops, types)):
        k = (fn, ty)
        v = done.get(k)
        if v is None:
            v = fn
            if fn and "/" not in fn and ty != ff.PARAMETER_TYPE:
                v = m.get(fn) or global_map.get(fn) or m.get(sanitize(fn)) or fn
            done[k] = v
        if v is not fn:
            ops[i] = v
    if key is not None:
        memo[key] = list(ops)
