"""Operator scopes of the frames Dynamo compiles around graph breaks (README, "Eager mode":
scopes; ``opdump/capture/graph/frame_scope.py``).

A break inside a sub-module's ``forward`` makes Dynamo compile that ``forward`` and its
resume function as frames of their own (module paths relative to the sub-module), and a
break in the root's ``forward`` while ``self.head`` is already on the value stack hands
the head to the resume function as an argument (``L['___stack0']``).  Every operator of
the compiled dump must still carry the name eager mode gives it: same set of operator
names per iteration (graph folders aside), forward and backward.
"""
from __future__ import annotations

import csv
import glob
import os
import re

import pytest
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from conftest import write_config

STATS = {"saved_data": "statistic", "statistic_category": ["max", "min"]}


class _Blk(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.n = nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x):
        y = self.a(x).relu()
        torch._dynamo.graph_break()               # the block's frame is compiled on its own
        return self.n(y)


class _TwoLevel(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.blk, self.head = nn.Linear(8, 8), _Blk(), nn.Linear(8, 1)

    def forward(self, x):
        x = self.inp(x).tanh()
        torch._dynamo.graph_break()               # a resume function of the root
        return self.head(self.blk(x)).pow(2).mean()   # self.head on the stack at the block's break


def _names(dump: str):
    """{iteration: operator names without their ``-opN`` number} over every graph folder.

    ``detach`` rows are left out: AOTAutograd adds ``detach`` nodes at a compiled graph's
    boundaries that eager mode never runs, so their number follows the break layout, not the
    naming (their scopes are checked below)."""
    per_it = {}
    for p in glob.glob(os.path.join(dump, "rank_0", "Net", "*", "*", "statistic.csv")):
        it = os.path.basename(os.path.dirname(p))
        if it == "constants":
            continue
        with open(p, newline="") as f:
            per_it.setdefault(int(it), set()).update(
                re.sub(r"-op\d+$", "", r["Op Name"]) for r in csv.DictReader(f)
                if r["Op Name"].startswith(("Default/", "Gradients/")) and r["Op Type"] != "detach")
    return per_it


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    import torch._dynamo
    out = {}
    for mode in ("eager", "graph"):
        torch.manual_seed(0)
        model = _TwoLevel()
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        folder = tmp_path_factory.mktemp(mode)
        cfg = write_config(folder, common=STATS)
        torch._dynamo.reset()
        with opdump.Session(cfg) as s, EagerCapture(s):
            run = torch.compile(model, backend=s.backend("eager")) if mode == "graph" else model
            for step in range(2):
                run(torch.randn(4, 8, generator=torch.Generator().manual_seed(step))).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        out[mode] = _names(str(folder / "dump"))
    torch._dynamo.reset()
    return out


def test_compiled_names_around_graph_breaks_equal_eager_names(dumps):
    eager, graph = dumps["eager"], dumps["graph"]
    assert sorted(graph) == sorted(eager) == [0, 1]
    for it in eager:
        assert graph[it] == eager[it], (sorted(graph[it] - eager[it]), sorted(eager[it] - graph[it]))


def test_the_break_frames_are_named_below_their_modules(dumps):
    names = dumps["graph"][0]
    assert any(n.startswith("Default/_TwoLevel/blk-_Blk/n-LayerNorm/") for n in names)
    assert any(n.startswith("Default/_TwoLevel/head-Linear/") for n in names)
    assert any(n.startswith("Gradients/Default/_TwoLevel/blk-_Blk/a-Linear/") for n in names)
    assert not any(n.startswith(("Default/_Blk", "Default/Linear", "Gradients/Default/_Blk")) for n in names)
    assert not any(re.match(r"(Gradients/)?Default/_TwoLevel/(addmm|native_layer_norm|mm)$", n) for n in names)
