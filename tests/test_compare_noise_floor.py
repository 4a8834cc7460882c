"""The noise floor of a precision compare (opdump/analysis/compare/noise_floor.py, README
"Analysis"): an output whose error is at or below ``eps(lower precision) × max|input|`` is
rounding noise of its inputs, not ``diverged`` -- in the tensor and the statistics compares,
the column-wise paths and the per-row stages (``OPDUMP_COMPARE_FAST=0``) alike; never for
same-dtype compares, an error above the bound, or an operator without floating inputs."""
import importlib

import pytest
import torch
import torch.nn as nn

import opdump
from opdump.analysis import compare
from opdump.analysis.compare.noise_floor import demote_noise, eps_of
from opdump.analysis.compare.pairs import Pair, Tensor
from opdump.capture.eager import EagerCapture
from conftest import write_config

stat_pairs = importlib.import_module("opdump.analysis.compare.stat_pairs")


class MeanShift(nn.Module):
    """``mean`` of a LayerNorm's output (zero-mean: its value is rounding noise, ~1e-8 in fp32,
    left unused), then ``head(h - shift)``: with a shift of 1 in A only, the ``sub`` is a real
    divergence (error 1.0, its bound ``2**-7 × max|h|`` ~0.02), so it must stay ``diverged``."""

    def __init__(self):
        super().__init__()
        self.fc, self.ln, self.head = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 4)

    def forward(self, x, shift):
        h = self.ln(self.fc(x))
        h.mean(-1, keepdim=True)                 # dumped: the noise-only output
        return self.head(h - shift).sum()


def _run(folder, dtype, saved, shift=0.0, noise=0.0, model_cls=None):
    """One step of ``model_cls`` (default :class:`MeanShift`) in ``dtype`` dumped to ``folder``."""
    torch.manual_seed(0)
    model, x = (model_cls or MeanShift)().to(dtype), torch.randn(8, 16)
    if noise:
        x = x + noise * torch.randn(8, 16)
    folder.mkdir(parents=True)
    cfg = write_config(folder, common={"iteration": "0", "saved_data": saved})
    with opdump.Session(cfg) as s, EagerCapture(s):
        model(x.to(dtype), shift).backward()
        s.step()
    return str(folder / "dump")


def precision_dumps(root, run):
    """``run``'s dumps under ``root``, tensor and statistic each: bf16, bf16 with the shift, fp32."""
    out = {}
    for saved in ("tensor", "statistic"):
        out[saved, "bf16"] = run(root / saved / "bf16", torch.bfloat16, saved)
        out[saved, "bf16_shift"] = run(root / saved / "bf16_shift", torch.bfloat16, saved, shift=1.0)
        out[saved, "fp32"] = run(root / saved / "fp32", torch.float32, saved)
    return out


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("noise")
    out = precision_dumps(root, _run)
    out["tensor", "bf16_noise"] = _run(root / "tensor" / "bf16_noise", torch.bfloat16, "tensor", noise=1e-2)
    return out


def _rows(res, op_type, io="output", slot=0):
    t = res.table
    return t[(t.op_type == op_type) & (t.io == io) & (t.slot == slot) & (t.kind == "op")]


def _column_path_ran(monkeypatch):
    seen = []
    real = stat_pairs.demote_stat_columns
    monkeypatch.setattr(stat_pairs, "demote_stat_columns", lambda *a: (seen.append(1), real(*a))[1])
    return seen


@pytest.mark.parametrize("saved", ["tensor", "statistic"])
def test_mean_of_normalised_input_is_rounding_noise(dumps, saved, monkeypatch):
    seen = _column_path_ran(monkeypatch)
    res = compare(dumps[saved, "bf16"], dumps[saved, "fp32"], progress=False)
    assert seen, "the column-wise path ran"
    assert res.first_divergence is None, res.first_divergence
    mean = _rows(res, "mean")
    assert list(mean.verdict) == ["warning"]
    assert "below the inputs' bf16 rounding (eps × max|input| = " in mean.reason.iloc[0]
    assert "(was: " in mean.reason.iloc[0]
    assert "diverged" not in set(res.table.verdict)


@pytest.mark.parametrize("saved", ["tensor", "statistic"])
def test_error_above_the_bound_stays_diverged(dumps, saved):
    res = compare(dumps[saved, "bf16_shift"], dumps[saved, "fp32"], progress=False)
    assert res.first_divergence is not None and res.first_divergence["op_type"] == "sub", res.first_divergence
    assert list(_rows(res, "sub").verdict) == ["diverged"]
    assert list(_rows(res, "mean").verdict) == ["warning"]          # still noise before it


