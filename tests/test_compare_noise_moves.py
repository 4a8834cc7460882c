"""The precision-noise rule through operators that only move values (README "Analysis",
compare verdicts; opdump/analysis/compare/noise_floor.py ``VALUE_MOVING``): a view, an
``expand``, a ``t`` or a ``clone`` of an output demoted as rounding noise is demoted with
it -- its output cannot compute differently, though its own inputs (the small noise values)
bound it far below that noise.  The same verdicts in every path that applies the rule: the
column paths (tensor and statistics pairs), the per-row stages (``OPDUMP_COMPARE_FAST=0``),
the online compare.  A real divergence through a view stays one, and the first divergence
is then its producer.  (Hold-out trial 5: a bf16-vs-fp32 Qwen2 statistics compare named a
backward ``expand`` the first divergence.)"""
import json

import pytest
import torch.nn as nn

from opdump.analysis import compare
from opdump.analysis.compare.noise_floor import VALUE_MOVING, demote_noise, moves_values
from opdump.debug import online_compare
from test_compare_noise_floor import _column_path_ran, _pair, _run as _run_model, precision_dumps
from test_online_compare import bf16_against_fp32_reference

_MOVES = ("view", "expand", "t", "clone")


class MeanMoved(nn.Module):
    """A LayerNorm output's mean (rounding noise only: ~1e-8 in fp32, ~1e-3 in bf16), moved
    by ``view`` -> ``expand`` -> ``t`` -> ``clone`` (left unused, dumped).  ``shift`` (1 in A
    only) is added to the normalised output first: a real divergence (error 1.0, bound
    ``2**-7 × max|h|``) that the mean and the moves must carry."""

    def __init__(self):
        super().__init__()
        self.fc, self.ln, self.head = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 4)

    def forward(self, x, shift=0.0):
        h = self.ln(self.fc(x)) + shift
        m = h.mean(-1, keepdim=True)
        m.view(8).expand(3, 8).t().clone()
        return self.head(h).sum()


def _run(folder, dtype, saved, shift=0.0):
    return _run_model(folder, dtype, saved, shift=shift, model_cls=MeanMoved)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    return precision_dumps(tmp_path_factory.mktemp("moves"), _run)


def _both_paths(a, b, monkeypatch):
    got = {}
    for fast in ("1", "0"):
        monkeypatch.setenv("OPDUMP_COMPARE_FAST", fast)
        seen = _column_path_ran(monkeypatch)
        got[fast] = compare(a, b, progress=False, workers=1)
        assert bool(seen) == (fast == "1")                   # the column path ran, and only there
    assert list(got["1"].table.verdict) == list(got["0"].table.verdict)
    assert list(got["1"].table.reason) == list(got["0"].table.reason)
    return got["1"]


def _forward(res, op_type):
    t = res.table
    return t[(t.op_type == op_type) & (t.kind == "op") & t.op.str.startswith("Default/MeanMoved/")
             & ~t.op.str.contains("-Linear/|-LayerNorm/")]


@pytest.mark.parametrize("saved", ["tensor", "statistic"])
def test_moves_of_a_noise_output_are_noise(dumps, saved, monkeypatch):
    res = _both_paths(dumps[saved, "bf16"], dumps[saved, "fp32"], monkeypatch)
    mean = _forward(res, "mean")
    assert list(mean[mean.io == "output"].verdict) == ["warning"], mean[["io", "verdict", "reason"]]
    for op_type in _MOVES:
        rows = _forward(res, op_type)
        assert len(rows) == 2, (op_type, rows[["io", "verdict"]])
        assert (rows.verdict == "warning").all(), rows[["io", "verdict", "reason"]].to_dict("records")
    out = _forward(res, "expand")
    assert "only moves values" in out[out.io == "output"].reason.iloc[0]
    first = res.first_divergence
    assert first is None or first["op_type"] not in _MOVES + ("mean",), first


@pytest.mark.parametrize("saved", ["tensor", "statistic"])
def test_a_real_divergence_through_moves_stays_and_its_producer_is_first(dumps, saved, monkeypatch):
    res = _both_paths(dumps[saved, "bf16_shift"], dumps[saved, "fp32"], monkeypatch)
    for op_type in ("add",) + _MOVES:
        out = _forward(res, op_type)
        assert out[out.io == "output"].verdict.tolist() == ["diverged"], (op_type, out[["io", "verdict"]])
    first = res.first_divergence
    assert first is not None and first["op_type"] == "add", first


def test_value_moving_list_is_the_views_and_same_dtype_copies():
    assert {"view", "_unsafe_view", "expand", "t", "transpose", "permute", "reshape", "squeeze", "unsqueeze",
            "slice", "select", "clone", "contiguous", "copy_"} <= VALUE_MOVING
    assert moves_values("aten.expand.default") and moves_values("_unsafe_view")
    assert not any(map(moves_values, ("mean", "add", "_to_copy", "mul", "sum")))


