"""bench/run.py --from-json rebuilds BENCHMARKS.md from a run's saved results, measuring nothing.

``bench/testdata/quick_results.json`` is what ``bench/run.py --quick --json`` saved on this
project's 2-core machine; its report, written by that run, equalled the --from-json rebuild
byte for byte."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "testdata", "quick_results.json")


def _rebuild(out):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "--from-json", RESULTS,
                           "--out", str(out)], capture_output=True, text=True, timeout=120)


def test_from_json_writes_the_report_without_measuring(tmp_path):
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    for out in (a, b):
        proc = _rebuild(out)
        assert proc.returncode == 0, proc.stderr
    text = a.read_text()
    assert text == b.read_text()                        # a pure function of the results
    assert text.startswith("# opdump benchmarks")
    assert "bench/run.py --quick" in text
    for model in ("AlexNet", "graph statistic device", "eager statistic device", "graph tensor"):
        assert model in text, model
    assert sorted(tmp_path.iterdir()) == sorted([a, b])        # nothing else written


def test_the_report_stage_imports_neither_torch_nor_opdump():
    code = ("import sys; sys.path.insert(0, %r); sys.argv = ['run.py']\n"
            "import bench.run\nprint('torch' in sys.modules, 'opdump' in sys.modules)") % ROOT
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["False", "False"], proc.stderr


def test_a_full_rewrite_keeps_sections_other_benchmarks_maintain(tmp_path):
    """bench/compare_bench.py --update owns a marked block of BENCHMARKS.md; run.py's
    rewrite of the whole file keeps it (and replaces everything else)."""
    out = tmp_path / "BENCHMARKS.md"
    block = "<!-- compare_bench: begin -->\n## compare\n| a | 1 |\n<!-- compare_bench: end -->\n"
    out.write_text("# stale report\n\n" + block + "\ntrailing stale text\n")
    proc = _rebuild(out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.startswith("# opdump benchmarks") and "stale" not in text
    assert text.count(block) == 1 and text.endswith(block)
