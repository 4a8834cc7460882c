"""Run a file of test cases in a pytest process of its own.

For cases that fork (compare's parallel open and CSV halves): a process forks only when it has
no other Python thread, and a pytest process that ran other test files may hold threads that
libraries left behind, depending on timing. A fresh process has none."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_cases_in_fresh_pytest(cases_file: str) -> None:
    """Run ``tests/<cases_file>`` in a new pytest process; assert every case passed."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / cases_file)],
                       cwd=HERE.parent, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout and "error" not in r.stdout.lower(), r.stdout[-3000:]
