"""Overflow-only dump (``op_debug_mode`` 3) in graph mode (README "Debug dumps"): compiled
models (opdump's backend, dumped iterations run op by op) whose fp16 operators overflow at
known steps.  Only the origin is dumped, forward and backward, with inputs and outputs equal
to a plain eager recomputation; operators that only carry the Inf along and an attention
``-inf`` mask are not reported; ``overflow_number`` limits; an in-place write to a graph
input after the origin ran does not change its recorded input; ``saved_data`` "statistic"
writes statistic.csv rows of the origins only; ``overflow.csv`` agrees with ``overflow.json``;
training under the watch is identical to an undumped compiled run."""
import csv
import json
import os
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.config import ConfigError
from opdump.config.loader import load_config_dict
from opdump.debug.overflow_summary import CSV_HEADER, read_csv
from dumpfiles import find, tensor_files
from conftest import write_config

BAD_STEP = 1


class Net(nn.Module):
    """fp16 block whose ``mul`` by ``scale`` overflows when the scale is 1e4, operators that
    only carry the Inf along, and an attention-style masked softmax (``-inf`` on purpose)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(()))

    def forward(self, x):
        h = self.fc(x).half() * 100.0
        h = h * self.scale.half()                 # the forward origin when scale is 1e4
        h = (h + 1).float() * 2                   # only propagate
        scores = x @ x.t()
        mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
        attn = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return h.sum() + attn.sum()


ORIGIN_LINE = Net.forward.__code__.co_firstlineno + 2


def _summaries(root, graph, iteration):
    folder = os.path.join(root, "rank_0", "Net", str(graph), str(iteration))
    with open(os.path.join(folder, "overflow.json")) as f:
        body = json.load(f)
    return body, read_csv(os.path.join(folder, "overflow.csv"))


def _run_net(root, common, steps=3):
    """Train Net compiled with opdump's backend under the overflow watch; the step losses."""
    cfg = write_config(root, common={"op_debug_mode": 3, **common})
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(4, 4) + 2.0
    losses = []
    with opdump.Session(cfg) as session:
        compiled = torch.compile(model, backend=session.backend("aot_eager"))
        for step in range(steps):
            model.scale.fill_(1e4 if step == BAD_STEP else 1.0)
            loss = compiled(x)
            loss.backward()
            losses.append(loss.item())
            session.step()
    return model, x, losses


@pytest.fixture(scope="module")
def net_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("net")
    torch._dynamo.reset()
    model, x, losses = _run_net(base, {})
    torch._dynamo.reset()
    return str(base / "dump"), model, x, losses


def test_forward_origin_dumped_as_eager_computes_it(net_run):
    root, model, x, _ = net_run
    files = tensor_files(root)
    assert {f.iteration for f in files} == {BAD_STEP}, "iterations without overflow write no tensor file"
    body, rows = _summaries(root, 0, BAD_STEP)
    assert len(body["overflows"]) == 1, body          # not the add/_to_copy/mul/sum carrying it, not the mask
    event = body["overflows"][0]
    name = event["op"]
    assert event["op_type"] == "mul" and "self.scale" in event["code"] and event["dumped"]
    assert event["source"].endswith(f"test_overflow_graph.py:{ORIGIN_LINE}")
    # the files hold what a plain eager run of the same operator computes
    with torch.no_grad():
        a = model.fc(x).half() * 100.0
        b = torch.tensor(1e4).half()
        want = a * b
    fwd = [f for f in files if f.graph == 0]
    assert {f.op_name for f in fwd} == {name.replace("/", "_")}
    np.testing.assert_array_equal(find(fwd, name, "input", 0).load(), a.numpy())
    np.testing.assert_array_equal(find(fwd, name, "input", 1).load(), b.numpy())
    out = find(fwd, name, "output", 0).load()
    np.testing.assert_array_equal(out, want.numpy())
    assert out.dtype == np.float16 and np.isinf(out).any()
    o = event["outputs"][0]
    assert (o["nan"], o["pos_inf"], o["neg_inf"]) == (int(np.isnan(out).sum()), int(np.isposinf(out).sum()),
                                                      int(np.isneginf(out).sum()))
    # overflow.csv: one row per overflowing output, the same facts
    assert rows == [{"Op Name": name, "Op Type": "mul", "Order": str(event["order"]), "Source": event["source"],
                     "Code": event["code"], "Slot": "0", "Data Type": "float16", "Shape": "(4,4)",
                     "NaN Count": str(o["nan"]), "Positive Inf Count": str(o["pos_inf"]),
                     "Negative Inf Count": str(o["neg_inf"]), "Dumped": "1"}]


