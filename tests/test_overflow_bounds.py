"""The overflow watch's bound rules (``op_debug_mode`` 3, eager, CPU; README "Debug dumps";
opdump/debug/overflow_bounds.py, opdump/stats/finite_bound.cpp): an operator whose
outputs' magnitudes are bounded, from its inputs' readings, well inside its dtype's range
is neither read nor copied before an in-place write.  The rules are checked against real
torch results; the watch's dumps with the rules are those without them (same overflows,
files and values); each shortcut is shown taken, and each guard fails when removed."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.debug.overflow import OverflowWatch
from opdump.debug.overflow_copies import CopyPool
from opdump.debug.overflow_bounds import ROOM, output_bound, proven_finite
from opdump.debug.overflow_values import read_now
from opdump.stats import native
from dumpfiles import tensor_files
from conftest import write_config

needs_native = pytest.mark.skipif(native.finite_bound() is None,
                                  reason="the native module (opdump/stats/finite_bound.cpp) is not built here")


@pytest.fixture(autouse=True)
def _rules_for_small_tensors(monkeypatch):
    """The rules apply from OverflowWatch.BOUND_MIN elements on (below, a reading is cheaper);
    these tests use small tensors."""
    monkeypatch.setattr(OverflowWatch, "BOUND_MIN", 0)


def _facts(t):
    value, facts = read_now(t)
    return facts if value == 0.0 else None


def _exact(t):
    """Exact facts: the largest magnitude and the smallest element."""
    return float(t.abs().max()), float(t.min())


def _check(op_type, overload, args, kwargs, out):
    """The rule's facts (from the arguments' exact facts) hold for the real result ``out``."""
    got = output_bound(op_type, overload, args, kwargs, _exact)
    assert got is not None, op_type
    b, low = got
    out = out.double()
    assert float(out.abs().max()) <= b, (op_type, float(out.abs().max()), b)
    assert float(out.min()) >= low, (op_type, float(out.min()), low)
    return got


@needs_native
def test_finite_bound_reads_magnitude_sign_nan_and_inf():
    fb = native.finite_bound()
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for n in (1, 33, 70_000, 300_000):            # the tail loop, the lanes, the parallel split
            x = (torch.randn(n) * 50).to(dtype)
            assert fb(x) == (float(x.abs().max()), bool((x.view(-1) < 0).any()))
            assert fb(x.abs()) == (float(x.abs().max()), False)
            y = x.clone()
            y[n // 2] = -math.inf
            assert fb(y) == (math.inf, True)
            y[n - 1] = math.nan
            assert math.isnan(fb(y)[0])
        assert fb(torch.randn(4, 6).to(dtype).t())[0] > 0           # dense, not contiguous
        assert fb(torch.randn(4, 6).to(dtype)[:, ::2]) is None     # gaps: torch reads it
    assert fb(torch.tensor([0.0, -0.0]))[1], "-0.0 counts as signed"
    assert fb(torch.ones(3, dtype=torch.int32)) is None and fb(torch.empty(0)) is None


@needs_native
@pytest.mark.parametrize("case", ["mul_t", "mul_s", "div", "div_neg", "add", "sub", "lerp_lo", "lerp_hi",
                                  "lerp_out", "addcmul", "addcmul_sq", "addcdiv", "sqrt", "mm", "bmm", "addmm",
                                  "softmax", "softmax_back", "sum", "sum_all", "mean", "relu", "clamp", "where",
                                  "cat", "bernoulli"])
def test_rules_bound_the_real_results(case):
    torch.manual_seed(0)
    a, b = torch.randn(64, 32) * 1e3, torch.randn(64, 32) * 1e-2
    pos = torch.rand(64, 32) + 1e-3
    m1, m2 = torch.randn(16, 40) * 7, torch.randn(40, 24) * 3
    calls = {
        "mul_t": ("mul", "Tensor", (a, b), {}, lambda: a * b),
        "mul_s": ("mul", "Tensor", (a, -3.5), {}, lambda: a * -3.5),
        "div": ("div", "Scalar", (pos, 0.25), {}, lambda: pos / 0.25),
        "div_neg": ("div", "Tensor", (a, -1e-3), {}, lambda: a / -1e-3),
        "add": ("add", "Tensor", (a, b), {"alpha": -20.0}, lambda: torch.add(a, b, alpha=-20.0)),
        "sub": ("sub", "Tensor", (pos, a), {"alpha": 2}, lambda: torch.sub(pos, a, alpha=2)),
        "lerp_lo": ("lerp", "Scalar", (a, b, 0.1), {}, lambda: torch.lerp(a, b, 0.1)),
        "lerp_hi": ("lerp", "Scalar", (a, b, 0.9), {}, lambda: torch.lerp(a, b, 0.9)),
        "lerp_out": ("lerp", "Scalar", (a, b, -3.0), {}, lambda: torch.lerp(a, b, -3.0)),
        "addcmul": ("addcmul", "default", (b, a, b), {"value": -0.5}, lambda: torch.addcmul(b, a, b, value=-0.5)),
        "addcmul_sq": ("addcmul", "default", (pos, a, a), {"value": 1e-3},
                       lambda: torch.addcmul(pos, a, a, value=1e-3)),
        "addcdiv": ("addcdiv", "default", (a, b, pos), {"value": -1e-3},
                    lambda: torch.addcdiv(a, b, pos, value=-1e-3)),
        "sqrt": ("sqrt", "default", (pos * 1e4,), {}, lambda: (pos * 1e4).sqrt()),
        "mm": ("mm", "default", (m1, m2), {}, lambda: m1 @ m2),
        "bmm": ("bmm", "default", (m1.expand(3, 16, 40), m2.expand(3, 40, 24)), {},
                lambda: torch.bmm(m1.expand(3, 16, 40), m2.expand(3, 40, 24))),
        "addmm": ("addmm", "default", (b[:16, :24], m1, m2), {"beta": 0.5, "alpha": 2.0},
                  lambda: torch.addmm(b[:16, :24], m1, m2, beta=0.5, alpha=2.0)),
        "softmax": ("_softmax", "default", (a, -1, False), {}, lambda: a.softmax(-1)),
        "softmax_back": ("_softmax_backward_data", "default", (a, a.softmax(-1), -1, torch.float32), {},
                         lambda: torch.ops.aten._softmax_backward_data(a, a.softmax(-1), -1, torch.float32)),
        "sum": ("sum", "dim_IntList", (a.abs(), [0]), {}, lambda: a.abs().sum(0)),
        "sum_all": ("sum", "default", (a,), {}, lambda: a.sum()),
        "mean": ("mean", "dim", (a, [-1], True), {}, lambda: a.mean(-1, keepdim=True)),
        "relu": ("relu", "default", (a,), {}, lambda: a.relu()),
        "clamp": ("clamp", "default", (b, -5000.0, 7000.0), {}, lambda: b.clamp(-5000.0, 7000.0)),
        "where": ("where", "self", (a > 0, b, 12345.0), {}, lambda: torch.where(a > 0, b, 12345.0)),
        "cat": ("cat", "default", ([a, b],), {}, lambda: torch.cat([a, b])),
        "bernoulli": ("bernoulli", "default", (pos - 1e-3,), {}, lambda: torch.bernoulli(pos - 1e-3)),
    }
    op_type, overload, args, kwargs, run = calls[case]
    _check(op_type, overload, args, kwargs, run())


@needs_native
def test_rules_give_nothing_they_cannot_bound():
    a = torch.randn(8, 8)
    pos, mixed = torch.rand(8, 8) + 1.0, torch.randn(8, 8)
    h = torch.rand(8, 8).half() + 1
    none = [
        ("sqrt", "default", (mixed,), {}),                      # a negative element: NaN
        ("addcdiv", "default", (a, a, mixed), {}),              # a divisor that may be 0
        ("addcdiv", "default", (h, h, h * 0 + 1e-8), {}),       # 1e-8 is not a normal float16
        ("div", "Tensor", (a, pos), {}),                        # a tensor divisor
        ("div", "Scalar", (a, 0.0), {}),
        ("mul", "Tensor", (a, math.inf), {}),                   # a non-finite number
        ("add", "Tensor", (a, a), {"alpha": math.nan}),
        ("mul", "Tensor", (h, 1e5), {}),                        # past float16's room: may be cast to inf
        ("mul", "Tensor", (a, torch.ones(8, 8, dtype=torch.int64)), {}),   # an integer tensor
        ("_to_copy", "default", (a,), {}),                      # no rule (a conversion)
        ("add", "out", (a, a), {}),
    ]
    for op_type, overload, args, kwargs in none:
        assert output_bound(op_type, overload, args, kwargs, _facts) is None, op_type
    masked = torch.zeros(8, 8).masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), -math.inf)
    assert output_bound("_softmax", "default", (masked, -1, False), {}, _facts) is None, "-inf: read"
    assert not proven_finite((ROOM[torch.float32] * 1.01, 0.0), [a])
    assert proven_finite((ROOM[torch.float16] * 0.99, 0.0), [h]) and not proven_finite((40000.0, 0.0), [h])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)
        self.register_buffer("boost", torch.ones(()))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)) * self.boost)


def _train(tmp_path, bounds: bool, monkeypatch, boost_at=None, boost=1.0, opt="adamw", steps=3,
           dtype=torch.float32):
    """``steps`` eager training steps under the watch; the dumped files and the summaries,
    and the number of pre-write copies.  The Python capture feeds the watch in every
    iteration (``OPDUMP_NATIVE_EAGER=0``): these tests are about the Python watch's rules and
    count its own copies (the native observer's watch: tests/test_native_watch.py)."""
    monkeypatch.setenv("OPDUMP_NATIVE_EAGER", "0")
    monkeypatch.setattr(OverflowWatch, "BOUNDS", bounds)
    copies = []
    real_copy = CopyPool.copy

    def counted(pool, t):       # the watch's pre-write copies, counted (the real copy is made)
        copies.append(t.shape)
        return real_copy(pool, t)

    monkeypatch.setattr(CopyPool, "copy", counted)
    torch.manual_seed(0)
    model = Net().to(dtype)
    optim = (torch.optim.AdamW(model.parameters(), lr=1e-2) if opt == "adamw"
             else torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9))
    x, y = torch.randn(8, 16).to(dtype), torch.randint(0, 4, (8,))
    tmp_path.mkdir()
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    with opdump.Session(cfg) as session, EagerCapture(session):
        for step in range(steps):
            model.boost.fill_(boost if step == boost_at else 1.0)
            optim.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optim.step()
            session.step()
    root = tmp_path / "dump"
    found = sorted(tensor_files(str(root)), key=lambda f: (f.iteration, f.op_name, f.io, f.slot))
    files = [((f.iteration, f.op_name, f.io, f.slot), f.load()) for f in found]
    sums = {str(p.relative_to(root)): [(e["op"], e["outputs"]) for e in json.loads(p.read_text())["overflows"]]
            for p in sorted(root.rglob("overflow.json"))}
    return files, sums, len(copies), [p.detach().clone() for p in model.parameters()]


