"""Reading dumps: the one place in opdump's analysis that knows file layouts.

Layout (seed 000, "Dump in CPU/GPU mode", and what opdump writes)::

    {root}/rank_{r}/.dump_metadata/{data_dump.json, config.json, manifest.json}
    {root}/rank_{r}/{net_name}/{graph_id}/{iteration}/
        {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{input|output}.{slot}.{format}[.{dtype}].npy
        statistic.csv   mapping.csv   {op_type}.{op_name}.json
        Parameter.{name}.0.0.{timestamp}.output.0.DefaultFormat[.{dtype}].npy
    {root}/rank_{r}/{net_name}/{graph_id}/constants/Parameter.data-{id}.0.0.{ts}.output.0.DefaultFormat[.{dtype}].npy
    {root}/rank_{r}/graphs/ms_output_trace_code_graph_{g}.ir  (+ opdump's .json twin)
    {root}/rank_{r}/execution_order/ms_execution_order_graph_{g}.csv
    {root}/rank_{r}/execution_order/ms_global_execution_order_graph_{g}.csv

Everything else in :mod:`opdump.analysis` works on the objects and tables this
module returns (:class:`Dump`, :meth:`Dump.records`), never on paths.

The ``op_name`` of a file name is the operator's full name with ``.``, ``/``,
``\\`` and spaces replaced by ``_`` -- not reversible, so files are mapped back
to operators by sanitising the full names the dump knows (execution order,
``.ir``/``.json`` graph files, ``statistic.csv``) and matching.

Arrays are loaded lazily and memory-mapped (``np.load(mmap_mode="r",
allow_pickle=False)``); pandas is imported here (analysis only).
"""
from __future__ import annotations

import csv
import json
import os
import re
import warnings
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

__all__ = [
    "Dump", "Rank", "Graph", "Iteration", "OpInfo", "SourceFrame", "TensorFile",
    "open_dump", "load_statistics", "sanitize", "op_type_of", "scope_of",
    "is_float_dtype", "is_library_file", "parse_tensor_filename", "DumpError",
    "STAT_COLUMNS",
]


class DumpError(Exception):
    """The path is not a readable dump."""


# ----------------------------------------------------------------------------- names

_SANITIZE_RE = re.compile(r"[./\\ ]")


def sanitize(name: str) -> str:
    """The file-name form of an operator/parameter name (F14): ``. / \\ space`` -> ``_``."""
    return _SANITIZE_RE.sub("_", name)


_OPID_RE = re.compile(r"^(?P<type>.+?)-op(?P<id>\d+)$")


def op_type_of(full_name: str) -> str:
    """``Default/Net/conv3-Conv2d/convolution-op12`` -> ``convolution``."""
    last = full_name.rsplit("/", 1)[-1]
    m = _OPID_RE.match(last)
    return m.group("type") if m else last


def scope_of(full_name: str) -> str:
    """``Default/Net/conv3-Conv2d/convolution-op12`` -> ``Default/Net/conv3-Conv2d``."""
    return full_name.rsplit("/", 1)[0] if "/" in full_name else ""


def kind_of_name(full_name: str, graph_kind: Optional[str] = None) -> str:
    """forward | backward | optimizer (| inference, as the graph says)."""
    if full_name.startswith("Gradients/"):
        return "backward"
    if "/optimizer-" in full_name or full_name.startswith("optimizer-"):
        return "optimizer"
    if graph_kind in ("backward", "inference"):
        return graph_kind
    return "forward"


# MindSpore type names (and the lower-case/older spellings) -> kind
def is_float_dtype(name: Optional[str]) -> bool:
    """True for floating dtype names (``Float32``, ``BFloat16``, ``float16``, ``Float8E4M3FN`` ...)."""
    if not name or not isinstance(name, str):
        return False
    n = name.lower().replace("_", "")
    return n.startswith(("float", "bfloat", "half", "double", "hifloat")) or n in ("f16", "f32", "f64", "bf16")


def is_complex_dtype(name: Optional[str]) -> bool:
    return bool(name) and isinstance(name, str) and name.lower().startswith("complex")