def test_backward_origin_in_the_backward_graph(net_run):
    """d(h*100)/d(fc) = 2 * 1e4 * 100 overflows fp16 in the backward graph: its own origin."""
    root, *_ = net_run
    body, rows = _summaries(root, 1, BAD_STEP)
    assert [(e["op"], e["op_type"]) for e in body["overflows"]] == [("Gradients/Default/Net/mul-op4", "mul")]
    assert [r["Op Name"] for r in rows] == ["Gradients/Default/Net/mul-op4"]
    bwd = [f for f in tensor_files(root) if f.graph == 1]
    assert (find(bwd, "Gradients/Default/Net/mul-op4", "input", 0).load() == 2e4).all()
    assert np.isposinf(find(bwd, "Gradients/Default/Net/mul-op4", "output", 0).load()).all()


def test_quiet_iterations_have_empty_summaries(net_run):
    root, *_ = net_run
    for it in (0, 2):
        for graph in (0, 1):
            body, rows = _summaries(root, graph, it)
            assert body["overflows"] == [] and body["complete"] and rows == []
    with open(os.path.join(root, "rank_0", "Net", "0", "0", "overflow.csv"), newline="") as f:
        assert tuple(next(csv.reader(f))) == CSV_HEADER


def test_statistic_rows_only_for_origins(tmp_path):
    _run_net(tmp_path, {"saved_data": "statistic"})
    root = str(tmp_path / "dump")
    assert tensor_files(root) == []
    stats = []
    for dirpath, _, names in os.walk(root):
        if "statistic.csv" in names:
            with open(os.path.join(dirpath, "statistic.csv"), newline="") as f:
                stats += [(os.path.relpath(dirpath, root), r["Op Name"], r["IO"], r["Slot"])
                          for r in csv.DictReader(f)]
    fwd = os.path.join("rank_0", "Net", "0", str(BAD_STEP))
    bwd = os.path.join("rank_0", "Net", "1", str(BAD_STEP))
    assert sorted(stats) == sorted([(fwd, "Default/Net/mul-op5", "input", "0"), (fwd, "Default/Net/mul-op5", "input", "1"),
                                    (fwd, "Default/Net/mul-op5", "output", "0"),
                                    (bwd, "Gradients/Default/Net/mul-op4", "input", "0"),
                                    (bwd, "Gradients/Default/Net/mul-op4", "output", "0")])


class Twice(nn.Module):
    """Two independent overflows in one graph, then an in-place write to the first one's input
    (a graph-input mutation: AOTAutograd's ``copy_`` at the end of the graph)."""

    def forward(self, a, b):
        y = a * 1e4
        z = b * 1e4
        a.mul_(0)
        return y, z


