"""The writer's byte budget and the recycled host buffers: bounded memory, exact files."""
import threading

import numpy as np
import torch
from torch import nn

import opdump
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
