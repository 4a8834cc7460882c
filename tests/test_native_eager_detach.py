"""The native eager observer keeps autograd's detaches of saved outputs off Python in the forward
pass (observer.cpp, exclude_python), and its dump stays the Python capture's.

Why it matters: a served iteration runs under the inert dispatch mode (native/inert.py); with any
mode on the stack torch detaches every output autograd saves through the mode's Python
``__torch_dispatch__`` (~20 us each).  The observer excludes the Python key from a candidate
operator's start to its end, so the saves made by that operator's autograd kernel take plain
eager's path.  Backward nodes still unpack through the mode: its ``__torch_dispatch__`` is the
observer's C++ ``inert_dispatch``, which forwards those detaches with no Python frame.  Proven
here on a real training step: in a served iteration no detach reaches the inert mode during the
forward pass, those of the backward pass run no Python, the dump equals the Python capture's file
by file, and the training's losses equal a run without opdump.
"""
import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from opdump.capture.eager.native import inert, path

_TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _TESTS)
from test_native_eager import _observer_built, assert_same_dump, run, sgd_training  # noqa: E402

pytestmark = pytest.mark.skipif(not _observer_built, reason="opdump's native module is not built on this machine")


@pytest.fixture(autouse=True)
def _as_in_a_fresh_eager_process():
    """As in tests/test_native_eager.py: Dynamo's frame counters set aside while these run."""
    from torch._dynamo.utils import counters
    saved = dict(counters["frames"])
    counters["frames"].clear()
    yield
    counters["frames"].update(saved)


class Saver(torch.nn.Module):
    """Operators whose autograd saves their output (sigmoid, tanh, exp): each save is a detach."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 5)

    def forward(self, x):
        h = self.fc(x)
        return (h.sigmoid() * h.tanh()).exp().sum()


PHASE = {"now": "forward", "detaches": {"forward": 0, "backward": 0}, "python": {"forward": 0, "backward": 0}}
_INERT_FILE = os.path.abspath(inert.__file__)
_TORCH_WRAPPERS = (os.path.join("torch", "_compile.py"), os.path.join("torch", "_dynamo", "eval_frame.py"))


_DISPATCH_FRAMES = ("__torch_dispatch__", "forward", "inner", "_fn")


def _python_calls(calls):
    """A sys.setprofile function counting into ``calls``, per phase, the Python calls of a mode's
    dispatch: the inert mode's own method, the Dynamo-disable wrappers torch puts around it."""
    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_name in _DISPATCH_FRAMES and (
                code.co_filename == _INERT_FILE or code.co_filename.endswith(_TORCH_WRAPPERS)):
            calls[PHASE["now"]] = calls.get(PHASE["now"], 0) + 1
    return profile


def _phase(now):
    """Enter phase ``now``: the detaches the inert mode forwarded natively so far go to the phase
    that ends (observer_api.cpp, inert_counts)."""
    obs = path._observer()
    done = obs.inert_counts()[0] if obs is not None else 0
    PHASE["detaches"][PHASE["now"]] = PHASE["detaches"].get(PHASE["now"], 0) + done
    PHASE["now"] = now


def _training(losses):
    def make():
        torch.manual_seed(0)
        model = Saver()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = [torch.randn(3, 6, generator=torch.Generator().manual_seed(i)) for i in range(4)]
        it = iter(batches)

        def step():
            calls = {}
            opt.zero_grad()
            sys.setprofile(_python_calls(calls))
            try:
                _phase("forward")
                loss = model(next(it))
                _phase("backward")
                served = isinstance(_get_current_dispatch_mode(), inert.InertMode)
                loss.backward()
                _phase("optimizer")
                opt.step()
                _phase("outside")
            finally:
                sys.setprofile(None)
            if served:      # the Python calls of the iterations the observer served
                for phase, n in calls.items():
                    PHASE["python"][phase] = PHASE["python"].get(phase, 0) + n
            losses.append(loss.item())
        return step
    return make


def test_served_forward_detaches_no_saved_output_through_python(tmp_path, monkeypatch):
    """Forward: no detach at all (the observer excludes the Python key around its operators);
    backward: the unpacks' detaches reach the inert mode, which forwards them natively -- no Python
    frame, neither its own nor Dynamo's wrappers (fails before: ~16 a step on AlexNet went
    through three Python frames each)."""
    PHASE["detaches"], PHASE["python"] = {"forward": 0, "backward": 0}, {"forward": 0, "backward": 0}
    PHASE["now"] = "outside"        # what earlier tests of this process left in the observer's counters
    _phase("outside")               # (inert_counts reads and resets them) is no phase of this test's
    nat_losses, py_losses, plain_losses = [], [], []
    # both runs made from one line (the listing's source stacks hold this test file's lines too)
    (nat_root, live, warned), (py_root, _, _) = [
        run(tmp_path / kind, _training(nat_losses if kind == "native" else py_losses), kind == "native",
            monkeypatch, steps=4) for kind in ("native", "python")]
    assert not warned, [str(w.message) for w in warned]
    assert live == [True, True, True, False]        # iterations 1-2 served (3: the last dumped one)
    # sigmoid, tanh and exp save their outputs in each served forward: none detached through the mode
    assert PHASE["detaches"]["forward"] == 0, PHASE["detaches"]
    # the backward's unpacks still are (a node's formula branches on the mode), natively
    assert PHASE["detaches"]["backward"] > 0, PHASE["detaches"]
    assert PHASE["python"]["backward"] == 0 and PHASE["python"]["forward"] == 0, PHASE["python"]
    assert_same_dump(py_root, nat_root, (0, 1, 2, 3))
    step = _training(plain_losses)()
    for _ in range(4):
        step()
    assert nat_losses == py_losses == plain_losses


class WithSubclass(torch.nn.Module):
    """From step 2 a tensor subclass with its own ``__torch_dispatch__`` (torch's TwoTensor) meets
    an operator in the forward: its call carries the Python key, so it must reach the inert mode
    (which notes it: the observer does not model it) with the mode enabled."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.step = 0

    def forward(self, x):
        self.step += 1
        h = self.fc(x).sigmoid()
        if self.step >= 3:
            from torch.testing._internal.two_tensor import TwoTensor
            pair = TwoTensor(x.detach(), x.detach() * 2)
            h = h + (pair * 3).a.sum()
        return h.sum()


def _subclass_training(losses):
    return sgd_training(losses, WithSubclass, lambda: torch.randn(2, 4, generator=torch.Generator().manual_seed(1)))


def test_a_subclass_call_in_a_served_iteration_reaches_the_mode(tmp_path, monkeypatch):
    """The call on the subclass is dispatched to the Python key: the observer leaves the Python key
    alone for it (excluded, torch's fallback would find no mode and skip the inert one): the inert
    mode sees it, iteration 2 is dropped with one warning, the Python capture serves the rest,
    and the training's losses are a plain run's."""
    losses, plain = [], []
    root, live, warned = run(tmp_path / "native", _subclass_training(losses), True, monkeypatch, steps=4)
    assert len(warned) == 1 and "reached a dispatch mode" in str(warned[0].message), [str(w.message) for w in warned]
    assert "iteration 2 is not dumped" in str(warned[0].message)
    assert live == [True, True, False, False]
    step = _subclass_training(plain)()
    for _ in range(4):
        step()
    assert losses == plain
