"""The iteration end's writer jobs handed over as one (``BackgroundWriter.defer``; README
"Reliability", "Debug dumps").

* the writer: jobs queued while deferring run as one job, in submission order, after the
  ``before`` callback; a job holding bytes, a wait on a deferred job, ``result()``, ``flush``
  and ``close`` hand the deferred jobs over first (nothing waits for a job never handed over);
* the session: an every-step eager overflow watch makes one writer hand-over and one
  manifest write per iteration (two of each before), the manifest names the iteration
  before any of its end-of-iteration files can run, and every file of every iteration is on
  disk after close;
* ``manifest.json`` is one page of JSON, one key per line.
"""
import json
import threading

import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.write import manifest as MF
from opdump.write.writer import BackgroundWriter
from conftest import write_config


def _pool_counter(writer):
    """How many jobs reach the writer threads (each one a wake-up)."""
    count = [0]
    real = writer._pool.submit

    def counted(*a, **kw):
        count[0] += 1
        return real(*a, **kw)
    writer._pool.submit = counted
    return count


def test_deferred_jobs_run_as_one_job_in_order_after_before():
    w = BackgroundWriter(threads=2)
    handed = _pool_counter(w)
    seen = []
    w.defer(before=lambda: seen.append("before"))
    assert w.deferring and w.defers_here()
    futs = [w.submit(lambda i=i: seen.append(i) or i) for i in range(5)]
    assert seen == [] and handed[0] == 0              # nothing ran, nothing handed over
    w.release_deferred()
    assert not w.deferring
    assert [f.result(timeout=10) for f in futs] == list(range(5))
    assert seen == ["before", 0, 1, 2, 3, 4]
    assert handed[0] == 1 and w.batches == 1
    w.close()


def test_a_job_with_bytes_hands_the_deferred_ones_over_first():
    w = BackgroundWriter(threads=1)
    seen = []
    w.defer(before=lambda: seen.append("before"))
    w.submit(lambda: seen.append("small"))
    w.submit(lambda: seen.append("bytes"), 100)
    w.submit(lambda: seen.append("after"))            # deferral ended: queued at once
    w.flush()
    assert seen == ["before", "small", "bytes", "after"]
    w.close()


def test_waiting_on_a_deferred_job_never_hangs():
    w = BackgroundWriter(threads=1)
    w.defer()
    fut = w.submit(lambda: 7)
    assert fut.result(timeout=10) == 7                 # result() handed it over
    w.defer()
    fut = w.submit(lambda: 8)
    w.wait([fut])
    assert fut.done() and fut.result() == 8
    w.defer()
    fut = w.submit(lambda: 9)
    w.flush()
    assert fut.done()
    w.defer()
    fut = w.submit(lambda: 10)
    assert w.close() == [] and fut.result() == 10


def test_a_failing_deferred_job_is_reported_and_the_rest_dropped():
    w = BackgroundWriter(threads=1)
    ran = []
    w.defer()

    def boom():
        raise OSError(28, "No space left on device")
    futs = [w.submit(boom), w.submit(lambda: ran.append(1))]
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.flush()
    assert w.failed and ran == [] and all(f.done() for f in futs)
    assert any("dumping stops" in str(c.message) for c in caught)
    w.close()


def test_other_threads_jobs_are_not_deferred():
    w = BackgroundWriter(threads=1)
    w.defer()
    out = []
    t = threading.Thread(target=lambda: out.append(w.submit(lambda: 3)))
    t.start()
    t.join()
    assert out[0].result(timeout=10) == 3 and w.deferring     # ran though this thread defers
    w.release_deferred()
    w.close()


def _watch(tmp_path, steps, on_end=None):
    """A tiny model under the every-step eager overflow watch, nothing overflowing."""
    torch.manual_seed(0)
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    writes = []
    real = MF.Manifest.write

    def counted(self, doc):
        writes.append(doc["iteration_in_progress"])
        return real(self, doc)
    MF.Manifest.write = counted
    try:
        with opdump.Session(cfg) as s, EagerCapture(s):
            handed = _pool_counter(s.writer)
            if on_end is not None:
                s.on_iteration_end(lambda it: on_end(s, it))
            for _ in range(steps):
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
                s.writer.flush()
            per_step = (handed[0], len(writes))
    finally:
        MF.Manifest.write = real
    return tmp_path / "dump" / "rank_0", per_step, writes


