"""compare on real opdump dumps of a tiny model (README, "Analysis" > compare): eager
against compiled of the same step, fp32 against bf16 autocast with an extra `.float()`,
one weight scaled by 1.001, one operator computing differently, two different models.

Every dump is a real capture (EagerCapture, torch.compile with opdump's backend); they
are made once per module."""
import inspect
import json
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import opdump
from opdump.analysis.compare import RULE_FIRST_DIFFERENCE, RULE_THRESHOLDS, compare
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec


class Block(nn.Module):
    def __init__(self, approx="none"):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16, bias=False)
        self.approx = approx
        self.cast = False

    def forward(self, x):
        h = self.fc1(self.norm(x))                                  # LINE_FC1
        h = torch.nn.functional.gelu(h, approximate=self.approx)   # LINE_GELU
        if self.cast:
            h = h.float()
        return x + self.fc2(h)


class Net(nn.Module):
    def __init__(self, approx="none"):
        super().__init__()
        self.emb = nn.Linear(8, 16)
        self.blk = Block(approx)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.blk(self.emb(x)))


class ConvNet(nn.Module):
    """Another model altogether."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.fc = nn.Linear(3 * 4 * 4, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x.reshape(4, 2, 2, 2).repeat(1, 1, 2, 2))).flatten(1))


def _line(cls, tag):
    src, start = inspect.getsourcelines(cls.forward)
    return start + next(i for i, t in enumerate(src) if tag in t)


def _run(root, *, compiled=False, bf16=False, scale=None, approx="none", model_cls=Net):
    torch.manual_seed(0)
    model = model_cls(approx) if model_cls is Net else model_cls()
    if bf16:
        model.blk.cast = True
    if scale is not None:
        with torch.no_grad():
            model.blk.fc1.weight.mul_(scale)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1)
    cfg = DumpConfig(path=str(root), iteration=IterationSpec(ranges=((0, 0),)))
    torch._dynamo.reset()
    with opdump.Session(cfg) as s, EagerCapture(s):
        m = torch.compile(model, backend=s.backend("inductor")) if compiled else model
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = m(x)
        loss = ((out.float() - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    torch._dynamo.reset()
    return root


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    return {
        "eager": _run(root / "eager"),
        "compiled": _run(root / "compiled", compiled=True),
        "bf16": _run(root / "bf16", bf16=True),
        "scaled": _run(root / "scaled", scale=1.001),
        "tanh": _run(root / "tanh", approx="tanh"),
        "conv": _run(root / "conv", model_cls=ConvNet),
    }


def _shape_mismatches(t):
    m = t[t["op"].notna() & t["op_b"].notna()]
    return m[m["shape_a"] != m["shape_b"]]


def test_eager_vs_compiled_same_step_agree(dumps):
    """The compiled step and the eager step compute the same values on CPU: every operator
    pairs with its own (eager runs extra detach ops and numbers operators differently), no
    weight is paired with a bias, nothing diverges."""
    r = compare(dumps["compiled"], dumps["eager"], progress=False)
    t = r.table
    assert _shape_mismatches(t).empty
    assert "diverged" not in r.counts, t[t["verdict"] == "diverged"][["op", "op_b", "reason"]]
    assert r.first_divergence is None and r.first_difference is None and not r.diverged
    assert r.rule == RULE_FIRST_DIFFERENCE
    ops = r.operators
    assert ops["matched_a"] >= 0.95 * ops["calls_a"] and ops["matched_b"] >= 0.95 * ops["calls_b"], ops
    assert r.matched_by.get("aligned order", 0) > 0 and not r.warnings
    # the gradient-accumulation detach of emb.weight pairs with eager's, whatever their numbers
    acc = t[t["op"].fillna("").str.startswith("Gradients/Default/Net/emb-Linear/detach")]
    assert len(acc) and (acc["shape_a"] == acc["shape_b"]).all() and set(acc["verdict"]) == {"pass"}


def test_fp32_vs_bf16_with_float_insertion(dumps):
    """bf16 autocast adds `_to_copy` operators (and `.float()` one more): they are unmatched,
    they shift nothing, and every optimizer update pairs with the same parameter's update."""
    r = compare(dumps["bf16"], dumps["eager"], progress=False)
    t = r.table
    assert r.rule == RULE_THRESHOLDS and r.first_difference is None
    assert _shape_mismatches(t).empty
    only_a = t[t["op_b"].isna()]
    assert set(only_a["op_type"]) <= {"_to_copy", "Parameter"}, set(only_a["op_type"])
    assert t[t["op_b"].isna() & (t["op_type"] == "_to_copy")]["op"].nunique() >= 5
    assert r.first_divergence is None, r.first_divergence
    upd = t[t["op"].fillna("").str.startswith("Default/optimizer-AdamW") & (t["io"] == "output")]
    assert len(upd) > 10 and upd["op_b"].notna().all()
    assert set(upd["verdict"]) <= {"pass", "warning"}
    ops = r.operators
    assert ops["matched_b"] == ops["calls_b"], ops          # every fp32 operator found its bf16 twin


def test_scaled_weight_first_difference_names_the_layer(dumps):
    """Same program, fc1's weight scaled by 1.001: the first difference is fc1's first
    operator, at its source line, caused by the parameter; thresholds see nothing."""
    r = compare(dumps["scaled"], dumps["eager"], progress=False)
    fd = r.first_difference
    assert r.rule == RULE_FIRST_DIFFERENCE and fd is not None
    assert fd["op"].startswith("Default/Net/blk-Block/fc1-Linear/"), fd
    assert fd["iteration"] == 0 and fd["source"].endswith(f"test_compare_real_dumps.py:{_line(Block, 'LINE_FC1')}")
    assert "Parameter.blk_fc1_weight" in fd["cause"] and fd["max_abs_err"] > 0
    assert r.first_divergence is None and r.diverged
    assert "first difference: Default/Net/blk-Block/fc1-Linear/" in r.summary()


def test_operator_that_computes_differently(dumps):
    """gelu(approximate='tanh') instead of the exact gelu: the same operator with identical
    inputs gives other outputs -- the first difference, with the size of the difference."""
    r = compare(dumps["tanh"], dumps["eager"], progress=False)
    fd = r.first_difference
    assert fd["op"].startswith("Default/Net/blk-Block/gelu-op"), fd
    assert fd["cause"].startswith("inputs identical, outputs differ")
    assert fd["io"] == "output" and 0 < fd["max_abs_err"] < 1e-2
    assert fd["source"].endswith(f":{_line(Block, 'LINE_GELU')}")
    assert "max abs error" in fd["reason"]


def test_two_different_models_warn(dumps):
    r = compare(dumps["conv"], dumps["eager"], progress=False)
    assert any("most operators are unmatched" in w for w in r.warnings), r.summary()
    assert "warning: most operators are unmatched" in r.summary()
    assert _shape_mismatches(r.table).empty


def test_cli_exit_code_and_json(dumps, tmp_path):
    """`opdump compare` in a real process: a first difference exits 1; --json carries the rule,
    the first difference and how pairs were matched."""
    p = subprocess.run([sys.executable, "-m", "opdump", "compare", str(dumps["scaled"]), str(dumps["eager"]), "-q",
                        "--json", "--csv", str(tmp_path / "t.csv")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    js = json.loads(p.stdout)
    assert js["rule"] == "first difference" and js["first_divergence"] is None
    assert js["first_difference"]["op"].startswith("Default/Net/blk-Block/fc1-Linear/")
    assert js["matched_by"] and js["operators"]["matched_a"] == js["operators"]["calls_a"]
    assert (tmp_path / "t.csv").is_file()
