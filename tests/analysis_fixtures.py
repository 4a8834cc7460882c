"""Small synthetic dumps in the MindSpore CPU/GPU layout, written with numpy, for the
analysis tests (no conftest: import what you need).

``make_dump(root, ...)`` simulates a tiny network (two Linear layers, relu, an
``empty_like``+``fill_`` pair holding garbage, a dropout, a ``mul`` and an ``exp``
that can overflow, a sum) plus a two-operator backward graph, for a few
iterations, and writes what opdump/MindSpore would write: tensor files,
statistic.csv, Parameter files, the graph files (``.ir`` in MindSpore 2.x or seed
style, and/or opdump's ``.json``) and the execution-order CSVs.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

MODEL_FILE = "/home/user/proj/model.py"
LIB_LINEAR = "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py"
LIB_MODULE = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"
LINES = {"fc1": 12, "relu": 13, "buf": 14, "drop": 15, "fc2": 16, "mul": 17, "exp": 18, "sum": 19}
CODE = {"fc1": "x = self.fc1(x)", "relu": "x = torch.relu(x)", "buf": "b = torch.empty_like(x).fill_(1)",
        "drop": "d = self.drop(x)", "fc2": "y = self.fc2(x)", "mul": "y = y * self.scale",
        "exp": "e = torch.exp(y)", "sum": "return e.sum()"}

DTYPE_NAME = {np.dtype("float32"): "Float32", np.dtype("float16"): "Float16", np.dtype("float64"): "Float64",
              np.dtype("int64"): "Int64", np.dtype("int32"): "Int32", np.dtype("bool"): "Bool"}
ALL_STATS = ["max", "min", "avg", "count", "negative zero count", "positive zero count", "nan count",
             "negative inf count", "positive inf count", "zero count", "md5", "l2norm"]
STAT_HEADER = {"max": "Max Value", "min": "Min Value", "avg": "Avg Value", "count": "Count",
               "negative zero count": "Negative Zero Count", "positive zero count": "Positive Zero Count",
               "nan count": "NaN Count", "negative inf count": "Negative Inf Count",
               "positive inf count": "Positive Inf Count", "zero count": "Zero Count", "md5": "MD5",
               "l2norm": "L2Norm Value"}


def sanitize(name: str) -> str:
    """The documented file-name rule (docs/design.md, "Names"), written out independently."""
    for ch in './\\ :*?"<>|' + "".join(map(chr, range(32))) + "\x7f":
        name = name.replace(ch, "_")
    return name or "_"


class Op:
    def __init__(self, full_name: str, key: str, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                 library_frames: bool = True):
        self.full_name = full_name
        self.op_type = full_name.rsplit("/", 1)[-1].rsplit("-op", 1)[0]
        self.key = key
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.library_frames = library_frames


def _stat_row(a: np.ndarray, cats: Sequence[str]) -> List[str]:
    f = a.astype(np.float64) if a.dtype != np.bool_ else a.astype(np.float64)
    fin = f[np.isfinite(f)] if f.size else f
    out = []
    for c in cats:
        if c == "max":
            out.append(repr(float(np.max(f))) if f.size else "")
        elif c == "min":
            out.append(repr(float(np.min(f))) if f.size else "")
        elif c == "avg":
            out.append(repr(float(np.mean(f))) if f.size else "")
        elif c == "count":
            out.append(str(f.size))
        elif c == "negative zero count":
            out.append(str(int((f < 0).sum())))
        elif c == "positive zero count":
            out.append(str(int((f > 0).sum())))
        elif c == "nan count":
            out.append(str(int(np.isnan(f).sum())))
        elif c == "negative inf count":
            out.append(str(int((f == -np.inf).sum())))
        elif c == "positive inf count":
            out.append(str(int((f == np.inf).sum())))
        elif c == "zero count":
            out.append(str(int((f == 0).sum())))
        elif c == "md5":
            out.append(hashlib.md5(np.ascontiguousarray(a).tobytes()).hexdigest())
        elif c == "l2norm":
            out.append(repr(float(np.sqrt(np.sum(f * f)))) if f.size else "")
    return out


def simulate(iteration: int, *, weight_delta: Optional[Dict[str, float]] = None, overflow_at: Optional[int] = None,
             nan_weight_at: Optional[int] = None, dropout_seed: int = 0, dtype=np.float32,
             extra_op: bool = False, seed: int = 0) -> Tuple[List[Op], List[Op], Dict[str, np.ndarray]]:
    """(forward ops, backward ops, parameters) of one iteration."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((16, 8)).astype(np.float32) * 0.3
    b1 = rng.standard_normal(16).astype(np.float32) * 0.1
    w2 = rng.standard_normal((4, 16)).astype(np.float32) * 0.3
    b2 = rng.standard_normal(4).astype(np.float32) * 0.1
    for k, d in (weight_delta or {}).items():
        {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2}[k][0] += d
    # a deterministic "update" per iteration
    w1 = w1 * (1 - 0.01 * iteration)
    w2 = w2 * (1 - 0.02 * iteration)
    if nan_weight_at is not None and iteration == nan_weight_at:
        w2 = w2.copy()
        w2[1, 3] = np.nan
    xr = np.random.default_rng(1000 + iteration)
    x = xr.standard_normal((4, 8)).astype(np.float32)
    cast = (lambda a: a.astype(dtype)) if dtype != np.float32 else (lambda a: a)
    w1, b1, w2, b2, x = map(cast, (w1, b1, w2, b2, x))
    f: List[Op] = []
    n = iter(range(100))
    w1t = w1.T.copy()
    f.append(Op(f"Default/Net/fc1-Linear/t-op{next(n)}", "fc1", [w1], [w1t]))
    h1 = (b1 + x @ w1t).astype(dtype)
    f.append(Op(f"Default/Net/fc1-Linear/addmm-op{next(n)}", "fc1", [b1, x, w1t], [h1]))
    a1 = np.maximum(h1, 0).astype(dtype)
    f.append(Op(f"Default/Net/relu-op{next(n)}", "relu", [h1], [a1]))
    if extra_op:
        f.append(Op(f"Default/Net/clone-op{next(n)}", "relu", [a1], [a1.copy()]))
    grng = np.random.default_rng(7777 + iteration * 13 + dropout_seed * 101 + (1 if weight_delta else 0))
    garbage = grng.standard_normal(a1.shape).astype(dtype)
    garbage[0, :3] = np.nan
    garbage[1, 0] = np.inf
    f.append(Op(f"Default/Net/empty_like-op{next(n)}", "buf", [a1], [garbage]))
    f.append(Op(f"Default/Net/fill_-op{next(n)}", "buf", [garbage], [np.ones_like(a1)]))
    mask = (np.random.default_rng(dropout_seed * 31 + iteration).random(a1.shape) > 0.5)
    f.append(Op(f"Default/Net/drop-Dropout/native_dropout-op{next(n)}", "drop", [a1],
                [(a1 * mask * 2).astype(dtype), mask]))
    w2t = w2.T.copy()
    f.append(Op(f"Default/Net/fc2-Linear/t-op{next(n)}", "fc2", [w2], [w2t]))
    y = (b2 + a1 @ w2t).astype(dtype)
    f.append(Op(f"Default/Net/fc2-Linear/addmm-op{next(n)}", "fc2", [b2, a1, w2t], [y]))
    scale = np.array(300.0 if overflow_at is not None and iteration == overflow_at else 1.0, dtype=dtype)
    ys = (y * scale).astype(dtype)
    f.append(Op(f"Default/Net/mul-op{next(n)}", "mul", [y, scale], [ys]))
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(ys).astype(dtype)
        s = np.array(e.sum(dtype=np.float64), dtype=dtype)
    f.append(Op(f"Default/Net/exp-op{next(n)}", "exp", [ys], [e]))
    f.append(Op(f"Default/Net/sum-op{next(n)}", "sum", [e], [s]))
    # backward graph
    b: List[Op] = []
    with np.errstate(over="ignore", invalid="ignore"):
        ge = np.ones_like(e)
        gy = (ge * e * scale).astype(dtype)
        b.append(Op("Gradients/Default/Net/exp-op0", "exp", [ge, e], [gy]))
        gw2 = (gy.T @ a1).astype(dtype)
        b.append(Op("Gradients/Default/Net/fc2-Linear/mm-op1", "fc2", [gy.T.copy(), a1], [gw2]))
    params = {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2, "inputs0": x}
    return f, b, params