@needs_native
@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_optimizer_writes_are_not_copied(tmp_path, monkeypatch, opt):
    # the shortcut: AdamW's lerp_/addcmul_/add_/addcdiv_ and SGD's add_ are proved finite
    # from their arguments' readings: no pre-write copy (without the rules: one per write)
    _, _, copies, _ = _train(tmp_path / "on", True, monkeypatch, opt=opt)
    _, _, before, _ = _train(tmp_path / "off", False, monkeypatch, opt=opt)
    assert before >= 3 * 4 * (2 if opt == "sgd" else 4) - 4, before     # steps x parameters x writes
    assert copies == 0, copies


@needs_native
@pytest.mark.parametrize("opt, dtype, boost", [("adamw", torch.float32, 1e38), ("sgd", torch.float32, 1e38),
                                               ("adamw", torch.float16, 3e4), ("sgd", torch.bfloat16, 1e38)])
def test_same_overflows_files_and_values_with_and_without_the_rules(tmp_path, monkeypatch, opt, dtype, boost):
    # step 1 overflows in the forward (relu(fc1) * boost) and then everywhere downstream,
    # the optimizer included; the rules change no verdict, file or value
    on = _train(tmp_path / "on", True, monkeypatch, boost_at=1, boost=boost, opt=opt, dtype=dtype)
    off = _train(tmp_path / "off", False, monkeypatch, boost_at=1, boost=boost, opt=opt, dtype=dtype)
    assert on[1] == off[1] and any(on[1].values())
    assert [k for k, _ in on[0]] == [k for k, _ in off[0]] and on[0]
    for (key, arr), (_, other) in zip(on[0], off[0]):
        assert np.array_equal(arr, other, equal_nan=True), key
    for p, q in zip(on[3], off[3]):
        assert torch.equal(p.nan_to_num(), q.nan_to_num()), "the training itself is unchanged"