_KNOWN_DTYPES = {
    "float16", "float32", "float64", "bfloat16", "int4", "int8", "int16", "int32", "int64",
    "uint1", "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128",
    "float8e4m3fn", "float8e5m2", "float8e4m3fnuz", "float8e5m2fnuz", "float8e8m0fnu",
    "hifloat8", "double", "half", "int", "uint", "float", "complex32", "string", "int2", "uint2",
    "float4e2m1fnx2", "qint8", "quint8", "qint32", "quint4x2",
}


def _looks_like_dtype(tok: str) -> bool:
    t = tok.lower()
    return t in _KNOWN_DTYPES or bool(re.match(r"^(b?float|u?int|complex)\d", t))


# ----------------------------------------------------------------------------- source frames

@dataclass(frozen=True)
class SourceFrame:
    """One ``# In file`` line of a graph file: where (part of) an operator comes from."""

    file: str
    line: int
    line_end: Optional[int] = None
    col: Optional[int] = None
    col_end: Optional[int] = None
    code: str = ""

    @property
    def is_library(self) -> bool:
        return is_library_file(self.file)

    @property
    def is_definition(self) -> bool:
        c = self.code.lstrip()
        return c.startswith(("def ", "async def ", "class ", "@"))

    def covers(self, line: int) -> bool:
        """Does this frame stand for ``line``? A ``def``/``class`` frame (a whole function's
        range, as MindSpore writes the enclosing function) only stands for its first line."""
        if self.line_end is None or self.is_definition:
            return self.line == line
        return self.line <= line <= self.line_end

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def to_dict(self) -> Dict[str, Any]:
        return {"file": self.file, "line": self.line, "line_end": self.line_end, "code": self.code}


_LIB_RE = re.compile(
    r"(site-packages|dist-packages|[/\\]lib[/\\]python\d[\d.]*[/\\]|^<|[/\\]torch[/\\](nn|_dynamo|fx|"
    r"_functorch|autograd|utils|_tensor|overrides|_ops|_refs|_decomp|_prims|functional)|"
    r"[/\\]opdump[/\\](capture|write|stats|select|debug|recorder))"
)


def is_library_file(path: str) -> bool:
    """Library (framework, site-packages, stdlib, opdump itself) vs the user's code."""
    return bool(_LIB_RE.search(path or ""))


# seed:  # In file ./train.py(175)/        x = self.conv3(x)/
_IN_FILE_SEED = re.compile(r"#\s*In file\s+(?P<file>.+?)\((?P<line>\d+)\)/(?P<code>.*?)/?\s*$")
# MindSpore 2.x:  # In file /p/train.py:59~60, 8~27/        x = self.fc1(x)/
_IN_FILE_MS = re.compile(
    r"#\s*In file\s+(?P<file>.+?):(?P<line>\d+)(?:~(?P<line_end>\d+))?"
    r"(?:,\s*(?P<col>\d+)(?:~(?P<col_end>\d+))?)?/(?P<code>.*?)/?\s*$"
)
_FULLNAME_RES = (
    re.compile(r"#\s*Fullname with scope:\s*\((?P<name>.+)\)\s*$"),
    re.compile(r"full_name_with_scope:\s*\((?P<name>.+)\)\s*$"),
)
_IR_NODE_RE = re.compile(r"^\s*%\d+(?:\([^)]*\))?\s*=\s*(?P<prim>[^\s(]+)")
_IR_BARE_NODE_RE = re.compile(r"^ {0,2}(?P<prim>[A-Za-z_][\w.]*)\(")        # Return(%1) …
_SHARED_NOTE_RE = re.compile(r"/?<~~.*$")                                   # "<~~This line of code can be shared…"
_IR_TYPES_RE = re.compile(r"^\s*:\s*\((?P<ins>.*)\)\s*->\s*\((?P<outs>.*)\)\s*$")
_IR_TENSOR_RE = re.compile(r"<(?:Ref\[)?Tensor\[(?P<dtype>\w+)\]\]?,\s*\((?P<shape>[^)]*)\)")


def parse_source_line(text: str) -> Optional[SourceFrame]:
    """Parse one ``# In file`` line (seed or MindSpore 2.x form); None when it is not one."""
    text = _SHARED_NOTE_RE.sub("/", text.rstrip())
    m = _IN_FILE_SEED.search(text)
    if m:
        return SourceFrame(m.group("file").strip(), int(m.group("line")), code=m.group("code").strip())
    m = _IN_FILE_MS.search(text)
    if m:
        def _i(k):
            v = m.group(k)
            return int(v) if v is not None else None
        return SourceFrame(m.group("file").strip(), int(m.group("line")), _i("line_end"),
                           _i("col"), _i("col_end"), m.group("code").strip())
    return None


