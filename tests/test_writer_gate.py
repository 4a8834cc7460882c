"""The writer's gate (opdump/write/writer.py, opdump/recorder/held.py): a closed gate starts
no job; nothing that waits on the writer can wait for ever behind it (the byte budget, a
flush, a failed writer); a gated hold window ends with its held files written, so that
nothing is left to keep or copy, and the files are the values at record time.

Real writer threads, real files, a real compiled graph; the gate is off by default
(``Holds.gate``), so the tests turn it on for their own ``Holds`` / session only."""
import os
import threading
import time
import warnings

import numpy as np
import torch
from torch import nn

import opdump
from opdump.recorder.held import Holds
from opdump.write.buffers import HostBuffers
from opdump.write.dtypes import to_numpy
from opdump.write.writer import BackgroundWriter
from dumpfiles import tensor_files
from conftest import write_config

_LONG = 30.0        # seconds a thread may take before the test calls it stuck (never reached when correct)


class _Layout:
    """What Holds.write needs of the session's layout: the open dump tree (None: plain paths)."""
    tree = None


def _in_thread(fn) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(_LONG)
    return t


def test_a_paused_writer_starts_no_job_until_resumed():
    writer = BackgroundWriter(budget_bytes=1 << 20, threads=2)
    ran = threading.Event()
    writer.pause()
    assert writer.paused
    writer.submit(ran.set)
    assert not ran.wait(0.3)               # two idle threads, one job: none starts it
    writer.resume()
    assert ran.wait(_LONG) and not writer.paused
    writer.close()


def test_reserve_beyond_the_budget_opens_a_closed_gate_and_closes_it_again():
    writer = BackgroundWriter(budget_bytes=100, threads=1)
    done = []
    writer.pause()
    writer.submit(lambda: done.append(1), 80)           # held: 80 of 100, queued behind the gate
    t = _in_thread(lambda: writer.submit(lambda: done.append(2), 40))   # 120 > 100: must wait for job 1
    assert not t.is_alive(), "reserve waited for ever behind the closed gate"
    assert done[:1] == [1]
    assert writer.paused                   # closed again once the budget had room: job 2 waits
    writer.flush()                         # a flush opens it for good
    assert done == [1, 2] and not writer.paused and writer.held == 0
    writer.close()


def test_flush_and_close_open_the_gate():
    writer = BackgroundWriter(budget_bytes=1 << 20, threads=2)
    done = []
    writer.pause()
    writer.submit(lambda: done.append(1))
    t = _in_thread(writer.flush)
    assert not t.is_alive() and done == [1]
    writer.pause()
    writer.submit(lambda: done.append(2))
    t = _in_thread(writer.close)
    assert not t.is_alive() and done == [1, 2]


def _gated_holds(writer) -> Holds:
    holds = Holds(HostBuffers(1 << 20), writer)
    holds.gate = True
    return holds


def _write_job(holds, entry, path):
    def job():
        try:
            holds.write(_Layout(), path, entry, to_numpy)
        finally:
            entry.release()
    return job


def test_a_gated_window_ends_with_its_held_files_written(tmp_path):
    writer = BackgroundWriter(budget_bytes=1 << 20, threads=2)
    holds = _gated_holds(writer)
    t = torch.arange(100_000, dtype=torch.float32)
    expected = t.clone()
    window = holds.open()
    entry = holds.hold(window, t)          # the first held tensor closes the gate
    assert writer.paused
    path = str(tmp_path / "x.npy")
    writer.submit(_write_job(holds, entry, path), t.nbytes)
    assert not os.path.exists(path)        # nothing written between the graph's operators
    holds.close(window)                    # opens the gate, waits for the window's files
    t.mul_(0)                              # t is referenced here: without the wait it would be copied
    assert os.path.exists(path) and np.array_equal(np.load(path), expected.numpy())
    assert holds.secured == 0 and holds.kept == 0 and holds.dropped == 0
    assert not writer.paused
    writer.close()


def test_a_failed_writer_ends_the_wait_and_the_entry_is_secured(tmp_path):
    writer = BackgroundWriter(budget_bytes=1 << 20, threads=1)
    holds = _gated_holds(writer)
    t = torch.arange(1000, dtype=torch.float32)
    window = holds.open()
    entry = holds.hold(window, t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        writer.fail(OSError(28, "No space left on device"))     # dumping stops: queued jobs never run
    writer.submit(_write_job(holds, entry, str(tmp_path / "x.npy")), t.nbytes)
    th = _in_thread(lambda: holds.close(window))
    assert not th.is_alive(), "the window's end waited for a job a failed writer never runs"
    assert holds.secured == 1                # still referenced: the rule of the window's end applies
    assert os.listdir(tmp_path) == []
    entry.release()
    writer.close()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_a_gated_graph_call_writes_the_values_at_record_time(tmp_path):
    torch._dynamo.reset()
    cfg = write_config(tmp_path, common={"iteration": "0"}, extra={"opdump_settings": {"writer_threads": 2}})
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(32, 64)
    x_at_record = x.clone()
    with opdump.Session(cfg) as session:
        holds = session.recorder.holds
        holds.gate = True
        out = torch.compile(model, backend=session.backend("eager"))(x)
        out_at_record = out.detach().clone()
        with torch.no_grad():               # right after the call, before any flush: user code writes
            out.mul_(0)
            x.add_(1)
            for p in model.parameters():
                p.mul_(0)
        counts = dict(held=holds.held, secured=holds.secured, kept=holds.kept, dropped=holds.dropped)
    torch._dynamo.reset()
    assert counts["held"] > 0 and counts["secured"] == counts["kept"] == counts["dropped"] == 0, counts
    files = tensor_files(str(tmp_path / "dump"))
    outputs = [f for f in files if f.io == "output" and f.op_type == "addmm"]
    assert any(np.array_equal(f.load(), out_at_record.numpy()) for f in outputs)
    assert not any(f.load().shape == tuple(out.shape) and not f.load().any() for f in outputs)
    inputs = [f for f in files if f.op_type == "Parameter" and f.op_name == "inputs0"]
    assert inputs and np.array_equal(inputs[0].load(), x_at_record.numpy())
    params = [f for f in files if f.op_type == "Parameter" and f.op_name != "inputs0"]
    assert params and all(f.load().any() for f in params)      # the weights before p.mul_(0)


def test_thread_cpu_counts_the_writer_threads_cpu():
    writer = BackgroundWriter(budget_bytes=1 << 20, threads=1)
    before = writer.thread_cpu()

    def burn():
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.05:
            pass
    writer.submit(burn)
    writer.flush()
    assert writer.thread_cpu() - before >= 0.05
    writer.close()
