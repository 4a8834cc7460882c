"""Real ``kill -9`` at random moments of a statistics-only training run (the writer at its
lowest priority): every file loads, no torn row, the rows of every finished iteration but
the last are on disk (the lag bound), the manifest is right about what it claims, and
``opdump ls`` reports the interrupted iteration (README, "Reliability")."""
import csv
import io
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import opdump
from conftest import write_config
from opdump.cli.main import main as opdump_main
from reliability_helpers import manifest_of, opdump_popen

KILLS = 4


def _read_rows(path: Path):
    """(header, complete rows); a final line without its newline (a kill inside the
    kernel's copy of a multi-page write) is not a row."""
    data = path.read_bytes()
    assert b"\x00" not in data
    complete = data[:data.rfind(b"\n") + 1]
    rows = list(csv.reader(io.StringIO(complete.decode("utf-8"), newline="")))
    header, body = rows[0], rows[1:]
    assert all(len(r) == len(header) for r in body), f"torn row in {path}"
    return header, body


def _kill_at(proc, step: int, delay: float) -> int:
    """Kill ``proc`` ``delay`` s after it printed STEP ``step``; the last step it printed."""
    last = -1
    while True:
        line = proc.stdout.readline()
        assert line, f"the run ended before step {step}: {proc.stderr.read()}"
        if line.startswith("STEP "):
            last = int(line.split()[1])
            if last >= step:
                break
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for line in proc.stdout.read().splitlines():      # printed before the kill, still in the pipe
        if line.startswith("STEP "):
            last = int(line.split()[1])
    return last


@pytest.mark.filterwarnings("ignore:.*marked incomplete in its manifest")
def test_kill_9_at_random_moments(tmp_path, capsys):
    seed = int(os.environ.get("OPDUMP_KILL_SEED", time.time_ns() % 100000))
    rng = random.Random(seed)
    runs = []
    for k in range(KILLS):                          # started together: their start-up overlaps
        d = tmp_path / f"run{k}"
        d.mkdir()
        cfg = write_config(d, common={"saved_data": "statistic", "statistic_category": ["max", "min", "l2norm"]},
                           e2e={"stat_calc_mode": "device"})
        runs.append((d / "dump", opdump_popen(cfg, "--steps", "100000", "--width", "64")))
    try:
        for root, proc in runs:
            step, delay = rng.randint(3, 25), rng.uniform(0, 0.02)
            last = _kill_at(proc, step, delay)
            _check_killed_dump(root, last, f"seed {seed}, step {step}, delay {delay:.4f}")
    finally:
        for _, proc in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # a stale temporary file (a kill between create and rename) is listed by `opdump ls`
    stale = runs[0][0] / "rank_0" / "Net" / "0" / "0" / ".opdump-tmp-999-1"
    stale.write_bytes(b"partial")
    capsys.readouterr()
    assert opdump_main(["ls", str(runs[0][0])]) == 0
    out = capsys.readouterr().out
    assert "INCOMPLETE (interrupted in iteration" in out and "stale temporary file" in out, out


def _check_killed_dump(root: Path, last: int, how: str) -> None:
    per_iteration = Counter()
    total = 0
    for path in root.rglob("statistic.csv"):
        header, rows = _read_rows(path)
        per_iteration[int(path.parent.name)] += len(rows)
        total += len(rows)
    full = per_iteration[0]
    assert full > 0, how
    # the lag bound: STEP `last` printed means iteration `last` ended, so every iteration
    # before it has all its rows on disk
    assert [per_iteration[i] for i in range(last)] == [full] * last, (how, last, per_iteration)
    manifest = manifest_of(root)
    assert manifest["complete"] is False, how
    assert manifest["on_disk_through"] >= last - 1, (how, last, manifest)
    assert full * (manifest["on_disk_through"] + 1) <= manifest["rows_written"] <= total, (how, manifest, total)
    d = opdump.load(str(root))            # the reader takes the killed dump
    stats = d.statistics()
    assert len(stats) == total, how
