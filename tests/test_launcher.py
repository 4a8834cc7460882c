"""The launcher as a real subprocess: env var / --config / python -m, bad configs
fail before step 0 with the field named, a crashing script still flushes."""
import json
import os
import subprocess
import sys

import pytest

from dumpfiles import tensor_files
from conftest import write_config

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "train_alexnet.py")
OPDUMP = [sys.executable, "-m", "opdump"]


def run(args, env_extra=None, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("OPDUMP_CONFIG", "MINDSPORE_DUMP_CONFIG")}
    env.update(env_extra or {})
    return subprocess.run(OPDUMP + args, capture_output=True, text=True, env=env, timeout=timeout)


def test_env_var_launch_dumps_selected_iterations(tmp_path):
    cfg = write_config(tmp_path, common={"iteration": "0|2", "net_name": "AlexNet"})
    proc = run(["run", SCRIPT, "--steps", "3"], {"OPDUMP_CONFIG": cfg})
    assert proc.returncode == 0, proc.stderr
    assert "step 2" in proc.stdout
    files = tensor_files(str(tmp_path / "dump"))
    # eager capture starts first (graph 0: the eager optimizer step); the compiled model's
    # forward and backward graphs are 1 and 2
    assert {(f.net, f.graph, f.iteration) for f in files} == {("AlexNet", g, i) for g in (0, 1, 2) for i in (0, 2)}
    eager_types = {f.op_type for f in files if f.graph == 0}
    assert "add_" in eager_types or "_foreach_add_" in eager_types, eager_types   # SGD's update
    # eager sees what runs outside the compiled graphs: the loss's backward and the optimizer
    assert all(f.op_name.startswith(("Default_optimizer-SGD", "Gradients_Default"))
               for f in files if f.graph == 0 and f.op_type != "Parameter")
    assert {f.op_type for f in files if f.graph == 1} >= {"convolution", "addmm"}


def test_config_option_alias_env_and_exception_flush(tmp_path):
    cfg = write_config(tmp_path, common={"iteration": "0"})
    proc = run(["run", "--config", cfg, SCRIPT, "--steps", "2", "--fail-at", "0"])
    assert proc.returncode == 1 and "deliberate failure" in proc.stderr
    files = tensor_files(str(tmp_path / "dump"))
    assert any(f.op_type == "convolution_backward" for f in files), "captured data is flushed despite the crash"
    manifest = json.load(open(tmp_path / "dump" / "rank_0" / ".dump_metadata" / "manifest.json"))
    assert manifest["complete"] is True
    assert not [p for p in (tmp_path / "dump").rglob(".opdump-tmp-*")]


def test_mindspore_env_alias_and_diagnostic_path(tmp_path):
    cfg = write_config(tmp_path, common={"iteration": "0", "path": ""})
    proc = run(["run", SCRIPT, "--steps", "1"],
               {"MINDSPORE_DUMP_CONFIG": cfg, "MS_DIAGNOSTIC_DATA_PATH": str(tmp_path / "diag")})
    assert proc.returncode == 0, proc.stderr
    assert tensor_files(str(tmp_path / "diag" / "debug_dump"))


BAD = [
    ({"common": {"iteration": "5-3"}}, ["common_dump_settings.iteration", "5-3", "after"]),
    ({"common": {"input_output": 3}}, ["input_output", "3"]),
    ({"common": {"saved_data": "tensors"}}, ["saved_data", "tensors", "statistic"]),
    ({"common": {"path": "relative/dir"}}, ["path", "relative/dir", "absolute"]),
    ({"common": {"iteraton": "0"}}, ["iteraton", "iteration"]),
    ({"common": {"dump_mode": 1, "kernels": []}}, ["kernels"]),
    ({"common": {"kernels": ["name-regex(([)"]}}, ["kernels", "name-regex"]),
    ({"common": {"statistic_category": ["max", "mean"]}, "e2e": {}}, ["statistic_category", "mean"]),
]


@pytest.mark.parametrize("change,needles", BAD)
def test_bad_config_fails_before_step_zero(tmp_path, change, needles):
    cfg = write_config(tmp_path, common=change.get("common"), e2e=change.get("e2e"))
    proc = run(["run", "--config", cfg, SCRIPT, "--steps", "1"], timeout=120)
    assert proc.returncode == 2
    assert "step 0" not in proc.stdout
    assert "Traceback" not in proc.stderr
    assert cfg in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


def test_invalid_json_names_line_and_column(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"common_dump_settings": {\n  "path": "/tmp/x",\n  "iteration": 0,,\n}}')
    proc = run(["run", "--config", str(bad), SCRIPT], timeout=120)
    assert proc.returncode == 2 and "line 3" in proc.stderr and "Traceback" not in proc.stderr


def test_missing_config_is_a_clear_error(tmp_path):
    proc = run(["run", SCRIPT], timeout=120)
    assert proc.returncode == 2 and "OPDUMP_CONFIG" in proc.stderr


def test_run_help_names_the_command():
    proc = run(["run", "--help"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: opdump run [-h]"), proc.stdout
    assert "run run" not in proc.stdout


def test_run_restores_torch_compile_argv_and_path(tmp_path):
    """``opdump run`` routes the script's torch.compile through opdump, and gives the
    original back (with sys.argv and sys.path) when the script ends."""
    cfg = write_config(tmp_path, common={"iteration": "0"})
    script = tmp_path / "tiny.py"
    script.write_text(
        "import torch\n"
        "model = torch.compile(torch.nn.Linear(4, 2), backend='eager')\n"
        "model(torch.ones(3, 4)).sum().backward()\n")
    driver = (
        "import sys, torch\n"
        "from opdump.cli.run import main_run\n"
        "original, argv, path = torch.compile, list(sys.argv), list(sys.path)\n"
        f"rc = main_run(['--config', {cfg!r}, '--no-eager', {str(script)!r}, '--flag'])\n"
        "assert rc == 0, rc\n"
        "assert torch.compile is original, torch.compile\n"
        "assert sys.argv == argv and sys.path == path, (sys.argv, sys.path)\n"
        "print('restored')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OPDUMP_CONFIG", "MINDSPORE_DUMP_CONFIG")}
    proc = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "restored" in proc.stdout, proc.stderr
    assert {f.op_type for f in tensor_files(str(tmp_path / "dump"))} >= {"addmm"}, "the compile was routed"
