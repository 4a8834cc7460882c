"""A new user's run of the Ascend dialects (README "Other dialects", "Ascend bin files and
`opdump convert`") on models that are not opdump's own: the seeds' example configs with
only their paths changed, run through ``opdump run`` and the Python API, the layout read
back, bin files converted and checked value by value against an ``.npy`` dump of the same
run, and the mistakes a user typically makes.

Regressions covered (each failed before its fix):

* torchair's own example sets ``dump_config_path`` *and* the other options; it raised a
  ConfigError, although torchair says the JSON file then simply does not take effect;
* a ``dump_list`` copied from the ACL example (``model_name: "ResNet-50"``) dumped nothing
  and said nothing: it now warns, naming the run's graphs and where to find their names;
* the README's ``opdump.capture.eager.EagerCapture(s)`` after a plain ``import opdump``
  raised AttributeError (the sub-package was never imported);
* an unmatched ``dump_layer`` / ``layer`` entry was reported as a "kernels entry", a field
  the user of these dialects never wrote.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import opdump
from opdump.config import ConfigError
from opdump.config import options as torchair

OPDUMP = [sys.executable, "-m", "opdump"]

# A small CNN written for this test (no torchvision): conv, batch norm, strided conv, linear.
CNN = textwrap.dedent('''
    import os, torch, torch.nn as nn
    torch.manual_seed(0)
    class SmallCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.conv2 = nn.Conv2d(4, 6, 3, stride=2)
            self.fc = nn.Linear(6 * 3 * 3, 5)
        def forward(self, x, y):
            x = torch.relu(self.bn(self.conv1(x)))
            x = torch.relu(self.conv2(x))
            return nn.functional.cross_entropy(self.fc(x.flatten(1)), y)
    m = SmallCNN()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(int(os.environ.get("STEPS", "3"))):
        x = torch.randn(2, 3, 8, 8, generator=g); y = torch.randint(0, 5, (2,), generator=g)
        loss = m(x, y); opt.zero_grad(); loss.backward(); opt.step()
    print("trained")
''')


def _run(tmp_path, config: dict, steps: int = 3, script: str = CNN):
    """``opdump run --config acl.json script.py`` in a fresh interpreter, as a user runs it."""
    (tmp_path / "train.py").write_text(script)
    cfg = tmp_path / "acl.json"
    cfg.write_text(json.dumps(config))
    env = dict(os.environ, STEPS=str(steps), PYTHONWARNINGS="default")
    return subprocess.run(OPDUMP + ["run", "--config", str(cfg), str(tmp_path / "train.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


def _train_in_process(tmp_path, config: dict, steps: int = 3) -> None:
    """The CNN above, trained under ``opdump.Session(acl.json)`` and eager capture (the Python API)."""
    path = tmp_path / "acl.json"
    path.write_text(json.dumps(config))
    namespace = {}
    exec(compile(CNN.split("m = SmallCNN()")[0], "cnn.py", "exec"), namespace)
    import torch
    from opdump.capture.eager import EagerCapture
    torch.manual_seed(0)
    m = namespace["SmallCNN"]()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with opdump.Session(str(path)) as s, EagerCapture(s, [m]):
        for _ in range(steps):
            x = torch.randn(2, 3, 8, 8, generator=g)
            y = torch.randint(0, 5, (2,), generator=g)
            loss = m(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()


def _files(root, pattern="**/*"):
    return sorted(p for p in glob.glob(os.path.join(str(root), pattern), recursive=True) if os.path.isfile(p))


@pytest.fixture(scope="module")
def bin_and_npy(tmp_path_factory):
    """One program dumped twice (dump_mode all, dump_step 1): bin (the dialect's default) and npy."""
    out = {}
    for fmt in ("bin", "npy"):
        work = tmp_path_factory.mktemp(fmt)
        (work / "dump").mkdir()
        cfg = {"dump": {"dump_list": [], "dump_path": str(work / "dump"), "dump_mode": "all",
                        "dump_op_switch": "off", "dump_data": "tensor", "dump_step": "1"}}
        if fmt == "npy":
            cfg["dump"]["file_format"] = "npy"
        r = _run(work, cfg)
        assert r.returncode == 0 and "trained" in r.stdout, r.stderr
        out[fmt] = work / "dump"
    return out


def test_seed_model_dump_config_verbatim_warns_about_unknown_model_names(tmp_path):
    """ACL's model-dump example, paths changed: its model names are not this run's graphs.
    The run succeeds, dumps no tensor, and says which names the graphs have (it was silent)."""
    (tmp_path / "output").mkdir()
    cfg = {"dump": {"dump_list": [{"model_name": "ResNet-101"},
                                  {"model_name": "ResNet-50", "layer": ["conv1conv1_relu",
                                   "res2a_branch2ares2a_branch2a_relu", "res2a_branch1", "pool1"]}],
                    "dump_path": str(tmp_path / "output"), "dump_mode": "output",
                    "dump_op_switch": "off", "dump_data": "tensor"}}
    r = _run(tmp_path, cfg, steps=1)
    assert r.returncode == 0, r.stderr
    for name in ("ResNet-101", "ResNet-50"):
        assert f"model_name '{name}' names no graph of this run (its graphs: graph_0" in r.stderr
    listing = _files(tmp_path / "output", "*/0/graphs/ms_output_trace_code_graph_0.ir")
    assert listing and open(listing[0]).readline().startswith("# IR entry: @graph_0")
    assert not opdump.load(str(tmp_path / "output")).tensors().shape[0]


def test_model_name_and_layer_select_graph_and_ops(tmp_path, monkeypatch):
    """The same example with the graph's real name: only the layer's op types, only dump_step."""
    (tmp_path / "output").mkdir()
    cfg = {"dump": {"dump_list": [{"model_name": "graph_0", "layer": ["addmm", "conv1conv1_relu"]}],
                    "dump_path": "output", "dump_mode": "output", "dump_op_switch": "off",
                    "dump_data": "tensor", "dump_step": "0|2"}}
    monkeypatch.chdir(tmp_path)                                            # "output" is relative
    with pytest.warns(UserWarning) as record:
        _train_in_process(tmp_path, cfg)
    said = [str(w.message) for w in record]
    assert not any("model_name" in m for m in said)                       # graph_0 exists
    assert "opdump: dump_list layer entry 'conv1conv1_relu' matched no operator" in said   # the user's word
    files = [f for f in _files(tmp_path / "output", "*/0/graph_0/0/*/*") if not f.endswith(".csv")]
    assert {f.split(os.sep)[-2] for f in files} == {"0", "2"}             # dump_step "0|2"
    assert files and all(os.path.basename(f).startswith("addmm.") for f in files)
    tensors = opdump.load(str(tmp_path / "output")).tensors()
    assert set(tensors["iteration"]) == {0, 2} and set(tensors["io"]) == {"output"}


def test_bin_dump_converts_to_the_npy_dump_of_the_same_run(bin_and_npy, tmp_path):
    """Every bin file opdump wrote, converted by ``opdump convert``, equals the ``.npy``
    dump of the same run (values, dtype, shape), matched by file name independently of compare."""
    r = subprocess.run(OPDUMP + ["convert", "-d", str(bin_and_npy["bin"]), "-out", str(tmp_path / "conv")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    converted = {}
    for path in _files(tmp_path / "conv", "**/*.npy"):
        base = os.path.basename(path)                 # {op_type}.{op_name}.{task}.{stream}.{ts}.{io}.{i}.{shape}.npy
        parts = base.split(".")
        converted[(parts[0], parts[1], parts[5], parts[6])] = path
    reference = {}
    for path in _files(bin_and_npy["npy"], "**/*.npy"):
        parts = os.path.basename(path).split(".")     # ….{io}.{i}.{format}.{dtype}.npy (MindSpore names)
        if parts[0] == "Parameter":
            reference[(parts[0], parts[1], "output", "0")] = path
        else:
            reference[(parts[0], parts[1], parts[5], parts[6])] = path
    assert len(converted) == len(reference) > 100
    assert converted.keys() == reference.keys()
    undefined = 0
    for key, path in converted.items():
        a, b = np.load(path), np.load(reference[key])
        assert a.dtype == b.dtype and a.shape == b.shape, key
        if key[0] in ("empty", "empty_like"):          # uninitialised memory: only its shape is defined
            undefined += 1
            continue
        np.testing.assert_array_equal(a, b, err_msg=str(key))
    # and the reader sees the same records in both
    ta, tb = (opdump.load(str(bin_and_npy[k])).tensors() for k in ("bin", "npy"))
    assert len(ta) == len(tb) == len(converted)


def test_ls_reads_the_acl_dump_back(bin_and_npy):
    """``opdump ls`` of an ACL JSON dump: its dump_data (was "saved_data=?"), iteration 1 only."""
    r = subprocess.run(OPDUMP + ["ls", str(bin_and_npy["bin"])], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "; dump_data=tensor; complete; graphs [0]" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:2] == ["0", "0"]]
    # iteration 1, 44 operators (no detach for the outputs autograd saves: two relu, log_softmax)
    assert [row[2] for row in rows] == ["1"] and rows[0][3] == "44"


def test_compare_bin_dump_against_npy_dump(bin_and_npy, tmp_path):
    r = subprocess.run(OPDUMP + ["compare", str(bin_and_npy["bin"]), str(bin_and_npy["npy"])],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "first divergence: none" in r.stdout
    assert "operators matched: 44 of 44 in A, 44 of 44 in B" in r.stdout


@pytest.mark.parametrize("mode, ios", [("input", {"input"}), ("output", {"output"})])
def test_dump_mode_input_output_and_single_operator_switch(tmp_path, monkeypatch, mode, ios):
    """``dump_op_switch: on`` (ACL's single-operator example): eager operators flat in
    {time}/{device_id}/; dump_mode input/output keeps only those tensors."""
    (tmp_path / "output").mkdir()
    cfg = {"dump": {"dump_path": "output", "dump_list": [], "dump_op_switch": "on",
                    "dump_data": "tensor", "dump_mode": mode}}
    monkeypatch.chdir(tmp_path)
    _train_in_process(tmp_path, cfg, steps=1)
    (stamp,) = os.listdir(tmp_path / "output")
    flat = [f for f in os.listdir(tmp_path / "output" / stamp / "0") if f.startswith("convolution.")]
    assert len(flat) == 2
    ops = {f for f in flat}
    assert not os.path.exists(tmp_path / "output" / stamp / "0" / "graph_0" / "0" / "0") or not any(
        n.startswith("convolution.") for n in os.listdir(tmp_path / "output" / stamp / "0" / "graph_0" / "0" / "0"))
    tensors = opdump.load(str(tmp_path / "output")).tensors()
    ops_io = set(tensors[~tensors["op"].str.startswith("Parameter")]["io"])
    assert ops_io == ios and ops


def test_torchair_seed_example_verbatim_uses_the_options(tmp_path):
    """torchair's example, paths changed, sets dump_config_path next to the other options:
    the JSON does not take effect (torchair's words), with a warning; it was a ConfigError."""
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump_config.json").write_text(json.dumps(
        {"dump": {"dump_path": str(tmp_path), "dump_list": [], "dump_op_switch": "on"}}))
    config = torchair.CompilerConfig()
    config.dump_config.enable_dump = True
    config.dump_config.dump_mode = "all"
    config.dump_config.dump_path = str(tmp_path / "dump")
    config.dump_config.quant_dumpable = True
    config.dump_config.dump_step = "0|1"
    config.dump_config.dump_layer = "Add_1Mul_1 Add2"
    config.dump_config.dump_data = "stats"
    config.dump_config.dump_config_path = str(tmp_path / "dump_config.json")
    with pytest.warns(UserWarning, match=r"dump_config_path .* is ignored: dump_config\.dump_path is set too"):
        cfg = config.dump_config.to_config()
    assert cfg.path == str(tmp_path / "dump") and cfg.saved_data == "statistic"
    assert cfg.kernels == ("Add_1Mul_1", "Add2") and cfg.world_folder and not cfg.single_op
    # alone, dump_config_path still loads the JSON
    only = torchair.CompilerConfig().dump_config
    only.dump_config_path = str(tmp_path / "dump_config.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert only.to_config().single_op


def test_torchair_options_compiled_stats_layout(tmp_path):
    """torchair options on a compiled model: worldsize1_global_rank0/, dump_step, stats rows of
    the layer's operators only, read back by opdump.load."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    config = torchair.CompilerConfig()
    config.dump_config.enable_dump = True
    config.dump_config.dump_mode = "all"
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.dump_step = "1"
    config.dump_config.dump_data = "stats"
    config.dump_config.dump_layer = "addmm relu nodename1"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match=r"^opdump: dump_config\.dump_layer entry 'nodename1' matched no operator$"):
        with opdump.Session(config.dump_config.to_config()) as s:
            compiled = torch.compile(model, backend=s.backend())
            for _ in range(3):
                compiled(torch.randn(3, 4)).sum().backward()
                opt.step()
                opt.zero_grad()
    csvs = _files(tmp_path, "worldsize1_global_rank0/*/0/graph_0/0/*/statistic.csv")
    assert [c.split(os.sep)[-2] for c in csvs] == ["1"]
    stats = opdump.load(str(tmp_path)).statistics()
    assert set(stats["iteration"]) == {1} and set(stats["op_type"]) == {"addmm", "relu"}
    assert {"input", "output"} <= set(stats["io"])


DIST = textwrap.dedent('''
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    import opdump                                      # the README's spelling, nothing else imported
    from opdump.config import options as torchair
    def work(rank, world, path, store):
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
        config = torchair.CompilerConfig()
        config.dump_config.enable_dump = True
        config.dump_config.dump_path = path
        config.dump_config.dump_step = "1"
        m = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        with opdump.Session(config.dump_config.to_config()) as s, opdump.capture.eager.EagerCapture(s, m):
            for i in range(2):
                m(torch.full((2, 4), float(rank))).sum().backward()
                for p in m.parameters(): dist.all_reduce(p.grad)
                opt.step(); opt.zero_grad()
        dist.barrier()              # both ranks done before either tears the group down (a rank
        dist.destroy_process_group()  # left alone once aborted in gloo: "terminate called...")
    if __name__ == "__main__":
        mp.spawn(work, args=(2, sys.argv[1], sys.argv[2]), nprocs=2)
''')


def test_torchair_world_size_folders_under_gloo(tmp_path):
    """World size 2 (gloo, torch.multiprocessing): one worldsize2_global_rank{r}/ per rank,
    each read back as its rank; the README's opdump.capture.eager spelling works."""
    (tmp_path / "dist.py").write_text(DIST)            # a file store: no TCP port to race for
    (tmp_path / "dump").mkdir()
    r = subprocess.run([sys.executable, str(tmp_path / "dist.py"), str(tmp_path / "dump"), str(tmp_path / "store")],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "dump")) == ["worldsize2_global_rank0", "worldsize2_global_rank1"]
    tensors = opdump.load(str(tmp_path / "dump")).tensors()
    assert set(tensors["rank"]) == {0, 1} and set(tensors["iteration"]) == {1}


@pytest.mark.parametrize("dump, field, words", [
    ({"dump_path": "{out}", "dump_list": [], "dump_step": "0,5"}, "dump.dump_step", ["'0,5'", "','", "'|'"]),
    ({"dump_list": [], "dump_mode": "all"}, "dump.dump_path", ["required"]),
    ({"dump_list": [{"layer": ["A", "B"], "watcher_nodes": ["C", "D"]}], "dump_path": "{out}",
      "dump_mode": "output", "dump_scene": "watcher", "dump_debug": "on"}, "dump.dump_debug", ["'on'", "watcher"]),
    ({"dump_path": "{out}", "dump_list": [], "dump_mode": "inputs"}, "dump.dump_mode",
     ["'inputs'", '"input", "output" or "all"']),
    ({"dump_path": "{out}", "dump_list": [], "dump_data": "stats", "file_format": "bin"}, "dump.dump_data",
     ["'stats'", 'use dump_data "tensor" with "bin"']),        # was: 'statistic' and saved_data, not its words
])
def test_typical_mistakes_name_file_field_value_allowed(tmp_path, dump, field, words):
    """The message names the file, the field, the value and what is allowed (in-process:
    ``opdump.load_config``; ``opdump run`` prints the same text, checked once below)."""
    (tmp_path / "out").mkdir()
    cfg = {"dump": {k: (v.replace("{out}", str(tmp_path / "out")) if isinstance(v, str) else v)
                    for k, v in dump.items()}}
    path = tmp_path / "acl.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as info:
        opdump.load_config(str(path))
    assert str(info.value).startswith(f"{path}: {field}: ")
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("dump, message", [
    ({"dump_list": [], "dump_step": "0,5"}, "dump.dump_step: '0,5': character ',' is not allowed"),
    ({"dump_list": [], "dump_path": "missing"}, "missing': does not exist or is not a folder; create it first"),              # checked when the session starts
])
def test_typical_mistake_through_opdump_run(tmp_path, dump, message):
    r = _run(tmp_path, {"dump": {"dump_path": str(tmp_path), **dump}}, steps=1)
    assert r.returncode == 2 and "trained" not in r.stdout
    assert f"invalid config: {tmp_path / 'acl.json'}: " in r.stderr and message in r.stderr, r.stderr


def test_long_names_go_to_mapping_csv(tmp_path):
    """A module path making a file name over 255 bytes: random digits + mapping.csv, read back."""
    import torch
    long = "a_really_long_submodule_name_for_testing_" * 3
    inner = torch.nn.Sequential()
    inner.add_module(long, torch.nn.Linear(3, 3))
    model = torch.nn.Sequential()
    model.add_module(long + "outer", inner)
    (tmp_path / "dump").mkdir()
    path = tmp_path / "acl.json"
    path.write_text(json.dumps({"dump": {"dump_path": str(tmp_path / "dump"), "dump_list": []}}))
    from opdump.capture.eager import EagerCapture
    with opdump.Session(str(path)) as s, EagerCapture(s, model):
        model(torch.ones(1, 3))
        s.step()
    mapping = _files(tmp_path / "dump", "*/0/graph_0/0/0/mapping.csv")
    assert mapping
    rows = open(mapping[0]).read().splitlines()
    assert any(long in row and row.split(",")[0].isdigit() for row in rows)
    tensors = opdump.load(str(tmp_path / "dump")).tensors()
    assert any(long in op for op in tensors["op"])


def _nc1hwc0_by_loops(x, c0=16):
    """NC1HWC0 built element by element (C padded with zeros to a multiple of C0)."""
    n, c, h, w = x.shape
    c1 = -(-c // c0)
    dev = np.zeros((n, c1, h, w, c0), x.dtype)
    for ni in range(n):
        for ci in range(c):
            dev[ni, ci // c0, :, :, ci % c0] = x[ni, ci]
    return dev


def _fractal_nz_by_loops(x, k=16):
    """FRACTAL_NZ of a (..., M, N) array: (..., ceil(N/16), ceil(M/16), 16, 16), zero padded."""
    *batch, m, n = x.shape
    dev = np.zeros((*batch, -(-n // k), -(-m // k), 16, k), x.dtype)
    for mi in range(m):
        for ni in range(n):
            dev[..., ni // k, mi // 16, mi % 16, ni % k] = x[..., mi, ni]
    return dev


def test_convert_device_formats_built_independently(tmp_path):
    """Device-format tensors built here by loops, written as a bin file (an Ascend op's input
    and output), converted back by ``opdump convert``: original shapes, padding removed."""
    from opdump.format import ascend_bin
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 19, 3, 5)).astype(np.float16)           # C = 19: one padded C1 block
    y = rng.standard_normal((3, 20, 33)).astype(np.float16)             # M, N not multiples of 16
    dx, dy = _nc1hwc0_by_loops(x), _fractal_nz_by_loops(y)
    buffers = ascend_bin.encode(
        "conv1", [ascend_bin.RawTensor(dx, "float16", dx.shape, "NC1HWC0", x.shape)],
        [ascend_bin.RawTensor(dy, "float16", dy.shape, "FRACTAL_NZ", y.shape)], timestamp=1700000000123456)
    name = "Conv2D.conv1.1.2.1700000000123456"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_bytes(b"".join(bytes(b) for b in buffers))
    r = subprocess.run(OPDUMP + ["convert", "-d", str(tmp_path / "in"), "-out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got_x = np.load(tmp_path / "out" / f"{name}.input.0.2x19x3x5.npy")
    got_y = np.load(tmp_path / "out" / f"{name}.output.0.3x20x33.npy")
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
