"""The analysis commands start without torch (issue 25: ``opdump compare`` paid ~1.7 s of
CPU importing torch through ``opdump/__init__`` although it never uses it), and the
package's lazy attributes keep ``opdump.session(...)``, ``import opdump.session`` and
``opdump.Session`` working as before.

Real dumps (eager capture of a tiny MLP, tensors and statistics), real subprocesses: each
command runs in a fresh interpreter that reports, at its end, whether torch was imported.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_RUN_CLI = """
import json, sys
{prelude}
from opdump.cli.main import main
try:
    rc = main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
sys.stdout.flush()
print("\\nSTARTUP " + json.dumps({"rc": rc, "torch": "torch" in sys.modules}), file=sys.stderr)
"""


def _dump(path, saved: str, scale: float) -> str:
    import opdump
    from opdump.capture.eager import EagerCapture
    from opdump.config.iteration import IterationSpec
    from opdump.config.model import DumpConfig
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    with torch.no_grad():
        m[0].weight.mul_(scale)
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    cfg = DumpConfig(path=str(path), iteration=IterationSpec(ranges=((0, 1),)), saved_data=saved)
    with opdump.Session(cfg) as s, EagerCapture(s):
        for _ in range(2):
            opt.zero_grad()
            F.cross_entropy(m(x), y).backward()
            opt.step()
    return str(path)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("startup")
    return {"ta": _dump(root / "ta", "tensor", 1.0), "tb": _dump(root / "tb", "tensor", 1.01),
            "sa": _dump(root / "sa", "statistic", 1.0), "sb": _dump(root / "sb", "statistic", 1.01),
            "root": str(root)}


def _cli(args, cwd, prelude=""):
    code = _RUN_CLI.replace("{prelude}", prelude)
    p = subprocess.run([sys.executable, "-c", code] + list(args), cwd=cwd, capture_output=True, text=True)
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("STARTUP ")]
    assert line, p.stderr[-2000:]
    return json.loads(line[-1][len("STARTUP "):]), p


@pytest.mark.parametrize("args", [
    ["compare", "--help"],
    ["compare", "{ta}", "{tb}", "--csv", "{root}/t.csv", "-q"],
    ["compare", "{sa}", "{sb}", "--json"],
    ["ls", "{ta}"],
    ["overflow", "{ta}"],
    ["locate", "{ta}", "--help"],
])
def test_analysis_commands_do_not_import_torch(dumps, args):
    args = [a.format(**dumps) for a in args]
    res, p = _cli(args, dumps["root"])
    assert res["rc"] in (0, 1), p.stderr[-2000:]          # compare exits 1 when A and B differ
    assert res["torch"] is False, f"opdump {' '.join(args)} imported torch"
    if args[0] == "compare" and "--csv" in args:
        assert os.path.getsize(os.path.join(dumps["root"], "t.csv")) > 0
    if "--json" in args:
        summary = json.loads(p.stdout[:p.stdout.rindex("}") + 1])
        assert summary["counts"], summary


def test_the_check_sees_torch_when_a_command_imports_it(dumps):
    """The check can fail: the same compare, after a real use of the session API (which
    imports torch), reports torch."""
    res, p = _cli(["compare", dumps["ta"], dumps["tb"], "-q"], dumps["root"], prelude="import opdump; opdump.Session")
    assert res["torch"] is True, p.stderr[-2000:]


_API = """
import sys, types
import opdump
assert "torch" not in sys.modules
assert isinstance(opdump.session, types.FunctionType)
import opdump.session
import opdump.session as s
from opdump.session import Session, current_session
from opdump import session
assert session is opdump.session is s and isinstance(s, types.FunctionType), (session, s)
assert opdump.Session is Session and opdump.current_session is current_session
assert isinstance(sys.modules["opdump.session"], types.ModuleType)
from opdump import ConfigError, DumpConfig, load_config, set_dump
import opdump.config
assert opdump.ConfigError is opdump.config.ConfigError
ses = opdump.session(sys.argv[1])
assert type(ses) is Session, type(ses)
with ses:
    assert current_session(create=False) is ses
assert {"Session", "session", "set_dump", "ConfigError"} <= set(dir(opdump))
try:
    opdump.no_such_name
except AttributeError:
    pass
else:
    raise AssertionError("opdump.no_such_name resolved")
print("OK")
"""


def test_session_function_and_module_after_lazy_import(tmp_path, config_file):
    """``opdump.session`` stays the function whichever of the names below is imported first;
    the lazy names resolve to the same objects as their modules'."""
    cfg = config_file()
    p = subprocess.run([sys.executable, "-c", _API, cfg], cwd=str(tmp_path), capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stderr[-3000:]


def test_star_import_gives_every_public_name(tmp_path):
    code = "from opdump import *\nprint(Session.__name__, session.__name__, ConfigError.__name__, set_dump.__name__)"
    p = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["Session", "session", "ConfigError", "set_dump"]


def test_session_from_env_opens_without_importing_opdump_session_first(tmp_path, config_file):
    """A capture front end asking ``opdump.active`` for the current session opens one from
    ``$OPDUMP_CONFIG`` although nothing imported ``opdump/session.py`` yet (the package used
    to import it eagerly, which registered the factory)."""
    code = ("import sys, opdump.active as a\nassert 'opdump.session' not in sys.modules\n"
            "s = a.current()\nprint(type(s).__name__, s is a.current())")
    env = dict(os.environ, OPDUMP_CONFIG=config_file())
    p = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["Session", "True"], p.stdout + p.stderr[-2000:]
