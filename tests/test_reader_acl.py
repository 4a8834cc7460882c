"""The reader on the ACL/GE layout and Ascend bin files (issue 22 item 5).

The dumps here are built with the format's own codec (opdump.format.ascend_bin.encode)
and layout names (opdump.format.acl_layout); device-format arrays are built with
explicit index loops written in this file (independent of device_formats), so the
reader's conversion is checked against an outside reference. The npy (MindSpore
layout) dump of the same values is written with plain np.save under the documented
file names. `opdump ls` / `opdump compare` run as real subprocesses.
"""
import itertools
import os
import re
import subprocess
import sys
import warnings

import pandas as pd
import numpy as np
import pytest

import opdump
from opdump.format import acl_layout as al
from opdump.format import ascend_bin
from opdump.format.layout import EXECUTION_ORDER_DIR, execution_order_file_name, render_execution_order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TS = 1_700_000_000_000_000


# ---- independent device-format builders (loops over host indices) -------------------

def nc1hwc0(x, c0=16):
    n_, c_, h_, w_ = x.shape
    c1 = (c_ + c0 - 1) // c0
    dev = np.zeros((n_, c1, h_, w_, c0), x.dtype)
    for n, c, h, w in itertools.product(*map(range, x.shape)):
        dev[n, c // c0, h, w, c % c0] = x[n, c, h, w]
    return dev


def fractal_z(x, c0=16):
    n_, c_, h_, w_ = x.shape
    c1, n1 = (c_ + c0 - 1) // c0, (n_ + 15) // 16
    dev = np.zeros((c1 * h_ * w_, n1, 16, c0), x.dtype)
    for n, c, h, w in itertools.product(*map(range, x.shape)):
        dev[(c // c0) * h_ * w_ + h * w_ + w, n // 16, n % 16, c % c0] = x[n, c, h, w]
    return dev


def fractal_nz(x, w0=16):
    h_, w_ = x.shape
    dev = np.zeros(((w_ + w0 - 1) // w0, (h_ + 15) // 16, 16, w0), x.dtype)
    for h, w in itertools.product(range(h_), range(w_)):
        dev[w // w0, h // 16, h % 16, w % w0] = x[h, w]
    return dev


def bf16_bytes(values):
    """float32 values exactly representable in bfloat16 -> their bf16 bytes."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype("<u2")


# ---- the operators of the test model -------------------------------------------------

def model_tensors(seed=0):
    """{full name: (op_type, [inputs], [outputs])} in execution order, host values."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 19, 3, 3)).astype(np.float16)
    w = rng.standard_normal((5, 19, 2, 2)).astype(np.float16)
    y = rng.standard_normal((2, 5, 2, 2)).astype(np.float16)
    a = rng.standard_normal((17, 20)).astype(np.float16)
    b = rng.standard_normal((20, 3)).astype(np.float16)
    bf = np.array([[1.0, -2.5, 0.15625], [3.0, 0.0, -0.5]], np.float32)   # bf16-exact
    return {
        "Default/network/Conv2D-op1": ("Conv2D", [x, w], [y]),
        "Default/network/MatMul-op2": ("MatMul", [a, b], [(a.astype(np.float32) @ b).astype(np.float16)]),
        "Default/network/Cast-op3": ("Cast", [bf], [bf]),
    }


def write_bin(folder, full_name, op_type, inputs, outputs, ts, device=True):
    """One bin file of an operator; device formats as a real Ascend dump would hold them."""
    ins, outs = [], []
    for kind, arrays, dst in (("input", inputs, ins), ("output", outputs, outs)):
        for i, v in enumerate(arrays):
            if op_type == "Cast" and kind == "output":     # bf16 output
                dst.append(ascend_bin.RawTensor(bf16_bytes(v), "bfloat16", v.shape))
            elif device and v.ndim == 4 and (op_type, kind, i) == ("Conv2D", "input", 1):
                dst.append(ascend_bin.RawTensor(fractal_z(v), "float16", fractal_z(v).shape, "FRACTAL_Z", v.shape))
            elif device and v.ndim == 4:
                dst.append(ascend_bin.RawTensor(nc1hwc0(v), "float16", nc1hwc0(v).shape, "NC1HWC0", v.shape))
            elif device and v.ndim == 2 and op_type == "MatMul":
                dst.append(ascend_bin.RawTensor(fractal_nz(v), "float16", fractal_nz(v).shape, "FRACTAL_NZ",
                                                v.shape))
            else:
                dst.append(v)
    name = al.bin_file_name(op_type, full_name, 0, 0, ts)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(b"".join(bytes(b) for b in ascend_bin.encode(full_name, ins, outs, timestamp=ts)))
    return name


def write_order(rank_folder, names, graph=0):
    d = os.path.join(rank_folder, EXECUTION_ORDER_DIR)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, execution_order_file_name(graph)), "w") as f:
        f.write(render_execution_order(names))


def acl_dump(root, ops, world=None, device_id=0, iterations=(0,), single_op=False):
    """The ACL/GE layout of ``ops`` under ``root`` (dump_path); returns the rank folder."""
    rank_folder = os.path.join(root, *al.rank_parts("20261123120000", device_id, world))
    for itn in iterations:
        folder = rank_folder if single_op else os.path.join(rank_folder, *al.data_parts(0, itn))
        os.makedirs(folder, exist_ok=True)
        for k, (fn, (op_type, ins, outs)) in enumerate(ops.items()):
            write_bin(folder, fn, op_type, ins, outs, TS + 1000 * itn + k)
    write_order(rank_folder, list(ops))
    return rank_folder


def npy_dump(root, ops, iterations=(0,)):
    """The MindSpore layout of the same values (np.save under the documented names)."""
    rank_folder = os.path.join(root, "rank_0")
    for itn in iterations:
        folder = os.path.join(rank_folder, "Net", "0", str(itn))
        os.makedirs(folder, exist_ok=True)
        for k, (fn, (op_type, ins, outs)) in enumerate(ops.items()):
            stem = f"{op_type}.{fn.replace('/', '_')}.0.0.{TS + 1000 * itn + k}"
            for kind, arrays in (("input", ins), ("output", outs)):
                for i, v in enumerate(arrays):
                    dt = "BFloat16" if op_type == "Cast" and kind == "output" else \
                        {"float16": "Float16", "float32": "Float32"}[v.dtype.name]
                    np.save(os.path.join(folder, f"{stem}.{kind}.{i}.DefaultFormat.{dt}.npy"), v)
    write_order(rank_folder, list(ops))
    return rank_folder


def cli(cwd, *args):
    """A real ``opdump`` subprocess run in ``cwd`` (compare writes its table there)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "opdump", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def written(ops):
    """{(full name, io, slot): host array} of ``ops``."""
    return {(fn, kind, i): v for fn, (_t, ins, outs) in ops.items()
            for kind, arrays in (("input", ins), ("output", outs)) for i, v in enumerate(arrays)}


# ---- tests ---------------------------------------------------------------------------

def test_load_reads_every_tensor_of_the_bin_files(tmp_path):
    ops = model_tensors()
    acl_dump(str(tmp_path / "dump"), ops, iterations=(0, 1))
    d = opdump.load(tmp_path / "dump")
    assert d.layout == "acl" and d.rank_ids == [0] and d.iterations == [0, 1]
    rec = d.records()
    want = written(ops)
    assert len(rec) == 2 * len(want)
    for itn in (0, 1):
        got = rec[rec["iteration"] == itn]
        assert list(dict.fromkeys(got["op"])) == list(ops)            # execution order, full names back
        for r in got.itertuples():
            v = want[(r.op, r.io, r.slot)]
            a = opdump.analysis.reader.load_array(r.path)
            assert a.shape == v.shape and a.dtype == v.dtype
            np.testing.assert_array_equal(a, v)
            assert r.format == "DefaultFormat"
    casts = rec[(rec["op_type"] == "Cast") & (rec["io"] == "output")]
    assert set(casts["dtype"]) == {"BFloat16"}                       # bf16 read as float32, named BFloat16
    # shapes from the bin headers, before anything is converted
    tens = d.tensors()
    assert set(tens.loc[tens["op"] == "Default/network/Conv2D-op1", "shape"]) == {"(2,19,3,3)", "(5,19,2,2)",
                                                                                   "(2,5,2,2)"}


def test_tensor_file_load_and_dump_folder_untouched(tmp_path):
    ops = model_tensors()
    rank_folder = acl_dump(str(tmp_path / "dump"), ops)
    before = sorted(os.path.relpath(os.path.join(dp, f), tmp_path) for dp, _, fs in os.walk(tmp_path) for f in fs)
    d = opdump.load(rank_folder)
    for t in d.tensor_files():
        np.testing.assert_array_equal(t.load(), written(ops)[(t.op, t.io, t.slot)])
    after = sorted(os.path.relpath(os.path.join(dp, f), tmp_path) for dp, _, fs in os.walk(tmp_path) for f in fs)
    assert before == after


@pytest.mark.parametrize("where", ["dump_path", "world", "time", "rank", "data"])
def test_torchair_world_folder_gives_the_rank(tmp_path, where):
    ops = model_tensors()
    root = tmp_path / "dump"
    rank_folder = acl_dump(str(root), ops, world=(2, 1), device_id=0)
    path = {"dump_path": root, "world": root / "worldsize2_global_rank1",
            "time": root / "worldsize2_global_rank1" / "20261123120000", "rank": rank_folder,
            "data": os.path.join(rank_folder, "graph_0", "0", "0")}[where]
    d = opdump.load(path)
    assert d.rank_ids == [1] and d.layout == "acl"
    assert len(d.records()) == len(written(ops))


def test_two_ranks_by_device_id(tmp_path):
    ops = model_tensors()
    for dev in (0, 1):
        acl_dump(str(tmp_path / "dump"), ops, device_id=dev)
    d = opdump.load(tmp_path / "dump")
    assert d.rank_ids == [0, 1]


def test_single_operator_mode(tmp_path):
    ops = model_tensors()
    rank_folder = acl_dump(str(tmp_path / "dump"), ops, single_op=True)
    d = opdump.load(tmp_path / "dump")
    rec = d.records()
    assert set(rec["iteration"]) == {0} and len(rec) == len(written(ops))
    for r in rec.itertuples():
        np.testing.assert_array_equal(opdump.analysis.reader.load_array(r.path), written(ops)[(r.op, r.io, r.slot)])
    assert opdump.load(rank_folder).rank_ids == [0]


def test_mapped_long_name_and_unreadable_file(tmp_path):
    ops = model_tensors()
    rank_folder = acl_dump(str(tmp_path / "dump"), ops)
    folder = os.path.join(rank_folder, "graph_0", "0", "0")
    name = [n for n in os.listdir(folder) if n.startswith("MatMul.")][0]
    short = al.mapped_name(name)
    os.rename(os.path.join(folder, name), os.path.join(folder, short))
    with open(os.path.join(folder, al.MAPPING_FILE), "w") as f:
        f.write(f"{short},{name}\n")
    with open(os.path.join(folder, "Add.Default_Add-op9.0.0.1"), "wb") as f:   # a bin name, garbage inside
        f.write(b"\xff" * 40)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        d = opdump.load(tmp_path / "dump")
    assert any("1 Ascend protobuf (bin) dump files are malformed" in str(x.message) for x in w)
    r = cli(tmp_path, "ls", str(tmp_path / "dump"))        # on the command line: one plain line per warning
    assert r.returncode == 0, r.stderr
    warned = [ln for ln in r.stderr.splitlines() if "malformed" in ln]
    assert len(warned) == 1 and warned[0].startswith("opdump") and "Warning" not in warned[0], r.stderr
    assert not any(".py:" in ln for ln in r.stderr.splitlines()), r.stderr
    rec = d.records()
    mm = rec[rec["op"] == "Default/network/MatMul-op2"]
    assert len(mm) == 3
    for r in mm.itertuples():
        np.testing.assert_array_equal(opdump.analysis.reader.load_array(r.path), written(ops)[(r.op, r.io, r.slot)])


def test_unknown_device_format_is_read_in_device_layout(tmp_path):
    folder = tmp_path / "dump" / "20261123120000" / "0" / "graph_0" / "0" / "0"
    folder.mkdir(parents=True)
    dev = np.arange(2 * 16 * 16, dtype=np.float16).reshape(2, 16, 16)
    raw = ascend_bin.RawTensor(dev, "float16", dev.shape, "FRACTAL_ZN_LSTM", (3, 5))
    with open(folder / al.bin_file_name("Lstm", "Default/Lstm-op1", 0, 0, TS), "wb") as f:
        f.write(b"".join(bytes(b) for b in ascend_bin.encode("Default/Lstm-op1", [], [raw], timestamp=TS)))
    d = opdump.load(tmp_path / "dump")
    (t,) = d.tensor_files()
    assert t.format == "FRACTAL_ZN_LSTM"
    with pytest.warns(UserWarning, match="FRACTAL_ZN_LSTM"):
        a = t.load()
    np.testing.assert_array_equal(a, dev)


def test_statistics_csv_in_the_acl_layout(tmp_path):
    from opdump.format.statistics import statistic_header
    folder = tmp_path / "dump" / "20261123120000" / "0" / "graph_0" / "0" / "3"
    folder.mkdir(parents=True)
    header = statistic_header(["max", "min"])
    rows = [header, ["Conv2D", "Default/network/Conv2D-op1", "0", "0", str(TS), "output", "0", "40", "float16",
                     "(2,5,2,2)", "1.5", "-2"]]
    (folder / al.STATISTIC_FILE).write_text("".join(",".join(r) + "\n" for r in rows))
    st = opdump.load(tmp_path / "dump").statistics()
    assert list(st["op"]) == ["Default/network/Conv2D-op1"] and list(st["iteration"]) == [3]
    assert float(st["max"].iloc[0]) == 1.5


def test_ls_lists_the_bin_tensors(tmp_path):
    ops = model_tensors()
    acl_dump(str(tmp_path / "dump"), ops)
    r = cli(tmp_path, "ls", str(tmp_path / "dump"), "--tensors")
    assert r.returncode == 0, r.stderr
    for fn in ops:
        assert fn in r.stdout
    assert "(2,19,3,3)" in r.stdout
    r = cli(tmp_path, "ls", str(tmp_path / "dump"), "--tensors", "--paths")   # where each is: {bin file}:{io}.{slot}
    assert r.returncode == 0, r.stderr
    assert al.bin_file_name("Conv2D", "Default/network/Conv2D-op1", 0, 0, TS) + ":input.1" in r.stdout


def test_compare_bin_dump_against_npy_dump(tmp_path):
    ops = model_tensors()
    acl_dump(str(tmp_path / "acl"), ops)
    npy_dump(str(tmp_path / "ms"), ops)
    r = cli(tmp_path, "compare", str(tmp_path / "acl"), str(tmp_path / "ms"), "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # the table names a bin tensor by its bin file and slot (its decoded .npy is temporary)
    table = pd.read_csv(tmp_path / "opdump_compare.csv")
    assert len(table) and all(re.fullmatch(r".+/[^/]+\.\d+\.\d+\.\d+:(input|output)\.\d+", p) and
                              os.path.isfile(p.rsplit(":", 1)[0]) for p in table["path_a"]), table["path_a"][:5]
    # the same values but one output changed: compare must see it
    other = model_tensors()
    _t, ins, outs = other["Default/network/MatMul-op2"]
    outs[0] = (outs[0] + np.float16(1)).astype(np.float16)
    npy_dump(str(tmp_path / "ms2"), other)
    r = cli(tmp_path, "compare", str(tmp_path / "acl"), str(tmp_path / "ms2"))
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "MatMul-op2" in r.stdout


# ---- a layout written by opdump's own writer (a real session, real torch) ------------

@pytest.fixture(scope="module")
def real_dumps(tmp_path_factory):
    """The same tiny eager model, two steps, dumped once in the ACL layout (bin files, the
    ACL JSON dialect) and once in the MindSpore layout (.npy); forward hooks capture each
    Linear's output independently."""
    import json

    import torch

    from conftest import write_config
    from opdump.capture.eager import EagerCapture
    from opdump.config.loader import load_config

    tmp = tmp_path_factory.mktemp("real_acl")

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 5)
            self.fc2 = torch.nn.Linear(5, 3)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    x = torch.linspace(-1, 1, 8).reshape(2, 4)

    def run(cfg):
        torch.manual_seed(0)
        model = Tiny()
        seen = {}
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear):
                mod.register_forward_hook(lambda m, a, out, name=name: seen.__setitem__(name, out.detach().clone()))
        with opdump.Session(cfg) as s, EagerCapture(s):
            for _ in range(2):
                model(x)
                s.step()
        return seen

    (tmp / "acl").mkdir()
    (tmp / "acl.json").write_text(json.dumps({"dump": {
        "dump_list": [{"model_name": "graph_0"}], "dump_path": str(tmp / "acl"), "dump_mode": "all",
        "dump_op_switch": "off", "dump_data": "tensor"}}))
    seen = run(load_config(str(tmp / "acl.json")))
    (tmp / "acl_stats").mkdir()
    (tmp / "stats.json").write_text(json.dumps({"dump": {
        "dump_list": [{"model_name": "graph_0"}], "dump_path": str(tmp / "acl_stats"), "dump_mode": "all",
        "dump_op_switch": "off", "dump_data": "stats"}}))
    run(load_config(str(tmp / "stats.json")))
    (tmp / "ms_cfg").mkdir()
    run(load_config(write_config(tmp / "ms_cfg", common={"path": str(tmp / "ms")})))
    return tmp, seen


def test_real_writer_layout_reads_back(real_dumps):
    tmp, seen = real_dumps
    bins = [f for _, _, fs in os.walk(tmp / "acl") for f in fs if al.parse_bin_name(f)]
    assert bins                                                    # the writer wrote bin files
    d = opdump.load(tmp / "acl")
    assert d.layout == "acl" and d.iterations == [0, 1]
    rec = d.records()
    assert rec["path"].notna().all()
    # each Linear's addmm output, step 1, equals the forward hook's copy
    for layer in ("fc1", "fc2"):
        row = rec[(rec["iteration"] == 1) & rec["op"].str.contains(f"{layer}-Linear/addmm")
                  & (rec["io"] == "output")]
        assert len(row) == 1, rec["op"].unique()
        np.testing.assert_array_equal(opdump.analysis.reader.load_array(row["path"].iloc[0]), seen[layer].numpy())
    # every tensor equals the npy (MindSpore layout) dump's of the same run, by op name and slot
    ms = opdump.load(tmp / "ms").records()
    key = ["iteration", "op", "io", "slot", "call"]
    assert sorted(map(tuple, rec[key].astype(str).values)) == sorted(map(tuple, ms[key].astype(str).values))
    by_key = {tuple(map(str, k)): p for k, p in zip(ms[key].values, ms["path"])}
    for k, p in zip(rec[key].values, rec["path"]):
        a = opdump.analysis.reader.load_array(p)
        b = opdump.analysis.reader.load_array(by_key[tuple(map(str, k))])
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_real_writer_compare_bin_against_npy(real_dumps):
    tmp, _ = real_dumps
    r = cli(tmp, "compare", str(tmp / "acl"), str(tmp / "ms"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "tensors: pass" in r.stdout


def test_absent_slot_plain_layout_and_int4(tmp_path):
    """A None argument (DT_UNDEFINED, no bytes) has no record; a plain NHWC tensor is read as
    dumped (format NHWC, like `opdump convert`); int4 is read as int8 values."""
    folder = tmp_path / "dump" / "20261123120000" / "0" / "graph_0" / "0" / "0"
    folder.mkdir(parents=True)
    nhwc = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    q = np.array([-8, -1, 0, 3, 7], np.int8)
    ins = [ascend_bin.RawTensor(nhwc, "float32", nhwc.shape, "NHWC"), ascend_bin.RawTensor(b"", 0, ())]
    outs = [ascend_bin.RawTensor(ascend_bin.pack_int4(q), "int4", q.shape)]
    with open(folder / al.bin_file_name("Quant", "Default/Quant-op1", 0, 0, TS), "wb") as f:
        f.write(b"".join(bytes(b) for b in ascend_bin.encode("Default/Quant-op1", ins, outs, timestamp=TS)))
    rec = opdump.load(tmp_path / "dump").records()
    assert [(r.io, r.slot, r.format, r.dtype) for r in rec.itertuples()] == [
        ("input", 0, "NHWC", "Float32"), ("output", 0, "DefaultFormat", "Int4")]
    np.testing.assert_array_equal(opdump.analysis.reader.load_array(rec["path"].iloc[0]), nhwc)
    out = opdump.analysis.reader.load_array(rec["path"].iloc[1])
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out, q)


def test_locate_names_the_bin_files(tmp_path):
    ops = model_tensors()
    rank_folder = acl_dump(str(tmp_path / "dump"), ops)
    r = cli(tmp_path, "locate", str(tmp_path / "dump"), "MatMul-op2")
    assert r.returncode == 0, r.stderr
    name = al.bin_file_name("MatMul", "Default/network/MatMul-op2", 0, 0, TS + 1)
    assert f"{name}:input.1" in r.stdout and os.path.join(rank_folder, "graph_0", "0", "0") in r.stdout
    assert "opdump-bin-" not in r.stdout                       # never the temporary .npy


def test_real_writer_statistics_read_back(real_dumps):
    """dump_data "stats": statistic.csv in the ACL data folders, one row per tensor the
    tensor dump holds, its max equal to the tensor's."""
    tmp, _ = real_dumps
    st = opdump.load(tmp / "acl_stats").statistics()
    rec = opdump.load(tmp / "acl").records()
    key = ["iteration", "op", "io", "slot", "call"]
    assert sorted(map(tuple, st[key].astype(str).values)) == sorted(map(tuple, rec[key].astype(str).values))
    paths = {tuple(map(str, k)): p for k, p in zip(rec[key].values, rec["path"])}
    for k, mx in zip(st[key].values, st["max"]):
        a = opdump.analysis.reader.load_array(paths[tuple(map(str, k))])
        if a.size and a.dtype.kind == "f":
            assert float(mx) == pytest.approx(float(a.max()), rel=1e-6)
