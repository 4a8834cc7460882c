"""Watcher mode (``dump_scene: "watcher"`` / ``e2e_dump_settings.watcher``; README "Debug
dumps") on real eager runs of tiny models: a saved activation overwritten by a later
``mul_`` is caught and the overwriting operator named with its source line; a model without
an overwrite reports no change and writes only the watched outputs once; ``layer`` triggers;
the write witnesses (declared write, version counter, end-of-iteration checksum); the
ACL-style and MindSpore-style configs give the same result; forbidden combinations are
ConfigErrors; snapshot files equal an independent capture (module forward hooks); the CLI
(``opdump watcher``, ``opdump ls``) in real subprocesses."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.config import ConfigError
from opdump.config.loader import load_config, load_config_dict
from opdump.debug.watcher import fingerprint
from dumpfiles import tensor_files
from conftest import write_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Corrupt(nn.Module):
    """The bug: scales a tensor it was handed earlier, in place, behind autograd's back."""

    def __init__(self, bug: bool):
        super().__init__()
        self.bug = bug
        self.stash = None

    def forward(self, x):
        if self.bug:
            self.stash.data.mul_(0.5)            # BUG_LINE: overwrites the saved activation
        return x + 1


class Net(nn.Module):
    def __init__(self, bug: bool):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 8)
        self.corrupt = Corrupt(bug)
        self.fc3 = nn.Linear(8, 2)

    def forward(self, x):
        h = self.act(self.fc1(x))                # the watched relu; saved for its backward
        self.corrupt.stash = h
        y = self.corrupt(self.fc2(h))
        return self.fc3(y)


BUG_LINE = next(i for i, line in enumerate(open(__file__), 1) if "BUG_LINE" in line and "mul_" in line)


def _train(model, steps):
    """A few SGD steps; forward hooks clone relu's output after it ran and after the corruption."""
    seen = {"relu": [], "after_corrupt": []}
    hooks = [model.act.register_forward_hook(lambda m, a, out: seen["relu"].append(out.detach().clone())),
             model.corrupt.register_forward_hook(
                 lambda m, a, out: seen["after_corrupt"].append(m.stash.detach().clone()))]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(steps):
        loss = model(x).square().sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())            # the optimizer step ends the iteration
    for h in hooks:
        h.remove()
    return losses, seen


def _run(cfg, bug=True, steps=2):
    torch.manual_seed(0)
    model = Net(bug)
    with opdump.Session(cfg) as session, EagerCapture(session):
        losses, seen = _train(model, steps)
    return losses, seen


def _reports(root):
    paths = sorted(p for p in _walk(root) if os.path.basename(p) == "watcher.json")
    return {json.load(open(p))["iteration"]: (p, json.load(open(p))) for p in paths}


def _walk(root):
    for folder, _, files in os.walk(root):
        for f in files:
            yield os.path.join(folder, f)


def _ms_config(tmp_path, watcher, common=None, name="data_dump.json"):
    return write_config(tmp_path, common={"input_output": 2, **(common or {})}, e2e={"watcher": watcher}, name=name)


def _snapshot_arrays(report_path, body, watched):
    """The arrays of each snapshot of ``watched``, in order, found by the snapshot's timestamp window."""
    from opdump.analysis.watcher_report import load_watcher
    it = next(i for i in load_watcher(os.path.dirname(report_path)) if i.path == report_path)
    out = []
    for snap, files in zip(it.body["snapshots"], it.snapshot_files):
        if snap["watched"] == watched:
            assert len(files) == 1, files
            out.append((snap, np.load(files[0])))
    return out


