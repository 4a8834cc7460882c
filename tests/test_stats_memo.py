"""The native StatsMemo (stats_memo.cpp): values as the kernel's, reuse only when safe."""
import gc

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from opdump.stats import native

memo_or_none = native.new_stats_memo()
pytestmark = pytest.mark.skipif(memo_or_none is None, reason="the native module could not be built here "
                                                              "(no C++ compiler, or OPDUMP_CPU_KERNEL=0)")
fused = native.fused_stats()


def kernel_values(t):
    """The kernel on ``t`` itself when dense (it reads it in memory order), else on its copy."""
    direct = fused(t)
    return (direct if direct is not None else fused(t.contiguous())) + (t.numel(),)


def fresh():
    return native.new_stats_memo()


def test_values_are_the_kernels_for_dense_and_gapped_tensors():
    x = torch.randn(8, 6, 128, 96)
    for i, t in enumerate([x, x.permute(3, 1, 0, 2), x[..., 32:64], x[:, ::2], x[0, 0, :, :1].expand(128, 7)]):
        m = fresh()
        assert m.stats(t, i) == kernel_values(t), i
        assert m.reads == 1


def test_same_memory_is_found_only_while_alive_and_unwritten():
    m = fresh()
    x = torch.randn(300, 400)
    assert isinstance(m.stats(x, 7), tuple)
    assert m.stats(x.t(), 8) == 7 and m.stats(x.view(-1), 9) == 7 and m.stats(x.detach(), 9) == 7
    assert isinstance(m.stats(x[:299], 10), tuple)      # fewer elements: other memory
    x.mul_(2)                                            # the version counter moves
    assert isinstance(m.stats(x.t(), 11), tuple)
    assert m.reads == 3


def test_a_dead_tensor_is_never_matched():
    m = fresh()
    m.stats(torch.ones(1000) * 3, 0)                     # dies at once: its memory may be reused
    gc.collect()
    y = torch.ones(1000) * 5                             # (often at the same address)
    assert m.stats(y, 1) == (5.0, 5.0, 5000.0, 25000.0, 1000)


def test_inference_tensors_are_never_reused():
    m = fresh()
    with torch.inference_mode():
        x = torch.randn(100)
    assert isinstance(m.stats(x, 0), tuple) and isinstance(m.stats(x, 1), tuple)


def test_forget_settle_clear():
    m = fresh()
    x = torch.randn(500)
    m.stats(x, 0)
    m.forget(x)
    assert isinstance(m.stats(x, 1), tuple)
    x.add_(1.0)                                          # one write (the operator that produced it)
    m.settle(x)
    assert m.stats(x, 2) == 1
    x.add_(1.0)
    x.add_(1.0)                                          # two writes: not settled
    m.settle(x)
    assert isinstance(m.stats(x, 3), tuple)
    m.clear()
    assert len(m) == 0 and isinstance(m.stats(x, 4), tuple)


def test_left_to_torch():
    m = fresh()
    assert m.stats(torch.randn(10, dtype=torch.float64), 0) is None
    assert m.stats(torch.randn(10)._neg_view(), 0) is None
    assert m.stats(torch.empty(0), 0) is None
    assert m.stats(torch.randn(3000, 4000)[:, :3000], 0) is None     # gaps, over 32 MiB
    assert len(m) == 0


def test_gathering_records_no_autograd():
    m = fresh()
    w = torch.randn(64, 64, requires_grad=True)
    v = w[:, :10]
    m.stats(v, 0)
    assert v.grad_fn is not None and w.grad is None
    assert m.stats(v, 1) == 0


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data())
def test_any_view_matches_the_kernel_on_its_copy(shape, data):
    base = torch.randn(*[s * 2 for s in shape])
    index = tuple(slice(data.draw(st.integers(0, s - 1)), None, data.draw(st.integers(1, 2))) for s in shape)
    view = base[index]
    perm = data.draw(st.permutations(range(view.dim())))
    view = view.permute(*perm)
    assert fresh().stats(view, 0) == kernel_values(view)
