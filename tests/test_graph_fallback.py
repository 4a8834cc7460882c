"""Graph mode never breaks the user's compile or step: a failure anywhere in the
dump path (armed with :mod:`opdump.capture.graph.faults` at each stage) gives one
warning naming the graph, the graph runs on the user's real backend, and the
losses are exactly those of the same training without opdump."""
import copy
import warnings

import pytest
import torch
from torch import nn

import opdump
from opdump.capture.graph import faults
from conftest import write_config
from dumpfiles import tensor_files


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _train(model, compiled, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        torch.manual_seed(step)
        x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
        loss = nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _run(tmp_path, real, iteration, stages):
    """Train with opdump (``stages`` armed) and without; the losses and opdump's warnings."""
    torch.manual_seed(0)
    model = Mlp()
    reference = copy.deepcopy(model)
    cfg = write_config(tmp_path, common={"iteration": iteration})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with faults.inject(*stages), opdump.Session(cfg) as session:
            losses = _train(model, torch.compile(model, backend=session.backend(real)))
    torch._dynamo.reset()
    expected = _train(reference, torch.compile(reference, backend=real))
    failures = [str(w.message) for w in caught if "is no longer dumped" in str(w.message)]
    return losses, expected, failures


@pytest.mark.parametrize("stage", ["compile:backward", "call", "tap", "dumped call"])
def test_failure_falls_back_with_one_warning_and_same_losses(tmp_path, stage):
    losses, expected, failures = _run(tmp_path, "eager", "0|1|2", [stage])
    assert losses == expected
    assert len(failures) == 1, failures
    assert "the graph of Mlp" in failures[0] and "InjectedFault" in failures[0], failures[0]
    # nothing is dumped after the failure: iterations 1 and 2 have no tensor file
    assert {f.iteration for f in tensor_files(str(tmp_path / "dump"))} <= {0}


def test_failure_with_iteration_all_runs_on_without_a_real_path(tmp_path):
    """``iteration: "all"`` compiles no real path up front; a failure at a call still goes on."""
    losses, expected, failures = _run(tmp_path, "eager", "all", ["dumped call"])
    assert losses == expected and len(failures) == 1, failures


def test_compile_failure_falls_back_to_inductor(tmp_path):
    """A failure while compiling the forward graph: inductor (the default real backend)
    compiles the graph instead, from step 0, and trains bit-for-bit like plain inductor."""
    losses, expected, failures = _run(tmp_path, "inductor", "0|1", ["compile:forward"])
    assert losses == expected
    assert len(failures) == 1 and "compiling the forward graph" in failures[0], failures
    assert tensor_files(str(tmp_path / "dump")) == []


def test_no_session_compiles_with_the_real_backend(recwarn):
    model = Mlp()
    compiled = torch.compile(model, backend=opdump.backend("eager"))
    with pytest.warns(RuntimeWarning, match="no open dump session"):
        out = compiled(torch.ones(2, 8))
    torch.testing.assert_close(out, model(torch.ones(2, 8)), rtol=0, atol=0)
