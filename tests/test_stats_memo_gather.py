"""The native StatsMemo's own gathering of a tensor with gaps (stats_memo.cpp ``gather``).

Why: the memo read such a tensor through ``t.contiguous()``, a torch call that went through the
dispatcher and every RecordFunction callback (the native eager observer's included) for each of
them; it now copies the elements itself, in the order ``contiguous()`` gives, so the values stay
the kernel's on the contiguous copy bit for bit.  Checked here against that copy for every element
size the memo takes, for broadcast (stride 0) and size-1 dimensions, for a copy large enough that
the GIL is released while it is gathered, and by a profiler that sees no torch call.
"""
import threading

import pytest
import torch

from opdump.stats import native

memo_or_none = native.new_stats_memo()
pytestmark = pytest.mark.skipif(memo_or_none is None, reason="the native module could not be built here "
                                                              "(no C++ compiler, or OPDUMP_CPU_KERNEL=0)")
fused = native.fused_stats()


def copy_values(t):
    """What the memo gave before: the kernel on ``t.contiguous()``, and the count."""
    return fused(t.contiguous()) + (t.numel(),)


def gapped(dtype):
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        base = torch.rand(6, 5, 40, generator=g) > 0.5
    elif dtype.is_floating_point:
        base = (torch.randn(6, 5, 40, generator=g) * 100).to(dtype)
    else:
        base = torch.randint(-100 if dtype not in (torch.uint8, torch.uint16, torch.uint32) else 0, 100,
                             (6, 5, 40), generator=g).to(dtype)
    # rows of 1..32 elements (every fixed row size the gather copies with vector moves, 8..128
    # bytes, for each element size), strided rows, broadcast and size-1 dimensions
    return [base[..., 1:1 + w] for w in (1, 2, 4, 8, 16, 32)] + [
        base[..., 3:17], base[:, ::2, 1::3], base.transpose(0, 2)[::3], base[2:3, :, 5:6],
        base[0, 0, :1].expand(9, 4), base[:, 1:2, :].expand(6, 3, 40), base[..., 7]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.bool, torch.uint8,
                                   torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32])
def test_gathered_values_are_the_contiguous_copys(dtype):
    for i, view in enumerate(gapped(dtype)):
        assert not view.is_contiguous() or view.numel() == 1, i
        m = native.new_stats_memo()
        assert m.stats(view, 0) == copy_values(view), (dtype, i)
        assert m.stats(view, 1) == 0     # found again: same memory, same geometry


def test_host_memo_gathers_alike():
    host = native.host_stats()
    x = torch.randn(64, 33, 17)[:, 5:30:2, 1:]
    assert native.new_stats_memo(host=True).stats(x, 0) == host(x.contiguous()) + (x.numel(),)


def test_a_large_gather_lets_another_thread_run_and_stays_exact():
    x = torch.randn(512, 1024)[:, :700]         # ~1.4 MiB gathered: the GIL is released meanwhile
    ticks = []
    stop = threading.Event()

    def other():
        while not stop.is_set():
            ticks.append(1)

    th = threading.Thread(target=other)
    th.start()
    try:
        got = [native.new_stats_memo().stats(x, 0) for _ in range(20)]
    finally:
        stop.set()
        th.join()
    assert all(v == copy_values(x) for v in got)


def test_a_gap_costs_no_torch_call():
    """Nothing reaches the dispatcher (no operator a profiler or a RecordFunction callback sees)."""
    x = torch.randn(32, 48, requires_grad=True)
    views = [x[:, :10], x.t()[::2], x[:, 1:2].expand(32, 5)]
    with torch.no_grad():
        views = [v.detach() for v in views]
    m = native.new_stats_memo()
    with torch.autograd.profiler.profile() as prof:
        for i, v in enumerate(views):
            m.stats(v, i)
    assert [e.name for e in prof.function_events] == []
