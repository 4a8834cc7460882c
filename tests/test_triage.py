"""``opdump triage``: real subprocess runs of tests/scripts/train_nan.py (a NaN injected by the
``scale`` module's ``mul`` at a known step and line) through the CLI and the launcher.

Run 1 (statistics) must find that origin, run 2 must dump tensors of only the suspects
(the ``mul`` and the producer of its input, ``relu``) at only that iteration, and the report
must name the origin, its line, the files and the commands; a reference run with a
different bias is found at its first differing operator; a script whose data changes
between runs is refused (not reproduced) instead of reported.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "scripts" / "train_nan.py"
LINES = SCRIPT.read_text().splitlines()
NAN_LINE = next(i for i, l in enumerate(LINES, 1) if "NAN-LINE" in l and "return" in l)
BIAS_LINE = next(i for i, l in enumerate(LINES, 1) if "a.bias)" in l)
MUL = "Default/Net/scale-Scale/mul-op4"      # t, addmm, add, relu, mul (relu's saved output: no operator)
RELU = "Default/Net/relu-op3"


def _triage(folder, *args, script_args=(), cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OPDUMP_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "opdump", "triage", "--out", str(folder), "-q", *args,
                           "--", str(SCRIPT), *script_args], capture_output=True, text=True, env=env,
                          cwd=str(cwd or folder.parent), timeout=300)


@pytest.fixture(scope="session")
def nan_triage(tmp_path_factory):
    base = tmp_path_factory.mktemp("triage")
    folder = base / "tri"
    r = _triage(folder, script_args=("--steps", "3", "--nan-step", "1"))
    return folder, r


def test_triage_names_the_origin_and_its_line(nan_triage):
    folder, r = nan_triage
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    first = out.splitlines()[0]
    assert MUL in first and "non-tensor argument" in first, out
    assert f"source: {SCRIPT}:{NAN_LINE}" in out
    assert "iteration 1" in out
    assert "run 2 reproduces run 1" in out
    doc = json.loads((folder / "triage.json").read_text())
    assert doc["origin"]["op"] == MUL and doc["origin"]["iteration"] == 1
    assert doc["reproduced"] is True and doc["exit_code"] == 1
    assert doc["suspects"]["operators"] == [MUL, RELU] and doc["suspects"]["iterations"] == [1]


def test_run2_holds_tensors_of_the_suspects_only(nan_triage):
    folder, r = nan_triage
    cfg = json.loads((folder / "run2.json").read_text())["common_dump_settings"]
    assert cfg["dump_mode"] == 1 and cfg["iteration"] == "1" and cfg["saved_data"] == "full"
    assert cfg["kernels"] == [MUL, RELU]
    files = sorted((folder / "run2").rglob("*.npy"))
    names = {(f.parent.name, f.name.split(".")[1], f.name.split(".")[-5] + "." + f.name.split(".")[-4])
             for f in files}
    assert names == {("1", "Default_Net_scale-Scale_mul-op4", "input.0"),
                     ("1", "Default_Net_scale-Scale_mul-op4", "output.0"),
                     ("1", "Default_Net_relu-op3", "input.0"), ("1", "Default_Net_relu-op3", "output.0")}
    # the report lists exactly those files, and the NaN is in the mul's output, not in its input
    doc = json.loads((folder / "triage.json").read_text())
    listed = sorted(p for ps in doc["files"].values() for p in ps)
    assert listed == sorted(str(f) for f in files)
    import numpy as np
    out = [f for f in files if "mul-op4" in f.name and ".output." in f.name][0]
    inp = [f for f in files if "mul-op4" in f.name and ".input." in f.name][0]
    assert np.isnan(np.load(out)).all() and np.isfinite(np.load(inp)).all()
    # run 1 wrote statistics only, of every iteration
    assert not list((folder / "run1").rglob("*.npy"))
    assert sorted(p.parent.name for p in (folder / "run1").rglob("statistic.csv")) == ["0", "1", "2"]


def test_report_gives_each_runs_command(nan_triage):
    """Each run's command, as printed, is the launcher with that run's config and the script's
    own arguments (split by a shell it gives back exactly the argv triage ran)."""
    import shlex
    folder, r = nan_triage
    doc = json.loads((folder / "triage.json").read_text())
    cmds = [run["command"] for run in doc["runs"]]
    assert len(cmds) == 2
    for name, cmd in zip(("run1", "run2"), cmds):
        assert cmd in r.stdout
        cd, rest = cmd.split(" && ", 1)
        assert shlex.split(cd) == ["cd", str(folder.parent)]
        assert shlex.split(rest) == [sys.executable, "-m", "opdump", "run", "--config", str(folder / f"{name}.json"),
                                     str(SCRIPT), "--steps", "3", "--nan-step", "1"]
        assert json.loads((folder / f"{name}.json").read_text())["common_dump_settings"]["path"] == str(folder / name)
    assert "STEP 2 loss nan" in (folder / "run1.log").read_text()      # the script's output is kept


def test_triage_html_marks_the_origin(nan_triage):
    folder, _ = nan_triage
    html = (folder / "triage.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in html
    assert html.count('<svg class="plot"') == 3          # NaN/Inf per iteration, magnitude, l2norm
    assert html.count('class="origin"') == 3              # the origin marked on each
    assert len(re.findall(r'class="bar-nonfinite"', html)) == 2     # iterations 1 and 2 hold NaN
    assert f"{SCRIPT}:{NAN_LINE}" in html and MUL in html
    import xml.dom.minidom
    for svg in re.findall(r"<svg .*?</svg>", html, re.S):
        xml.dom.minidom.parseString(svg)                  # each plot is well-formed SVG


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


def _env():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OPDUMP_CONFIG", None)
    return env


@pytest.fixture(scope="session")
def analysis_pages(nan_triage):
    """``opdump overflow --html`` and ``opdump watch --html`` of run 1's dump."""
    folder, _ = nan_triage
    pages = {}
    for name, args in (("overflow", ["overflow", str(folder / "run1")]),
                       ("watch", ["watch", str(folder / "run1"), "--cond", "nan"])):
        page = folder.parent / f"{name}.html"
        r = subprocess.run([sys.executable, "-m", "opdump", *args, "-q", "--html", str(page)], capture_output=True,
                           text=True, env=_env(), timeout=300)
        assert r.returncode == 1 and f"report: {page}" in r.stderr, r.stdout + r.stderr
        pages[name] = (page, r.stdout)
    return pages


