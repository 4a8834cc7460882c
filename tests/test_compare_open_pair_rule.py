"""The parallel open's "is a CPU idle" rule (compare/open_pair.py): processes running now are
read from /proc/loadavg, so that a user's own compares run back to back (which lift the
one-minute load average on an idle machine) still read B in a child, while other work
running now keeps it serial."""
import subprocess
import sys
import time

from opdump.analysis.compare import open_pair


def test_busy_processes_are_counted_as_running():
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        time.sleep(0.5)
        seen = max(open_pair._others_running() for _ in range(20))
    finally:
        for p in spin:
            p.kill()
            p.wait()
    assert 3 <= seen < 1 << 30          # three spinning children are runnable at every instant


def test_the_count_excludes_this_process():
    assert 0 <= open_pair._others_running() < 1 << 30