def test_inplace_overwrite_names_the_operator_and_its_line(tmp_path):
    cfg = _ms_config(tmp_path, {"watcher_nodes": ["relu"]})
    _, seen = _run(cfg, bug=True)
    reports = _reports(tmp_path / "dump")
    assert sorted(reports) == [0, 1]
    for it, (path, body) in reports.items():
        first = body["first_change"]
        assert body["complete"] and first is not None
        assert first["after_type"] == "mul_" and first["after"].startswith("Default/Net/corrupt-Corrupt/mul_-op")
        assert first["source"] == f"{__file__}:{BUG_LINE}" and "mul_" in first["code"]
        assert first["watched"] == "Default/Net/act-ReLU/relu-op2" and first["slot"] == 0
        assert first["witness"] == "write"
        assert first["watched_source"].endswith(f"test_debug_watcher.py:{Net.forward.__code__.co_firstlineno + 1}")
        # snapshots equal the forward hooks' independent clones: after relu ran, after the mul_
        snaps = _snapshot_arrays(path, body, first["watched"])
        assert [s["kind"] for s, _ in snaps] == ["own run", "change"]
        np.testing.assert_array_equal(snaps[0][1], seen["relu"][it].numpy())
        np.testing.assert_array_equal(snaps[1][1], seen["after_corrupt"][it].numpy())
        assert not np.array_equal(snaps[0][1], snaps[1][1])
        assert snaps[1][0]["after"] == first["after"]


def test_no_overwrite_reports_nothing_and_writes_only_the_watched_outputs(tmp_path):
    cfg = _ms_config(tmp_path, {"watcher_nodes": ["relu"]})
    losses, _ = _run(cfg, bug=False, steps=3)
    reports = _reports(tmp_path / "dump")
    assert sorted(reports) == [0, 1, 2]
    for _, body in reports.values():
        assert body["first_change"] is None and body["changes"] == []
        assert [w["op"] for w in body["watched"]] == ["Default/Net/act-ReLU/relu-op2"]
        assert [s["kind"] for s in body["snapshots"]] == ["own run"]
    files = tensor_files(str(tmp_path / "dump"))
    assert len(files) == 3 and {f.io for f in files} == {"output"}        # one per iteration, no parameter
    torch.manual_seed(0)
    plain, _ = _train(Net(False), 3)
    assert losses == plain, "watching changes no training value"


def test_layer_triggers(tmp_path):
    """Explicit triggers: the change is found at the first trigger after the write (checksum:
    a `.data` write bumps no version), or, with no trigger after it, at the iteration's end."""
    after = _ms_config(tmp_path, {"layer": ["name-regex(Default/Net/fc3-Linear/.*)"], "watcher_nodes": ["relu"]},
                       common={"iteration": "0", "path": str(tmp_path / "a")}, name="a.json")
    _run(after, steps=1)
    first = _reports(tmp_path / "a")[0][1]["first_change"]
    assert first["after"].startswith("Default/Net/fc3-Linear/") and first["witness"] == "checksum"

    at = _ms_config(tmp_path, {"layer": ["mul_"], "watcher_nodes": ["relu"]},
                    common={"iteration": "0", "path": str(tmp_path / "b")}, name="b.json")
    _run(at, steps=1)
    first = _reports(tmp_path / "b")[0][1]["first_change"]
    assert first["after_type"] == "mul_" and first["source"].endswith(f":{BUG_LINE}")

    before = _ms_config(tmp_path, {"layer": ["name-regex(Default/Net/fc2-Linear/.*)"], "watcher_nodes": ["relu"]},
                        common={"iteration": "0", "path": str(tmp_path / "c")}, name="c.json")
    _run(before, steps=1)
    body = _reports(tmp_path / "c")[0][1]
    first = body["first_change"]
    assert first["after"] is None and first["witness"] == "end"
    assert [s["kind"] for s in body["snapshots"]] == ["own run", "change"]


def test_optimizer_step_writing_a_watched_view_is_named(tmp_path):
    """fc1's ``t`` (a view of its weight) is watched: SGD's in-place update of the weight changes it."""
    cfg = _ms_config(tmp_path, {"watcher_nodes": ["name-regex(Default/Net/fc1-Linear/t-op\\d+)"]},
                     common={"iteration": "0"})
    _run(cfg, bug=False, steps=1)
    body = _reports(tmp_path / "dump")[0][1]
    first = body["first_change"]
    assert first is not None and first["watched"].startswith("Default/Net/fc1-Linear/t-op")
    assert first["after"].startswith("Default/optimizer-SGD/") and first["witness"] == "write"


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


