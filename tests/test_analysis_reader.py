"""Reader: the real MindSpore sample, synthetic dumps in every variant of the layout."""
import json
import os
import shutil
import warnings

import numpy as np
import pytest

from analysis_fixtures import MS_SAMPLE, make_dump
from opdump.analysis.reader import (DumpError, load_statistics, open_dump, parse_source_line,
                                    parse_tensor_filename, sanitize)

needs_sample = pytest.mark.skipif(not MS_SAMPLE.is_dir(), reason=f"MindSpore sample dump not found at {MS_SAMPLE}")


@needs_sample
def test_mindspore_sample_objects_and_tables():
    d = open_dump(MS_SAMPLE)
    assert d.rank_ids == [0] and d.graph_ids == [0] and d.iterations == [0, 1]
    assert d.ranks[0].config["ms_version"] == "2.10.0"
    assert d.ranks[0].complete is None           # MindSpore writes no manifest
    g = d.graph(0)
    assert len(g.execution_order) == 18 and g.iterations_run == [0, 1]
    t = d.tensors()
    assert len(t) == 180
    assert set(t["dtype"]) >= {"Float32", "Bool", "Int64", "Int32"}
    # every op file is mapped back to a full name of the execution order
    ops_t = t[t["kind"] == "op"]
    assert set(ops_t["op"]) == set(g.execution_order)
    mm = ops_t[(ops_t["op"] == "Default/network-WithLossCell/_backbone-TinyMLP/fc1-Dense/MatMul-op0")
               & (ops_t["iteration"] == 0)]
    assert list(zip(mm["io"], mm["slot"])) == [("input", 0), ("input", 1), ("input", 2), ("input", 3), ("output", 0)]
    assert list(mm["shape"]) == ["(4,8)", "(16,8)", "()", "()", "(4,16)"]
    # execution order: first op of iteration 0 is fc1 MatMul, parameters last
    it0 = d.records()[d.records()["iteration"] == 0]
    assert it0.iloc[0]["op"].endswith("fc1-Dense/MatMul-op0")
    assert (it0.iloc[-13:]["kind"] == "parameter").all()
    ops = d.ops()
    assert len(ops) == 18
    row = ops[ops["full_name"].str.endswith("fc2-Dense/BiasAdd-op0")].iloc[0]
    assert row["file"] == "/home/user/ms/train.py" and row["line"] == 67 and row["kind"] == "forward"
    bw = ops[ops["full_name"].str.startswith("Gradients/")]
    assert set(bw["kind"]) == {"backward"}
    # lazy, memory-mapped, no pickle
    tf = next(f for f in d.tensor_files(iteration=0) if f.io == "output" and f.op_type == "MatMul")
    arr = tf.load()
    assert isinstance(arr, np.memmap) and arr.shape == tf.shape
    assert d.statistics().empty


@needs_sample
def test_open_rank_folder_and_inner_folder():
    a = open_dump(MS_SAMPLE / "rank_0")
    b = open_dump(MS_SAMPLE / "rank_0" / "MLP" / "0" / "1")
    assert a.rank_ids == b.rank_ids == [0]
    assert len(a.tensors(with_shape=False)) == len(b.tensors(with_shape=False)) == 180


def test_parse_tensor_filename_variants():
    p = parse_tensor_filename("Conv2D.Default_net_Conv2D-op12.0.0.1623124369613540.output.0.DefaultFormat.Float16.npy")
    assert p["op_type"] == "Conv2D" and p["op_file"] == "Default_net_Conv2D-op12" and p["io"] == "output"
    assert p["slot"] == 0 and p["dtype"] == "Float16" and p["format"] == "DefaultFormat"
    old = parse_tensor_filename("Conv2D.Conv2D-op12.0.0.1623124369613540.output.0.DefaultFormat.npy")
    assert old["dtype"] is None and old["op_file"] == "Conv2D-op12" and old["timestamp"] == 1623124369613540
    seed_ex = parse_tensor_filename("Conv2D.Conv2D-op12.0.0.1623124369613540.output.0.DefaultFormat.float16.npy")
    assert seed_ex["dtype"] == "float16"
    par = parse_tensor_filename("Parameter.data-3.0.0.1700.output.0.DefaultFormat.Int64.npy")
    assert par["op_type"] == "Parameter" and par["op_file"] == "data-3"
    bw = parse_tensor_filename("convolution_backward.Gradients_Default_A_conv-Conv2d_convolution_backward-op3."
                               "0.7.1700.input.2.NCHW.BFloat16.npy")
    assert bw["op_type"] == "convolution_backward" and bw["stream_id"] == 7 and bw["slot"] == 2
    assert parse_tensor_filename("statistic.csv") is None
    assert parse_tensor_filename("random_name.npy") is None


