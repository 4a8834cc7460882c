"""The debug modes (README "Debug dumps", "Online compare") tried as a new user would, on
models written here and not used elsewhere in the suite: a tiny GPT-2 (``transformers``, built
from a config, no download) run in fp16 whose MLP weights are scaled to overflow at a known
step; an attention block with ``-inf`` masks and a model fed a NaN (nothing may be reported);
an embedding index out of range in GPT-2 under ``opdump run`` (the repro script re-raises it,
exit statuses are the script's own); a saved activation overwritten by a later ``.data.mul_``
(watcher names the line), also with the model compiled; an fp32 statistics reference against
the same program with one layer in bf16 (online compare names that layer's line); two sampled
dumps read back and compared.

Regression tests for what broke when tried this way:

* ``opdump overflow`` on an overflow-only dump in which nothing overflowed said "nothing to
  analyse" and exited 2 (an error); it now reads the ``overflow.json`` summaries: exit 0.
* watcher mode with a compiled model under the eager capture (``opdump run`` of a script that
  calls ``torch.compile``) warned "no operator matched watcher_nodes" and wrote an empty
  ``watcher.json`` from the eager side although the graph side watched the operators.
"""
import glob
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from conftest import write_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPDUMP = [sys.executable, "-m", "opdump"]


def _cli(*args, cwd=None):
    return subprocess.run(OPDUMP + [str(a) for a in args], capture_output=True, text=True, cwd=cwd or ROOT,
                          timeout=300)


def _overflows(dump):
    out = []
    for p in sorted(glob.glob(os.path.join(str(dump), "rank_0", "*", "*", "*", "overflow.json"))):
        body = json.load(open(p))
        out.extend((body["iteration"], o) for o in body["overflows"])
    return out


# ---------------------------------------------------------------- overflow (op_debug_mode 3)
def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def test_overflow_fp16_gpt2_names_the_pow_of_gelu_at_the_scaled_step(tmp_path):
    """fp16 GPT-2; before step 1 the MLP's ``c_fc`` weight is scaled by 3000: its output stays
    finite, the GELU's ``pow(input, 3)`` overflows -- the origin, in activations.py."""
    pytest.importorskip("transformers", reason="transformers is a test dependency (tests/zoo)")
    cfg = write_config(tmp_path, {"op_debug_mode": 3})
    model = _gpt2().half()
    g = torch.Generator().manual_seed(0)
    with opdump.Session(cfg) as s, EagerCapture(s):
        for step in range(2):
            ids = torch.randint(0, 64, (2, 8), generator=g)
            if step == 1:
                with torch.no_grad():
                    model.transformer.h[0].mlp.c_fc.weight.mul_(3000.0)
            model(input_ids=ids, labels=ids).loss.backward()
            s.step()
    found = _overflows(tmp_path / "dump")
    assert found, "nothing reported"
    assert {it for it, _ in found} == {1}                 # step 0 is clean
    it, first = found[0]
    assert first["op_type"] == "pow" and "NewGELUActivation" in first["op"]
    assert os.path.join("transformers", "activations.py:") in first["source"]
    assert "torch.pow(input, 3.0)" in first["code"] and first["dumped"]
    assert sum(o["pos_inf"] + o["neg_inf"] for o in first["outputs"]) > 0
    # nothing upstream (c_fc's addmm, the layer norm, the attention) is reported
    assert not any("c_fc" in o["op"] or "attn" in o["op"] for _, o in found)


class _MaskedAttention(nn.Module):
    """Causal attention with two intentional ``-inf`` masks (``masked_fill`` and ``full``)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.o = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        s = self.q(x) @ self.k(x).transpose(-1, -2)
        n = x.shape[1]
        s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
        s = s + torch.full((n, n), float("-inf")).triu(1)
        return self.o(s.softmax(-1) @ x)


class _Propagate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x).relu()


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_overflow_mask_and_nan_input_are_not_reported_and_cli_says_clean(tmp_path, mode):
    """A ``-inf`` mask is no overflow, nor a NaN that comes in with the data; ``opdump
    overflow`` on that clean overflow-only dump exits 0 (it exited 2, "nothing to analyse")."""
    cfg = write_config(tmp_path, {"op_debug_mode": 3})
    torch.manual_seed(0)
    attn, prop = _MaskedAttention(), _Propagate()

    def data(step):
        x = torch.randn(2, 8)
        if step == 1:
            x[0, 0] = float("nan")
        return x

    with opdump.Session(cfg) as s:
        if mode == "eager":
            with EagerCapture(s):
                for step in range(2):
                    attn(torch.randn(2, 5, 8)).sum().backward()
                    prop(data(step)).sum().backward()
                    s.step()
        else:
            ca = torch.compile(attn, backend=s.backend("eager"))
            cp = torch.compile(prop, backend=s.backend("eager"))
            for step in range(2):
                ca(torch.randn(2, 5, 8)).sum().backward()
                cp(data(step)).sum().backward()
                s.step()
    dump = tmp_path / "dump"
    assert glob.glob(str(dump / "rank_0" / "*" / "*" / "*" / "overflow.json"))
    assert _overflows(dump) == []
    r = _cli("overflow", dump)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "no NaN/Inf found" in r.stdout
    r = _cli("overflow", dump, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["found"] is False


# ---------------------------------------------------------------- exception (op_debug_mode 4)
EXC_SCRIPT = textwrap.dedent("""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for step in range(3):
        ids = torch.randint(0, 64, (2, 8))
        if step == 2:
            ids[1, 3] = 70                      # past the 64-row embedding table
        m(input_ids=ids, labels=ids).loss.backward(); opt.step(); opt.zero_grad()
        print("step", step, flush=True)