def test_overflow_and_watch_html(analysis_pages):
    page, out = analysis_pages["overflow"]
    html = page.read_text()
    assert "<script" not in html and html.count('class="origin"') == 3 and MUL in html
    assert f"{SCRIPT}:{NAN_LINE}" in html and "Next affected operators" in html
    page, out = analysis_pages["watch"]
    html = page.read_text()
    hits = int(re.search(r"(\d+) hit\(s\)", out).group(1))
    assert hits > 10 and html.count("<tr><td>nan</td>") == hits
    assert "first hit: " + MUL in html and html.count('class="pt pt-mark"') > 10


def test_progress_bar_on_a_terminal_only(nan_triage):
    """Long analyses draw a tqdm bar on a terminal (a pseudo-terminal here) and none when piped."""
    import pty
    folder, _ = nan_triage
    cmd = [sys.executable, "-m", "opdump", "overflow", str(folder / "run1")]
    piped = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert "overflow scan" not in piped.stderr + piped.stdout
    import fcntl
    import struct
    import termios
    master, slave = pty.openpty()
    # a terminal of 40x120 (a new pseudo-terminal is 0 columns wide, where tqdm draws nothing)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    try:
        p = subprocess.run(cmd, stdin=slave, stdout=subprocess.PIPE, stderr=slave, env=_env(), timeout=300)
        os.close(slave)
        slave = None
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert p.returncode == 1
    assert b"overflow scan" in seen and b"tensor" in seen