class Kw(nn.Module):
    def forward(self, a, b):
        c = a * 1.0
        c.add_(b, alpha=1e10)        # 1e30 + 1e10 * 1e30: Inf although a and b are finite
        return c


def test_keyword_scale_is_part_of_the_bound(tmp_path):
    # guard: the rules read add_'s alpha from the keyword arguments; taken as 1, the bound
    # (2e30) would prove add_ finite: no copy, no reading, the origin missed
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    a, b = torch.full((32,), 1e30), torch.full((32,), 1e30)
    with opdump.Session(cfg) as session, EagerCapture(session):
        out = Kw()(a, b)
        session.step()
    assert torch.isposinf(out).all()
    files = tensor_files(str(tmp_path / "dump"))
    assert {f.op_name for f in files} == {"Default_Kw_add_-op1"}
    f = next(f for f in files if f.io == "input" and f.slot == 0)
    assert (f.load() == np.float32(1e30)).all(), "its value before the write"


class Product(nn.Module):
    def forward(self, a, b):
        return (a * 1.0) @ (b * 1.0)     # 16 products of 1e19 * 1e19 = 1.6e39: Inf


def test_matrix_product_bound_counts_its_terms(tmp_path):
    # guard: mm's bound is k * Ba * Bb; without the k (1e38, inside the room) the Inf of
    # the sum of 16 finite products would go unread and the origin missed
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    with opdump.Session(cfg) as session, EagerCapture(session):
        out = Product()(torch.full((4, 16), 1e19), torch.full((16, 4), 1e19))
        session.step()
    assert torch.isposinf(out).all()
    assert {f.op_name for f in tensor_files(str(tmp_path / "dump"))} == {"Default_Product_mm-op2"}


