"""Per-step work of an every-step debug dump's root entry (issue 20: the eager overflow watch's
floor; opdump/capture/eager/mode.py ``_enter_root``).

* A debug dump records no parameter: the root's parameters and buffers go to the listing, and
  the walk that lists them runs again only when the root's tree changed (parameters.py
  ``members_unchanged``) -- not every iteration; a buffer registered later still reaches the
  listing.
* Once an optimizer counts the iterations, ``Session.enter_forward`` does nothing
  (``counts_model_calls`` False): the root entry no longer pauses the native observer around it.
Real sessions, captures and files; a spy counts calls of the real functions.
"""
import os
import warnings

import pytest
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.capture.eager import mode as eager_mode
from conftest import write_config


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _steps(tmp_path, monkeypatch, native: str, common: dict, steps: int = 4, grow_at: int = -1):
    """Train ``Small`` for ``steps`` optimizer steps under a session with ``common`` settings;
    at step ``grow_at`` a buffer is registered on ``fc2``.  Returns (calls of
    parameters_to_dump per step, the listing's parameter names, the capture)."""
    monkeypatch.setenv("OPDUMP_NATIVE_EAGER", native)
    calls = []
    real = eager_mode.parameters_to_dump

    def spy(*args, **kwargs):
        calls[-1] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(eager_mode, "parameters_to_dump", spy)
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    cfg = write_config(tmp_path, common=common)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with opdump.Session(cfg) as session, EagerCapture(session) as cap:
            for i in range(steps):
                calls.append(0)
                if i == grow_at:
                    model.fc2.register_buffer("seen", torch.zeros(2))
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
            names = set(cap.listing.param_names)
    return calls, names, cap


@pytest.mark.parametrize("native", ["0", "1"])
def test_overflow_watch_lists_parameters_once_per_tree(tmp_path, monkeypatch, native):
    calls, names, _ = _steps(tmp_path, monkeypatch, native, {"op_debug_mode": 3, "saved_data": "full"})
    assert calls == [1, 0, 0, 0]            # before: [1, 1, 1, 1] (a walk at every root entry)
    assert names == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}


def test_a_buffer_registered_later_reaches_the_debug_listing(tmp_path, monkeypatch):
    calls, names, _ = _steps(tmp_path, monkeypatch, "1", {"op_debug_mode": 3, "saved_data": "full"},
                             steps=5, grow_at=3)
    assert calls == [1, 0, 0, 1, 0]         # the tree changed at step 3: listed again, once
    assert "fc2.seen" in names


def test_a_parameter_dump_still_records_parameters_every_iteration(tmp_path, monkeypatch):
    calls, names, cap = _steps(tmp_path, monkeypatch, "1", {"saved_data": "tensor"}, steps=3)
    assert calls == [1, 1, 1]               # not a debug dump: every dumped iteration's values
    dump = tmp_path / "dump"
    params = sorted(name for _, _, files in os.walk(dump) for name in files if name.startswith("Parameter."))
    assert len([p for p in params if p.startswith("Parameter.fc1_weight.")]) == 3


def test_enter_forward_counts_model_calls_until_an_optimizer_steps(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 3, "saved_data": "full"})
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(cfg) as session:
        assert session.counts_model_calls
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        assert not session.counts_model_calls
        before = session.iteration
        session.enter_forward(("any", 1))
        session.enter_forward(("any", 1))    # a repeated key: no new iteration once driven
        assert session.iteration == before


def test_a_served_root_entry_does_not_pause_the_observer_around_enter_forward(tmp_path, monkeypatch):
    """Native pauses per served step: the parameter index and the iteration's end (before: one
    more, around enter_forward, which an optimizer-driven session makes a no-op)."""
    from opdump.capture.eager.native.path import NativeEager, _observer
    if _observer() is None:
        pytest.skip("opdump's native module is not built on this machine")
    from torch._dynamo.utils import counters
    saved = dict(counters["frames"])
    counters["frames"].clear()          # the native path serves only a process that compiled nothing
    pauses = []
    real = NativeEager._native_pause

    def spy(self):
        pauses.append(self.session.iteration)
        return real(self)

    monkeypatch.setattr(NativeEager, "_native_pause", spy)
    try:
        _, _, cap = _steps(tmp_path, monkeypatch, "1", {"op_debug_mode": 3, "saved_data": "full"}, steps=5)
    finally:
        counters["frames"].update(saved)
    assert cap.native_watch_counts[0] > 0       # the observer served (it read outputs)
    assert pauses.count(3) == 2, pauses          # before: 3