""")


def test_exception_gpt2_embedding_out_of_range_under_opdump_run(tmp_path):
    """``opdump run`` of a GPT-2 script whose step 2 feeds an id past the table: the script's
    own IndexError and exit status 1; the repro script beside the inputs re-raises it (exit 1)."""
    pytest.importorskip("transformers", reason="transformers is a test dependency (tests/zoo)")
    cfg = write_config(tmp_path, {"op_debug_mode": 4})
    script = tmp_path / "train.py"
    script.write_text(EXC_SCRIPT)
    r = _cli("run", "--config", cfg, script, cwd=str(tmp_path))
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stdout.split() == ["step", "0", "step", "1"]
    assert r.stderr.rstrip().splitlines()[-1] == "IndexError: index out of range in self"
    folder = tmp_path / "dump" / "rank_0" / "Net" / "0" / "2"
    rec = json.load(open(folder / "exception.json"))["exceptions"][0]
    assert rec["op_type"] == "embedding" and "wte-Embedding" in rec["op"]
    assert "modeling_gpt2.py:" in rec["source"]
    assert "self.wte(input_ids)" in rec["code"]
    ids = np.load(folder / next(i["file"] for i in rec["inputs"] if i["slot"] == 1))
    assert ids.max() == 70
    repro = subprocess.run([sys.executable, str(folder / rec["repro"])], capture_output=True, text=True,
                           cwd=str(tmp_path), timeout=120)
    assert repro.returncode == 1
    assert repro.stderr.rstrip().splitlines()[-1] == "IndexError: index out of range in self"


class _WrongShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(12, 4)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())      # WRONG_SHAPE_LINE: 16 features into a Linear(12, 4)


def test_exception_wrong_shape_into_linear_same_exception_and_repro(tmp_path):
    cfg = write_config(tmp_path, {"op_debug_mode": 4})
    model = _WrongShape()
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(3x16 and 12x4\)"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with opdump.Session(cfg) as s, EagerCapture(s):
                model(torch.randn(3, 8))
    rec = json.load(open(tmp_path / "dump" / "rank_0" / "Net" / "0" / "0" / "exception.json"))["exceptions"][0]
    line = next(i for i, t in enumerate(open(__file__), 1) if "WRONG_SHAPE_LINE" in t and "return" in t)
    assert rec["source"] == f"{__file__}:{line}" and "fc2-Linear" in rec["op"]
    repro = subprocess.run([sys.executable, str(tmp_path / "dump" / "rank_0" / "Net" / "0" / "0" / rec["repro"])],
                           capture_output=True, text=True, timeout=120)
    assert repro.returncode == 1 and "mat1 and mat2 shapes cannot be multiplied" in repro.stderr


# ---------------------------------------------------------------- watcher
class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x, store):
        h = torch.tanh(self.fc(self.norm(x)))    # tanh saves h for its backward
        store.append(h)
        return x + h


class _Stacked(nn.Module):
    def __init__(self, bug=True):
        super().__init__()
        self.b1, self.b2, self.head = _Block(), _Block(), nn.Linear(8, 1)
        self.bug = bug

    def forward(self, x):
        store = []
        x = self.b2(self.b1(x, store), store)
        if self.bug:
            store[0].data.mul_(0.0)              # OVERWRITE_LINE: b1's saved tanh output zeroed
        return self.head(x).sum()


def test_watcher_names_the_data_mul_that_overwrote_a_saved_activation(tmp_path):
    cfg = write_config(tmp_path, {"iteration": "0", "input_output": 2}, e2e={"watcher": {"watcher_nodes": ["tanh"]}})
    torch.manual_seed(0)
    model = _Stacked()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(cfg) as s, EagerCapture(s):
        for _ in range(2):
            model(torch.randn(4, 8)).backward(); opt.step(); opt.zero_grad()
    r = _cli("watcher", tmp_path / "dump")
    assert r.returncode == 1, (r.stdout, r.stderr)
    line = next(i for i, t in enumerate(open(__file__), 1) if "OVERWRITE_LINE" in t and "mul_" in t)
    first = next(ln for ln in r.stdout.splitlines() if "first change" in ln)
    assert "b1-_Block/tanh-op" in first and "/mul_-op" in first and f"{__file__}:{line}" in first


def test_watcher_compiled_model_under_eager_capture_no_false_unmatched_warning(tmp_path):
    """The model compiled through opdump's backend, the optimizer under the eager capture (what
    ``opdump run`` does): the graph side watches the tanh outputs; the eager side must not warn
    that nothing matched nor write an empty ``watcher.json`` of its own."""
    cfg = write_config(tmp_path, {"iteration": "0", "input_output": 2}, e2e={"watcher": {"watcher_nodes": ["tanh"]}})
    torch.manual_seed(0)
    model = _Stacked(bug=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as s, EagerCapture(s):
            compiled = torch.compile(model, backend=s.backend("eager"))
            for _ in range(2):
                compiled(torch.randn(4, 8)).backward(); opt.step(); opt.zero_grad()
    assert not [w for w in caught if "no operator matched" in str(w.message)]
    bodies = [json.load(open(p)) for p in glob.glob(str(tmp_path / "dump" / "rank_0" / "*" / "*" / "*" / "watcher.json"))]
    assert len(bodies) == 1 and bodies[0]["watched"], bodies
    assert any("b1-_Block/tanh" in w["op"] for w in bodies[0]["watched"])
    assert bodies[0]["first_change"] is None


# ---------------------------------------------------------------- online compare
class _Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = self.fc2(x.to(self.fc2.weight.dtype)).float()     # FC2_LINE
        return self.fc3(torch.relu(x)).sum()


def _train_mixed(cfg, bf16):
    torch.manual_seed(0)
    model = _Mixed()
    if bf16:
        model.fc2.to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    with opdump.Session(cfg) as s, EagerCapture(s):
        for _ in range(3):
            model(torch.randn(8, 16, generator=g)).backward(); opt.step(); opt.zero_grad()


def test_online_compare_fp32_reference_names_the_bf16_layer(tmp_path):
    ref_cfg = write_config(tmp_path, {"saved_data": "statistic", "path": str(tmp_path / "ref")}, name="ref.json")
    _train_mixed(ref_cfg, bf16=False)
    cfg = write_config(tmp_path, {"saved_data": "statistic"},
                       extra={"opdump_settings": {"reference": str(tmp_path / "ref")}})
    _train_mixed(cfg, bf16=True)
    firsts = [json.load(open(p))["first_divergence"]
              for p in sorted(glob.glob(str(tmp_path / "dump" / "rank_0" / "Net" / "0" / "*" / "online_compare.json")))]
    first = next(f for f in firsts if f)
    line = next(i for i, t in enumerate(open(__file__), 1) if "FC2_LINE" in t and "self.fc2(" in t)
    assert "fc2-Linear" in first["op"] and first["source"] == f"{__file__}:{line}", first
    assert first["cause"].startswith("inputs match")


# ---------------------------------------------------------------- sample mode
def test_sample_files_read_back_and_sampled_dumps_compare(tmp_path):
    from opdump.analysis.reader import open_dump
    for name, bf16 in (("a", False), ("b", True)):
        cfg = write_config(tmp_path, {"saved_data": "full", "iteration": "0|2", "path": str(tmp_path / name)},
                           e2e={"sample_mode": 1, "sample_num": 16}, name=f"{name}.json")
        _train_mixed(cfg, bf16)
    d = open_dump(str(tmp_path / "a"))
    assert d.sample_num == 16
    shapes = {np.load(f.path).shape for f in d.tensor_files()}
    assert shapes <= {(16,), (4,), (1,)} and (16,) in shapes
    same = _cli("compare", tmp_path / "a", tmp_path / "a", cwd=tmp_path)   # its opdump_compare.csv there
    assert same.returncode == 0, same.stdout + same.stderr
    diff = _cli("compare", tmp_path / "b", tmp_path / "a", cwd=tmp_path)
    assert diff.returncode == 1, diff.stdout + diff.stderr
    assert "fc2-Linear" in next(ln for ln in diff.stdout.splitlines() if ln.startswith("first divergence"))