def test_same_dtypes_are_unchanged(dumps):
    """bf16 against bf16 with a slightly different input: the mean's noise differs and is
    diverged by the thresholds; no precision compare, so it stays so."""
    res = compare(dumps["tensor", "bf16_noise"], dumps["tensor", "bf16"], progress=False)
    mean = _rows(res, "mean")
    assert list(mean.verdict) == ["diverged"], mean[["verdict", "reason", "cosine", "max_abs_err"]]
    assert "rounding" not in mean.reason.iloc[0]


@pytest.mark.parametrize("saved", ["tensor", "statistic"])
@pytest.mark.parametrize("which", ["bf16", "bf16_shift"])
def test_per_row_stages_give_the_same(dumps, saved, which, monkeypatch):
    fast = compare(dumps[saved, which], dumps[saved, "fp32"], progress=False)
    monkeypatch.setenv("OPDUMP_COMPARE_FAST", "0")
    seen = _column_path_ran(monkeypatch)
    slow = compare(dumps[saved, which], dumps[saved, "fp32"], progress=False)
    assert not seen, "OPDUMP_COMPARE_FAST=0 ran the per-row stages"
    assert fast.first_divergence == slow.first_divergence
    assert fast.summary() == slow.summary()
    cols = ["op", "io", "slot", "verdict", "reason"]
    assert fast.table[cols].equals(slow.table[cols])
    assert (fast.table.verdict == "warning").sum() > 0


# -- the rule on records: the cases a real run does not reach on demand -------------------------
def _t(io, slot, dtype, shape=(4,), row=None, op="Default/f-op0", call=0):
    t = Tensor(dict({"rank": 0, "iteration": 0, "graph": 0, "op": op, "op_file": op, "op_type": "f",
                     "kind": "op", "io": io, "slot": slot, "call": call, "order": slot, "dtype": dtype},
                    **(row or {})))
    t.shape = shape
    return t


def _pair(io, slot, da, db, mae, ref, verdict="diverged", cos=0.1, mode="tensor", ra=None, rb=None, **kw):
    m = {"max_abs_err": mae, "max_abs_ref": ref, "cosine": cos, "n": 4} if mode == "tensor" else {}
    m.update(kw)
    return Pair(_t(io, slot, da, row=ra), _t(io, slot, db, row=rb), "name", mode, verdict,
                "cosine 0.1 < 0.9" if verdict == "diverged" else "", None, m)


def test_eps_of_dtype_names():
    assert eps_of("BFloat16") == (2 ** -7, "bf16") and eps_of("bfloat16") == (2 ** -7, "bf16")
    assert eps_of("Float16")[0] == 2 ** -10 and eps_of("float16")[0] == 2 ** -10
    assert eps_of("Float32")[0] == 2 ** -23 and eps_of("float64")[0] == 2 ** -52
    assert eps_of("Int64") is None and eps_of("Bool") is None and eps_of(None) is None


@pytest.mark.parametrize("mae, demoted", [(2 ** -7 * 3.0, True), (2 ** -7 * 3.0 * 1.001, False)])
def test_bound_is_eps_times_the_largest_input(mae, demoted):
    pairs = [_pair("input", 0, "BFloat16", "Float32", 1e-3, 3.0, verdict="pass", cos=1.0),
             _pair("input", 1, "BFloat16", "Float32", 1e-4, 0.5, verdict="pass", cos=1.0),
             _pair("output", 0, "BFloat16", "Float32", mae, 1e-8)]
    assert demote_noise(pairs) == ([2] if demoted else [])
    assert pairs[2].verdict == ("warning" if demoted else "diverged")


def test_no_floating_input_no_same_dtype_no_nonfinite():
    ints = [_pair("input", 0, "Int64", "Int64", 0.0, 100.0, verdict="pass", cos=1.0),
            _pair("output", 0, "BFloat16", "Float32", 1e-4, 1e-8)]
    same = [_pair("input", 0, "Float32", "Float32", 1e-3, 3.0, verdict="pass", cos=1.0),
            _pair("output", 0, "Float32", "Float32", 1e-4, 1e-8)]
    nonfinite = [_pair("input", 0, "BFloat16", "Float32", 1e-3, 3.0, verdict="pass", cos=1.0),
                 _pair("output", 0, "BFloat16", "Float32", 1e-4, 1e-8, nonfinite_mismatch=2)]
    for pairs in (ints, same, nonfinite):
        assert demote_noise(pairs) == [] and pairs[1].verdict == "diverged"