@pytest.mark.parametrize("data", [False, True])
def test_writes_outside_the_captured_operators(tmp_path, data):
    """A write by code outside the model (not an operator the capture names): a normal in-place
    write moves the version counter, seen at the next captured operator (witness version);
    a ``.data`` write moves nothing and is found by the iteration's last checksum (witness end)."""
    cfg = _ms_config(tmp_path, {"watcher_nodes": ["addmm"]}, common={"iteration": "0"})
    torch.manual_seed(0)
    model = Plain()
    with opdump.Session(cfg) as session, EagerCapture(session):
        y = model(torch.randn(2, 4))
        if data:
            y.data.mul_(3)
        else:
            with torch.no_grad():
                y.mul_(3)
        y.sum().backward()
        session.step()
    first = _reports(tmp_path / "dump")[0][1]["first_change"]
    assert first["watched"].startswith("Default/Plain/fc-Linear/addmm-op")
    if data:
        assert first["after"] is None and first["witness"] == "end"
    else:
        assert first["after"].startswith("Gradients/") and first["witness"] == "version"


def test_acl_and_mindspore_configs_give_the_same_result(tmp_path):
    ms = load_config(_ms_config(tmp_path, {"layer": ["mul_"], "watcher_nodes": ["relu"]}, common={"iteration": "0"}))
    acl_root = tmp_path / "acl"
    acl_root.mkdir()
    acl_path = tmp_path / "acl.json"
    acl_path.write_text(json.dumps({"dump": {
        "dump_path": str(acl_root), "dump_mode": "output", "dump_scene": "watcher", "dump_step": "0",
        "file_format": "npy", "dump_list": [{"layer": ["mul_"], "watcher_nodes": ["relu"]}]}}))
    acl = load_config(str(acl_path))
    for field in ("dump_scene", "watcher_layer", "watcher_nodes", "input_output", "op_debug_mode", "dump_mode"):
        assert getattr(acl, field) == getattr(ms, field), field
    _run(ms, steps=1)
    _run(acl, steps=1)

    def essence(body):
        keep = ("watched", "after", "after_type", "slot", "witness", "source", "code")
        return ([{k: c[k] for k in keep} for c in body["changes"]],
                [(s["watched"], s["kind"], s["after"], s["slots"]) for s in body["snapshots"]])
    (ms_path, ms_body), = _reports(tmp_path / "dump").values()
    (acl_path_json, acl_body), = _reports(acl_root).values()
    assert ms_body["first_change"] is not None
    assert essence(ms_body) == essence(acl_body)
    ms_arrays = [a for _, a in _snapshot_arrays(ms_path, ms_body, ms_body["first_change"]["watched"])]
    acl_arrays = [a for _, a in _snapshot_arrays(acl_path_json, acl_body, acl_body["first_change"]["watched"])]
    for a, b in zip(ms_arrays, acl_arrays, strict=True):
        np.testing.assert_array_equal(a, b)


ACL_BAD = [
    ({"dump_debug": "on"}, "dump.dump_debug"),
    ({"dump_op_switch": "on"}, "dump.dump_op_switch"),
    ({"dump_mode": "all"}, "dump.dump_mode"),
    ({"dump_mode": "input"}, "dump.dump_mode"),
    ({"dump_list": [{"model_name": "Net", "watcher_nodes": ["relu"]}]}, "dump.dump_list[0].model_name"),
    ({"dump_list": [{"layer": ["mul_"]}]}, "dump.dump_list"),
    ({"dump_list": [{"watcher_nodes": ["name-regex(()"]}]}, "dump.dump_list[0].watcher_nodes"),
]


@pytest.mark.parametrize("change,field", ACL_BAD)
def test_acl_forbidden_combinations(tmp_path, change, field):
    dump = {"dump_path": str(tmp_path), "dump_scene": "watcher", "dump_list": [{"watcher_nodes": ["relu"]}], **change}
    path = tmp_path / "acl.json"
    path.write_text(json.dumps({"dump": dump}))
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert info.value.field == field and str(path) in str(info.value)


