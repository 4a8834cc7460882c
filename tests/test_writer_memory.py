"""The writer's byte budget and the recycled host buffers: bounded memory, exact files."""
import os
import sys
import threading

import numpy as np
import pytest
import torch
from torch import nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.write.buffers import HostBuffers
from opdump.write.writer import BackgroundWriter
from dumpfiles import tensor_files
from conftest import write_config


def test_host_copy_is_recycled_only_after_its_last_release():
    pool = HostBuffers(1 << 30)
    t = torch.randn(256, 1024)
    copy = pool.copy_of(t)
    assert copy.acquire()                  # a second user (e.g. the next operator's input file)
    copy.release()
    assert pool.free_bytes == 0 and torch.equal(copy.tensor, t)
    copy.release()
    assert pool.free_bytes == t.numel() * 4 and copy.tensor is None and not copy.acquire()
    again = pool.copy_of(t * 2)            # reuses the buffer, holds the new values
    assert pool.free_bytes == 0 and torch.equal(again.tensor, t * 2)


def test_pool_never_keeps_more_than_its_cap():
    pool = HostBuffers(3 << 20)
    copies = [pool.copy_of(torch.zeros(n, 1024)) for n in (256, 512, 768, 1024)]   # 1, 2, 3, 4 MiB
    for c in copies:
        c.release()
    assert pool.free_bytes <= 3 << 20


def test_writer_blocks_at_its_budget_and_never_exceeds_it():
    writer = BackgroundWriter(budget_bytes=10, threads=2)
    gate = threading.Event()
    held = []
    for _ in range(3):
        writer.reserve(4)
        held.append(writer._held)
        writer.submit(gate.wait, 4, reserved=True)
        if len(held) == 2:
            threading.Timer(0.2, gate.set).start()    # the third reserve must wait for this
    writer.close()
    assert max(held) <= 10 and writer.errors == []


def test_tiny_budget_large_tensors_exact(tmp_path):
    cfg = write_config(tmp_path, common={"iteration": "0"}, extra={"opdump_settings": {"writer_queue_mb": 1}})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512))
    x = torch.randn(256, 512)              # activations of 0.5-1 MiB, weights of 2 MiB: beyond the budget
    with opdump.Session(cfg) as session:
        torch.compile(model, backend=session.backend("eager"))(x).sum().backward()
    files = tensor_files(str(tmp_path / "dump"))
    relu = [f for f in files if f.op_type == "relu" and f.io == "output"][0].load()
    np.testing.assert_array_equal(relu, torch.relu(model[0](x)).detach().numpy())
    weight = [f for f in files if f.op_name == "0_weight"][0].load()
    np.testing.assert_array_equal(weight, model[0].weight.detach().numpy())
    assert session.recorder.buffers.free_bytes == 0      # nothing kept once the session closed


def test_closed_pool_keeps_nothing():
    """A closed session's recorder must not hold recycled buffers (compiled graphs keep it alive)."""
    pool = HostBuffers(1 << 30)
    copies = [pool.copy_of(torch.ones(1 << 18)) for _ in range(3)]
    for c in copies:
        c.release()
    assert pool.free_bytes == 3 << 20
    pool.close()
    assert pool.free_bytes == 0
    c = pool.copy_of(torch.ones(1 << 18))
    c.release()
    assert pool.free_bytes == 0


def _nice_of_thread(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[16])          # field 19 of proc(5), counted after the ")" of the name


def _writer_nices(writer):
    try:
        tids = [writer.submit(threading.get_native_id).result() for _ in range(4)]
        nices = {tid: _nice_of_thread(tid) for tid in set(tids)}
    finally:
        writer.close()
    assert threading.get_native_id() not in tids
    return set(nices.values())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_statistics_only_writer_runs_at_the_lowest_priority_tensor_writer_does_not(tmp_path):
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert _writer_nices(BackgroundWriter(budget_bytes=1 << 20, threads=2, low_priority=True)) == {19}
    assert _writer_nices(BackgroundWriter(budget_bytes=1 << 20, threads=2)) == {before}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    # low priority only for statistics computed as tensors are recorded (device mode, and host mode
    # without md5: opdump/stats/host_batch.py): files and md5 hashing must keep up with the step
    for saved, mode, nice in (("statistic", "device", 19), ("statistic", "host", 19),
                              ("tensor", "device", before), ("full", "device", before)):
        with opdump.Session(write_config(tmp_path, {"saved_data": saved}, e2e={"stat_calc_mode": mode})) as s:
            assert _writer_nices(s.writer) == {nice}, (saved, mode)
    md5 = write_config(tmp_path, {"saved_data": "statistic", "statistic_category": ["max", "md5"]},
                       e2e={"stat_calc_mode": "device"})
    with pytest.warns(UserWarning, match="md5"), opdump.Session(md5) as s:      # md5 is computed on the host
        assert _writer_nices(s.writer) == {before}


def test_statistic_rows_count_against_the_writer_budget(tmp_path):
    """A statistics-only dump holds the training thread back when the (low-priority) writer
    falls behind: its rows are reckoned in the byte budget, released once written."""
    cfg = write_config(tmp_path, {"saved_data": "statistic"}, e2e={"stat_calc_mode": "device"})
    seen = []
    with opdump.Session(cfg) as s:
        original = s.writer.submit

        def spy(fn, nbytes=0, **kw):
            seen.append(nbytes)
            return original(fn, nbytes, **kw)
        s.writer.submit = spy
        with EagerCapture(s):
            nn.Linear(4, 3)(torch.randn(2, 4))
        s.writer.flush()
        assert s.writer.held == 0
    assert any(n > 0 for n in seen)


def test_a_failing_job_warns_once_and_nothing_raises_or_runs_after():
    """A write error is reported once; queued and later jobs are dropped (never raising into
    the caller), their reserved bytes given back, the mark/wait lag bound still returns."""
    writer = BackgroundWriter(budget_bytes=1 << 20, threads=1)
    ran = []
    gate = threading.Event()

    def fail():
        gate.wait()
        raise OSError(28, "No space left on device", "/x/y.npy")
    with pytest.warns(RuntimeWarning, match=r"dumping stops.*No space left on device: '/x/y.npy'") as caught:
        first = writer.submit(fail, 100)
        queued = writer.submit(lambda: ran.append("queued"), 100)
        gate.set()
        writer.wait(writer.mark())
        writer.reserve(50)
        late = writer.submit(lambda: ran.append("late"), 50, reserved=True)
        writer.fail(OSError("second"))
    assert len([w for w in caught if "dumping stops" in str(w.message)]) == 1
    assert first.result() is None and queued.result() is None and late.result() is None
    assert ran == [] and writer.held == 0 and writer.failed and len(writer.errors) == 2
    assert len(writer.close()) == 2
    assert writer.submit(lambda: ran.append("closed")).result() is None and ran == []