def test_statistics_error_is_what_the_statistics_prove():
    """max(|Δmax|, |Δmin|, |Δavg|, |Δl2norm|/sqrt(count)): here the l2norm's difference 0.08
    over 64 elements proves at least 0.01 element-wise, above 2**-7 × 1.0."""
    inp = {"max": 1.0, "min": -1.0, "avg": 0.0, "l2norm": 5.0, "count": 64}
    out_a = {"max": 1e-4, "min": -1e-4, "avg": 1e-6, "l2norm": 0.0005, "count": 64}
    for l2_b, demoted in ((0.0, True), (0.0805, False)):
        out_b = {"max": 1e-8, "min": -1e-8, "avg": 0.0, "l2norm": l2_b, "count": 64}
        pairs = [_pair("input", 0, "BFloat16", "Float32", None, None, verdict="pass", mode="statistics",
                       ra=inp, rb=inp),
                 _pair("output", 0, "BFloat16", "Float32", None, None, mode="statistics", ra=out_a, rb=out_b)]
        assert demote_noise(pairs) == ([1] if demoted else []), pairs[1].reason


def test_a_consumed_noise_output_is_demoted_as_input_only_when_its_values_match():
    out = _pair("output", 0, "BFloat16", "Float32", 1e-4, 1e-8)
    ins = [_pair("input", 0, "BFloat16", "Float32", 1e-3, 3.0, verdict="pass", cos=1.0), out]
    later_same = _pair("input", 0, "BFloat16", "Float32", 1e-4, 1e-8)
    later_other = _pair("input", 1, "BFloat16", "Float32", 2e-4, 1e-8)
    for p in (later_same, later_other):
        for t in (p.a, p.b):
            t.row.update(op="Default/g-op1", op_file="Default/g-op1", op_type="g")
            t.row["call"] = 0
    pairs = ins + [later_same, later_other]
    assert demote_noise(pairs) == [1, 2]
    assert "the values of Default/f-op0 output.0" in later_same.reason and later_other.verdict == "diverged"


class Centred(nn.Module):
    """A residual-stream-like input: centred in the autocast dtype (bf16 under autocast), then
    normalised in fp32 (``.float()``: the LayerNorm's call holds fp32 on both sides)."""

    def __init__(self):
        super().__init__()
        self.fc, self.ln, self.head = nn.Linear(16, 48), nn.LayerNorm(48), nn.Linear(48, 4)

    def forward(self, x):
        h = self.fc(x)
        h = h - h.mean(-1, keepdim=True)
        return self.head(self.ln(h.float()))


@pytest.mark.parametrize("saved", ["tensor", "statistic"])
def test_autocast_fp32_operator_carries_bf16_rounding(tmp_path, saved, monkeypatch):
    """bf16 autocast vs fp32: the LayerNorm's call holds fp32 on both sides, but its input was
    centred in bf16 upstream: its mean is ~1e-8 in fp32 and bf16 rounding (~1e-3) in the
    autocast run, cosine noise. The compare's lowest precision (bf16) bounds it: no divergence
    (a ConvNeXt's downsampling LayerNorm was named the first divergence)."""
    dumps = []
    for autocast in (True, False):
        torch.manual_seed(0)
        model, x = Centred(), torch.randn(8, 16)
        folder = tmp_path / ("bf16" if autocast else "fp32")
        folder.mkdir()
        cfg = write_config(folder, common={"iteration": "0", "saved_data": saved})
        with opdump.Session(cfg) as s, EagerCapture(s):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(x)
            out.float().sum().backward()
            s.step()
        dumps.append(str(folder / "dump"))
    results = {}
    for fast in ("1", "0"):
        monkeypatch.setenv("OPDUMP_COMPARE_FAST", fast)
        res = compare(dumps[0], dumps[1], progress=False, workers=1)
        mean = res.table[(res.table.op_type == "native_layer_norm") & (res.table.io == "output")
                         & (res.table.slot == 1) & (res.table.kind == "op")]
        assert len(mean) == 1 and (mean.dtype_a == mean.dtype_b).all()       # fp32 on both sides
        assert res.first_divergence is None or res.first_divergence["op_type"] != "native_layer_norm", \
            res.first_divergence
        results[fast] = (list(res.table.verdict), list(res.table.reason))
    assert results["1"] == results["0"]