def _ir_text(graph_id: int, ops: List[Op], style: str) -> str:
    lines = [f"# IR entry: @kernel_graph{graph_id}", "", f"subgraph @kernel_graph{graph_id}() {{"]
    for i, op in enumerate(ops):
        def tt(arrs):
            return ", ".join(f"<Tensor[{DTYPE_NAME.get(a.dtype, 'Float32')}], ({', '.join(str(d) for d in a.shape)})>"
                             for a in arrs)
        lines.append(f"  %{i}(x{i}) = PrimFunc_{op.op_type}(%{max(0, i - 1)}) {{instance name: {op.op_type}}}")
        lines.append(f"      : ({tt(op.inputs)}) -> ({tt(op.outputs)})")
        line, code = LINES[op.key], CODE[op.key]
        if style == "seed":
            lines.append(f"      : full_name_with_scope: ({op.full_name})")
            lines.append("      ...")
            lines.append(f"      # In file ./model.py({line})/        {code}/")
        else:
            lines.append(f"      # Fullname with scope: ({op.full_name})")
            lines.append(f"      # In file {LIB_MODULE}:1750~1762, 4~20/    def _call_impl(self, *args, **kwargs):/")
            lines.append(f"      # In file {MODEL_FILE}:10~20, 4~21/    def forward(self, x):/")
            lines.append(f"      # In file {MODEL_FILE}:{line}, 8~30/        {code}/")
            if op.key in ("fc1", "fc2") and op.library_frames:
                lines.append(f"      # In file {LIB_LINEAR}:125, 15~55/        return F.linear(input, self.weight, self.bias)/")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _json_text(graph_id: int, ops: List[Op], kind: str) -> str:
    doc = {"format": "opdump-graph-1", "graph_id": graph_id, "kind": kind, "ops": []}
    for i, op in enumerate(ops):
        src = [{"file": MODEL_FILE, "line": LINES[op.key], "code": CODE[op.key], "function": "forward"}]
        if op.key in ("fc1", "fc2"):
            src.append({"file": LIB_LINEAR, "line": 125, "code": "return F.linear(input, self.weight, self.bias)",
                        "function": "forward"})
        doc["ops"].append({
            "index": i, "full_name": op.full_name, "op_type": op.op_type, "overload": "default",
            "scope": op.full_name.rsplit("/", 1)[0],
            "inputs": [{"shape": list(a.shape), "dtype": DTYPE_NAME.get(a.dtype, "Float32")} for a in op.inputs],
            "outputs": [{"shape": list(a.shape), "dtype": DTYPE_NAME.get(a.dtype, "Float32")} for a in op.outputs],
            "source": src, "args": {},
        })
    return json.dumps(doc, indent=1)