def test_parse_source_lines():
    seed = parse_source_line("# In file ./tain_alexnet.py(175)/        x = self.conv3(x)/")
    assert (seed.file, seed.line, seed.code) == ("./tain_alexnet.py", 175, "x = self.conv3(x)")
    ms = parse_source_line("      # In file /home/u/train.py:59~60, 8~27/        x = self.fc1(x)/")
    assert (ms.file, ms.line, ms.line_end, ms.col, ms.col_end) == ("/home/u/train.py", 59, 60, 8, 27)
    single = parse_source_line("# In file /home/u/train.py:67, 34~42/        return self.fc2(x)/")
    assert single.line == 67 and single.line_end is None and single.covers(67)
    d = parse_source_line("# In file /home/u/train.py:66~80, 4~47/    def construct(self, x):/")
    assert d.covers(66) and not d.covers(67)      # a def frame only stands for its first line
    assert parse_source_line("# Fullname with scope: (X)") is None


def test_synthetic_full_dump_statistics_join(tmp_path):
    make_dump(tmp_path / "d", saved_data="full", stats=["max", "min", "avg", "nan count", "md5", "l2norm"],
              graph_files=("ir",), quote_shape=False)
    d = open_dump(tmp_path / "d")
    rec = d.records()
    assert rec["path"].notna().all() and rec["stat_row"].all()        # every tensor got its statistics row
    st = load_statistics(tmp_path / "d")
    assert {"rank", "graph", "iteration", "op", "io", "slot", "max", "min", "avg", "nan_count", "md5",
            "l2norm", "shape"} <= set(st.columns)
    row = st[(st["op"] == "Default/Net/fc1-Linear/t-op0") & (st["io"] == "input") & (st["iteration"] == 0)].iloc[0]
    arr = np.load(rec[(rec["op"] == row["op"]) & (rec["io"] == "input") & (rec["iteration"] == 0)].iloc[0]["path"])
    assert row["shape"] == "(16,8)"                     # an unquoted (16,8) was glued back together
    assert row["max"] == pytest.approx(float(arr.max())) and row["nan_count"] == 0
    # graphs 0 (forward) and 1 (backward): forward ops come first in each iteration
    it1 = rec[rec["iteration"] == 1]
    g = list(it1[it1["kind"] == "op"]["graph"])
    assert g == sorted(g) and g[0] == 0 and g[-1] == 1


def test_statistics_only_dump(tmp_path):
    make_dump(tmp_path / "s", saved_data="statistic", graph_files=())
    d = open_dump(tmp_path / "s")
    assert not d.has_tensors and d.has_statistics
    st = d.statistics()
    assert len(st) > 40 and st["path"].isna().all() if "path" in st else True
    ops = set(st["op"])
    assert "Default/Net/exp-op9" in ops and "Parameter.fc2_weight" in ops
    assert d.tensors().empty


def test_long_names_mapping_csv_and_loose_folder(tmp_path):
    make_dump(tmp_path / "m", long_names=True, graph_files=("json",), iterations=(0,))
    folder = tmp_path / "m" / "rank_0" / "Net" / "0" / "0"
    assert (folder / "mapping.csv").is_file()
    assert all(n[0].isdigit() for n in os.listdir(folder) if n.endswith(".npy"))
    d = open_dump(tmp_path / "m")
    t = d.tensors()
    assert "Default/Net/fc2-Linear/addmm-op7" in set(t["op"])
    # a bare folder of dump files reads as rank 0 / graph 0 / iteration 0
    loose = tmp_path / "loose"
    shutil.copytree(tmp_path / "m" / "rank_0" / "Net" / "0" / "0", loose)
    dl = open_dump(loose)
    assert dl.loose and len(dl.tensors()) == len(t[t["graph"] == 0])