class Denominator(nn.Module):
    def forward(self, p, m, v):
        d = v.sqrt()
        d.add_(1e-30)                    # AdamW's denominator with a tiny eps
        q = p * 1.0
        q.addcdiv_(m, d, value=-1.0)     # m / 1e-30 = 1e30 ... and 1e10 / 1e-30 = Inf
        return q


def test_divisor_lower_bound_comes_from_its_facts(tmp_path):
    # guard: addcdiv_'s bound divides by the divisor's lower bound (1e-30: sqrt(0) + eps),
    # not by 1 or more; dividing by max(low, 1) the Inf would go unread, the origin missed
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    m = torch.full((64,), 1e10)
    with opdump.Session(cfg) as session, EagerCapture(session):
        out = Denominator()(torch.ones(64), m, torch.zeros(64))
        session.step()
    assert torch.isneginf(out).all()
    files = tensor_files(str(tmp_path / "dump"))
    assert {f.op_name for f in files} == {"Default_Denominator_addcdiv_-op3"}, "not add_ (1e-30 is finite)"
    f = next(f for f in files if f.io == "input" and f.slot == 0)
    assert (f.load() == 1.0).all(), "its value before the write"


@needs_native
def test_proved_outputs_are_not_read(tmp_path, monkeypatch):
    # the shortcut: matrix products, softmax and the optimizer's arithmetic are proved finite
    # from their arguments' facts: far fewer elements read (without the rules: every output)
    import opdump.debug.overflow_now as now
    read = []
    real = now.read_now

    def counted(t):             # the watch's readings, counted (the real reading is made)
        read.append(t.numel())
        return real(t)

    monkeypatch.setattr(now, "read_now", counted)
    _train(tmp_path / "on", True, monkeypatch)
    with_rules, read[:] = sum(read), []
    _train(tmp_path / "off", False, monkeypatch)
    assert with_rules < 0.6 * sum(read), (with_rules, sum(read))


class Tied(nn.Module):
    def forward(self, x, w):
        x = x * 2.0              # read: its facts
        h = x @ w.t()            # w.t() is read for mm's bound (the smaller side): w gets its facts
        return h, w * 3.0        # proved from w's facts: not read


@needs_native
def test_a_view_of_all_of_its_base_gives_the_base_its_facts(tmp_path, monkeypatch):
    # the shortcut: the facts read through a weight's .t() are the weight's (the same
    # elements, the shared version counter); without it w * 3.0 is read
    import opdump.debug.overflow_now as now
    shapes = []
    real = now.read_now

    def counted(t):
        shapes.append(tuple(t.shape))
        return real(t)

    monkeypatch.setattr(now, "read_now", counted)
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    with opdump.Session(cfg) as session, EagerCapture(session):
        Tied()(torch.randn(100, 16), torch.randn(8, 16))
        session.step()
    assert (16, 8) in shapes and (8, 16) not in shapes, shapes