def _render(page: Path, tmp_path: Path, plots: int) -> dict:
    """Load ``page`` in headless Chromium; what it laid out, and every error it raised."""
    probe = tmp_path / ("probe_" + page.name)
    errors_hook = ("<script>window.__errors=[];window.addEventListener('error',function(e){"
                   "window.__errors.push(String(e.message||e.type))},true);"
                   "var ce=console.error;console.error=function(){window.__errors.push('console.error');"
                   "ce.apply(console,arguments)};</script>")
    text = page.read_text().replace("<head>", "<head>" + errors_hook, 1)
    probe.write_text(text.replace("</body>", """<script>
window.addEventListener('load', function(){
 var boxes=[].map.call(document.querySelectorAll('svg.plot'), function(s){var b=s.getBoundingClientRect();
   return [b.width, b.height];});
 var bars=document.querySelectorAll('rect.bar-nonfinite').length;
 var line=document.querySelector('#plot-magnitude polyline.series');
 var lb=line ? line.getBBox() : {width:0,height:0};
 var o=document.querySelector('#plot-magnitude line.origin').getBBox();
 document.title='RESULT:'+JSON.stringify({boxes:boxes, bars:bars, linew:lb.width, lineh:lb.height,
   originh:o.height, errors:window.__errors});});
</script></body>"""))
    out = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--enable-logging=stderr", "--v=0", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)
    m = re.search(r"<title>RESULT:(\{.*?\})</title>", out.stdout)
    assert m, out.stderr[-2000:]
    assert not re.search(r"CONSOLE.*(Uncaught|Error)", out.stderr), out.stderr[-2000:]
    res = json.loads(m.group(1).replace("&quot;", '"'))
    assert res["errors"] == []
    assert len(res["boxes"]) == plots and all(w > 300 and h > 100 for w, h in res["boxes"])
    return res


@pytest.mark.skipif(_chromium() is None, reason="headless Chromium is not installed (Debian package 'chromium', "
                                                "installed by scripts/setup.sh when run as root)")
def test_reports_render_in_headless_chromium(nan_triage, analysis_pages, tmp_path):
    folder, _ = nan_triage
    for page in (folder / "triage.html", analysis_pages["overflow"][0], analysis_pages["watch"][0]):
        res = _render(page, tmp_path, 3)
        assert res["bars"] == 2 and res["linew"] > 100 and res["lineh"] > 10 and res["originh"] > 100, page


def test_triage_against_a_reference_names_the_first_difference(nan_triage, tmp_path):
    ref = nan_triage[0] / "run1"           # the same program without the bias, as statistics
    r = _triage(tmp_path / "tri", "--reference", str(ref), script_args=("--steps", "3", "--bias", "0.5"))
    assert r.returncode == 1, r.stdout + r.stderr
    head = r.stdout.splitlines()
    assert head[0] == "first difference from the reference: Default/Net/add-op2", r.stdout
    assert f"source: {SCRIPT}:{BIAS_LINE}" in r.stdout and "iteration 0" in head[1]
    assert "computes differently" in r.stdout and "run 2 reproduces run 1" in r.stdout
    doc = json.loads((tmp_path / "tri" / "run2.json").read_text())["common_dump_settings"]
    assert doc["iteration"] == "0" and doc["kernels"][0] == "Default/Net/add-op2"
    assert {f.parent.name for f in (tmp_path / "tri" / "run2").rglob("*.npy")} == {"0"}


def test_nondeterministic_script_is_not_reported(tmp_path):
    r = _triage(tmp_path / "tri", script_args=("--steps", "2", "--nan-step", "1", "--random"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.startswith("NOT REPORTED: run 2 does NOT reproduce run 1"), r.stdout
    assert "torch.use_deterministic_algorithms(True)" in r.stdout
    assert "files (run 2)" not in r.stdout and "origin:" not in r.stdout
    doc = json.loads((tmp_path / "tri" / "triage.json").read_text())
    assert doc["reproduced"] is False and doc["reproduction"]["mismatches"]
    html = (tmp_path / "tri" / "triage.html").read_text()
    assert "Not reported" in html and ".npy" not in html        # run 2's files are not offered as the answer


def test_bad_config_stops_before_any_run(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"common_dump_settings": {"path": "/x", "iteraton": "0"}}))
    r = _triage(tmp_path / "tri", "--config", str(bad), script_args=("--steps", "1"))
    assert r.returncode == 2 and "iteraton" in r.stderr and "unknown field" in r.stderr
    assert not (tmp_path / "tri" / "run1").exists()


def test_a_script_that_dumps_nothing_is_an_error(tmp_path):
    """A script that fails before its first step is not "no NaN found": exit 2 with its log's end."""
    script = tmp_path / "broken.py"
    script.write_text("import torch\nraise SystemExit('cannot open the data set')\n")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "opdump", "triage", "--out", str(tmp_path / "tri"), "-q", "--",
                        str(script)], capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "run1 left nothing to analyse" in r.stderr and "script exit status 1" in r.stderr
    assert "cannot open the data set" in r.stderr and "No NaN" not in r.stdout


