"""The overflow watch's CPU path and its shortcuts (``op_debug_mode`` 3, eager; README "Debug
dumps"; opdump/debug/overflow_now.py, overflow_rules.py): CPU operators are read and judged
as they return, inputs are read only for a verdict, ``mul`` by a number of magnitude at most
1 (``div`` by at least 1) and random fills are spared reductions and pre-write copies.  Each
test is a real eager run of a tiny module whose dump an independent recomputation
predicts, and each fails when the guard it names is removed."""
import json

import numpy as np
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.debug.overflow_rules import needs_prewrite_copy, scales_down
from dumpfiles import tensor_files
from conftest import write_config


def _dump(tmp_path, module, *args):
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    with opdump.Session(cfg) as session, EagerCapture(session):
        out = module(*args)
        session.step()
    files = tensor_files(str(tmp_path / "dump"))
    return out, files, {f.op_name for f in files}


def _load(files, op_name, io, slot=0):
    return next(f for f in files if f.op_name == op_name and f.io == io and f.slot == slot).load()


def test_scales_down_only_for_bounded_nonzero_numbers():
    assert scales_down("mul_", "Tensor", [None, 0.9]) and scales_down("mul", "Scalar", [None, -1.0])
    assert scales_down("div_", "Tensor", [None, 1.0]) and scales_down("div", "Tensor", [None, -8])
    assert scales_down("mul", "Tensor", [None, torch.tensor(0.5)])
    for op, s in (("mul_", 1.5), ("mul_", 0.0), ("mul", float("nan")), ("div_", 0.9), ("div", float("inf")),
                  ("mul", torch.ones(2)), ("mul", 1j), ("add", 0.5)):
        assert not scales_down(op, "Tensor", [None, s]), (op, s)
    assert needs_prewrite_copy("mul_", "Tensor", False, [None, 2.0])
    assert not needs_prewrite_copy("mul_", "Tensor", False, [None, 0.5])
    assert not needs_prewrite_copy("bernoulli_", "float", False)


class ScaleUp(nn.Module):
    def forward(self, a):
        b = a + 0
        b.mul_(1e10)                 # |s| > 1: may overflow, so it is copied and read
        c = a + 0
        c.div_(1e-10)                # |s| < 1 for div: the same
        return b, c


def test_in_place_scaling_up_is_still_an_origin_with_its_input(tmp_path):
    # guard: scales_down's bound (|s| <= 1 for mul, >= 1 for div); without it both writes
    # are taken as finite-preserving: outputs "finite" from their finite inputs, no copy
    a = torch.full((16,), 1e30)
    (b, c), files, names = _dump(tmp_path, ScaleUp(), a)
    assert torch.isposinf(b).all() and torch.isposinf(c).all()
    assert names == {"Default_ScaleUp_mul_-op1", "Default_ScaleUp_div_-op3"}
    for name in names:
        assert (_load(files, name, "input") == np.float32(1e30)).all(), "the value before the write"
        assert np.isposinf(_load(files, name, "output")).all()


class MaskTimesZero(nn.Module):
    def forward(self, x):
        m = torch.full_like(x, float("-inf"))    # an on-purpose -inf (a non-finite argument)
        m.mul_(0.0)                              # -inf * 0 = NaN: this operator made the NaN
        return x + m


def test_on_purpose_inf_times_zero_is_an_origin_with_its_input(tmp_path):
    # guard: scales_down excludes 0 (inf * 0 is NaN); without it the copy is skipped and the
    # recorded input is the NaN the operator wrote, not the -inf it read
    out, files, names = _dump(tmp_path, MaskTimesZero(), torch.ones(8))
    assert torch.isnan(out).all()
    assert names == {"Default_MaskTimesZero_mul_-op1"}
    assert np.isneginf(_load(files, "Default_MaskTimesZero_mul_-op1", "input")).all()
    assert np.isnan(_load(files, "Default_MaskTimesZero_mul_-op1", "output")).all()


