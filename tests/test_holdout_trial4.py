"""opdump tried a fourth time as a new user would, doing what the reviewer of the debug modes,
of ``opdump compare`` and of the statistics cost will do (README "Debug dumps", "Analysis",
"What it costs"), on models in none of the earlier trials, the zoo or the bench: small random
``transformers`` models built from configs (OPT and Falcon in fp16, Phi, ConvNeXt) and
hand-written nets with a planted fault (an ``exp`` whose scale grows at a known step, an index
out of range and a shape mismatch in a known layer, a saved activation overwritten through
``.data`` and a parameter view rewritten by the optimizer).

What held (the trial's numbers, not all re-run here): the overflow watch named the planted
operator and line as the first overflow, eager and compiled, fp16 and bf16, MindSpore-style and
ACL-style configs (``dump_debug: "on"``), never the ``-inf`` mask nor the operators that only carry
the Inf along; ``overflow_number`` 2 dumped exactly the first two overflowing operators of the
session and listed the rest as not dumped; the exception dump's ``repro_*.py`` re-raised the same
error (exit 1) from the saved inputs for an ``index_select`` and an ``embedding`` out of range
(eager and compiled) and a ``mm`` shape mismatch (eager; compiled, Dynamo raises it while tracing,
as README says); watcher mode named the ``.data.add_`` line and the optimizer's ``_foreach_add_`` /
``add_`` that rewrote a parameter view, in both dialects; a sampled dump of Phi (eager and
compiled, 1,923 / 1,114 tensors) held exactly the first ``sample_num`` elements of every tensor
of a whole-tensor dump of the same run, and its ``statistic.csv`` rows (max, min, avg, l2norm,
count, md5) were equal to the whole dump's.

What broke, each with its test here:

* (fixed, ``opdump/analysis/overflow.py``, ``opdump/cli/analysis_commands.py``, triage) ``opdump
  overflow`` listed every operator after the origin whose outputs held NaN/Inf as "next affected
  operators" -- also operators that overflowed on their own from finite inputs (a second planted
  overflow in the same step, a backward ``sinh``/``pow`` that overflows from finite inputs, and so
  every entry of an overflow-only dump after the first), which told the user they were victims of
  the first. They are now listed apart ("also overflowed on their own", ``more_origins`` in
  ``--json``).
* (fixed, ``opdump/config/acl.py``) An ACL-style overflow config (``dump_debug: "on"``) with
  ``layer``/``model_name`` entries in ``dump_list`` or ``dump_mode`` "input"/"output" watched every
  operator of every graph and saved inputs and outputs without a word, so a user who asked for
  one layer's overflows got the whole model's (the MindSpore dialect warns for ``dump_mode`` 1);
  it now warns, naming the ignored fields.
* (fixed, ``opdump/analysis/compare/noise_floor.py``: an error below ``eps × max|input|`` of a
  precision compare is a warning) A bf16-vs-fp32 compare of the same model names the
  mean output (``output.1``) of a LayerNorm whose input is itself normalised as the first
  divergence: the fp32 mean is ~1e-8 (the input is zero-mean), the bf16 one ~1e-4 (rounding of the
  input), so their cosine is noise although the error (4e-4) is far below one bf16 ulp of the
  input (~2e-2). Found on a ConvNeXt (its downsampling LayerNorm), tensor and statistics compares.
* (open, xfail: ``opdump/capture/graph/ops.py``; torch drops the node metadata) After a recompile
  that makes a Python float argument symbolic (``h * k`` with ``k`` changing between calls),
  AOTAutograd's ``mul`` node carries no ``stack_trace`` nor module stack, so the overflow watch's
  ``overflow.json`` and ``opdump overflow`` give the compiled origin no source line (eager gives
  it).
"""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn

import opdump
from opdump.analysis import compare
from opdump.analysis.overflow import find_overflow
from opdump.capture.eager import EagerCapture
from conftest import write_config

OPDUMP = [sys.executable, "-m", "opdump"]


class TwoOverflows(nn.Module):
    """Two independent overflows from the same finite tensor (fp16): ``exp`` first, then ``pow``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, k):
        h = self.fc(x) * k
        a = torch.exp(h)            # overflows on its own
        b = h.pow(4)                # overflows on its own too: not a victim of the exp
        return a.sum() + b.sum()


def _run_eager(cfg, model, inputs):
    with opdump.Session(cfg) as s, EagerCapture(s):
        for args in inputs:
            model(*args).backward()
            s.step()


@pytest.fixture(scope="module")
def overflow_only_dump(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ovf_only")
    torch.manual_seed(0)
    model, x = TwoOverflows().half(), torch.randn(4, 8).half()
    cfg = write_config(tmp, common={"op_debug_mode": 3, "overflow_number": 0})
    _run_eager(cfg, model, [(x, 1.0), (x, 300.0)])
    return str(tmp / "dump")


def test_overflow_independent_origins_are_not_reported_as_affected(overflow_only_dump):
    rep = find_overflow(opdump.load(overflow_only_dump), progress=False)
    assert rep.origin.op_type == "exp" and rep.origin.iteration == 1
    more = [e.op_type for e in rep.more_origins]
    assert "pow" in more, more                       # the forward pow overflowed on its own
    assert all(e.kind == "operator" for e in rep.more_origins)
    assert not rep.affected, [e.op for e in rep.affected]   # an overflow-only dump holds no victims
    out = subprocess.run(OPDUMP + ["overflow", overflow_only_dump], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert "next affected" not in out.stdout and "also overflowed on their own" in out.stdout, out.stdout
    js = json.loads(subprocess.run(OPDUMP + ["overflow", overflow_only_dump, "--json"],
                                   capture_output=True, text=True).stdout)
    assert "Default/TwoOverflows/pow-op" in " ".join(e["op"] for e in js["more_origins"]) and js["affected"] == []


class Victims(nn.Module):
    """One overflow (``exp``) and operators that only carry its Inf along."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, k):
        g = torch.exp(self.fc(x) * k)
        return (g * 2.0 + 1.0).sum()


