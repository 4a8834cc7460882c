"""``opdump compare A B --rank R`` of a rank a side does not hold: exit 2 with a line naming the
side, the rank and the ranks it holds, as the other analysis commands say it -- before, "A: ... holds
no dumped tensors or statistics", which is false (A holds them; rank R is what is missing)."""
import os
import subprocess
import sys

SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "mindspore_cpu_mlp")


def _compare(tmp_path, *args):
    # in tmp_path: compare writes its CSV table (opdump_compare.csv) into the current folder
    return subprocess.run([sys.executable, "-m", "opdump", "compare", SAMPLE, SAMPLE, "-q", *args],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))


def test_a_rank_neither_side_holds(tmp_path):
    out = _compare(tmp_path, "--rank", "9")
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "A: " in out.stderr and "no rank 9" in out.stderr and "its ranks: 0" in out.stderr, out.stderr
    assert "holds no dumped tensors" not in out.stderr, out.stderr


def test_a_rank_b_does_not_hold(tmp_path):
    out = _compare(tmp_path, "--rank", "0", "--rank-b", "4")
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "B: " in out.stderr and "no rank 4" in out.stderr, out.stderr


def test_the_rank_both_hold_is_compared(tmp_path):
    out = _compare(tmp_path, "--rank", "0")
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert os.path.isfile(os.path.join(str(tmp_path), "opdump_compare.csv"))
