"""The native statistics kernel (cpu_kernel.cpp) keeps the GIL for a small read and releases it
for a large one (over 256 KiB): giving it up for every small tensor handed it to the writer
thread between a graph's taps, and the training thread then waited for it.

How it is seen without timing: with a long switch interval, a thread waiting for the GIL runs
only when the main thread gives the GIL up; that thread counts each time it gets it (on a
loaded machine it is not always woken in time to take a given release: the bounds are loose)."""
import sys
import threading
import time

import pytest
import torch

from opdump.stats import native

pytestmark = pytest.mark.skipif(native.module() is None,
                                reason="the native module could not be built here (a warning says why)")

CALLS = 200


def _switches(read, tensor) -> int:
    """How often a waiting thread got the GIL while ``read(tensor)`` ran CALLS times."""
    count = [0]
    stop = threading.Event()
    started = threading.Event()

    def other():
        started.set()
        while not stop.is_set():
            count[0] += 1
            time.sleep(0)           # gives the GIL back at once

    old = sys.getswitchinterval()
    t = threading.Thread(target=other, daemon=True)
    t.start()
    started.wait()
    sys.setswitchinterval(30.0)     # the main thread keeps the GIL unless it gives it up
    try:
        before = count[0]
        for _ in range(CALLS):
            read(tensor)
        after = count[0]
    finally:
        sys.setswitchinterval(old)
        stop.set()
        t.join()
    return after - before


@pytest.mark.parametrize("name", ["fused_stats", "host_stats"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_small_reads_keep_the_gil_large_ones_release_it(name, dtype):
    read = getattr(native.module(), name)
    small = torch.arange(1000).to(dtype)                  # 4 KB
    large = torch.arange(1 << 20).to(dtype)               # 4 MiB: a release long enough to be taken
    assert read(small) is not None and read(large) is not None
    assert _switches(read, small) < CALLS // 20          # 0 or 1 here; one per call before
    assert _switches(read, large) >= 1                   # about one per call on a quiet machine