# -- the rule on records: a generated producer, then moves -----------------------------------------
def _call(pairs, op, op_type):
    for p in pairs:
        for t in (p.a, p.b):
            t.row.update(op=op, op_file=op, op_type=op_type)
    return pairs


def _producer():
    """A call whose output (error 1e-4, input scale 3.0: bound 3 × 2**-7) is rounding noise."""
    return _call([_pair("input", 0, "BFloat16", "Float32", 1e-3, 3.0, verdict="pass", cos=1.0),
                  _pair("output", 0, "BFloat16", "Float32", 1e-4, 1e-8)], "Default/mean-op0", "mean")


@pytest.mark.parametrize("op_type", ["expand", "view", "aten._unsafe_view.default", "t", "clone", "copy_"])
def test_records_a_move_after_a_demoted_producer_is_demoted(op_type):
    moved = _call([_pair("input", 0, "BFloat16", "Float32", 1e-4, 1e-8),              # the producer's values
                   _pair("output", 0, "BFloat16", "Float32", 1e-4, 1e-8, cos=0.2, n=12)],   # broadcast
                  "Default/m-op1", op_type)
    then = _call([_pair("input", 0, "BFloat16", "Float32", 1e-4, 1e-8, cos=0.2, n=12),   # the moved values
                  _pair("output", 0, "BFloat16", "Float32", 1e-4, 1e-8, cos=0.3, n=12)],
                 "Default/t-op2", "t")
    pairs = _producer() + moved + then
    assert demote_noise(pairs) == [1, 2, 3, 4, 5]
    assert "only moves values" in moved[1].reason and "was: cosine 0.1 < 0.9" in moved[1].reason
    assert "the values of Default/m-op1 output.0" in then[0].reason
    assert "only moves values" in then[1].reason


def test_records_no_demotion_through_a_computing_op_a_diverged_input_or_a_dtype_change():
    computes = _call([_pair("input", 0, "BFloat16", "Float32", 1e-4, 1e-8),
                      _pair("output", 0, "BFloat16", "Float32", 1e-4, 1e-8, cos=0.2, n=12)], "Default/a-op1", "add")
    pairs = _producer() + computes
    assert demote_noise(pairs) == [1, 2] and computes[1].verdict == "diverged"
    beyond = _call([_pair("input", 0, "BFloat16", "Float32", 0.5, 1.0),             # diverged beyond any bound
                    _pair("output", 0, "BFloat16", "Float32", 0.5, 1.0, n=12)], "Default/e-op1", "expand")
    pairs = _producer() + beyond
    assert demote_noise(pairs) == [1] and [p.verdict for p in beyond] == ["diverged", "diverged"]
    cast = _call([_pair("input", 0, "BFloat16", "Float32", 1e-4, 1e-8),
                  _pair("output", 0, "Float16", "Float32", 1e-4, 1e-8, cos=0.2, n=12)], "Default/c-op1", "copy_")
    pairs = _producer() + cast
    assert demote_noise(pairs) == [1, 2] and cast[1].verdict == "diverged"
    same = [_pair(io, 0, "Float32", "Float32", 1e-4, 1e-8) for io in ("input", "output")]
    assert demote_noise(_call(same, "Default/v-op1", "view")) == []


# -- online: the same verdicts as offline ----------------------------------------------------------------
@pytest.mark.parametrize("batch_ops", [None, 1])
def test_online_compare_demotes_the_moves_too(tmp_path, batch_ops, monkeypatch):
    """``batch_ops`` 1: every operator judged in a batch of its own, the producer's demoted
    output carried to the later batches (``_Folder.carried``)."""
    if batch_ops:
        monkeypatch.setattr(online_compare, "BATCH_OPS", batch_ops)
    report = bf16_against_fp32_reference(tmp_path, MeanMoved)
    diverged = [d.get("op", "") for d in report.get("diverged", [])]
    assert not [op for op in diverged if any(f"Default/MeanMoved/{m}-op" in op for m in _MOVES + ("mean",))], diverged
    # one-operator batches: the bf16 run has one operator more (its .float() cast), so its two
    # LayerNorm-backward detaches are numbered one higher; a batch's names would pair each with the
    # other detach (min 0.69 off) -- the online matcher breaks such ties by order (match.py)
    assert report["first_divergence"] is None, json.dumps(report["first_divergence"])[:2000]
    offline = compare(tmp_path / "b", tmp_path / "r", progress=False, workers=1)
    assert offline.first_divergence is None, offline.first_divergence
