"""Eager capture next to the graph front-end: a model that compiles one sub-module
and runs the rest eagerly is dumped completely, once, with names that do not
collide (README, Eager mode)."""
import os

import numpy as np
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec
from dumpfiles import execution_order, find, sanitize, tensor_files


class Blk(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(3, 3)

    def forward(self, x):
        return torch.tanh(self.l(x))


class Part(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Blk()
        self.sub = Blk()

    def forward(self, x):
        return self.sub(torch.relu(self.a(x))).sum()


def _run(root, dump_mode=0, mark=False):
    torch.manual_seed(0)
    model = Part()
    if mark:
        opdump.set_dump(model.a)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = [torch.randn(2, 3) for _ in range(2)]
    cfg = DumpConfig(path=root, iteration=IterationSpec(ranges=((0, 1),)), dump_mode=dump_mode)
    seen = {}
    with opdump.Session(cfg) as session, EagerCapture(session) as cap:
        model.sub = torch.compile(model.sub, backend=session.backend("eager"))
        for i, x in enumerate(xs):
            h = model.a.register_forward_hook(lambda m, inp, out: seen.__setitem__(i, out.detach().clone()))
            model(x).backward()
            h.remove()
            opt.step()
            opt.zero_grad()
    return cap.graph_id, seen


def test_partly_compiled_model_dumped_once_without_collisions(tmp_path):
    root = str(tmp_path)
    gid, seen = _run(root)
    assert gid == 0                                        # reserved at start, before any compile
    eager = execution_order(root, 0)
    fwd_graph = execution_order(root, 1)                   # the compiled sub-module's graphs
    bwd_graph = execution_order(root, 2)
    # the compiled sub-module is dumped by the graph front-end only; what the eager graph shows
    # of it is autograd's accumulation of its gradients into .grad, which no graph contains
    sub = [n for n in eager if "sub-" in n]
    assert sub and all(n.startswith("Gradients/Default/Part/sub-Blk/l-Linear/detach-op") for n in sub)
    assert "Default/Part/a-Blk/l-Linear/addmm-op1" in eager
    assert any(n.startswith("Default/Part/relu-op") for n in eager)
    assert any(n.startswith("Gradients/Default/Part/a-Blk/tanh_backward-op") for n in eager)
    # named as in eager: under the root and the enclosing modules (graph/frame_scope.py)
    assert "Default/Part/sub-Blk/l-Linear/addmm-op1" in fwd_graph
    assert any(n.startswith("Gradients/Default/Part/sub-Blk/tanh_backward-op") for n in bwd_graph)
    # every operator of the model ran once in the dump: 2 addmm / tanh in forward, one per graph
    forward = [n for n in eager + fwd_graph if n.startswith("Default/") and "optimizer" not in n]
    assert sum(n.rsplit("/", 1)[1].startswith("addmm-") for n in forward) == 2
    assert sum(n.rsplit("/", 1)[1].startswith("tanh-") for n in forward) == 2
    # both iterations dumped, same names in each
    files = tensor_files(root)
    for graph in (0, 1, 2):
        by_it = [{(f.op_name, f.io, f.slot) for f in files if f.graph == graph and f.iteration == it}
                 for it in (0, 1)]
        assert by_it[0] == by_it[1] and by_it[0]
    # eager values match an independent capture (forward hook)
    for it in (0, 1):
        out = find(files, "Default/Part/a-Blk/tanh-op2", "output", 0, it)
        assert out.graph == 0
        np.testing.assert_array_equal(out.load(), seen[it].numpy())
    # the eager graph dumps only the parameters of the eager part
    params = {f for f in os.listdir(os.path.join(root, "rank_0", "Net", "0", "1")) if f.startswith("Parameter.")}
    assert {p.split(".")[1] for p in params} == {"a_l_weight", "a_l_bias"}


def test_set_dump_in_partly_compiled_model(tmp_path):
    root = str(tmp_path)
    _run(root, dump_mode=2, mark=True)
    eager = execution_order(root, 0)
    dumped = {f.op_name for f in tensor_files(root) if f.graph == 0 and f.op_type != "Parameter"}
    assert dumped == {sanitize(n) for n in eager if "/a-Blk/" in n}