class Carry(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.nn.functional.dropout(self.fc(x), 0.5, training=True)     # bernoulli_ mask
        return (h * 0.5).relu() * 3.0


def test_a_non_finite_input_nobody_read_is_not_blamed(tmp_path):
    # guard: inputs are read when an output is not finite (lazily, not never): the Inf comes
    # in with x, every operator only carries it; no origin, no file
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    x[1, 2] = float("inf")
    out, files, names = _dump(tmp_path, Carry(), x)
    assert not torch.isfinite(out).all()
    assert names == set()


class Reuse(nn.Module):
    def forward(self, a, bad):
        b = a + 0
        b.mul_(2.0)          # copied (known finite), the copy's buffer is freed after its verdict
        bad.mul_(2.0)        # copied into that buffer; bad was never read and holds Inf
        return b, bad


def test_a_reused_copy_buffer_does_not_keep_its_old_value(tmp_path):
    # guard: copy_written drops the pooled buffer's old value (a copy made under the dispatch
    # mode moves no version counter); without it the second copy reads "finite" and mul_ is
    # blamed for an Inf that came in with its input
    bad = torch.ones(64)
    bad[3] = float("inf")
    (b, out), files, names = _dump(tmp_path, Reuse(), torch.ones(64), bad)
    assert torch.isposinf(out[3]) and (b == 2).all()
    assert names == set()


class AfterInPlace(nn.Module):
    def forward(self, a):
        b = a * 1.0
        b.mul_(1e30)         # the origin (a = 1e10): read as it returns
        c = b.view(-1)       # reads b's value after autograd bumped b's version
        return c + 1         # only carries the Inf


def test_value_read_before_the_version_bump_still_judges_the_next_operators(tmp_path):
    out, files, names = _dump(tmp_path, AfterInPlace(), torch.full((32,), 1e10))
    assert torch.isposinf(out).all()
    assert names == {"Default_AfterInPlace_mul_-op1"}
    assert (_load(files, "Default_AfterInPlace_mul_-op1", "input") == np.float32(1e10)).all()


class FromUnread(nn.Module):
    def forward(self, x):
        v = x.abs()          # finite-preserving, x never read: v is left unread too
        return v * 3.0       # Inf out: v is read for the verdict, the Inf came in with x


def test_a_finite_preserving_output_of_an_unread_input_is_read_for_a_verdict(tmp_path):
    # guard: a finite-preserving operator with an unread input leaves its outputs unknown
    # (not "finite"); taken as finite, mul would be blamed for x's Inf
    x = torch.ones(4, 4)
    x[0, 0] = float("inf")
    out, files, names = _dump(tmp_path, FromUnread(), x)
    assert torch.isposinf(out[0, 0])
    assert names == set()


class Mixed(nn.Module):
    """An fp16 origin, its propagation, a -inf mask (on purpose), in-place writes (relu_,
    a scaled mul_, an overflowing add_), dropout, and an optimizer step around it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(()))

    def forward(self, x):
        h = self.fc(x)
        h.relu_()
        g = h.half() * self.scale.half()              # the origin when scale is 1e4 (fp16)
        g = (g + 1).float()                           # propagates
        scores = x @ x.t()
        mask = torch.full_like(scores, float("-inf")).triu(1)
        attn = (scores + mask).softmax(-1)             # -inf on purpose, no NaN
        big = x.detach() * 1e30
        big.mul_(0.5)
        big.add_(big * 1e9)                            # the second origin: fp32 overflows
        drop = torch.nn.functional.dropout(h, 0.5, training=True)
        return g.sum() + attn.sum() + big.sum() + drop.sum()


def _mixed_run(tmp_path, now: bool, monkeypatch):
    from opdump.debug.overflow import OverflowWatch
    monkeypatch.setattr(OverflowWatch, "READ_CPU_NOW", now)
    torch.manual_seed(0)
    model = Mixed()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(4, 8) * 30
    tmp_path.mkdir()
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    with opdump.Session(cfg) as session, EagerCapture(session):
        for step in range(3):
            model.scale.fill_(1e4 if step == 1 else 1.0)
            opt.zero_grad()
            model(x).backward()
            opt.step()
            session.step()
    root = tmp_path / "dump"
    # operators by iteration and type, not index: the held path's listing numbers one more
    # operator (a detach after full_like that the capture lists in that path only)
    found = sorted(tensor_files(str(root)), key=lambda f: (f.iteration, int(f.op_name.rsplit("-op", 1)[1]), f.io,
                                                           f.slot))
    files = [((f.iteration, f.op_name.rsplit("-op", 1)[0], f.io, f.slot), f.load()) for f in found]
    summaries = {}
    for p in sorted(root.rglob("overflow.json")):
        body = json.loads(p.read_text())
        summaries[str(p.relative_to(root))] = [(e["op_type"], e["outputs"]) for e in body["overflows"]]
    return files, summaries


def test_cpu_path_finds_what_the_held_path_finds(tmp_path, monkeypatch):
    """The same run watched by the CPU path and by the held (device) path, both on the CPU:
    the same overflows, the same files with the same values, the same summaries."""
    now_files, now_sums = _mixed_run(tmp_path / "now", True, monkeypatch)
    held_files, held_sums = _mixed_run(tmp_path / "held", False, monkeypatch)
    assert now_sums == held_sums
    assert [k for k, _ in now_files] == [k for k, _ in held_files]
    for (key, arr), (_, other) in zip(now_files, held_files):
        assert np.array_equal(arr, other, equal_nan=True), key
    names = {k[1] for k, _ in now_files}
    assert {n for n in names if n.endswith("_mul")} == {"Default_Mixed_mul"}, names       # both origins
    assert len({k[0] for k, _ in now_files}) == 3, "an origin in every step (the fp32 one), two in step 1"
    assert not any("softmax" in n or "relu" in n for n in names), names
