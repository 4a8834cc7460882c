"""The overflow watch (``op_debug_mode`` 3, eager; README "Debug dumps") served by the native
eager observer (opdump/capture/eager/native/watch.cpp): its dump is the Python capture's.

Each workload runs twice, ``OPDUMP_NATIVE_EAGER=0`` (the Python capture's dispatch mode feeds
the watch: the reference) and ``=1`` (iteration 0 is the Python capture's with the observer
probing beside it; later iterations are the observer's, which reads every floating output
natively and hands the operators it cannot clear to the same watch).  Compared: every file
(tensor files, overflow.json/.csv, execution orders, listing) byte for byte, statistic.csv
rows but timestamps; and the native run must really have served the iterations where the
overflows happen (its counters: outputs read, operators handed over, pre-write copies).
"""
import csv
import os
import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.stats import native
from conftest import write_config
from dumpfiles import find, tensor_files
from test_debug_overflow import Net     # fp16 origin at scale 1e4, carried Inf, -inf mask on purpose

ENV = "OPDUMP_NATIVE_EAGER"
_observer_built = native.module() is not None and hasattr(native.module(), "eager_observer")
pytestmark = pytest.mark.skipif(not _observer_built, reason="opdump's native module is not built on this machine")


@pytest.fixture(autouse=True, scope="module")
def _as_in_a_fresh_eager_process():
    """The native path stays off in a process that compiled anything (tests/test_native_eager.py):
    Dynamo's frame counters left by earlier test files are set aside while these run."""
    from torch._dynamo.utils import counters
    saved = dict(counters["frames"])
    counters["frames"].clear()
    yield
    counters["frames"].update(saved)


# ---------------------------------------------------------------------- workloads
def _net():
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(4, 4) + 2.0

    def step(i):
        model.scale.fill_(1e4 if i == 2 else 1.0)
        model(x)
    return step


class Twice(nn.Module):
    """Two overflows in one step, then an in-place write to the first one's input."""

    def forward(self, a, b):
        y = a * 1e4
        z = b * 1e4
        a.mul_(0)
        return y, z


def _twice():
    twice = Twice()

    def step(i):
        big = 10.0 if i >= 1 else 1e-3
        twice(torch.full((8,), big, dtype=torch.float16), torch.full((8,), 2 * big, dtype=torch.float16))
    return step


class InPlace(nn.Module):
    def forward(self, a):
        b = a + 0
        b.mul_(1e4)                  # an in-place operator overflows
        return b * 2                 # propagates only


class Masked(nn.Module):
    def forward(self, x):
        m = torch.full((4, 4), float("-inf")).triu(1)          # scalar -inf mask
        s = (x @ x.t() + m).softmax(-1)
        return s.masked_fill(torch.eye(4, dtype=torch.bool), float("-inf")).sum()


def _inplace():
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    masked, blow, carry = Masked(), InPlace(), InPlace()     # kept: the session counts root modules

    def step(i):
        masked(x)
        blow(torch.full((4,), 30.0 if i == 2 else 1.0, dtype=torch.float16))    # overflows at step 2
        carry(torch.full((4,), float("nan") if i == 3 else 1.0, dtype=torch.float16))   # NaN: propagated
    return step


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(inplace=True), nn.Dropout(0.1), nn.Linear(32, 32),
                                 nn.GELU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)