# ----------------------------------------------------------------------------- operators

@dataclass
class OpInfo:
    """An operator of a graph: its full name, type, scope, source frames and signature."""

    rank: int
    graph: int
    full_name: str
    op_type: str
    scope: str
    kind: str = "forward"               # forward | backward | optimizer | inference
    index: Optional[int] = None         # position in the execution order (first occurrence)
    sources: List[SourceFrame] = field(default_factory=list)
    inputs: List[Dict[str, Any]] = field(default_factory=list)
    outputs: List[Dict[str, Any]] = field(default_factory=list)
    args: Dict[str, Any] = field(default_factory=dict)

    @property
    def file_name(self) -> str:
        return sanitize(self.full_name)

    @property
    def user_frame(self) -> Optional[SourceFrame]:
        """The innermost frame that is not library code (else the innermost frame)."""
        for fr in reversed(self.sources):
            if not fr.is_library:
                return fr
        return self.sources[-1] if self.sources else None

    @property
    def source(self) -> str:
        fr = self.user_frame
        return f"{fr.file}:{fr.line}" if fr else ""

    @property
    def code(self) -> str:
        fr = self.user_frame
        return fr.code if fr else ""


def _parse_ir_types(text: str) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    m = _IR_TYPES_RE.match(text)
    if not m:
        return [], []

    def _t(s):
        out = []
        for tm in _IR_TENSOR_RE.finditer(s):
            shape = [int(x) for x in re.findall(r"-?\d+", tm.group("shape"))]
            out.append({"dtype": tm.group("dtype"), "shape": shape})
        return out
    return _t(m.group("ins")), _t(m.group("outs"))


def parse_ir(path: Path) -> List[Dict[str, Any]]:
    """Operators of a ``.ir`` file: ``[{full_name, sources: [SourceFrame], inputs, outputs}]``.

    Accepts MindSpore 2.x (``# Fullname with scope: (…)``, ``# In file f:l~l, c~c/ code/``)
    and the seed's older form (``: full_name_with_scope: (…)``, ``# In file f(l)/ code/``).
    """
    ops: List[Dict[str, Any]] = []
    cur: Optional[Dict[str, Any]] = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n")
            m = _IR_NODE_RE.match(line) or _IR_BARE_NODE_RE.match(line)
            if m and not line.lstrip().startswith(("#", ":")):
                cur = {"full_name": None, "sources": [], "inputs": [], "outputs": [], "prim": m.group("prim")}
                ops.append(cur)
                continue
            if cur is None:
                continue
            s = line.strip()
            if s.startswith("}"):
                cur = None
                continue
            if cur["full_name"] is None:
                for rx in _FULLNAME_RES:
                    m = rx.search(s)
                    if m:
                        cur["full_name"] = m.group("name").strip()
                        break
                else:
                    if not cur["inputs"] and not cur["outputs"] and s.startswith(":"):
                        cur["inputs"], cur["outputs"] = _parse_ir_types(s)
                    elif s.startswith("#") and "In file" in s:
                        fr = parse_source_line(s)
                        if fr:
                            cur["sources"].append(fr)
                    continue
                continue
            if "In file" in s:
                fr = parse_source_line(s)
                if fr:
                    cur["sources"].append(fr)
    return [o for o in ops if o["full_name"]]


# ----------------------------------------------------------------------------- tensor files

