"""How the ``opdump`` command leaves (opdump/cli/main.py ``program``): an analysis command exits
by ``os._exit`` once its output is flushed and the ``atexit`` handlers have run, with its own
status; a command that runs the user's code exits as Python does (the script's ``atexit``
handlers and status are the script's)."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "data", "mindspore_cpu_mlp")
OPDUMP = shutil.which("opdump", path=os.path.dirname(sys.executable))


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "opdump", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("command", [[sys.executable, "-m", "opdump"], [OPDUMP]])
def test_compare_output_and_status_survive_the_fast_exit(tmp_path, command):
    """Through a pipe (block-buffered stdout): every line is there, the CSV is whole, the
    status says "agree" (0) for a dump against itself."""
    csv = tmp_path / "t.csv"
    r = subprocess.run([*command, "compare", SAMPLE, SAMPLE, "--csv", str(csv)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith(f"table: {csv}"), r.stdout[-500:]
    lines = csv.read_text().splitlines()
    assert len(lines) > 10 and "verdict" in lines[0]


def test_an_analysis_error_keeps_its_status(tmp_path):
    r = _run("compare", tmp_path / "missing_a", tmp_path / "missing_b")
    assert r.returncode == 2 and "opdump" in r.stderr


def test_run_keeps_the_scripts_atexit_handlers_and_status(tmp_path):
    (tmp_path / "c.json").write_text('{"common_dump_settings": {"path": "%s", "iteration": "0", '
                                     '"saved_data": "statistic"}}' % (tmp_path / "dump"))
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""\
        import atexit, sys
        atexit.register(lambda: print("handler ran", flush=True))
        sys.exit(7)
        """))
    r = _run("run", "--config", tmp_path / "c.json", script, cwd=tmp_path)
    assert r.returncode == 7, r.stderr
    assert "handler ran" in r.stdout
