"""Watcher mode in graph mode: an in-place write to a watched output inside the compiled region
(README's own bug, ``self.cache.data.mul_(0.5)``) is functionalised by AOTAutograd into an
operator making a new tensor (``mul(detach(h), 0.5)``), which the backward then reads instead of
the watched output.  The seventh hold-out trial (B1) found graph mode saying "no watched output
changed" (exit 0) where eager mode names the write; now the operator that computes the new value
is named, with the line of the write (opdump/debug/watcher_graph.py, functionalised_writes)."""
import json
import os

import numpy as np
import torch
import torch.nn as nn

import opdump
from conftest import write_config


class Net(nn.Module):
    def __init__(self, bug: bool):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)
        self.cache, self.bug = None, bug

    def forward(self, x):
        h = torch.tanh(self.fc1(x))          # tanh saves h for its backward
        self.cache = h
        y = self.fc2(h)
        if self.bug:
            self.cache.data.mul_(0.5)        # BUG_LINE: rescales h behind autograd's back
        return y


BUG_LINE = next(i for i, line in enumerate(open(__file__), 1) if "BUG_LINE" in line and "mul_" in line)


def _run(tmp_path, bug: bool):
    cfg = write_config(tmp_path, common={"input_output": 2, "iteration": "0"},
                       e2e={"watcher": {"watcher_nodes": ["tanh"]}})
    torch.manual_seed(0)
    model = Net(bug)
    with opdump.Session(cfg) as session:
        compiled = torch.compile(model, backend=session.backend("aot_eager"))
        for _ in range(2):
            compiled(torch.randn(3, 4)).sum().backward()
            session.step()
    paths = [os.path.join(f, n) for f, _, names in os.walk(tmp_path / "dump") for n in names if n == "watcher.json"]
    bodies = [json.load(open(p)) for p in paths]
    return [(p, b) for p, b in zip(paths, bodies) if b["watched"]]


def test_functionalised_data_write_is_named_with_its_line(tmp_path):
    ((path, body),) = _run(tmp_path, bug=True)
    first = body["first_change"]
    assert first is not None, body                       # before: None ("no watched output changed")
    assert first["watched"].endswith("tanh-op2") and first["slot"] == 0 and first["witness"] == "write"
    assert first["after_type"].startswith("mul") and first["source"].endswith(f":{BUG_LINE}"), first
    from opdump.analysis.watcher_report import load_watcher
    it = next(i for i in load_watcher(os.path.dirname(path)) if i.path == path)
    arrays = [np.load(files[0]) for snap, files in zip(it.body["snapshots"], it.snapshot_files)
              if snap["watched"] == first["watched"]]
    assert len(arrays) == 2                               # own run, then the halved value
    np.testing.assert_allclose(arrays[1], arrays[0] * np.float32(0.5))


def test_no_write_no_change(tmp_path):
    ((_, body),) = _run(tmp_path, bug=False)
    assert body["first_change"] is None and body["changes"] == [], body


def test_functionalised_writes_of_an_aot_graph():
    """Which nodes of an AOT forward graph replace another node's output: the ``mul`` of a
    ``.data`` write (through ``detach``) replaces ``tanh``'s; a write to a slice is an ``add`` that
    replaces the ``slice`` and a ``slice_scatter`` that replaces ``relu``'s whole output (the
    ``slice`` itself, a view, replaces nothing); ``c[1:] = 0`` the same with ``fill``; the product
    ``a * b``, made of no in-place call, replaces nothing."""
    from torch._dynamo.backends.common import aot_autograd
    from opdump.debug.watcher_graph import functionalised_writes
    seen = []

    def fw(gm, _):
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        op = lambda n: str(n.target).replace("aten.", "").split(".")[0]      # noqa: E731
        seen.extend(sorted((op(nodes[k]), op(nodes[v])) for k, (v, _) in functionalised_writes(nodes).items()))
        return gm.forward

    class Two(nn.Module):
        def forward(self, x):
            a = torch.tanh(x)
            b = torch.relu(x)
            y = a * b
            a.data.mul_(0.5)                 # whole alias: replaces tanh's output
            b[:1].add_(1)                    # a slice of it: add on the slice, slice_scatter into b
            c = torch.sigmoid(x)
            c[1:] = 0                        # setitem: fill of the slice, slice_scatter into c
            return y, a.data, b, c
    from functorch.compile import make_boxed_func
    torch.compile(Two(), backend=aot_autograd(fw_compiler=lambda gm, ex: make_boxed_func(fw(gm, ex))))(
        torch.randn(2, 3))
    assert seen == [("add", "slice"), ("fill", "slice"), ("mul", "tanh"), ("slice_scatter", "relu"),
                    ("slice_scatter", "sigmoid")], seen
