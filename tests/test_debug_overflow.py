"""Overflow-only dump (``op_debug_mode`` 3, eager mode; README "Debug dumps") on real eager
runs of tiny models: only the operator that turned finite inputs into Inf/NaN is dumped
(inputs and outputs, values as they were when it ran), operators that only propagate it or
make ``-inf`` on purpose (attention masks) are not, ``overflow_number`` limits, iterations
without overflow write no tensor file, and training is unchanged by the watch.  Graph mode:
tests/test_overflow_graph.py."""
import json
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.debug.origin import ARGUMENT, INPUT, ON_PURPOSE, OPERATOR, judge
from dumpfiles import find, tensor_files
from conftest import write_config


class Net(nn.Module):
    """fp16 block whose ``mul`` by ``scale`` overflows when the scale is 1e4, then operators
    that only carry the Inf along, and an attention-style masked softmax."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(()))

    def forward(self, x):
        h = self.fc(x).half() * 100.0
        h = h * self.scale.half()                 # the origin when scale is 1e4
        h = (h + 1).float() * 2                   # only propagate
        scores = x @ x.t()
        mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
        attn = scores.masked_fill(mask, float("-inf")).softmax(-1)     # -inf on purpose
        return (h.sum() + attn.sum())


def _overflow_json(root, iteration):
    paths = sorted(root.rglob("overflow.json"))
    hit = [p for p in paths if p.parent.name == str(iteration)]
    assert len(hit) == 1, paths
    return json.loads(hit[0].read_text())


def _run(tmp_path, steps=3, bad_step=1, common=None):
    cfg = write_config(tmp_path, common={"op_debug_mode": 3, **(common or {})})
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(4, 4) + 2.0
    with opdump.Session(cfg) as session, EagerCapture(session):
        for step in range(steps):
            model.scale.fill_(1e4 if step == bad_step else 1.0)
            model(x)
            session.step()
    return tmp_path / "dump"


def test_only_the_origin_is_dumped(tmp_path):
    root = _run(tmp_path)
    files = tensor_files(str(root))
    assert {f.iteration for f in files} == {1}, "iterations without overflow write no tensor file"
    report = _overflow_json(root, 1)
    assert len(report["overflows"]) == 1
    event = report["overflows"][0]
    name = event["op"]
    assert event["op_type"] == "mul" and "self.scale" in event["code"] and event["dumped"]
    assert event["source"].endswith(f"test_debug_overflow.py:{Net.forward.__code__.co_firstlineno + 2}")
    assert {f.op_name for f in files} == {name.replace("/", "_")}
    out = find(files, name, "output", 0).load()
    assert out.dtype == np.float16 and np.isinf(out).any()
    for slot in (0, 1):
        assert np.isfinite(find(files, name, "input", slot).load()).all()
    o = event["outputs"][0]
    assert o["slot"] == 0 and o["nan"] == int(np.isnan(out).sum())
    assert (o["pos_inf"], o["neg_inf"]) == (int(np.isposinf(out).sum()), int(np.isneginf(out).sum()))
    assert _overflow_json(root, 0)["overflows"] == [] and _overflow_json(root, 2)["overflows"] == []


class Twice(nn.Module):
    """Two independent overflows in one step, then an in-place write to the first one's input."""

    def forward(self, a, b):
        y = a * 1e4                  # overflows (a holds values > 6.6)
        z = b * 1e4                  # overflows too
        a.mul_(0)                    # overwrites the first overflow's input after it ran
        return y, z


def test_overflow_number_limits_and_inputs_are_as_they_were(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 3, "overflow_number": 1})
    a = torch.full((8,), 10.0, dtype=torch.float16)
    b = torch.full((8,), 20.0, dtype=torch.float16)
    with opdump.Session(cfg) as session, EagerCapture(session):
        Twice()(a, b)
        session.step()
    root = tmp_path / "dump"
    files = tensor_files(str(root))
    assert {f.op_name for f in files} == {"Default_Twice_mul-op0"}
    assert (find(files, "Default/Twice/mul-op0", "input", 0).load() == 10).all()   # before a.mul_(0)
    report = _overflow_json(root, 0)
    assert [(e["op"], e["dumped"]) for e in report["overflows"]] == [
        ("Default/Twice/mul-op0", True), ("Default/Twice/mul-op1", False)]


class InPlace(nn.Module):
    def forward(self, a):
        b = a + 0
        b.mul_(1e4)                  # an in-place operator overflows
        return b * 2                 # propagates only


def test_in_place_origin_keeps_its_input(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    with opdump.Session(cfg) as session, EagerCapture(session):
        InPlace()(torch.full((4,), 30.0, dtype=torch.float16))
        session.step()
    files = tensor_files(str(tmp_path / "dump"))
    assert {f.op_name for f in files} == {"Default_InPlace_mul_-op1"}
    assert (find(files, "Default/InPlace/mul_-op1", "input", 0).load() == 30).all()
    assert np.isposinf(find(files, "Default/InPlace/mul_-op1", "output", 0).load()).all()


class Masked(nn.Module):
    def forward(self, x):
        m = torch.full((4, 4), float("-inf")).triu(1)          # scalar -inf mask
        s = (x @ x.t() + m).softmax(-1)
        return s.masked_fill(torch.eye(4, dtype=torch.bool), float("-inf")).sum()


def test_masks_and_nan_propagation_are_not_reported(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    with opdump.Session(cfg) as session, EagerCapture(session):
        Masked()(torch.randn(4, 4))
        InPlace()(torch.full((4,), float("nan"), dtype=torch.float16))     # NaN in: only propagated
        session.step()
    root = tmp_path / "dump"
    assert tensor_files(str(root)) == []
    assert _overflow_json(root, 0)["overflows"] == []


class Train(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(inplace=True), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)


def _train(cfg=None, steps=4):
    torch.manual_seed(0)
    model = Train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 6), torch.randn(16, 1)
    losses = []

    def loop(session=None):
        for _ in range(steps):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    if cfg is None:
        loop()
    else:
        with opdump.Session(cfg) as session, EagerCapture(session):
            loop(session)
    return losses, [p.detach().clone() for p in model.parameters()]


def test_training_unchanged(tmp_path):
    plain_losses, plain_params = _train()
    losses, params = _train(write_config(tmp_path, common={"op_debug_mode": 3}))
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(params, plain_params))
    assert tensor_files(str(tmp_path / "dump")) == []
    for it in range(4):
        assert _overflow_json(tmp_path / "dump", it)["overflows"] == []


def test_dump_mode_1_kernels_ignored_with_warning(tmp_path):
    with pytest.warns(UserWarning, match="dump_mode 1 is ignored"):
        cfg = opdump.load_config(write_config(tmp_path, common={"op_debug_mode": 3, "dump_mode": 1,
                                                                "kernels": ["Default/Net/mul-op3"]}))
    assert cfg.dump_mode == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opdump.load_config(write_config(tmp_path, common={"op_debug_mode": 3}))


@pytest.mark.parametrize("facts,verdict", [
    ((False, False, False, False, False), None),
    ((False, False, True, False, False), OPERATOR),       # finite in, Inf out
    ((False, False, True, False, True), ON_PURPOSE),      # masked_fill(-inf)
    ((True, False, True, False, False), ON_PURPOSE),      # a mask carried along
    ((True, False, True, True, False), OPERATOR),         # masked row softmax -> NaN
    ((False, False, True, True, True), ARGUMENT),         # x + nan
    ((True, True, True, True, False), INPUT),             # NaN came in
])
def test_origin_rule(facts, verdict):
    assert judge(*facts) == verdict
