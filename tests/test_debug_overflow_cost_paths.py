"""The eager overflow watch's cheaper paths (``op_debug_mode`` 3; README "Debug dumps"):
in-place operators that cannot make Inf/NaN from finite values (``relu_``, ``zero_``…,
:data:`opdump.debug.overflow.FINITE_PRESERVING`) get no pre-write copy, and the dumps stay
exactly what an independent plain-eager recomputation gives -- for an origin that reads
what such an operator wrote, and for an origin whose output such an operator overwrites.
Real eager runs of tiny models; the copies are counted by a real outer dispatch mode."""
import types

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

import opdump
from opdump.capture.eager import EagerCapture
from opdump.debug.overflow import needs_prewrite_copy
from dumpfiles import tensor_files
from conftest import write_config


@pytest.mark.parametrize("op_type, overload, flagged, needed", [
    ("relu_", "default", False, False), ("zero_", "default", False, False),
    ("fill_", "Scalar", False, False), ("clamp_", "default", False, False),
    ("fill_", "Scalar", True, True),          # a non-finite scalar: may be an on-purpose origin
    ("mul_", "Tensor", False, True), ("add_", "Tensor", False, True),
    ("copy_", "default", False, True),        # fp32 -> fp16 copies overflow
])
def test_which_in_place_operators_are_copied(op_type, overload, flagged, needed):
    assert needs_prewrite_copy(op_type, overload, flagged) is needed


class _Counts(TorchDispatchMode):
    """Counts the calls of one operator that reach it (under opdump's mode: the watch's own
    work -- ``clone``: its pre-write copies, ``sum``: its fp32 flags)."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is self.op:
            self.n += 1
        return func(*args, **(kwargs or {}))


class TwoWrites(nn.Module):
    def forward(self, a):
        b = a + 1
        b.relu_()                    # finite-preserving: no copy
        b.mul_(1e38)                 # may overflow (2e38 is past the bound rules' room, half of
        return b                     # float32's max: .overflow_bounds): copied before it runs


def test_relu_in_place_is_not_copied_mul_in_place_is(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    counter = _Counts(torch.ops.aten.clone.default)
    with counter, opdump.Session(cfg) as session, EagerCapture(session):
        out = TwoWrites()(torch.ones(16))
        session.step()
    assert counter.n == 1, "only mul_'s written argument is copied"
    assert torch.isfinite(out).all()


class ReluThenOrigin(nn.Module):
    """``relu_`` writes ``h``; the next ``mul`` overflows reading it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(()))

    def forward(self, x):
        h = self.fc(x).half() * 100.0
        h.relu_()
        g = h * self.scale.half()        # the origin when scale is 1e4
        return g.float().sum()


