"""Iterations counted without an optimizer or ``session.step()`` (README, "Iterations"): each
new top-level call of the dumped model is an iteration -- in graph mode also when Dynamo
recompiles the model between calls (a new Python float argument), as in eager mode.

Found by a hold-out trial: a recompile made a new forward graph, which had not run in the
current iteration, so three calls landed in iteration 0 in graph mode and in 0, 1, 2 in eager.
"""
import os

import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from conftest import write_config


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, scale: float):
        return self.fc(x) * scale


def _iterations(root):
    """The iteration folders of each graph folder of rank 0 that hold a statistic.csv."""
    found = set()
    for dirpath, _, files in os.walk(root):
        if "statistic.csv" in files:
            found.add(int(os.path.basename(dirpath)))
    return sorted(found)


def _run(tmp_path, mode, scales):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = write_config(tmp_path, common={"saved_data": "statistic", "statistic_category": ["max"]})
    torch.manual_seed(0)
    model, x = Scaled(), torch.randn(2, 4)
    with torch.no_grad(), opdump.Session(cfg) as session:
        if mode == "eager":
            with EagerCapture(session):
                for s in scales:
                    model(x, s)
        else:
            compiled = torch.compile(model, backend=session.backend("eager"))
            for s in scales:
                compiled(x, s)
    torch._dynamo.reset()
    return _iterations(str(tmp_path / "dump"))


def test_a_recompile_starts_the_next_iteration_as_eager_does(tmp_path):
    scales = [1.0, 2.0, 3.0]          # each float is a new constant for Dynamo: a recompile per call
    eager = _run(tmp_path / "eager", "eager", scales)
    graph = _run(tmp_path / "graph", "graph", scales)
    assert eager == [0, 1, 2]
    assert graph == eager


def test_the_same_graph_again_still_starts_the_next_iteration(tmp_path):
    assert _run(tmp_path, "graph", [1.0, 1.0, 1.0]) == [0, 1, 2]