def test_overflow_victims_stay_affected(tmp_path):
    torch.manual_seed(0)
    model, x = Victims().half(), torch.randn(4, 8).half()
    cfg = write_config(tmp_path, common={"iteration": "0"})
    _run_eager(cfg, model, [(x, 300.0)])
    rep = find_overflow(opdump.load(str(tmp_path / "dump")), progress=False)
    assert rep.origin.op_type == "exp"
    assert [e.op_type for e in rep.affected][:2] == ["mul", "add"], [e.op for e in rep.affected]
    assert not [e.op for e in rep.more_origins if e.op_type in ("mul", "add")]


class TwoNorms(nn.Module):
    """A LayerNorm of a LayerNorm's output: the second one's input is zero-mean, so its mean
    output (``native_layer_norm`` output 1) is rounding noise, ~1e-8 in fp32."""

    def __init__(self):
        super().__init__()
        self.fc, self.ln1, self.ln2, self.head = nn.Linear(16, 32), nn.LayerNorm(32), nn.LayerNorm(32), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.ln2(self.ln1(self.fc(x))))


def test_bf16_vs_fp32_layernorm_mean_is_not_a_divergence(tmp_path):
    dumps = []
    for dt in (torch.bfloat16, torch.float32):
        torch.manual_seed(0)
        model, x = TwoNorms().to(dt), torch.randn(8, 16).to(dt)
        folder = tmp_path / str(dt).split(".")[-1]
        folder.mkdir()
        cfg = write_config(folder, common={"iteration": "0"})
        with opdump.Session(cfg) as s, EagerCapture(s):
            model(x).float().sum().backward()
            s.step()
        dumps.append(opdump.load(str(folder / "dump")))
    res = compare(dumps[0], dumps[1])
    assert res.first_divergence is None, res.first_divergence


class ScaledByFloat(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, k):
        h = self.fc(x) * k                      # overflows when k is 1e5 (fp16)
        return h.float().sum()


@pytest.mark.xfail(strict=True, reason="opdump/capture/graph (not this file's owner): AOTAutograd drops the "
                   "stack_trace of the mul by a symbolic float after a recompile (see module docstring)")
def test_compiled_overflow_after_float_recompile_has_its_source_line(tmp_path):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = ScaledByFloat().half(), torch.randn(4, 8).half()
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    with opdump.Session(cfg) as s:
        compiled = torch.compile(model, backend=s.backend("eager"))
        for k in (1.0, 1e5):
            compiled(x, k).backward()
            s.step()
    torch._dynamo.reset()
    rep = find_overflow(opdump.load(str(tmp_path / "dump")), progress=False)
    assert rep.origin is not None and rep.origin.op_type == "mul"
    assert rep.origin.source.endswith(f"{os.path.basename(__file__)}:{ScaledByFloat.forward.__code__.co_firstlineno + 1}"), \
        rep.origin.source


@pytest.mark.parametrize("dump, says", [
    ({"dump_list": [{"model_name": "graph_0", "layer": ["addmm"]}]},
     ["dump.dump_list[0].model_name", "dump.dump_list[0].layer"]),
    ({"dump_mode": "input"}, ['dump.dump_mode "input"']),
    ({}, None),                                     # the seed's own example: nothing to say
    ({"dump_mode": "all", "dump_list": []}, None),
])
def test_acl_overflow_config_says_what_it_ignores(tmp_path, dump, says):
    path = tmp_path / "acl.json"
    path.write_text(json.dumps({"dump": {"dump_path": str(tmp_path), "dump_debug": "on", **dump}}))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cfg = opdump.load_config(str(path))
    assert cfg.op_debug_mode == 3 and cfg.input_output == 0 and cfg.kernels == () and cfg.model_filter == ()
    texts = [str(w.message) for w in seen if "dump_debug" in str(w.message)]
    if says is None:
        assert not texts, texts
    else:
        assert len(texts) == 1 and all(x in texts[0] for x in says), texts
        assert seen[0].filename == __file__              # attributed to the caller's line
