"""The compare table's CSV with half of its rows made by a forked child
(opdump/analysis/compare/csv_halves.py).  The child is forked only by a process with no
other Python thread, and a pytest process that ran other files may hold some (see
test_compare_open_pair.py), so the cases, in ``csv_halves_cases.py``, run in a fresh
pytest process of their own."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_csv_halves_cases_in_a_fresh_process():
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "csv_halves_cases.py")],
                       cwd=HERE.parent, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout and "error" not in r.stdout.lower(), r.stdout[-3000:]