def test_acl_watcher_nodes_without_watcher_scene(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config_dict({"dump": {"dump_path": str(tmp_path), "dump_list": [{"watcher_nodes": ["relu"]}]}})
    assert info.value.field == "dump.dump_list[0].watcher_nodes" and "watcher" in info.value.allowed


MS_BAD = [
    ({"watcher_nodes": ["relu"]}, {"op_debug_mode": 3, "input_output": 0}, "common_dump_settings.op_debug_mode"),
    ({"watcher_nodes": ["relu"]}, {"dump_mode": 1, "kernels": ["relu"]}, "common_dump_settings.dump_mode"),
    ({"watcher_nodes": ["relu"]}, {"input_output": 0}, "common_dump_settings.input_output"),
    ({"watcher_nodes": ["relu"]}, {"input_output": 1}, "common_dump_settings.input_output"),
    ({"layer": ["mul_"]}, {}, "e2e_dump_settings.watcher.watcher_nodes"),
    ({"watcher_nodes": []}, {}, "e2e_dump_settings.watcher.watcher_nodes"),
    ({"watcher_nodes": ["relu"], "layer": []}, {}, "e2e_dump_settings.watcher.layer"),
    ({"watcher_nodes": ["relu", "relu"]}, {}, "e2e_dump_settings.watcher.watcher_nodes"),
    ({"watcher_nodes": ["relu"], "watched": ["x"]}, {}, "e2e_dump_settings.watcher.watched"),
    ({"watcher_nodes": "relu"}, {}, "e2e_dump_settings.watcher.watcher_nodes"),
    ({"watcher_nodes": ["name-regex([)"]}, {}, "e2e_dump_settings.watcher.watcher_nodes"),
    (["relu"], {}, "e2e_dump_settings.watcher"),
]


@pytest.mark.parametrize("watcher,common,field", MS_BAD)
def test_mindspore_forbidden_combinations(tmp_path, watcher, common, field):
    cfg = write_config(tmp_path, common={"input_output": 2, **common}, e2e={"watcher": watcher})
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert info.value.field == field and cfg in str(info.value)


def test_input_output_may_be_left_out(tmp_path):
    cfg = load_config_dict({"common_dump_settings": {"path": str(tmp_path)},
                            "e2e_dump_settings": {"watcher": {"watcher_nodes": ["relu"]}}})
    assert cfg.input_output == 2 and cfg.dump_scene == "watcher" and cfg.watcher_layer == ()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                   torch.bool, torch.complex64, torch.uint8])