def test_watch_suspects_and_producers_from_a_real_dump(nan_triage):
    """--cond picks the first hits' operators; the listing gives each operator's producers."""
    from opdump.analysis.reader import open_dump
    from opdump.analysis.triage_producers import input_producers
    from opdump.analysis.triage_suspects import from_watch
    d = open_dump(nan_triage[0] / "run1")
    p = input_producers(d, MUL)
    assert p.ops == [RELU] and p.parameters == []
    p = input_producers(d, "Default/Net/fc1-Linear/addmm-op1")
    assert p.ops == ["Default/Net/fc1-Linear/t-op0"] and p.parameters == ["fc1.bias"]
    s = from_watch(d, ["nan"], max_suspects=2, progress=False)
    assert s.origin.op == MUL and s.origin.iteration == 1 and s.origin.source == f"{SCRIPT}:{NAN_LINE}"
    assert s.ops[:2] == [MUL, RELU] and len(s.ops) == 3 and s.iterations == [1]


def test_producers_in_a_graph_mode_listing():
    """Graph-mode listings name arguments by FX node (``%relu``), eager ones by index (``%3``)."""
    from opdump.analysis.triage_producers import _parse_ir
    text = """subgraph @graph_3() {
  %0(t) = t.default(%primals_2)
      : full_name_with_scope: (Default/Net/fc1-Linear/t-op0)
  %1(addmm) = addmm.default(%primals_3, %primals_1, %t)
      : full_name_with_scope: (Default/Net/fc1-Linear/addmm-op1)
  %3(relu) = relu.default(%addmm)
      : full_name_with_scope: (Default/Net/relu-op3)
  %5(mul) = mul.Tensor(%relu, nan) {other: nan}
      : full_name_with_scope: (Default/Net/scale-Scale/mul-op5)
  %6(mul_1) = mul.Tensor(%3, %para2_fc1.weight)
      : full_name_with_scope: (Default/Net/mul-op6)
}
"""
    p = _parse_ir(text)
    assert p["Default/Net/scale-Scale/mul-op5"].ops == ["Default/Net/relu-op3"]
    assert p["Default/Net/fc1-Linear/addmm-op1"].ops == ["Default/Net/fc1-Linear/t-op0"]
    assert p["Default/Net/fc1-Linear/addmm-op1"].parameters == []        # primals_N: graph inputs, not named
    assert p["Default/Net/mul-op6"].ops == ["Default/Net/relu-op3"] and p["Default/Net/mul-op6"].parameters == [
        "fc1.weight"]


def test_configs_from_a_users_config(tmp_path):
    """--config: the user's settings are kept, its path replaced, --iterations applied; run 2 adds
    the counts the reproduction check reads; another dialect is refused before any run."""
    from opdump.analysis.triage_config import run1_config, run2_config, write_config
    from opdump.config import ConfigError
    user = tmp_path / "mine.json"
    user.write_text(json.dumps({
        "common_dump_settings": {"path": "/elsewhere/dump", "net_name": "Llama", "iteration": "0|5",
                                 "saved_data": "statistic", "statistic_category": ["max", "l2norm"]},
        "e2e_dump_settings": {"enable": True, "stat_calc_mode": "host"}}))
    one = run1_config(str(tmp_path / "tri" / "run1"), str(user), "95-105")
    c = one["common_dump_settings"]
    assert c["path"] == str(tmp_path / "tri" / "run1") and c["iteration"] == "95-105" and c["net_name"] == "Llama"
    assert c["statistic_category"] == ["max", "l2norm"] and one["e2e_dump_settings"]["stat_calc_mode"] == "host"
    two = run2_config(one, str(tmp_path / "tri" / "run2"), ["Default/Net/relu-op3", "Parameter.fc1_weight"], [101, 99])
    c2 = two["common_dump_settings"]
    assert c2["dump_mode"] == 1 and c2["iteration"] == "99|101" and c2["saved_data"] == "full"
    assert c2["kernels"] == ["Default/Net/relu-op3", "Parameter.fc1_weight"]
    assert c2["statistic_category"][:2] == ["max", "l2norm"] and "nan count" in c2["statistic_category"]
    assert c["statistic_category"] == ["max", "l2norm"]          # run 1's config untouched
    (tmp_path / "tri").mkdir()
    write_config(two, str(tmp_path / "tri" / "run2.json"))       # valid for opdump's own loader
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"dump": {"dump_path": "/x", "dump_mode": "all"}}))
    with pytest.raises(ConfigError, match="common_dump_settings"):
        run1_config(str(tmp_path / "t2"), str(acl))
