"""compare's parallel open (opdump/analysis/compare/open_pair.py) forks only a process with no
other Python thread, by design; a pytest process that has run other test files may hold threads
that libraries left behind (a pool nobody shut down), and whether it does depends on timing. So
the cases, in ``open_pair_cases.py``, run in a fresh pytest process of their own."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_open_pair_cases_in_a_fresh_process():
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "open_pair_cases.py")],
                       cwd=HERE.parent, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout and "error" not in r.stdout.lower(), r.stdout[-3000:]
