"""watch conditions, and the CLI subcommands (in-process through argparse, and as
subprocesses once the main CLI exists)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis_fixtures import LINES, MS_SAMPLE, file_of, make_dump
from opdump.analysis.reader import open_dump
from opdump.analysis.watch import Condition, watch
from opdump.cli.main import build_parser

REPO = Path(__file__).resolve().parents[1]
needs_sample = pytest.mark.skipif(not MS_SAMPLE.is_dir(), reason=f"MindSpore sample dump not found at {MS_SAMPLE}")


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    root = tmp_path_factory.mktemp("w") / "d"
    make_dump(root, iterations=(0, 1, 2), overflow_at=2)
    # a weight that never changes, and a tensor that is all zero
    for it in (0, 1, 2):
        p = next((root / "rank_0" / "Net" / "0" / str(it)).glob("Parameter.fc1_bias.*"))
        np.save(p, np.full(16, 0.5, np.float32))
    z = file_of(root, "Default/Net/relu-op2", "output", 0, iteration=1)
    np.save(z, np.zeros((4, 16), np.float32))
    return root


def test_condition_parsing():
    c = Condition.parse("too_large:max_gt=100,abs_mean_gt=5")
    assert c.name == "too_large" and c.p == {"max_gt": 100.0, "abs_mean_gt": 5.0}
    assert Condition.parse("all_zero").p == {"zero_percentage_ge": 100.0}
    assert Condition.parse("weight_not_changed").name == "not_changed"
    with pytest.raises(ValueError, match="did you mean 'too_large'"):
        Condition.parse("too_larg")
    with pytest.raises(ValueError, match="unknown parameter"):
        Condition.parse("too_large:maxgt=1")
    with pytest.raises(ValueError, match="range_start"):
        Condition.parse("range:range_percentage_lt=5")


def test_watch_conditions(dump):
    d = open_dump(dump)
    hits = watch(d, ["overflow"], progress=False)
    assert hits and hits[0].op == "Default/Net/exp-op9" and hits[0].iteration == 2 and hits[0].io == "output"
    assert all("empty_like" not in h.op and "fill_" not in h.op for h in hits)
    big = watch(d, ["too_large:max_gt=1e30"], progress=False)
    assert big and all(h.param == "max_gt" and h.value > 1e30 for h in big)
    zero = watch(d, ["all_zero"], op=r"relu", progress=False)
    assert [(h.op, h.io, h.iteration) for h in zero] == [("Default/Net/relu-op2", "output", 1)]
    rng = watch(d, ["range:range_start=-1,range_end=1,range_percentage_lt=50"], op=r"^Default/Net/mul-op8$",
                io="output", progress=False)
    assert [h.iteration for h in rng] == [2]
    nc = watch(d, ["not_changed"], progress=False)
    # biases never move in the fixture's "training"; graph inputs are not watched by default
    assert {(h.op, h.iteration, h.previous_iteration) for h in nc} == {
        (f"Parameter.{b}", i, i - 1) for b in ("fc1_bias", "fc2_bias") for i in (1, 2)}
    big_change = watch(d, ["change_too_large:abs_update_ratio_mean_gt=0.015"], progress=False)
    assert {h.op for h in big_change} == {"Parameter.fc2_weight"}       # w2 moves 2%/step, w1 1%/step
    small = watch(d, ["too_small:abs_mean_lt=1e-3"], iterations=[1], op="relu-op2", progress=False)
    assert small and small[0].value == 0.0


def test_watch_from_statistics(tmp_path):
    make_dump(tmp_path / "s", iterations=(0, 1), overflow_at=1, saved_data="statistic",
              stats=["max", "min", "avg", "l2norm"])
    d = open_dump(tmp_path / "s")
    hits = watch(d, ["inf", "too_large:max_gt=1e30"], progress=False)
    assert hits[0].op == "Default/Net/exp-op9" and hits[0].iteration == 1


def _run(argv):
    a = build_parser().parse_args(argv)
    return a.func(a)


@needs_sample
def test_cli_ls_and_locate_on_mindspore_sample(capsys):
    assert _run(["ls", str(MS_SAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "ms_version=2.10.0" in out and "total: 180 tensor files" in out
    assert _run(["ls", str(MS_SAMPLE), "--ops"]) == 0
    assert "fc2-Dense/BiasAdd-op0" in capsys.readouterr().out
    assert _run(["ls", str(MS_SAMPLE), "--tensors", "--iteration", "1", "--limit", "5"]) == 0
    assert "more rows" in capsys.readouterr().out
    assert _run(["locate", str(MS_SAMPLE), "train.py:67"]) == 0
    out = capsys.readouterr().out
    assert "11 operator(s)" in out and "Gradients/Default" in out
    assert _run(["locate", str(MS_SAMPLE), "nosuch.py:3"]) == 1
    assert _run(["ls", "/nonexistent/dump"]) == 2


def test_cli_overflow_compare_watch(tmp_path, capsys):
    make_dump(tmp_path / "ovf", iterations=(0, 1), overflow_at=1)
    make_dump(tmp_path / "ref", iterations=(0, 1))
    make_dump(tmp_path / "fc1", iterations=(0, 1), weight_delta={"fc1.weight": 0.5})
    assert _run(["overflow", str(tmp_path / "ovf"), "-q"]) == 1
    out = capsys.readouterr().out
    assert "Default/Net/exp-op9" in out and f"model.py:{LINES['exp']}" in out and "iteration 1" in out
    assert _run(["overflow", str(tmp_path / "ref"), "-q"]) == 0
    capsys.readouterr()
    assert _run(["overflow", str(tmp_path / "ovf"), "--json", "-q"]) == 1
    js = json.loads(capsys.readouterr().out)
    assert js["origin"]["op"] == "Default/Net/exp-op9"
    csv, html = tmp_path / "c.csv", tmp_path / "c.html"
    assert _run(["compare", str(tmp_path / "fc1"), str(tmp_path / "ref"), "--csv", str(csv), "--html", str(html),
                 "-q"]) == 1
    out = capsys.readouterr().out
    assert "first divergence: Default/Net/fc1-Linear/t-op0" in out and csv.is_file() and html.is_file()
    assert _run(["compare", str(tmp_path / "ref"), str(tmp_path / "ref"), "--csv", str(csv), "-q"]) == 0
    capsys.readouterr()
    assert _run(["watch", str(tmp_path / "ovf"), "--cond", "nan", "--cond", "inf", "-q"]) == 1
    assert "exp-op9" in capsys.readouterr().out
    assert _run(["watch", str(tmp_path / "ref"), "--cond", "overflow", "-q"]) == 0
    assert _run(["watch", str(tmp_path / "ref"), "--cond", "bogus", "-q"]) == 2


@pytest.mark.skipif(not (REPO / "opdump" / "cli" / "main.py").is_file() and not (REPO / "opdump" / "__main__.py").is_file(),
                    reason="the main CLI (opdump/cli/main.py, python -m opdump) is not in this checkout yet")
def test_cli_as_subprocess(tmp_path):
    make_dump(tmp_path / "d", iterations=(0,), overflow_at=0)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "opdump", "ls", str(tmp_path / "d")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "total:" in r.stdout
    r = subprocess.run([sys.executable, "-m", "opdump", "overflow", str(tmp_path / "d"), "-q"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 1 and "exp-op9" in r.stdout


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


@pytest.mark.skipif(_chromium() is None, reason="headless Chromium is not installed (Debian package 'chromium'); "
                                                "the HTML report's render check needs it")
def test_html_report_renders_in_headless_chromium(tmp_path):
    make_dump(tmp_path / "ref", iterations=(0,))
    make_dump(tmp_path / "fc2", iterations=(0,), weight_delta={"fc2.weight": 0.4})
    from opdump.analysis.compare import compare
    r = compare(tmp_path / "fc2", tmp_path / "ref", progress=False)
    html = tmp_path / "r.html"
    r.to_html(html)
    # a script run after load reports what the browser laid out into the DOM
    probe = tmp_path / "probe.html"
    probe.write_text(html.read_text().replace("</body>", """<script>
window.addEventListener('load', function(){
 var s=document.getElementById('plot-cosine').getBBox ? document.querySelector('#plot-cosine polyline').getBBox() : null;
 var t=document.getElementById('compare-table').getBoundingClientRect();
 var res={plotw: s ? s.width : 0, ploth: s ? s.height : 0, tableh: t.height,
          rows: document.querySelectorAll('#compare-table tbody tr').length,
          marker: document.querySelectorAll('line.first-divergence').length};
 document.title='RESULT:'+JSON.stringify(res);});
</script></body>"""))
    out = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    import re
    m = re.search(r"<title>RESULT:(\{.*?\})</title>", out.stdout)
    assert m, out.stderr[-2000:]
    res = json.loads(m.group(1).replace("&quot;", '"'))
    assert res["plotw"] > 100 and res["ploth"] > 10
    assert res["rows"] == len(r.table) and res["tableh"] > 100 and res["marker"] == 2