def test_fingerprint_sees_one_bit(dtype):
    t = (torch.arange(24).reshape(4, 6) % 5).to(dtype)
    kept = t.clone()
    before = fingerprint(t)
    assert torch.equal(t, kept), "the fingerprint never writes the tensor"
    view = t.t()                                     # non-contiguous views are read in place
    assert torch.equal(fingerprint(view), before)
    t.view(-1)[7] = 1 if dtype is not torch.bool else (not bool(t.view(-1)[7]))
    assert not torch.equal(fingerprint(t), before)
    assert fingerprint(torch.empty(0, dtype=dtype)).tolist() == [0, 0]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "opdump", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_cli_watcher_and_ls(tmp_path):
    bad, good = tmp_path / "bad", tmp_path / "good"
    bad.mkdir()
    good.mkdir()
    _run(_ms_config(bad, {"watcher_nodes": ["relu"]}, common={"iteration": "0"}), steps=1)
    _run(_ms_config(good, {"watcher_nodes": ["relu"]}, common={"iteration": "0"}), bug=False, steps=1)
    r = _cli("watcher", str(bad / "dump"), "--files")
    assert r.returncode == 1, r.stderr
    assert "first change: Default/Net/act-ReLU/relu-op2 output 0 changed after Default/Net/corrupt-Corrupt/mul_-op" in r.stdout
    assert f"{__file__}:{BUG_LINE}" in r.stdout and r.stdout.count(".npy") == 2
    r = _cli("ls", str(bad / "dump"))
    assert r.returncode == 0 and "watcher: iteration 0: " in r.stdout and f":{BUG_LINE}" in r.stdout
    r = _cli("watcher", str(good / "dump"), "--json")
    assert r.returncode == 0, r.stderr
    (doc,) = json.loads(r.stdout)
    assert doc["first_change"] is None and len(doc["snapshot_files"]) == 1
    (tmp_path / "nothing").mkdir()               # a folder without watcher.json (a missing path: its own error)
    r = _cli("watcher", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "no watcher.json" in r.stderr


class Buf(nn.Module):
    """A buffer read through a view, then scaled in place: the compiled graph writes it back
    with a ``copy_`` at its end, overwriting what the view showed."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("acc", torch.ones(4))

    def forward(self, x):
        h = self.fc(x) + self.acc.view(1, 4)
        self.acc.mul_(2)
        return h


def test_graph_mode_names_the_write_back(tmp_path):
    """Graph mode (dumped iterations op by op): the watched ``view`` of a buffer is overwritten
    by the graph's input-mutation ``copy_``; snapshots hold the buffer before and after."""
    cfg = _ms_config(tmp_path, {"watcher_nodes": ["view"]}, common={"iteration": "1"})
    model = Buf()
    with opdump.Session(cfg) as session, torch.no_grad():
        compiled = torch.compile(model, backend=session.backend("aot_eager"))
        for _ in range(3):
            compiled(torch.randn(2, 4))
            session.step()
    assert torch.equal(model.acc, torch.full((4,), 8.0)), "training values unchanged"
    ((path, body),) = _reports(tmp_path / "dump").values()
    first = body["first_change"]
    assert body["iteration"] == 1 and first["watched"] == "Default/Buf/view-op2"
    assert first["after"].startswith("Default/Buf/copy_-op") and first["witness"] == "write"
    snaps = _snapshot_arrays(path, body, first["watched"])
    assert [s["kind"] for s, _ in snaps] == ["own run", "change"]
    np.testing.assert_array_equal(snaps[0][1], np.full((1, 4), 2.0, np.float32))      # acc at iteration 1
    np.testing.assert_array_equal(snaps[1][1], np.full((1, 4), 4.0, np.float32))


@pytest.mark.parametrize("stat_calc_mode", ["host", "device"])
def test_statistic_snapshots_are_rows_of_the_values_then(tmp_path, stat_calc_mode):
    """saved_data "statistic": each snapshot is a statistic.csv row of the values at that moment
    (device statistics are launched when the snapshot is taken, not at the flush)."""
    cfg = write_config(tmp_path, common={"input_output": 2, "iteration": "0", "saved_data": "statistic"},
                       e2e={"watcher": {"watcher_nodes": ["relu"]}, "stat_calc_mode": stat_calc_mode})
    _, seen = _run(cfg, steps=1)
    (path, body), = _reports(tmp_path / "dump").values()
    assert body["first_change"]["after_type"] == "mul_"
    rows = open(os.path.join(os.path.dirname(path), "statistic.csv")).read().splitlines()[1:]
    assert len(rows) == 2 and all(r.startswith("relu,Default/Net/act-ReLU/relu-op2,") for r in rows)
    maxima = [float(r.split('"')[2].split(",")[1]) for r in rows]
    expected = [seen["relu"][0].max().item(), seen["after_corrupt"][0].max().item()]
    assert maxima == pytest.approx(expected, rel=1e-6) and maxima[0] != maxima[1]


@pytest.mark.parametrize("watcher", [{"watcher_nodes": ["relu"]}, {"watcher_nodes": ["relu"], "layer": ["mul_"]}])
def test_written_data_dump_json_loads_back(tmp_path, watcher):
    """A config given as an object: the data_dump.json the session writes is the same watcher config."""
    cfg = load_config_dict({"common_dump_settings": {"path": str(tmp_path / "dump"), "iteration": "0"},
                            "e2e_dump_settings": {"watcher": watcher}})
    _run(cfg, steps=1)
    back = load_config(str(tmp_path / "dump" / "rank_0" / ".dump_metadata" / "data_dump.json"))
    for field in ("dump_scene", "watcher_layer", "watcher_nodes", "input_output"):
        assert getattr(back, field) == getattr(cfg, field), field