def test_overflow_number_and_inputs_before_an_in_place_write(tmp_path):
    with pytest.warns(UserWarning, match="dump_mode 1 is ignored") as caught:
        cfg = opdump.load_config(write_config(tmp_path, common={"op_debug_mode": 3, "overflow_number": 1,
                                                                "dump_mode": 1, "kernels": ["relu"]}))
    assert len([w for w in caught if "dump_mode" in str(w.message)]) == 1
    a = torch.full((8,), 10.0, dtype=torch.float16)
    b = torch.full((8,), 20.0, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # the one warning above, no other (no unused-kernels one)
        with opdump.Session(cfg) as session:
            compiled = torch.compile(Twice(), backend=session.backend("aot_eager"))
            with torch.no_grad():
                y, z = compiled(a, b)
            session.step()
    assert (a == 0).all() and torch.isinf(y).all() and torch.isinf(z).all()
    root = str(tmp_path / "dump")
    files = tensor_files(root)
    body, rows = _summaries(root, 0, 0)
    events = [(e["op"], e["dumped"]) for e in body["overflows"]]
    assert events == [("Default/Twice/mul-op0", True), ("Default/Twice/mul-op1", False)]
    assert [(r["Op Name"], r["Dumped"]) for r in rows] == [("Default/Twice/mul-op0", "1"), ("Default/Twice/mul-op1", "0")]
    assert {f.op_name for f in files} == {"Default_Twice_mul-op0"}
    assert (find(files, "Default/Twice/mul-op0", "input", 0).load() == 10).all()      # before a.mul_(0)


class Train(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)


def _train(cfg=None, steps=3):
    torch.manual_seed(0)
    model = Train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 6), torch.randn(16, 1)
    losses = []

    def loop(backend):
        compiled = torch.compile(model, backend=backend)
        for _ in range(steps):
            opt.zero_grad()
            loss = ((compiled(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    if cfg is None:
        loop("aot_eager")
    else:
        with opdump.Session(cfg) as session:
            loop(session.backend("aot_eager"))
    return losses, [p.detach().clone() for p in model.parameters()]


def test_training_identical_to_an_undumped_compiled_run(tmp_path):
    plain_losses, plain_params = _train()
    torch._dynamo.reset()
    losses, params = _train(write_config(tmp_path, common={"op_debug_mode": 3}))
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(params, plain_params))
    root = str(tmp_path / "dump")
    assert tensor_files(root) == []
    for it in range(3):
        for graph in (0, 1):
            assert _summaries(root, graph, it)[0]["overflows"] == []


def test_config_statistics_allowed_and_kernels_dump_refused(tmp_path):
    C = "common_dump_settings"
    cfg = load_config_dict({C: {"path": str(tmp_path), "op_debug_mode": 3, "saved_data": "full"}}, env={})
    assert (cfg.op_debug_mode, cfg.saved_data) == (3, "full")
    acl = load_config_dict({"dump": {"dump_path": str(tmp_path), "dump_debug": "on", "dump_data": "stats"}},
                           file="/cfg/acl.json", env={})
    assert (acl.op_debug_mode, acl.saved_data, acl.input_output) == (3, "statistic", 0)
    with pytest.raises(ConfigError, match="graph_dump.*must be \"operators\""):
        load_config_dict({C: {"path": str(tmp_path), "op_debug_mode": 3},
                          "opdump_settings": {"graph_dump": "kernels"}}, env={})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config_dict({C: {"path": str(tmp_path), "op_debug_mode": 3}}, env={})


class Sliced(nn.Module):
    """An overflow, a slice that keeps only its finite part, then a second, real origin on
    that slice: the slice's flag is derived from its input (no reduction of its own) and
    settled exactly when the input is not finite, so the second origin is still found."""

    def forward(self, a):
        x = a * 1e4                  # origin 1: the 10s overflow fp16
        y = x[:, :2]                 # 1e4, finite
        return y * 10.0              # origin 2: 1e5 overflows fp16


def test_origin_behind_a_view_of_an_overflowed_tensor(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    a = torch.tensor([[1.0, 1.0, 10.0, 10.0]], dtype=torch.float16)
    with opdump.Session(cfg) as session:
        compiled = torch.compile(Sliced(), backend=session.backend("aot_eager"))
        with torch.no_grad():
            compiled(a)
        session.step()
    body, _ = _summaries(str(tmp_path / "dump"), 0, 0)
    assert [e["op_type"] for e in body["overflows"]] == ["mul", "mul"], body


def test_uninitialized_memory_is_not_an_overflow():
    """``empty``'s garbage may hold NaN bit patterns: neither it, nor a view of it, nor the
    operator that fills it is reported (the watch itself, fed real tensors)."""
    from opdump.capture.op_info import OpInfo
    from opdump.debug.overflow import OverflowWatch
    recorded = []
    watch = OverflowWatch(0, lambda *a: recorded.append(a), None, lambda: None)
    garbage = torch.full((4,), float("nan"))
    view = garbage.view(2, 2)
    watch.add(OpInfo(0, "empty", "Default"), [], [garbage], False)
    watch.add(OpInfo(1, "view", "Default"), [garbage], [view], False)
    filled = torch.ones(2, 2)
    watch.add(OpInfo(2, "mul", "Default"), [filled], [filled * float("inf")], False)   # a real origin
    watch.flush()
    assert [a[0].op_type for a in recorded] == ["mul"]


SCRIPT = '''
import torch, torch.nn as nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(()))

    def forward(self, x):
        return (x.half() * self.scale.half()).float().sum()   # 10 * 1e4 overflows fp16

model = Block()
compiled = torch.compile(model)
for step in range(3):
    model.scale.fill_(1e4 if step == 2 else 1.0)
    with torch.no_grad():
        print("step", step, compiled(torch.full((8,), 10.0)).item())
    import opdump; opdump.step()
'''


def test_opdump_run_no_eager(tmp_path):
    """``opdump run --no-eager`` (a real subprocess): the script's own ``torch.compile`` is
    routed to opdump's backend and the overflow at step 2 is found in the compiled graph."""
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    env = {k: v for k, v in os.environ.items() if k not in ("OPDUMP_CONFIG", "MINDSPORE_DUMP_CONFIG")}
    proc = subprocess.run([sys.executable, "-m", "opdump", "run", "--no-eager", "--config", cfg, str(script)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "step 2 inf" in proc.stdout
    root = str(tmp_path / "dump")
    body, rows = _summaries(root, 0, 2)
    assert [(e["op_type"], e["source"].rsplit(":", 1)[-1]) for e in body["overflows"]] == [("mul", "10")]
    assert [r["Op Name"] for r in rows] == [body["overflows"][0]["op"]]
    assert _summaries(root, 0, 0)[0]["overflows"] == [] and _summaries(root, 0, 1)[0]["overflows"] == []
    assert {(f.iteration, f.io) for f in tensor_files(root)} == {(2, "input"), (2, "output")}
