"""The command line as a user runs it (issue 17, item 9): output piped into a reader that
goes away (``opdump ls D | head``), the launcher's own frames kept out of the listing, and
``watch too_large`` on a statistics-only dump holding Inf.  Real subprocesses, real dumps."""
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import opdump
from opdump.analysis import Condition, locate, watch
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec
from conftest import write_config

OPDUMP_DIR = os.path.dirname(os.path.abspath(opdump.__file__))
LAUNCHER = os.path.join(os.path.dirname(sys.executable), "opdump")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(OPDUMP_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def small_dump(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = DumpConfig(path=str(root), iteration=IterationSpec(ranges=((0, 0),)))
    with opdump.Session(cfg) as session, EagerCapture(session):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    return str(root)


@pytest.mark.parametrize("command", [["ls", "--ops"], ["overflow", "-q"], ["ls"]])
def test_a_reader_that_goes_away_gives_no_traceback(small_dump, command):
    proc = subprocess.Popen([sys.executable, "-m", "opdump", command[0], small_dump] + command[1:],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    proc.stdout.close()                 # `| head -0`: the reader is gone before anything is written
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_the_api_functions_are_functions_after_their_modules_are_imported():
    import opdump.analysis.locate                    # noqa: F401 - what the CLI does first
    import opdump.analysis.watch                     # noqa: F401
    from opdump.analysis import locate as locate_fn, watch as watch_fn
    assert callable(locate_fn) and callable(watch_fn)
    assert locate_fn is locate and watch_fn is watch


SCRIPT = textwrap.dedent('''
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = model(torch.randn(2, 4)).sum()      # SCRIPT_LINE
        loss.backward()
        opt.step()
        opt.zero_grad()
''')


@pytest.mark.skipif(not os.path.exists(LAUNCHER), reason="the console script is installed by `pip install -e .`")
def test_launcher_frames_never_appear_in_the_listing(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cfg = write_config(tmp_path, common={"iteration": "0"})
    proc = subprocess.run([LAUNCHER, "run", "--config", cfg, str(script)], capture_output=True, text=True,
                          env=_env(), timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    graphs = tmp_path / "dump" / "rank_0" / "graphs"
    doc = json.loads((graphs / "ms_output_trace_code_graph_0.json").read_text())
    line = next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if "SCRIPT_LINE" in text)
    tanh = next(o for o in doc["ops"] if o["op_type"] == "tanh")
    assert [(s["file"], s["line"]) for s in tanh["source"]] == [(str(script), line)]
    for op in doc["ops"]:
        for s in op["source"]:
            assert not s["file"].startswith(OPDUMP_DIR + os.sep) and s["file"] != LAUNCHER, s
    ir = (graphs / "ms_output_trace_code_graph_0.ir").read_text()
    assert "sys.exit(main())" not in ir and "runpy" not in ir


class Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y.masked_fill(y > 0.1, float("inf"))     # Inf, and finite elements below 100


def test_watch_too_large_uses_finite_elements_of_a_statistics_only_dump(tmp_path):
    torch.manual_seed(0)
    model = Masked()
    cfg = DumpConfig(path=str(tmp_path), iteration=IterationSpec(ranges=((0, 0),)), saved_data="statistic",
                     statistic_category=("max", "min", "avg"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(cfg) as session, EagerCapture(session):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    dump = opdump.load(str(tmp_path))
    stats = dump.statistics()
    ops = stats["op"].astype(str)
    masked = stats[ops.str.startswith("Default/") & ops.str.contains("masked_fill") & (stats["io"] == "output")]
    assert len(masked) == 1 and float(masked["max"].iloc[0]) == math.inf     # what statistic.csv says
    hits = watch(dump, [Condition.parse("too_large:max_gt=100")])
    assert not [h for h in hits if "masked_fill" in h.op], [(h.op, h.actual) for h in hits]
    assert all(math.isfinite(float(h.actual)) for h in hits), [(h.op, h.actual) for h in hits]