def test_incomplete_manifest_warns_and_errors(tmp_path):
    make_dump(tmp_path / "i", manifest=False, iterations=(0,))
    with pytest.warns(UserWarning, match="incomplete"):
        d = open_dump(tmp_path / "i")
    assert d.complete is False
    with pytest.raises(DumpError, match="no such"):
        open_dump(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DumpError, match="not a dump"):
        open_dump(tmp_path / "empty")


def test_two_ranks(tmp_path):
    make_dump(tmp_path / "r", rank=0, iterations=(0,))
    make_dump(tmp_path / "r", rank=1, iterations=(0,))
    d = open_dump(tmp_path / "r")
    assert d.rank_ids == [0, 1]
    t = d.tensors(with_shape=False)
    assert set(t["rank"]) == {0, 1}
    assert sanitize("Default/a b.c\\d") == "Default_a_b_c_d"


def test_acl_layout_with_npy_files(tmp_path):
    make_dump(tmp_path / "ms", iterations=(0, 1), graph_files=())
    # re-home the iteration folders into {dump_path}/worldsize2_global_rank1/{time}/{device}/{model}/{model_id}/{it}
    for it in (0, 1):
        src = tmp_path / "ms" / "rank_0" / "Net" / "0" / str(it)
        dst = tmp_path / "acl" / "worldsize2_global_rank1" / "20260101120000" / "0" / "Net" / "3" / str(it)
        shutil.copytree(src, dst)
    (dst / "Conv2D.Default_conv-op1.2.7.161243956333802").write_bytes(b"\0" * 8)   # raw protobuf file
    with pytest.warns(UserWarning, match="1 Ascend protobuf"):
        d = open_dump(tmp_path / "acl")
    assert d.layout == "acl" and d.rank_ids == [1] and d.graph_ids == [3] and d.iterations == [0, 1]
    t = d.tensors(with_shape=False)
    assert len(t) == len(open_dump(tmp_path / "ms").tensors(with_shape=False)[lambda x: x["graph"] == 0])


MS_STYLE_IR = """# IR entry: @1_Net_construct
# In file net.py:10~14, 4~16/    def construct(self, x, y):/
subgraph @1_Net_construct() {
  %0(CNode_1$a) = PrimFunc_Sub(%para1_x, Tensor(shape=[], dtype=Float32, value=1)) cnode_attrs: {checkpoint: Bool(1)}
      : (<Tensor[Float32], ()>, <Tensor[Float32], (), value=...>) -> (<Tensor[Float32], ()>)
      # Fullname with scope: (Default/Sub-op0)
      # In file net.py:10~14, 4~16/    def construct(self, x, y):/
      # In file net.py:11, 12~25/        a = ops.sub(x, 1)/
      # In file net.py:11, 12~19/        a = ops.sub(x, 1)/<~~This line of code can be shared by multiple nodes, and may be duplicated./
      # In file /env/lib/python3.9/site-packages/mindspore/ops/auto_generate/gen_ops_def.py:370, 11~31/    return sub_op(x, y)/
  %1(CNode_2$b) = PrimFunc_Add(%0, %para2_y) cnode_attrs: {checkpoint: Bool(1)}
      : (<Tensor[Float32], ()>, <Tensor[Float32], ()>) -> (<Tensor[Float32], ()>)
      # Fullname with scope: (Default/Add-op0)
      # In file net.py:12, 12~25/        b = ops.add(a, y)/
  Return(%1) cnode_attrs: {checkpoint: Bool(1)}
      : (<Tensor[Float32], ()>)
      # Fullname with scope: (Default/Return-op0)
      # In file net.py:13, 8~16/        return b/
}
"""
MS_STYLE_CSV = (
    "Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,L2Norm Value\n"
    'Sub,Default_Sub-op0,0,0,1733905446819790,input,0,4,float32,"()",3,3,3,\n'
    'Sub,Default_Sub-op0,0,0,1733905446820357,input,1,4,float32,"()",1,1,1,\n'
    'Sub,Default_Sub-op0,0,0,1733905446820495,output,0,4,float32,"()",2,2,2,\n'
    'Add,Default_Add-op0,0,0,1733905446822806,input,0,4,float32,"()",2,2,2,\n'
    'Add,Default_Add-op0,0,0,1733905446822996,input,1,4,float32,"()",inf,inf,inf,\n'
    'Add,Default_Add-op0,0,0,1733905446823151,output,0,4,float32,"()",inf,inf,inf,\n')