@dataclass
class TensorFile:
    """One dumped ``.npy`` file. ``load()`` memory-maps it (never unpickles)."""

    path: str
    rank: int
    net: str
    graph: int
    iteration: Optional[int]            # None for constants/
    op_type: str
    op_file: str                        # op_name as in the file name (sanitised)
    op: str                             # full name when known, else op_file
    task_id: int
    stream_id: int
    timestamp: int
    io: str                             # input | output
    slot: int
    format: str
    dtype: Optional[str]                # MindSpore type name from the file name (None in old dumps)
    kind: str = "op"                    # op | parameter | constant
    nbytes: int = 0
    call: int = 0                       # occurrence of (op, io, slot) in its iteration folder

    def header(self) -> Tuple[Tuple[int, ...], np.dtype]:
        """(shape, stored numpy dtype) from the ``.npy`` header only."""
        return _npy_header(self.path)

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.header()[0]

    def load(self, mmap: bool = True) -> np.ndarray:
        return load_array(self.path, mmap=mmap)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def load_array(path: str, mmap: bool = True) -> np.ndarray:
    """``np.load`` without pickle, memory-mapped when possible (empty arrays cannot be)."""
    if mmap:
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError:
            pass
    return np.load(path, allow_pickle=False)


def _npy_header(path: str) -> Tuple[Tuple[int, ...], np.dtype]:
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:  # pragma: no cover - 3.0 headers are utf8 2.0
            shape, fortran, dtype = np.lib.format._read_array_header(f, version)
    return tuple(shape), dtype


_IO = ("input", "output")


def parse_tensor_filename(name: str) -> Optional[Dict[str, Any]]:
    """Split ``{op_type}.{op_name}.{task}.{stream}.{ts}.{io}.{slot}.{format}[.{dtype}].npy``.

    Returns None when the name does not follow the pattern.  Accepts the older
    form without the dtype field and msaccucmp's ``….{io}.{slot}.{AxB}.npy``.
    """
    if not name.endswith(".npy"):
        return None
    toks = name[:-4].split(".")
    io_idx = None
    if len(toks) >= 9 and toks[-4] in _IO and toks[-3].isdigit():
        io_idx, dtype = len(toks) - 4, toks[-1]
        fmt = toks[-2]
    elif len(toks) >= 8 and toks[-3] in _IO and toks[-2].isdigit():
        io_idx, dtype = len(toks) - 3, None
        fmt = toks[-1]
        if _looks_like_dtype(fmt):  # some writers put dtype where format is
            dtype = fmt
    if io_idx is None or io_idx < 5:
        return None
    ts, stream, task = toks[io_idx - 1], toks[io_idx - 2], toks[io_idx - 3]
    if not (ts.isdigit() and stream.lstrip("-").isdigit() and task.lstrip("-").isdigit()):
        return None
    return {
        "op_type": toks[0],
        "op_file": ".".join(toks[1:io_idx - 3]),
        "task_id": int(task), "stream_id": int(stream), "timestamp": int(ts),
        "io": toks[io_idx], "slot": int(toks[io_idx + 1]),
        "format": fmt, "dtype": dtype,
    }


# ----------------------------------------------------------------------------- statistics

#: statistic.csv header -> column name in the tables of this module
STAT_COLUMNS = {
    "Max Value": "max", "Min Value": "min", "Avg Value": "avg", "Count": "count",
    "Negative Zero Count": "negative_zero_count", "Positive Zero Count": "positive_zero_count",
    "NaN Count": "nan_count", "Nan Count": "nan_count",
    "Negative Inf Count": "negative_inf_count", "Positive Inf Count": "positive_inf_count",
    "Zero Count": "zero_count", "MD5": "md5", "MD5 Value": "md5",
    "L2Norm Value": "l2norm", "l2norm": "l2norm",
    "Finite Max Value": "finite_max", "Finite Min Value": "finite_min",
}
_STRUCT_COLUMNS = {
    "Op Type": "op_type", "Op Name": "op", "Task ID": "task_id", "Stream ID": "stream_id",
    "Timestamp": "timestamp", "IO": "io", "Input/Output": "io", "Slot": "slot",
    "Data Size": "data_size", "Data Type": "dtype", "Format": "format", "Shape": "shape",
}
NUMERIC_STATS = [c for c in dict.fromkeys(STAT_COLUMNS.values()) if c != "md5"]


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


def _read_statistic_csv(path: Path) -> List[Dict[str, Any]]:
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
                continue  # torn row (F38 says it cannot happen; be safe)
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


# ----------------------------------------------------------------------------- containers

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


_RANK_RE = re.compile(r"^rank_(\d+)$")
_RAW_RE = re.compile(r"^[^.]+\.[^.]+\.\d+\.\d+\.\d+$")      # {op_type}.{op_name}.{task}.{stream}.{ts}
_WORLD_RE = re.compile(r"^worldsize\d+_global_rank(\d+)$")
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


