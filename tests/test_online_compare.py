"""Online compare (README, "Online compare"): ``opdump_settings.reference`` compares each
operator's statistics (or tensors) with a reference dump while the run goes, saves the
tensors of diverging operators only, prints the first divergence at once, and with
``stop_on_divergence`` stops ``opdump run`` with exit status 3.

Real runs: an fp32 statistics reference of a small training script, then the same script
with one operator perturbed (the ``* SCALE`` line: 1.0 in the reference, 1.5 perturbed),
each through ``opdump run`` as a subprocess; the results are checked against the offline
``opdump compare`` of the same two dumps.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from opdump import ConfigError, load_config
from opdump.analysis.compare import compare
from opdump.analysis.reader import open_dump
from opdump.capture.eager import EagerCapture
from opdump.debug.online_compare import EXIT_DIVERGED, DivergenceStop
from opdump.format.layout import ONLINE_COMPARE_JSON
from opdump.session import Session

REPO = Path(__file__).resolve().parents[1]

SCRIPT = '''\
import os, torch
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
SCALE = float(os.environ.get("PERTURB", "1.0"))
STEPS = int(os.environ.get("STEPS", "3"))

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 16)
        self.fc3 = torch.nn.Linear(16, 4)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = self.fc2(x) * SCALE
        return self.fc3(torch.relu(x))

net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
data = torch.randn(STEPS, 32, 8)
target = torch.randn(STEPS, 32, 4)
for i in range(STEPS):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(net(data[i]), target[i])
    loss.backward()
    opt.step()
print("finished", STEPS)
'''
MUL_LINE = SCRIPT.splitlines().index("        x = self.fc2(x) * SCALE") + 1


def _config(path: Path, dump: Path, saved: str = "statistic", **opdump_settings) -> Path:
    doc = {"common_dump_settings": {"path": str(dump), "net_name": "Net", "saved_data": saved, "iteration": "all"}}
    if opdump_settings:
        doc["opdump_settings"] = opdump_settings
    path.write_text(json.dumps(doc))
    return path


def _run(root: Path, name: str, perturb: float = 1.0, steps: int = 3, saved: str = "statistic",
         **opdump_settings) -> subprocess.CompletedProcess:
    cfg = _config(root / f"{name}.json", root / name, saved, **opdump_settings)
    env = dict(os.environ, PERTURB=str(perturb), STEPS=str(steps))
    return subprocess.run([sys.executable, "-m", "opdump", "run", "--config", str(cfg), str(root / "model.py")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("online")
    (root / "model.py").write_text(SCRIPT)
    out = {"root": root}
    r = _run(root, "ref")
    assert r.returncode == 0, r.stderr
    ref = str(root / "ref")
    out["b"] = _run(root, "b", perturb=1.5, reference=ref)
    out["same"] = _run(root, "same", reference=ref)
    out["stop"] = _run(root, "stop", perturb=1.5, steps=5, reference=ref, stop_on_divergence=True)
    r = _run(root, "ref_full", saved="full")
    assert r.returncode == 0, r.stderr
    out["full"] = _run(root, "full", perturb=1.5, saved="full", reference=str(root / "ref_full"))
    r = _run(root, "full_plain", perturb=1.5, saved="full")          # every tensor, for the offline compare
    assert r.returncode == 0, r.stderr
    return out


def _reports(dump: Path) -> dict:
    return {int(p.parent.name): json.loads(p.read_text()) for p in dump.glob(f"rank_0/Net/0/*/{ONLINE_COMPARE_JSON}")}


def _npy(dump: Path) -> list:
    return sorted(dump.rglob("*.npy"))


def test_first_divergence_names_the_operator_and_its_line(runs):
    r = runs["b"]
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "first divergence" in ln]
    assert len(lines) == 1, r.stderr                          # printed once, for the whole run
    assert "iteration 0, Default/Net/mul-op5 (" in lines[0] and f"model.py:{MUL_LINE})" in lines[0]
    assert "stat_max_rel_diff=" in lines[0]
    first = _reports(runs["root"] / "b")[0]["first_divergence"]
    assert first["op"] == "Default/Net/mul-op5" and first["source"].endswith(f"model.py:{MUL_LINE}")
    assert first["code"] == "x = self.fc2(x) * SCALE"
    assert first["cause"].startswith("inputs match, output differs")
    assert first["metrics"]["stat_max_rel_diff"] == pytest.approx(1 / 3, rel=1e-3)     # l2norm 1.5x


def test_only_diverging_operators_tensors_are_saved_and_statistics_of_all(runs):
    dump, ref = open_dump(runs["root"] / "b"), open_dump(runs["root"] / "ref")
    reports = _reports(runs["root"] / "b")
    assert sorted(reports) == [0, 1, 2]
    rec = dump.records()
    # statistics of every tensor, as many rows as the reference's
    assert rec["stat_row"].sum() == ref.records()["stat_row"].sum() > 0
    files = rec[rec["path"].notna()]
    assert len(files) == sum(len(r["saved_files"]) for r in reports.values()) > 0
    for it, report in reports.items():
        diverged = {(e["op"], e["call"]) for e in report["diverged"]}
        saved = {(r.op, r.call) for r in files[files["iteration"] == it].itertuples()}
        assert saved == diverged, it            # every call with a diverged tensor, nothing else
    # the diverging operator's input and output; nothing before it in iteration 0
    it0 = files[files["iteration"] == 0]
    assert set(it0[it0["op"] == "Default/Net/mul-op5"]["io"]) == {"input", "output"}
    first_order = rec[(rec["iteration"] == 0) & (rec["op"] == "Default/Net/mul-op5")]["order"].min()
    assert it0["order"].min() >= first_order
    # every saved file holds the values its statistics row was computed from, also where the
    # tensor was written in place afterwards (the optimizer's add_ on each parameter, relu's
    # output read again by threshold_backward): held copies, not references
    inplace = files[files["op_type"] == "add_"]
    assert len(inplace[inplace["io"] == "input"]) > 0
    for row in files.itertuples():
        arr = np.load(row.path)
        assert (float(arr.max()), float(arr.min())) == (pytest.approx(row.max, rel=1e-6, abs=1e-7),
                                                        pytest.approx(row.min, rel=1e-6, abs=1e-7)), row.path


def test_results_agree_with_the_offline_compare(runs):
    res = compare(runs["root"] / "b", runs["root"] / "ref", progress=False, workers=1)
    assert res.first_divergence["op"] == "Default/Net/mul-op5"
    reports = _reports(runs["root"] / "b")
    assert reports[0]["first_divergence"]["op"] == res.first_divergence["op"]
    assert reports[0]["first_divergence"]["source"] == res.first_divergence["source"]
    t = res.table
    for it, report in reports.items():
        rows = t[t["iteration"] == it]
        offline = {(r.op, r.io, r.slot, r.call) for r in rows[rows["verdict"] == "diverged"].itertuples()}
        online = {(e["op"], e["io"], e["slot"], e["call"]) for e in report["diverged"]}
        assert online == offline, it
        counts = rows["verdict"].value_counts().to_dict()
        assert report["verdicts"] == {k: counts[k] for k in sorted(counts)}, it


def test_identical_run_reports_nothing_and_saves_no_tensor(runs):
    r = runs["same"]
    assert r.returncode == 0, r.stderr
    assert "divergence" not in r.stderr
    reports = _reports(runs["root"] / "same")
    assert sorted(reports) == [0, 1, 2]
    for report in reports.values():
        assert report["first_divergence"] is None and report["diverged"] == [] and report["saved_files"] == []
        assert report["compared"] > 0 and set(report["verdicts"]) == {"pass"}
    assert _npy(runs["root"] / "same") == []


def test_stop_on_divergence_stops_opdump_run_cleanly(runs):
    r = runs["stop"]
    assert r.returncode == EXIT_DIVERGED == 3, r.stderr
    assert "finished" not in r.stdout                 # the script did not run its 5 steps
    assert "stopped at the first divergence: iteration 0, Default/Net/mul-op5" in r.stderr
    assert "Traceback" not in r.stderr
    dump = runs["root"] / "stop"
    assert sorted(_reports(dump)) == [0]
    manifest = json.loads((dump / "rank_0/.dump_metadata/manifest.json").read_text())
    assert manifest["complete"] is True and manifest["error_count"] == 0
    # nothing of a later step: iteration 1 holds at most the optimizer's trailing
    # record_function exit (captured after its step hook, as in any run), no statistics
    rec = open_dump(dump).records()
    assert set(rec["iteration"].dropna()) == {0}
    assert any("mul-op5" in p.name for p in _npy(dump))


def test_tensor_reference_compares_tensors(runs):
    """saved_data "full" against a "full" reference: tensor metrics decide, as offline."""
    r = runs["full"]
    assert r.returncode == 0, r.stderr
    reports = _reports(runs["root"] / "full")
    first = reports[0]["first_divergence"]
    assert {"cosine", "max_abs_err", "max_rel_err"} <= set(first["metrics"])
    assert {e["mode"] for rep in reports.values() for e in rep["diverged"]} == {"tensor"}
    # offline, on the same data: every tensor of the perturbed run against the reference (the
    # online dump holds the files of diverging operators only, so there offline compares the
    # others by their statistics)
    res = compare(runs["root"] / "full_plain", runs["root"] / "ref_full", progress=False, workers=1)
    # a 1.5x scale keeps the cosine at 1: by the tensor thresholds the mul itself is only a
    # warning, and the first divergence is a later operator -- the same one offline
    assert first["op"] == res.first_divergence["op"] and first["source"] == res.first_divergence["source"]
    assert first["metrics"]["cosine"] == pytest.approx(res.first_divergence["cosine"])
    t = res.table
    mul = t[(t["op"] == "Default/Net/mul-op5") & (t["io"] == "output") & (t["iteration"] == 0)]
    assert list(mul["verdict"]) == ["warning"]
    for it, report in reports.items():
        rows = t[t["iteration"] == it]
        offline = {(x.op, x.io, x.slot, x.call) for x in rows[rows["verdict"] == "diverged"].itertuples()}
        assert {(e["op"], e["io"], e["slot"], e["call"]) for e in report["diverged"]} == offline, it
    saved = {p.name for p in _npy(runs["root"] / "full")}
    assert saved and not any("mul-op5" in n for n in saved)       # a warning is not saved


def test_small_budget_judges_early_and_holds_nothing_after(runs, tmp_path):
    """A 1 MiB writer budget and 1.5 MiB activations: each operator's batch is judged before
    the next is held (bounded memory); the verdicts are those of one batch per iteration."""
    ref_cfg = _config(tmp_path / "r.json", tmp_path / "r")
    b_cfg = _config(tmp_path / "b.json", tmp_path / "b", reference=str(tmp_path / "r"), writer_queue_mb=1)

    reads = []

    def run(cfg, scale):
        torch.manual_seed(0)
        lin = torch.nn.Linear(512, 768)
        x = torch.randn(512, 512)
        with Session(load_config(str(cfg))) as s, EagerCapture(s):
            flush = s.recorder.flush_statistics
            s.recorder.flush_statistics = lambda: (reads.append(1), flush())[1]      # counted, not replaced
            y = torch.relu(lin(x)) * scale
            (y.sum() * 2.0).backward()
            s.step()
        return s

    run(ref_cfg, 1.0)
    reads.clear()
    s = run(b_cfg, 2.0)
    assert len(reads) > 4                        # judged operator by operator, not once per iteration
    online = s.recorder.online
    assert online._held == {} and online._held_bytes == 0
    report = _reports(tmp_path / "b")[0]
    assert report["first_divergence"]["op_type"] == "mul" and report["saved_files"]
    res = compare(tmp_path / "b", tmp_path / "r", progress=False, workers=1)
    assert res.first_divergence["op"] == report["first_divergence"]["op"]


def test_the_stop_is_raised_at_the_iteration_boundary_not_before(runs, tmp_path, monkeypatch):
    """Python API: DivergenceStop comes out of ``optimizer.step()`` at the end of the first
    iteration (a BaseException: the script's ``except Exception`` does not swallow it), after
    the iteration is on disk; the session then closes normally."""
    cfg = _config(tmp_path / "b.json", tmp_path / "b", reference=str(runs["root"] / "ref"),
                  stop_on_divergence=True)
    monkeypatch.setenv("PERTURB", "1.5")
    monkeypatch.setenv("STEPS", "3")
    code = compile(SCRIPT.replace("    opt.step()\n", "    opt.step()\n    steps.append(i)\n"), "model.py", "exec")
    steps, swallowed = [], []
    with pytest.raises(DivergenceStop) as info:
        with Session(load_config(str(cfg))) as s, EagerCapture(s):
            try:
                exec(code, {"__name__": "__main__", "steps": steps})
            except Exception:  # noqa: BLE001 - what a script may do; the stop must pass through
                swallowed.append(True)
    assert steps == [] and swallowed == []           # stopped inside the first optimizer.step()
    assert not isinstance(info.value, Exception) and info.value.info["op"] == "Default/Net/mul-op5"
    assert (tmp_path / "b/rank_0/Net/0/0" / ONLINE_COMPARE_JSON).is_file()
    manifest = json.loads((tmp_path / "b/rank_0/.dump_metadata/manifest.json").read_text())
    assert manifest["complete"] is True


@pytest.mark.parametrize("settings, field, why", [
    ({"reference": "/no/such/dump"}, "opdump_settings.reference", "no such folder"),
    ({"reference": "relative/dump"}, "opdump_settings.reference", "absolute"),
    ({"reference": 3}, "opdump_settings.reference", "absolute path"),
    ({"reference": "EMPTY"}, "opdump_settings.reference", "not an opdump/MindSpore dump"),
    ({"reference": "FILE"}, "opdump_settings.reference", "not a folder"),
    ({"stop_on_divergence": True}, "opdump_settings.stop_on_divergence", "needs opdump_settings.reference"),
    ({"stop_on_divergence": "yes", "reference": "REF"}, "opdump_settings.stop_on_divergence", "true or false"),
])
def test_config_refuses_a_bad_reference(runs, tmp_path, settings, field, why):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    subst = {"EMPTY": str(tmp_path / "empty"), "FILE": str(tmp_path / "file"), "REF": str(runs["root"] / "ref")}
    settings = {k: subst.get(v, v) if isinstance(v, str) else v for k, v in settings.items()}
    cfg = _config(tmp_path / "c.json", tmp_path / "d", **settings)
    with pytest.raises(ConfigError) as info:
        load_config(str(cfg))
    assert info.value.field == field and why in str(info.value)


def test_config_refuses_tensor_only_and_the_dump_itself(runs, tmp_path):
    ref = str(runs["root"] / "ref")
    with pytest.raises(ConfigError, match="saved_data.*\"statistic\" or \"full\""):
        load_config(str(_config(tmp_path / "c.json", tmp_path / "d", saved="tensor", reference=ref)))
    with pytest.raises(ConfigError, match="reference.*own folder"):
        load_config(str(_config(tmp_path / "c.json", runs["root"] / "ref", reference=ref)))
    cfg = load_config(str(_config(tmp_path / "c.json", tmp_path / "d", reference=ref + "/rank_0")))
    assert cfg.reference == ref + "/rank_0" and cfg.stop_on_divergence is False


def test_opdump_run_with_a_bad_reference_exits_2(runs, tmp_path):
    cfg = _config(tmp_path / "c.json", tmp_path / "d", reference=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "opdump", "run", "--config", str(cfg), str(runs["root"] / "model.py")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "opdump_settings.reference" in r.stderr and "finished" not in r.stdout


# An inline bf16 round trip of one activation (only in the run, not in the fp32 reference):
# step 0 gives only ``warning`` verdicts; with a large learning rate the small difference grows
# and crosses the divergence thresholds at a later operator in step 1 (of 3) -- which the first
# divergence alone would blame ("inputs match, output differs: this operator computes
# differently").  The report must lead back to the cast.
CAST_SCRIPT = SCRIPT.replace(
    "        x = self.fc2(x) * SCALE\n",
    "        x = self.fc2(x) * SCALE\n"
    "        if os.environ.get('BF16') == '1':\n"
    "            x = x.to(torch.bfloat16).to(torch.float32)\n").replace("lr=0.1", "lr=2.0")
CAST_LINE = CAST_SCRIPT.splitlines().index("            x = x.to(torch.bfloat16).to(torch.float32)") + 1


@pytest.fixture(scope="session")
def cast_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("online_cast")
    (root / "model.py").write_text(CAST_SCRIPT)
    r = _run(root, "ref", steps=3)
    assert r.returncode == 0, r.stderr
    cfg = _config(root / "b.json", root / "b", reference=str(root / "ref"))
    env = dict(os.environ, STEPS="3", BF16="1")
    b = subprocess.run([sys.executable, "-m", "opdump", "run", "--config", str(cfg), str(root / "model.py")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert b.returncode == 0, b.stderr
    return root, b


def test_divergence_after_warnings_leads_back_to_the_inline_cast(cast_runs):
    root, b = cast_runs
    reports = _reports(root / "b")
    assert "diverged" not in reports[0]["verdicts"] and reports[0]["verdicts"]["warning"] > 0
    assert reports[0]["first_divergence"] is None
    first = reports[1]["first_divergence"]
    assert first is not None and first["iteration"] == 1        # a later operator crossed the thresholds
    origin = first["origin"]
    assert origin["iteration"] == 0 and origin["io"] == "input"
    producer = origin["producer"]
    assert producer["op_type"] == "_to_copy" and producer["source"].endswith(f"model.py:{CAST_LINE}")
    assert producer["code"] == "x = x.to(torch.bfloat16).to(torch.float32)"
    assert first["cause"].startswith("the difference began earlier")
    assert reports[0]["first_difference"]["producer"] == producer
    lines = [ln for ln in b.stderr.splitlines() if "first divergence" in ln]
    assert len(lines) == 1 and f"model.py:{CAST_LINE})" in lines[0], b.stderr


def test_offline_first_difference_names_no_parameter_of_a_later_iteration(cast_runs, tmp_path):
    """Offline ``opdump compare`` of the same pair: the first difference is the cast's consumer at
    iteration 0, where every parameter is still identical; parameters that differ only from
    iteration 1 on (after the first update) must not be named as its cause."""
    root, _ = cast_runs
    r = subprocess.run([sys.executable, "-m", "opdump", "compare", str(root / "b"), str(root / "ref"), "--json",
                        "--csv", str(tmp_path / "t.csv")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    first = json.loads(r.stdout)["first_difference"]
    assert first["iteration"] == 0 and first["io"] == "input"
    assert first["parameters"] == [] and "parameter that differs" not in first["cause"]


def bf16_against_fp32_reference(tmp_path, model_cls):
    """One step of ``model_cls`` in fp32 dumped as the reference (``tmp_path/r``), then in
    bf16 compared online against it (``tmp_path/b``); the bf16 run's report."""
    ref_cfg = _config(tmp_path / "r.json", tmp_path / "r")
    b_cfg = _config(tmp_path / "b.json", tmp_path / "b", reference=str(tmp_path / "r"))
    for cfg, dtype in ((ref_cfg, torch.float32), (b_cfg, torch.bfloat16)):
        torch.manual_seed(0)
        model, x = model_cls().to(dtype), torch.randn(8, 16).to(dtype)
        with Session(load_config(str(cfg))) as s, EagerCapture(s):
            model(x).float().sum().backward()
            s.step()
    return _reports(tmp_path / "b")[0]


def test_precision_noise_is_no_online_divergence(tmp_path):
    """A bf16 run against an fp32 reference: the mean output of a LayerNorm whose input is
    already normalised is rounding noise (README, compare verdicts: precision compares), not
    a divergence -- online as offline (``noise_floor.demote_noise`` on each judged batch), so
    ``stop_on_divergence`` would not stop a healthy bf16 run on it."""
    class TwoNorms(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.head = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
            self.ln1, self.ln2 = torch.nn.LayerNorm(32), torch.nn.LayerNorm(32)

        def forward(self, x):
            return self.head(self.ln2(self.ln1(self.fc(x))))

    report = bf16_against_fp32_reference(tmp_path, TwoNorms)
    assert report["first_divergence"] is None, report["first_divergence"]
    offline = compare(tmp_path / "b", tmp_path / "r", progress=False, workers=1)
    assert offline.first_divergence is None