def test_mindspore_statistic_dump_with_sanitized_names_and_shared_line_notes(tmp_path):
    r = tmp_path / "ms" / "rank_0"
    (r / "graphs").mkdir(parents=True)
    (r / "graphs" / "ms_output_trace_code_graph_0.ir").write_text(MS_STYLE_IR)
    (r / "execution_order").mkdir()
    (r / "execution_order" / "ms_execution_order_graph_0.csv").write_text(
        "NodeExecutionOrder-FullNameWithScope\nDefault/Sub-op0\nDefault/Add-op0\n")
    (r / "Net" / "0" / "0").mkdir(parents=True)
    (r / "Net" / "0" / "0" / "statistic.csv").write_text(MS_STYLE_CSV)
    d = open_dump(tmp_path / "ms")
    sub = d.op_info("Default/Sub-op0")
    assert [f.line for f in sub.sources][-1] == 370 and sub.user_frame.line == 11
    assert sub.user_frame.code == "a = ops.sub(x, 1)"
    assert d.op_info("Default/Add-op0").sources[-1].line == 12       # Return's lines are not Add's
    st = d.statistics()
    assert list(st["op"].unique()) == ["Default/Sub-op0", "Default/Add-op0"]
    assert len(st) == 6 and st["l2norm"].iloc[2] == 2.0
    from opdump.analysis.overflow import find_overflow
    rep = find_overflow(d, progress=False)
    assert rep.origin.op == "Default/Add-op0" and rep.origin.kind == "input"


# ---------------------------------------------------------------------- each iteration's own order
def _write_iteration(root, iteration, names, timestamps, order=None):
    """An iteration folder with one output file per operator (written with numpy, names
    built by hand), and optionally its own execution-order CSV."""
    d = root / "rank_0" / "Net" / "0" / str(iteration)
    d.mkdir(parents=True)
    for i, (name, ts) in enumerate(zip(names, timestamps)):
        op_type = name.rsplit("/", 1)[1].rsplit("-op", 1)[0]
        np.save(d / f"{op_type}.{sanitize(name)}.0.0.{ts}.output.0.DefaultFormat.Float32.npy",
                np.full(2, float(i), np.float32))
    if order is not None:
        (d / "ms_execution_order_graph_0.csv").write_text(
            "NodeExecutionOrder-FullNameWithScope\n" + "".join(n + "\n" for n in order))


def test_records_follow_each_iterations_own_execution_order(tmp_path):
    """Iteration 1 took a branch (an extra operator first), so every later operator has a
    name iteration 0 never had.  Their timestamps cross a 1000-microsecond boundary: ordering
    by timestamp digits put ``exp`` before ``mul``; the iteration's own order is right."""
    it0 = ["Default/M/relu-op0", "Default/M/mul-op1", "Default/M/exp-op2", "Default/M/sum-op3"]
    it1 = ["Default/M/relu-op0", "Default/M/where-op1", "Default/M/mul-op2", "Default/M/exp-op3",
           "Default/M/sum-op4"]
    (tmp_path / "rank_0" / "execution_order").mkdir(parents=True)
    (tmp_path / "rank_0" / "execution_order" / "ms_execution_order_graph_0.csv").write_text(
        "NodeExecutionOrder-FullNameWithScope\n" + "".join(n + "\n" for n in it0))
    _write_iteration(tmp_path, 0, it0, [1000, 1100, 1200, 1300], order=it0)
    _write_iteration(tmp_path, 1, it1, [1990, 1995, 1998, 2003, 2004], order=it1)
    d = open_dump(tmp_path)
    rec = d.records()
    assert list(rec[rec["iteration"] == 1]["op"]) == it1          # before: relu, exp, sum, where, mul
    assert list(rec[rec["iteration"] == 0]["op"]) == it0
    # the operators only iteration 1 ran are operators of the graph
    assert {o.full_name for o in d.graph(0).ops} == set(it0) | set(it1)
    assert d.op_info("Default/M/where-op1") is not None
    # without per-iteration orders, unknown operators follow their timestamps (not their digits)
    (tmp_path / "rank_0" / "Net" / "0" / "1" / "ms_execution_order_graph_0.csv").unlink()
    rec = open_dump(tmp_path).records()
    assert list(rec[rec["iteration"] == 1]["op_file"]) == [sanitize(n) for n in it1]