def test_every_step_watch_one_hand_over_and_one_manifest_write_per_iteration(tmp_path):
    steps = 6
    rank, (handed, written), writes = _watch(tmp_path, steps)
    # the first iteration writes the listing and the metadata on the training thread, then one
    # manifest write and one job (execution order + overflow.json/.csv) per iteration
    assert handed <= steps, handed                    # was 2 per iteration
    assert written <= steps + 2, writes               # was 2 per iteration
    for it in range(steps):
        folder = rank / "Net" / "0" / str(it)
        assert sorted(p.name for p in folder.iterdir()) == [
            "ms_execution_order_graph_0.csv", "overflow.csv", "overflow.json"], it
        assert json.loads((folder / "overflow.json").read_text())["overflows"] == []
    manifest = json.loads((rank / ".dump_metadata" / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["dumped_iterations"] == f"0-{steps - 1}"


def test_the_manifest_names_the_iteration_before_its_end_files_are_written(tmp_path):
    seen = []

    def on_end(session, it):
        # queued at the end like the watch's summaries: when it runs, the manifest on disk
        # must already name this iteration
        path = rank_of(session) / ".dump_metadata" / "manifest.json"
        session.writer.submit(lambda: seen.append((it, json.loads(path.read_text()))))

    def rank_of(session):
        import pathlib
        return pathlib.Path(session.dump_root) / "rank_0"
    _watch(tmp_path, 4, on_end)
    # (the iteration the last optimizer step opens runs nothing and ends at close)
    got = [(it, m["iteration_in_progress"], m["dumped_iterations"]) for it, m in seen if it < 4]
    assert len(got) >= 4, seen
    for it, in_progress, dumped in got:         # the manifest written at its end names the next one
        assert in_progress == it + 1 and dumped.endswith(str(it)), got


def test_manifest_page_is_json_one_key_per_line():
    doc = {"complete": False, "tool": "opdump", "errors": ["a: b", "c"], "error_count": 2}
    data = MF.encode(doc)
    assert len(data) == MF.PAGE and json.loads(data) == doc
    lines = data.decode().rstrip().splitlines()
    assert lines[0] == '{"complete": false,' and lines[1] == ' "tool": "opdump",', lines


def test_deferred_jobs_of_a_writer_that_failed_meanwhile_are_dropped_not_hung():
    w = BackgroundWriter(threads=1)
    w.defer()
    futs = [w.submit(lambda: 1), w.submit(lambda: 2)]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w.fail(OSError(5, "I/O error"))
    w.release_deferred()
    assert [f.result(timeout=10) for f in futs] == [None, None]
    w.close()


_KILLED_WATCH = """
import os, signal, sys, torch, torch.nn as nn
import opdump
from opdump.capture.eager import EagerCapture
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with opdump.Session(sys.argv[1]) as s, EagerCapture(s):
    for step in range(8):
        loss = model(torch.randn(4, 8)).sum()
        if step == 4:
            os.kill(os.getpid(), signal.SIGKILL)      # mid-iteration 4
        loss.backward(); opt.step(); opt.zero_grad()
"""


def test_watch_killed_later_leaves_every_file_of_the_finished_iterations(tmp_path):
    """kill -9 in iteration 4 of an every-step eager watch: iterations 0-2 (the lag bound) have
    their execution order and both summaries, whole; the manifest says so."""
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text(_KILLED_WATCH)
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    r = subprocess.run([sys.executable, str(script), cfg], capture_output=True, text=True, timeout=240)
    assert r.returncode == -9, r.stderr[-2000:]
    rank = tmp_path / "dump" / "rank_0"
    manifest = json.loads((rank / ".dump_metadata" / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["on_disk_through"] >= 2, manifest
    # iteration 4 wrote nothing yet, but the run was in it (it was 3 before: the manifest written
    # at an iteration's end named the iteration that ended)
    assert manifest["iteration_in_progress"] == 4 and manifest["dumped_iterations"] == "0-3", manifest
    for it in range(manifest["on_disk_through"] + 1):
        folder = rank / "Net" / "0" / str(it)
        assert sorted(p.name for p in folder.iterdir()) == [
            "ms_execution_order_graph_0.csv", "overflow.csv", "overflow.json"], it
        assert json.loads((folder / "overflow.json").read_text())["iteration"] == it