# ----------------------------------------------------------------------------- opening

def _find_rank_dirs(p: Path) -> Tuple[List[Tuple[int, Path]], bool]:
    m = _RANK_RE.match(p.name)
    if m and p.is_dir():
        return [(int(m.group(1)), p)], False
    ranks = []
    if p.is_dir():
        for e in os.scandir(p):
            mm = _RANK_RE.match(e.name)
            if mm and e.is_dir():
                ranks.append((int(mm.group(1)), Path(e.path)))
    if ranks:
        return sorted(ranks), False
    # a folder inside a rank (net/graph/iteration): climb to the rank
    for parent in p.parents:
        mm = _RANK_RE.match(parent.name)
        if mm:
            return [(int(mm.group(1)), parent)], False
    # a bare folder of dump files
    if p.is_dir() and any(e.name.endswith(".npy") or e.name == "statistic.csv" for e in os.scandir(p)):
        return [(0, p)], True
    return [], False


def _find_acl(p: Path, max_depth: int = 8) -> Dict[int, List[Tuple[str, int, int, Path]]]:
    """The ACL/GE layout (seeds 001, 003, 004; SPEC F25):
    ``{dump_path}/[worldsize{N}_global_rank{r}/]{time}/{device_id}/{model_name}/{model_id}/{iteration}/files``.
    Returns rank -> [(model_name, model_id, iteration, folder)]; the rank is ``r`` of the
    torchair folder, else the device id."""
    out: Dict[int, List[Tuple[str, int, int, Path]]] = {}
    base_depth = len(p.parts)
    for dirpath, dirnames, filenames in os.walk(p):
        depth = len(Path(dirpath).parts) - base_depth
        if depth >= max_depth:
            dirnames[:] = []
        if not any(f.endswith(".npy") or f == "statistic.csv" or _RAW_RE.match(f) for f in filenames):
            continue
        parts = Path(dirpath).relative_to(p).parts
        if len(parts) < 4:
            continue
        device, model, model_id, itn = parts[-4], parts[-3], parts[-2], parts[-1]
        if not (device.isdigit() and model_id.isdigit() and itn.isdigit()):
            continue
        rank = int(device)
        for q in parts:
            m = _WORLD_RE.match(q)
            if m:
                rank = int(m.group(1))
        out.setdefault(rank, []).append((model, int(model_id), int(itn), Path(dirpath)))
    for v in out.values():
        v.sort(key=lambda e: (e[1], e[2], e[0]))
    return out


def open_dump(path: os.PathLike) -> Dump:
    """Open a dump: its root (holding ``rank_*``), a ``rank_N`` folder, a folder inside a
    rank (the whole rank is read), a bare folder of dump files (read as rank 0, graph 0,
    iteration 0), or an ACL/GE-layout dump whose tensors are ``.npy`` (converted) files."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DumpError(f"{p}: no such file or directory")
    if not p.is_dir():
        raise DumpError(f"{p}: not a folder (give the dump root or a rank_N folder)")
    rank_dirs, loose = _find_rank_dirs(p.resolve())
    acl = None
    if not rank_dirs:
        acl = _find_acl(p.resolve())
        if not acl:
            raise DumpError(f"{p}: not a dump (no rank_N folders, no ACL {{time}}/{{device}}/{{model}}/{{id}}/"
                            "{iteration} folders, no .npy files, no statistic.csv)")
    d = Dump(p, rank_dirs, loose=loose, acl=acl)
    raw = sum(len(it.raw_files) for r in d.ranks.values() for it in r.iterations)
    if raw:
        warnings.warn(f"{p}: {raw} Ascend protobuf dump files are not converted to .npy and are not read "
                      "(convert them with `opdump convert`)", stacklevel=2)
    if d.complete is False:
        warnings.warn(f"{p}: the dump is marked incomplete in its manifest (the run was interrupted "
                      "or is still running); reading what is there", stacklevel=2)
    return d


def load_statistics(path: os.PathLike):
    """All ``statistic.csv`` of a dump as one DataFrame (rank, graph, iteration, op, io, slot, …)."""
    return open_dump(path).statistics()