def test_tensor_files_is_a_list_as_the_readme_shows(tmp_path):
    make_dump(tmp_path / "d")
    d = open_dump(tmp_path / "d")
    files = d.tensor_files()
    assert isinstance(files, list) and files
    assert files[0].load().shape == files[0].shape
    assert d.tensor_files(iteration=1) and all(t.iteration == 1 for t in d.tensor_files(iteration=1))


def test_demo_reads_its_dump_through_the_reader(tmp_path):
    """``opdump demo`` (a real run, in a subprocess) summarises its dump with the reader:
    the per-iteration tensor counts it prints are the files on disk, and it finds the
    operators of ``x = self.conv3(x)`` (forward and backward)."""
    import subprocess
    import sys
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "opdump", "demo", "--out", str(out), "--steps", "2",
                           "--iteration", "0", "--backend", "eager"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    root = out / "dump" / "rank_0" / "AlexNet"
    rows = [ln.split() for ln in text.splitlines() if ln.strip().startswith("0 ") and len(ln.split()) == 8]
    assert rows, text
    for rank, graph, it, ops, params, tensors, stat_rows, size in rows:
        on_disk = [f for f in os.listdir(root / graph / it) if f.endswith(".npy")]
        assert int(tensors) == len(on_disk)
    assert "conv3-Conv2d/convolution-op" in text and "conv3-Conv2d/convolution_backward-op" in text
    assert "no NaN/Inf found" in text


def test_eager_iteration_that_takes_a_branch_is_read_in_its_own_order(tmp_path):
    """A real eager run: iteration 1 takes a branch that makes a NaN before the usual
    operators, so its operators' names differ from iteration 0's from there on.  The reader
    orders iteration 1 by its own execution order and overflow names the branch's operator,
    not a later victim.  (The sleeps spread the timestamps over several milliseconds, where
    ordering by timestamp digits went wrong.)"""
    import time

    import torch

    import opdump
    from opdump.analysis.overflow import find_overflow
    from opdump.capture.eager import EagerCapture
    from opdump.config import DumpConfig, IterationSpec

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.step = 0

        def forward(self, x):
            x = x + 1                                # named alike in both iterations
            if self.step == 1:
                x = x * float("nan")                 # the origin, iteration 1 only
            for fn in (torch.sin, torch.cos, torch.exp, torch.tanh, torch.sigmoid, torch.neg):
                time.sleep(0.0004)
                x = fn(x)
            return self.fc(x).sum()

    model = Net()
    cfg = DumpConfig(path=str(tmp_path), iteration=IterationSpec(ranges=((0, 1),)), saved_data="full",
                     statistic_category=("max", "min", "nan count"))
    with opdump.Session(cfg) as session, EagerCapture(session, root_modules=[model]):
        for step in range(2):
            model.step = step
            model(torch.ones(2, 4))
            session.step()
    d = open_dump(tmp_path)
    own = (tmp_path / "rank_0" / "Net" / "0" / "1" / "ms_execution_order_graph_0.csv").read_text().split("\n")[1:]
    own = [n for n in own if n]
    rec = d.records()
    ops1 = rec[(rec["iteration"] == 1) & (rec["kind"] == "op")]
    assert list(dict.fromkeys(ops1["op"])) == list(dict.fromkeys(own))
    assert own[1].endswith("/mul-op1")
    rep = find_overflow(d, progress=False)
    assert rep.origin is not None and rep.origin.iteration == 1 and rep.origin.op == own[1]