def _training(opt_name, dtype, bad_step=3, big=None):
    """A training loop whose input blows up at ``bad_step`` (the Inf/NaN then runs through the
    backward and the optimizer, and every later step)."""
    def make():
        torch.manual_seed(0)
        model = Mlp().to(dtype)
        opt = (torch.optim.AdamW(model.parameters(), lr=1e-3) if opt_name == "adamw"
               else torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
        x, y = torch.randn(16, 8, dtype=dtype), torch.randn(16, 1, dtype=dtype)
        scale = big or {torch.float16: 1e4, torch.bfloat16: 1e37, torch.float32: 1e37}[dtype]

        def step(i):
            opt.zero_grad(set_to_none=True)
            xi = x * scale if i == bad_step else x
            loss = ((model(xi) - y) ** 2).mean()
            loss.backward()
            opt.step()
        return step
    return make


WORKLOADS = {
    "net": (_net, {}),
    "twice_limited": (_twice, {"overflow_number": 1}),
    "inplace_masked_nan": (_inplace, {}),
    "adamw_fp32": (_training("adamw", torch.float32), {}),
    "sgd_fp32": (_training("sgd", torch.float32), {}),
    "adamw_fp16": (_training("adamw", torch.float16), {}),
    "sgd_fp16": (_training("sgd", torch.float16), {}),
    "adamw_bf16": (_training("adamw", torch.bfloat16), {}),
    "adamw_fp32_limited": (_training("adamw", torch.float32), {"overflow_number": 2}),
}
STEPS = 5


def run(root, make, native_on, monkeypatch, **common):
    """Dump every iteration of ``STEPS`` steps with the watch; (dump root, whether the observer was
    installed after each step, its counters)."""
    monkeypatch.setenv(ENV, "1" if native_on else "0")
    cfg = write_config(root, common={"op_debug_mode": 3, "saved_data": "full", **common})
    step = make()
    live = []
    torch.manual_seed(1)            # dropout draws the same masks in both runs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session, EagerCapture(session) as cap:
            for i in range(STEPS):
                step(i)
                session.step()
                live.append(cap._native_live)
            counts = getattr(cap, "native_watch_counts", None)
    failures = [str(w.message) for w in caught if "opdump" in str(w.message)]
    assert not failures, failures       # no native failure, no watch failure
    return root / "dump", live, counts


_STAMP = re.compile(r"\.\d{10,}\.(input|output)\.")


def files_of(root):
    """Every file of the dump (relative path -> bytes; statistic.csv: its rows but timestamps),
    timestamps in file names masked, the run's own metadata left out."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            rel = _STAMP.sub(r".T.\1.", os.path.relpath(path, root))
            if ".dump_metadata" in rel.split(os.sep):
                continue
            if name == "statistic.csv":
                with open(path, newline="") as f:
                    rows = list(csv.reader(f))
                stamp = rows[0].index("Timestamp")
                out[rel] = [r[:stamp] + r[stamp + 1:] for r in rows]
            else:
                with open(path, "rb") as f:
                    out[rel] = f.read()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    out = {}
    try:
        for name, (make, common) in WORKLOADS.items():
            base = tmp_path_factory.mktemp(name)
            (base / "py").mkdir()
            (base / "nat").mkdir()
            out[name] = (run(base / "py", make, False, mp, **common), run(base / "nat", make, True, mp, **common))
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_native_watch_dump_is_the_python_watch_dump(runs, name):
    (py_root, py_live, py_counts), (nat_root, nat_live, counts) = runs[name]
    assert not any(py_live) and py_counts == (0, 0, 0)
    # served: installed after the probe (step 0) until the last dumped step; outputs read natively
    assert nat_live[:-1] == [True] * (STEPS - 1), nat_live
    assert counts[0] > 0 and counts[1] > 0, counts
    py, nat = files_of(py_root), files_of(nat_root)
    assert sorted(nat) == sorted(py)
    assert any(k.endswith("overflow.json") for k in py)
    for rel in py:
        assert nat[rel] == py[rel], rel


def test_native_in_place_origin_keeps_its_pre_write_input(runs):
    """The in-place origin of a served iteration (step 2): its input dumped is the value before the
    write (the observer's pre-write copy), bit for bit; the NaN of step 3 is not reported."""
    (_, _, _), (nat_root, _, counts) = runs["inplace_masked_nan"]
    assert counts[2] > 0
    files = tensor_files(str(nat_root))
    names = {(f.iteration, f.op_name) for f in files}
    assert names == {(2, "Default_InPlace_mul_-op10")}, names
    got = find(files, "Default/InPlace/mul_-op10", "input", 0).load()
    assert got.dtype == np.float16 and (got == 30).all()
    assert np.isposinf(find(files, "Default/InPlace/mul_-op10", "output", 0).load()).all()
