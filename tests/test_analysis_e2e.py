"""End to end: real opdump captures (torch.compile graph mode) analysed by the
analysis commands -- two runs differing in one layer's weights, an exp() that
overflows at a known step, locate on a CNN line."""
import inspect
import json

import pytest

import torch
import opdump

from opdump.analysis.compare import compare          # noqa: E402
from opdump.analysis.locate import locate            # noqa: E402
from opdump.analysis.overflow import find_overflow   # noqa: E402
from opdump.analysis.reader import open_dump         # noqa: E402


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc1 = torch.nn.Linear(4 * 4 * 4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        x = torch.relu(self.conv1(x))                      # LINE_CONV
        x = torch.nn.functional.max_pool2d(x, 2).flatten(1)
        x = torch.relu(self.fc1(x))
        x = self.fc2(x)                                    # LINE_FC2
        return torch.exp(x * self.scale).sum()            # LINE_EXP


def _line(tag):
    src, start = inspect.getsourcelines(SmallCNN.forward)
    for i, text in enumerate(src):
        if tag in text:
            return start + i
    raise AssertionError(tag)


def _run(path, *, steps=3, perturb=False, overflow_step=None):
    cfg = {"common_dump_settings": {"op_debug_mode": 0, "dump_mode": 0, "path": str(path), "net_name": "Net",
                                    "iteration": "all", "saved_data": "tensor", "input_output": 0, "kernels": [],
                                    "support_device": [0]},
           "e2e_dump_settings": {"enable": True, "trans_flag": True}}
    cfg_path = path.parent / (path.name + ".json")
    cfg_path.write_text(json.dumps(cfg))
    torch.manual_seed(0)
    model = SmallCNN()
    model.scale = 1.0
    if perturb:
        with torch.no_grad():
            model.fc2.weight[0, 0] += 0.5
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    with opdump.Session(str(cfg_path)) as s:
        cm = torch.compile(model, backend=s.backend("eager"), dynamic=False)
        for step in range(steps):
            x = torch.randn(2, 3, 8, 8, generator=gen)
            if overflow_step is not None and step == overflow_step:
                x = x * 1e4
            loss = cm(x)
            loss.backward()
            opt.step()
            opt.zero_grad()
    torch._dynamo.reset()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    return {"ref": _run(root / "ref", steps=2), "fc2": _run(root / "fc2", steps=2, perturb=True),
            "ovf": _run(root / "ovf", steps=3, overflow_step=2)}


def test_compare_names_the_perturbed_layer(runs, tmp_path):
    r = compare(runs["fc2"], runs["ref"], progress=False)
    fd = r.first_divergence
    assert fd is not None
    assert "fc2-Linear" in fd["op"] and fd["iteration"] == 0, fd
    assert fd["source"].endswith(f":{_line('LINE_FC2')}"), fd
    assert not r.unmatched_a and not r.unmatched_b
    # everything of conv1 and fc1 in the first forward matched exactly
    t = r.table
    early = t[(t["iteration"] == 0) & t["op"].fillna("").str.contains("conv1-Conv2d|fc1-Linear")
              & ~t["op"].fillna("").str.startswith("Gradients")]
    assert len(early) and set(early["verdict"]) <= {"pass", "skipped"}
    r.to_html(tmp_path / "r.html")
    assert "fc2-Linear" in (tmp_path / "r.html").read_text()


def test_overflow_names_exp_at_its_step(runs):
    rep = find_overflow(open_dump(runs["ovf"]), progress=False)
    assert rep.found
    o = rep.origin
    assert o.op_type == "exp" and o.iteration == 2 and o.kind == "operator", o
    assert o.source.endswith(f":{_line('LINE_EXP')}"), o


def test_locate_a_cnn_line(runs):
    d = open_dump(runs["ref"])
    hits = locate(d, f"test_analysis_e2e.py:{_line('LINE_CONV')}")
    names = [h.full_name for h in hits]
    assert any("conv1-Conv2d" in n and not n.startswith("Gradients") for n in names), names
    assert any(n.startswith("Gradients/") for n in names), names          # the backward of that line too
    assert all(sorted(k for k in h.files if k is not None) == [0, 1] for h in hits if h.files)


SCRIPT = '''
import torch
torch.manual_seed(0)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x):
        h = self.fc(x)
        return torch.exp(h).mean()          # EXP_LINE

model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    x = torch.randn(3, 6) * (200.0 if step == 2 else 1.0)
    loss = model(x)
    loss.backward()
    opt.step()
    opt.zero_grad()
'''


def test_opdump_run_eager_then_overflow_cli(tmp_path):
    """As a new user: `opdump run` an unmodified eager script whose exp() overflows at step 2,
    then `opdump overflow` (exit 1) names exp and its line; `opdump ls` reads the dump."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    line = next(i for i, t in enumerate(SCRIPT.splitlines(), 1) if "EXP_LINE" in t)
    dump = tmp_path / "dump"
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({
        "common_dump_settings": {"op_debug_mode": 0, "dump_mode": 0, "path": str(dump), "net_name": "Net",
                                 "iteration": "0-3", "saved_data": "statistic", "input_output": 0, "kernels": [],
                                 "support_device": [0], "statistic_category": ["max", "min", "l2norm"]},
        "e2e_dump_settings": {"enable": True, "trans_flag": True}}))
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "opdump", "run", "--config", str(cfg), str(script)],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "opdump", "overflow", str(dump), "-q"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("first operator producing NaN/Inf:") and "exp-op" in first, r.stdout
    assert f"train.py:{line}" in r.stdout and "iteration 2" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-m", "opdump", "ls", str(dump)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0 and "saved_data=statistic" in r.stdout, r.stdout + r.stderr
