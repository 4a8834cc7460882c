"""Eager backward operators point at their forward operator's source line (not loss.backward())."""
import json
import os

import torch
from torch import nn

import opdump
from opdump.capture.eager import EagerCapture
from conftest import write_config


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return torch.tanh(self.fc(x))   # SOURCE-LINE


def test_backward_ops_carry_forward_source(tmp_path):
    cfg = write_config(tmp_path, common={"iteration": "0"})
    model = Net()
    with opdump.Session(cfg) as session, EagerCapture(session) as eager:
        model(torch.randn(2, 4)).sum().backward()
    graph = json.load(open(os.path.join(tmp_path, "dump", "rank_0", "graphs",
                                        f"ms_output_trace_code_graph_{eager.graph_id}.json")))
    line = next(i for i, t in enumerate(open(__file__).read().splitlines(), 1) if "# SOURCE-LINE" in t)
    tanh_bwd = [op for op in graph["ops"] if op["op_type"] == "tanh_backward"]
    assert tanh_bwd and tanh_bwd[0]["scope"] == "Gradients/Default/Net"
    assert any(s["file"] == __file__ and s["line"] == line for s in tanh_bwd[0]["source"]), tanh_bwd[0]["source"]