class OriginThenRelu(nn.Module):
    """The ``mul`` overflows (to +Inf and -Inf), then ``relu_`` overwrites its output."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(()))

    def forward(self, x):
        h = self.fc(x).half() * 100.0
        g = h * self.scale.half()        # the origin when scale is 1e4
        g.relu_()                        # its -Inf become 0 after the origin ran
        return g.float().sum()


def _watched(tmp_path, cls):
    torch.manual_seed(0)
    model = cls()
    model.scale.fill_(1e4)
    x = torch.randn(4, 8)
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    with opdump.Session(cfg) as session, EagerCapture(session):
        model(x)
        session.step()
    files = tensor_files(str(tmp_path / "dump"))
    names = {f.op_name for f in files}
    assert len(names) == 1, names                     # one origin, nothing else
    (name,) = names
    assert "_mul-op" in name and "relu" not in name
    return model, x, files, name


def _load(files, op_name, io, slot):
    return next(f for f in files if f.op_name == op_name and f.io == io and f.slot == slot).load()


def test_origin_after_relu_in_place_dumps_its_real_inputs(tmp_path):
    model, x, files, name = _watched(tmp_path, ReluThenOrigin)
    with torch.no_grad():                             # an independent plain-eager recomputation
        h = torch.relu(model.fc(x).half() * 100.0)
        g = h * model.scale.half()
    assert np.array_equal(_load(files, name, "input", 0), h.numpy())
    assert np.array_equal(_load(files, name, "output", 0), g.numpy())
    assert np.isinf(g.numpy()).any()


def test_origin_overwritten_by_relu_in_place_keeps_its_output(tmp_path):
    model, x, files, name = _watched(tmp_path, OriginThenRelu)
    with torch.no_grad():
        h = model.fc(x).half() * 100.0
        g = h * model.scale.half()
    out = _load(files, name, "output", 0)
    assert np.isneginf(out).any(), "the values the origin made, before relu_ overwrote them"
    assert np.array_equal(out, g.numpy())
    assert np.array_equal(_load(files, name, "input", 0), h.numpy())


class Chained(nn.Module):
    def forward(self, a):
        b = a + 0
        b.mul_(2)
        b.mul_(1e30)                 # overflows fp32 (a = 1e10): the origin
        return b.view(-1)            # finite-preserving: b's value as read after the write


def test_chained_in_place_writes_reduce_each_value_once(tmp_path, monkeypatch):
    import opdump.debug.overflow_now as now
    from opdump.debug.overflow import OverflowWatch
    # the bound rules spare both mul_ their readings (tests/test_overflow_bounds.py): off here
    monkeypatch.setattr(OverflowWatch, "BOUNDS", False)
    counter = types.SimpleNamespace(n=0)
    real = now.read_now

    def counted(t):
        counter.n += 1
        return real(t)

    monkeypatch.setattr(now, "read_now", counted)
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    with opdump.Session(cfg) as session, EagerCapture(session):
        # no overflow: nothing recorded, no statistic
        Chained()(torch.full((1 << 16,), 1.0))
        session.step()
    # b after add, after the first mul_, after the second; not the input a (a CPU input is
    # read only for a verdict), not the copies taken before each mul_ (their value is the
    # one read before the write), not the view (b's reading after the second mul_ is still
    # valid once autograd has bumped b's version: was 4 sums, 6 before that)
    assert counter.n == 3


def test_chained_in_place_origin_keeps_its_input(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    with opdump.Session(cfg) as session, EagerCapture(session):
        Chained()(torch.full((8,), 1e10))
        session.step()
    files = tensor_files(str(tmp_path / "dump"))
    assert {f.op_name for f in files} == {"Default_Chained_mul_-op2"}
    assert (_load(files, "Default_Chained_mul_-op2", "input", 0) == 2e10).all()
    assert np.isposinf(_load(files, "Default_Chained_mul_-op2", "output", 0)).all()


class Steps(nn.Module):
    """Four chained in-place writes of one shape, then (scale 1e30) an origin, then more."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(()))

    def forward(self, a):
        b = a + 0
        for _ in range(4):
            b.mul_(1.5)
        b.mul_(self.scale)               # the origin when scale is 1e30 (a = 1e10)
        c = a + 7
        for _ in range(4):
            c.mul_(2.0)                  # same shape: copies into the freed buffers
        return b, c


def test_pre_write_copies_are_reused_and_a_recorded_one_is_not(tmp_path, monkeypatch):
    from opdump.debug.overflow import OverflowWatch
    # the bound rules spare these mul_ their copies (tests/test_overflow_bounds.py): off here
    monkeypatch.setattr(OverflowWatch, "BOUNDS", False)
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    counter = _Counts(torch.ops.aten.clone.default)
    model = Steps()
    a = torch.full((64,), 1.0)
    with counter, opdump.Session(cfg) as session, EagerCapture(session):
        model(a)                         # no overflow: 9 copies, one buffer
        session.step()
        assert counter.n == 1, "each copy after the first goes into the judged batch's buffer"
        model.scale.fill_(1e30)
        a = torch.full((64,), 1e10)
        b, c = model(a)
        session.step()
    assert torch.isposinf(b).all() and (c == (1e10 + 7) * 16).all()
    files = tensor_files(str(tmp_path / "dump"))
    (name,) = {f.op_name for f in files}
    assert name == "Default_Steps_mul_-op5"
    assert (_load(files, name, "input", 0) == 1e10 * 1.5 ** 4).all()      # its values before the write
    assert np.isposinf(_load(files, name, "output", 0)).all()
