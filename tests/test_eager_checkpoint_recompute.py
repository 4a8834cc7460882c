"""Activation checkpointing under the eager capture (seventh trial, B2/B3): a forward that
autograd recomputes in the backward is named in the scope of the module call it repeats
(``Gradients/<that scope>/<op>``, as graph mode names a recomputation), with the recomputed
line, and it is never taken for a new model call (no root entered: no parameters listed again,
the iteration goes on).  The trial's own tests (names, parameters) are in test_holdout_trial7.py."""
import csv
import json
import os

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import opdump
from opdump.capture.eager import EagerCapture


class Blk(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.ff = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = torch.tanh(self.attn(x))        # RECOMPUTED_LINE
        return self.ff(h)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blk, self.head = Blk(), nn.Linear(8, 2)

    def forward(self, x):
        return self.head(checkpoint(self.blk, x, use_reentrant=False))


def _dump(tmp_path, iteration, steps):
    path = os.path.join(str(tmp_path), "cfg.json")
    with open(path, "w") as f:
        json.dump({"common_dump_settings": {"path": os.path.join(str(tmp_path), "dump"), "net_name": "Net",
                                            "iteration": iteration, "saved_data": "statistic"},
                   "e2e_dump_settings": {"enable": True}}, f)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(path) as s, EagerCapture(s):
        for _ in range(steps):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    return os.path.join(str(tmp_path), "dump", "rank_0")


def _rows(folder):
    with open(os.path.join(folder, "statistic.csv")) as f:
        return list(csv.DictReader(f))


def test_recomputed_operators_carry_their_module_scope_and_line(tmp_path):
    rank = _dump(tmp_path, "0", 1)
    names = [r["Op Name"] for r in _rows(os.path.join(rank, "Net", "0", "0"))]
    recomputed = [n for n in names if n.startswith("Gradients/") and ("addmm" in n or "/tanh-" in n)]
    assert any(n.startswith("Gradients/Default/Net/blk-Blk/attn-Linear/addmm-op") for n in recomputed), recomputed
    assert any(n.startswith("Gradients/Default/Net/blk-Blk/tanh-op") for n in recomputed), recomputed
    assert not [n for n in names if n.startswith("Gradients/") and "/ff-Linear/tanh-" in n], names
    with open(os.path.join(rank, "graphs", "ms_output_trace_code_graph_0.ir")) as f:
        ir = f.read()
    at = ir.index("full_name_with_scope: (Gradients/Default/Net/blk-Blk/attn-Linear/addmm-op")
    block = ir[at:ir.index("%", at)]
    assert "RECOMPUTED_LINE" in block, block        # the recomputed line, not the backward call's


def test_a_recomputation_is_no_new_model_call(tmp_path):
    """Three steps, iterations 1 and 2 dumped: the recompute in every step (dumped or not) enters
    no root, so each step is one iteration and each dump holds the same rows, parameters once."""
    rank = _dump(tmp_path, "1|2", 3)
    folders = sorted(os.listdir(os.path.join(rank, "Net", "0")))
    assert folders == ["1", "2"], folders
    one, two = (_rows(os.path.join(rank, "Net", "0", k)) for k in folders)
    assert [r["Op Name"] for r in one] == [r["Op Name"] for r in two]
    params = sorted(r["Op Name"] for r in one if r["Op Type"] == "Parameter")
    assert params == sorted(n for n, _ in Net().named_parameters()), params
