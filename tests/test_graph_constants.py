"""Graph mode with tensor constants in ``forward`` (lifted into the ATen graph):
the compile no longer fails under fake tensors, training is unchanged, and the
constants are written once under ``{net}/{graph_id}/constants/`` with their values."""
import copy
import os

import numpy as np
import torch
from torch import nn

import opdump
from conftest import write_config


class WithConstants(nn.Module):
    """A forward holding tensor constants, as Hugging Face models do (``tensor([])`` too)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        scale = torch.tensor([1., 2., 3.])
        empty = torch.tensor([])
        return torch.cat([self.fc(x) * scale, empty.expand(x.shape[0], 0)], dim=1)


def _train(model, compiled, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        loss = compiled(torch.randn(4, 3)).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_lifted_constants_compile_train_and_are_written(tmp_path, recwarn):
    torch.manual_seed(0)
    model = WithConstants()
    reference = copy.deepcopy(model)
    # iteration 1 only: the compile (at iteration 0) happens while nothing dumps, the case that failed
    cfg = write_config(tmp_path, common={"iteration": "1", "net_name": "Net"})
    with opdump.Session(cfg) as session:
        losses = _train(model, torch.compile(model, backend=session.backend("eager")))
    assert losses == _train(reference, reference), "the dump changed the training"
    assert not [w for w in recwarn.list if "no longer dumped" in str(w.message)]

    net = tmp_path / "dump" / "rank_0" / "Net"
    folders = sorted(p for p in net.glob("*/constants"))
    assert len(folders) == 1, "the forward graph's constants"
    files = sorted(os.listdir(folders[0]))
    assert len(files) == 2, files
    assert all(f.startswith("Parameter.data-") and f.endswith(".Float32.npy") for f in files), files
    values = sorted((np.load(folders[0] / f) for f in files), key=lambda a: a.size)
    assert values[0].shape == (0,)
    np.testing.assert_array_equal(values[1], np.array([1., 2., 3.], dtype=np.float32))
    # the iteration's own files are there too (the graph ran on the dump path at iteration 1)
    assert os.listdir(folders[0].parent / "1")