def make_dump(root, *, iterations: Iterable[int] = (0, 1), saved_data: str = "tensor",
              stats: Sequence[str] = ("max", "min", "l2norm"), graph_files: Sequence[str] = ("json",),
              rank: int = 0, net: str = "Net", manifest: Optional[bool] = True, quote_shape: bool = True,
              long_names: bool = False, with_params: bool = True, **sim) -> Path:
    """Write a dump under ``root`` (created); returns ``root``. ``graph_files``: any of
    ``json`` (opdump), ``ir`` (MindSpore 2.x style), ``ir_seed`` (seed style)."""
    root = Path(root)
    rdir = root / f"rank_{rank}"
    (rdir / ".dump_metadata").mkdir(parents=True, exist_ok=True)
    (rdir / ".dump_metadata" / "data_dump.json").write_text(json.dumps(
        {"common_dump_settings": {"op_debug_mode": 0, "dump_mode": 0, "path": str(root), "net_name": net,
                                  "iteration": "all", "saved_data": saved_data, "input_output": 0,
                                  "kernels": [], "support_device": [0], "statistic_category": list(stats)},
         "e2e_dump_settings": {"enable": True, "trans_flag": True}}))
    (rdir / ".dump_metadata" / "config.json").write_text(json.dumps({"device_target": "CPU", "opdump_version": "test"}))
    if manifest is not None:
        (rdir / ".dump_metadata" / "manifest.json").write_text(json.dumps({"complete": manifest, "tool": "opdump"}))
    ts = [1_700_000_000_000_000 + rank * 10_000_000]
    graphs_written = False
    its = list(iterations)
    for it in its:
        fwd, bwd, params = simulate(it, **sim)
        if not graphs_written:
            (rdir / "graphs").mkdir(exist_ok=True)
            (rdir / "execution_order").mkdir(exist_ok=True)
            for gid, ops, kind in ((0, fwd, "forward"), (1, bwd, "backward")):
                if "json" in graph_files:
                    (rdir / "graphs" / f"ms_output_trace_code_graph_{gid}.json").write_text(_json_text(gid, ops, kind))
                if "ir" in graph_files:
                    (rdir / "graphs" / f"ms_output_trace_code_graph_{gid}.ir").write_text(_ir_text(gid, ops, "ms"))
                elif "ir_seed" in graph_files:
                    (rdir / "graphs" / f"ms_output_trace_code_graph_{gid}.ir").write_text(_ir_text(gid, ops, "seed"))
                (rdir / "execution_order" / f"ms_execution_order_graph_{gid}.csv").write_text(
                    "NodeExecutionOrder-FullNameWithScope\n" + "".join(o.full_name + "\n" for o in ops))
                (rdir / "execution_order" / f"ms_global_execution_order_graph_{gid}.csv").write_text(
                    "".join(f"{i}\n" for i in its))
            graphs_written = True
        for gid, ops in ((0, fwd), (1, bwd)):
            d = rdir / net / str(gid) / str(it)
            d.mkdir(parents=True, exist_ok=True)
            stat_rows = []
            mapping = []

            def save(op_type, op_name, io, slot, arr):
                ts[0] += 17
                dt = DTYPE_NAME.get(arr.dtype, "Float32")
                name = f"{sanitize(op_type)}.{sanitize(op_name)}.0.0.{ts[0]}.{io}.{slot}.DefaultFormat.{dt}.npy"
                if saved_data in ("tensor", "full"):
                    fname = name
                    if long_names or len(name.encode()) > 255:
                        fname = f"{abs(hash(name)) % 10**18:018d}.npy"
                        mapping.append((fname, name))
                    np.save(d / fname, arr, allow_pickle=False)
                if saved_data in ("statistic", "full"):
                    shape = "(" + ",".join(str(s) for s in arr.shape) + ")"
                    stat_rows.append([op_type, op_name, "0", "0", str(ts[0]), io, str(slot), str(arr.nbytes),
                                      dt.lower() if False else dt, shape] + _stat_row(arr, stats))

            if gid == 0 and with_params:
                for pn, pa in params.items():
                    save("Parameter", pn, "output", 0, pa)
            for op in ops:
                for i, a in enumerate(op.inputs):
                    save(op.op_type, op.full_name, "input", i, np.asarray(a))
                for i, a in enumerate(op.outputs):
                    save(op.op_type, op.full_name, "output", i, np.asarray(a))
            if stat_rows:
                with open(d / "statistic.csv", "w", newline="") as fh:
                    header = ["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size",
                              "Data Type", "Shape"] + [STAT_HEADER[c] for c in stats]
                    if quote_shape:
                        w = csv.writer(fh)
                        w.writerow(header)
                        w.writerows(stat_rows)
                    else:
                        fh.write(",".join(header) + "\n")
                        for r in stat_rows:
                            fh.write(",".join(r) + "\n")
            if mapping:
                with open(d / "mapping.csv", "w") as fh:
                    for a, b in mapping:
                        fh.write(f"{a},{b}\n")
    return root


def file_of(root, op_full_name: str, io: str, slot: int, iteration: int = 0, graph: int = 0, rank: int = 0,
            net: str = "Net") -> Path:
    d = Path(root) / f"rank_{rank}" / net / str(graph) / str(iteration)
    key = f".{sanitize(op_full_name)}.0.0."
    for p in d.iterdir():
        if key in p.name and f".{io}.{slot}." in p.name:
            return p
    raise FileNotFoundError(op_full_name)


MS_SAMPLE = Path(__file__).resolve().parent / "data" / "mindspore_cpu_mlp"     # copy of shared/samples/
