"""Device statistics (run on CPU tensors here; on CUDA when available) against the host path."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from opdump.stats import CATEGORIES, DeviceStatsBatch, lookup, native
from opdump.stats.formatting import format_cell
from opdump.stats.host import reduce_tensor

DEVICE_CATS = [c for c in CATEGORIES if lookup(c).device_capable]
NAN, INF = float("nan"), float("inf")
#: documented agreement of device avg/l2norm with the host's float64 results
HIGH_REL = {"cpu": 1e-12, "cuda": 1e-5}

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

#: tests of the one-pass CPU kernel itself (with OPDUMP_CPU_KERNEL=0 the suite runs the torch path only)
needs_kernel = pytest.mark.skipif(not native.enabled_by_environment(),
                                  reason="OPDUMP_CPU_KERNEL=0: the CPU kernel is switched off on purpose")

TENSORS = {
    "f32_special": torch.tensor([1.0, -2.0, 0.0, -0.0, NAN, INF, -INF, 0.1]),
    "f32_plain": torch.linspace(-3, 5, 1001).reshape(7, 11, 13),
    "f64": torch.tensor([1e-300, -4.0, 2.5], dtype=torch.float64),
    "f16": (torch.arange(-50, 50, dtype=torch.float32) / 3).to(torch.float16),
    "f16_inf": torch.tensor([1.0, INF, -3.0]).to(torch.float16),
    "bf16": (torch.arange(-50, 50, dtype=torch.float32) / 3).to(torch.bfloat16).reshape(10, 10),
    "bf16_nan": torch.tensor([1.0, NAN]).to(torch.bfloat16),
    "only_inf": torch.tensor([INF, -INF]),
    "zero_dim": torch.tensor(-1.25),
    "int8": torch.tensor([-128, 0, 5, 127], dtype=torch.int8),
    "int64": torch.tensor([-(2**62), 0, 17, 2**62], dtype=torch.int64),
    "uint8": torch.tensor([0, 255, 3], dtype=torch.uint8),
    "uint16": torch.tensor([0, 65535, 3], dtype=torch.uint16),
    "bool": torch.tensor([True, False, True]),
    "empty": torch.empty(3, 0),
    "complex": torch.tensor([1 + 1j]),
}
if hasattr(torch, "float8_e4m3fn"):
    TENSORS["f8_e4m3fn"] = torch.tensor([1.0, -2.0, 0.0, 0.1, 448.0, NAN]).to(torch.float8_e4m3fn)
if hasattr(torch, "float8_e5m2"):
    TENSORS["f8_e5m2"] = torch.tensor([1.0, -2.0, INF, -INF, NAN]).to(torch.float8_e5m2)


def host_values(t):
    return reduce_tensor(t.cpu(), [lookup(c).host for c in DEVICE_CATS])


def agree(name, dev_value, host_value, rel):
    cat = name.rsplit("/", 1)[-1]
    if host_value is None:
        assert dev_value is None, name
        return
    assert dev_value is not None, name
    h, d = float(host_value), float(dev_value)
    if math.isnan(h):
        assert math.isnan(d), name
    elif cat in ("avg", "l2norm"):
        assert d == pytest.approx(h, rel=rel, abs=0), (name, d, h)
    else:
        assert d == h, (name, d, h)         # elements and counts: exact


@pytest.mark.parametrize("kernel", [True, False], ids=["cpu-kernel", "torch"])
@pytest.mark.parametrize("device", DEVICES)
def test_every_tensor_agrees_with_host(device, kernel):
    batch = DeviceStatsBatch(DEVICE_CATS, "high", cpu_kernel=kernel)
    names = sorted(TENSORS)
    handles = {n: batch.add(TENSORS[n].to(device)) for n in names}
    values = batch.collect()
    assert len(values) == len(names)
    for n in names:
        row = values[handles[n]]
        assert len(row) == len(DEVICE_CATS)
        for cat, d, h in zip(DEVICE_CATS, row, host_values(TENSORS[n])):
            agree(f"{n}/{cat}", d, h, HIGH_REL[device])
        if n not in ("complex",):
            # formatted cells are identical for everything but float round-off in avg/l2norm
            for cat, d, h in zip(DEVICE_CATS, row, host_values(TENSORS[n])):
                if cat not in ("avg", "l2norm"):
                    kind = lookup(cat).kind
                    assert format_cell(kind, d, TENSORS[n].dtype) == format_cell(kind, h, TENSORS[n].dtype)


def test_special_values_on_device():
    batch = DeviceStatsBatch(["max", "min", "finite max", "finite min", "nan count",
                              "positive inf count", "negative inf count", "zero count",
                              "negative zero count", "positive zero count", "count"])
    i = batch.add(TENSORS["f32_special"])
    j = batch.add(TENSORS["only_inf"])
    k = batch.add(TENSORS["empty"])
    c = batch.add(TENSORS["complex"])
    v = batch.collect()
    assert [x if not (isinstance(x, float) and math.isnan(x)) else "nan" for x in v[i]] == \
        ["nan", "nan", 1.0, -2.0, 1, 1, 1, 2, 2, 3, 8]
    assert v[j][:4] == [INF, -INF, None, None]
    assert v[k] == [None, None, None, None, 0, 0, 0, 0, 0, 0, 0]
    assert v[c] == [None] * 11


def test_integer_results_are_exact_int():
    batch = DeviceStatsBatch(["max", "min", "count"])
    i = batch.add(torch.tensor([2**62 + 1, -(2**62) - 3], dtype=torch.int64))
    b = batch.add(torch.tensor([True, False]))
    v = batch.collect()
    assert v[i] == [2**62 + 1, -(2**62) - 3, 2]
    assert all(type(x) is int for x in v[i])
    assert v[b] == [1, 0, 2]


def test_no_host_transfer_per_tensor(monkeypatch):
    """add() never syncs: no .cpu()/.item()/.tolist()/.numpy(); collect() does ONE .cpu() per device."""
    calls = {"cpu": 0}
    real_cpu = torch.Tensor.cpu

    def forbidden(*a, **k):
        raise AssertionError("host transfer during add()")

    batch = DeviceStatsBatch(DEVICE_CATS, "high")
    with monkeypatch.context() as m:
        for meth in ("cpu", "item", "tolist", "numpy"):
            m.setattr(torch.Tensor, meth, forbidden)
        for t in TENSORS.values():
            batch.add(t)

    def counting_cpu(self, *a, **k):
        calls["cpu"] += 1
        return real_cpu(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    values = batch.collect()
    assert calls["cpu"] == 1                       # all tensors are on the CPU device here
    assert len(values) == len(TENSORS)


@needs_kernel
def test_cpu_kernel_is_built_and_used_here():
    """This machine has g++ and ninja: the suite must exercise the kernel, not only the fallback."""
    fn = native.fused_stats()
    assert fn is not None
    x = torch.tensor([[1.0, -3.0], [float("inf"), 2.0]])
    assert fn(x) == (float("inf"), -3.0, float("inf"), float("inf"))
    assert fn(torch.tensor([1.0, float("nan")]))[0] != fn(torch.tensor([1.0, float("nan")]))[0]   # NaN
    assert fn(torch.tensor([2**62 + 1, -3])) == (2**62 + 1, -3, float(2**62 - 2), float(2**124 + 2**63 + 10))
    assert fn(torch.tensor([True, False, True])) == (1, 0, 2.0, 2.0)
    assert fn(torch.randn(4, dtype=torch.float64)) is None and fn(torch.empty(0)) is None
    assert fn(torch.randn(8, 8)[:, :3]) is None                         # gaps: left to torch


def _aten_ops_of_add(batch, t):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        batch.add(t)
    return [e.name for e in prof.events() if e.name.startswith("aten::")]


def test_few_kernels_per_tensor():
    """Default categories with torch reductions: aminmax + vector_norm only (the stacking
    happens once in collect)."""
    ops = _aten_ops_of_add(DeviceStatsBatch(["max", "min", "l2norm"], "high", cpu_kernel=False),
                           torch.randn(1000))
    top = {"aten::aminmax", "aten::linalg_vector_norm"}
    assert top <= set(ops)
    assert ops.count("aten::aminmax") == 1 and ops.count("aten::linalg_vector_norm") == 1
    assert "aten::stack" not in ops and "aten::_local_scalar_dense" not in ops


@needs_kernel
@pytest.mark.parametrize("make", [lambda: torch.randn(1000), lambda: torch.randn(300, 700).t(),
                                  lambda: torch.randn(2, 3, 40, 40).to(memory_format=torch.channels_last),
                                  lambda: torch.randn(5000).bfloat16()],
                         ids=["contiguous", "transposed", "channels_last", "bf16"])
def test_cpu_kernel_reads_dense_tensors_in_one_call(make):
    """The default categories of a dense CPU float tensor: no torch reduction, copy or upcast
    (only the views that find its memory block), values known at once."""
    t = make()
    batch = DeviceStatsBatch(["max", "min", "avg", "l2norm", "count"], "high")
    assert set(_aten_ops_of_add(batch, t)) <= {"aten::permute", "aten::as_strided"}
    [row] = batch.collect()
    x = t.double()
    assert row[:2] == [float(x.max()), float(x.min())]
    # float32 blocks above 16384 elements: the sum's error is relative to the sum of |x|
    assert row[2] == pytest.approx(float(x.mean()), rel=0, abs=1e-6 * float(x.abs().mean()))
    assert row[3] == pytest.approx(float(torch.linalg.vector_norm(x)), rel=1e-7)
    assert row[4] == t.numel()


@needs_kernel
@pytest.mark.parametrize("make", [lambda: torch.randn(64, 64)[:, :10], lambda: torch.randn(8, 1).expand(8, 9),
                                  lambda: torch.randn(8, 6, 128, 96)[..., 32:64]],
                         ids=["slice", "expand", "qkv-split"])
def test_cpu_kernel_gathers_tensors_with_gaps_once(make):
    """A slice or expand is gathered to contiguous memory by the memo itself (no torch call at
    all: stats_memo.cpp) and read by the kernel, with the values of a float64 reference; the
    same view added again is found without any copy."""
    t = make()
    batch = DeviceStatsBatch(["max", "min", "avg", "l2norm"], "high")
    ops = _aten_ops_of_add(batch, t)
    assert ops == []
    assert _aten_ops_of_add(batch, t[...]) == []    # another view of the same elements: nothing read
    assert batch.add(t[...]) == 0                    # ... its entry
    [row] = batch.collect()
    x = t.double()
    assert row[:2] == [float(x.max()), float(x.min())]
    assert row[2] == pytest.approx(float(x.mean()), rel=0, abs=1e-6 * float(x.abs().mean()))
    assert row[3] == pytest.approx(float(torch.linalg.vector_norm(x)), rel=1e-7)


@pytest.mark.parametrize("make", [lambda: torch.randn(100, dtype=torch.float64), lambda: torch.randn(10)._neg_view(),
                                  lambda: torch.randn(3000, 4000)[:, :3000]],
                         ids=["float64", "negative-bit", "slice-over-copy-limit"])
def test_cpu_kernel_leaves_other_tensors_to_torch(make):
    """Other dtypes, negative-bit views and slices over the 32 MiB copy limit (36 MB here) are
    reduced by torch, with the same values."""
    t = make()
    a = DeviceStatsBatch(["max", "min", "l2norm"], "high")
    b = DeviceStatsBatch(["max", "min", "l2norm"], "high", cpu_kernel=False)
    a.add(t)
    b.add(t)
    assert a.collect() == b.collect()


def test_clear_and_reuse():
    batch = DeviceStatsBatch(["max"])
    batch.add(torch.tensor([1.0]))
    batch.clear()
    assert batch.collect() == []
    assert batch.add(torch.tensor([5.0])) == 0
    assert batch.collect() == [[5.0]]


def test_precision_modes():
    big = torch.full((4,), 60000.0, dtype=torch.float16)
    hi, lo = DeviceStatsBatch(["l2norm", "avg"], "high"), DeviceStatsBatch(["l2norm", "avg"], "low")
    hi.add(big)
    lo.add(big)
    (l2_hi, avg_hi), = hi.collect()
    (l2_lo, avg_lo), = lo.collect()
    assert l2_hi == pytest.approx(120000.0, rel=1e-6) and avg_hi == 60000.0
    assert l2_lo == INF                            # documented fp16 overflow in "low"
    assert avg_lo == 60000.0
    # low mode on well-scaled data stays within the dtype's precision
    x = (torch.arange(1, 101, dtype=torch.float32) / 100).to(torch.bfloat16)
    lo.clear()
    lo.add(x)
    (l2, avg), = lo.collect()
    ref = float(torch.linalg.vector_norm(x.double()))
    assert l2 == pytest.approx(ref, rel=2**-7)


def test_rejects_host_only_category_and_bad_precision():
    with pytest.raises(ValueError, match="md5"):
        DeviceStatsBatch(["max", "md5"])
    with pytest.raises(ValueError):
        DeviceStatsBatch(["max"], "medium")


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(dtype=st.sampled_from([np.float32, np.float16]),
                  shape=hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=40),
                  elements=st.floats(allow_nan=True, allow_infinity=True, width=16)),
       st.booleans(), st.booleans())
def test_random_device_matches_host(arr, bf16, kernel):
    t = torch.from_numpy(arr.copy())
    if bf16:
        t = t.to(torch.bfloat16)
    batch = DeviceStatsBatch(DEVICE_CATS, "high", cpu_kernel=kernel)
    batch.add(t)
    [row] = batch.collect()
    for cat, d, h in zip(DEVICE_CATS, row, host_values(t)):
        agree(cat, d, h, 1e-12)


# --------------------------------------------------------------------------- memory order, reuse
LAYOUTS = {
    # name: a function of a contiguous (64, 96, 5) float32 base -> a strided tensor
    "transpose": lambda b: b.transpose(0, 1),
    "permute": lambda b: b.permute(2, 0, 1),
    "slice_gap": lambda b: b[:, 10:70:3],
    "expand": lambda b: b[:1].expand(7, 96, 5),
    "big_transpose": lambda b: b.reshape(-1).repeat(40).view(3200, 384).t(),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_strided_tensors_agree_with_host(layout):
    """Permuted tensors are reduced through a contiguous view of their memory, slices and
    expands through a copy: the values must still be the host's, category by category."""
    torch.manual_seed(0)
    base = torch.randn(64, 96, 5)
    base[3, 4, 1] = 1e4          # a unique max and min, wherever they land
    base[60, 2, 4] = -1e4
    t = LAYOUTS[layout](base)
    assert not t.is_contiguous()
    batch = DeviceStatsBatch(DEVICE_CATS, "high")
    batch.add(t)
    [values] = batch.collect()
    scale = float(t.abs().double().mean())
    for cat, d, h in zip(DEVICE_CATS, values, host_values(t.contiguous())):
        if cat == "avg":     # float32 rows (1e-7 of the mean magnitude; the mean itself is ~0)
            assert abs(d - h) <= 1e-6 * scale, (layout, d, h)
        else:
            agree(f"{layout}/{cat}", d, h, 1e-6)


def test_views_of_one_memory_block_share_statistics():
    x = torch.randn(400, 200)
    batch = DeviceStatsBatch(["max", "min", "l2norm"], "high")
    i = batch.add(x)
    assert batch.add(x.t()) == i                 # same elements, other order: reused
    assert batch.add(x.view(200, 400)) == i
    assert batch.add(x[:390]) != i               # fewer elements: computed
    j = batch.add(x.neg())                       # another tensor
    assert j != i
    x.mul_(2)                                    # in-place write: the version counter moves
    k = batch.add(x.t())
    assert k not in (i, j)
    values = batch.collect()
    assert values[k][0] == pytest.approx(2 * values[i][0])
    assert values[k][2] == pytest.approx(2 * values[i][2])


def test_tensors_with_gaps_share_statistics_only_through_identical_strides():
    x = torch.randn(600, 240)
    batch = DeviceStatsBatch(["max", "min", "l2norm"], "high")
    cols = x[:, ::2]                              # gaps: no memory block of its own
    i = batch.add(cols)
    assert batch.add(x[:, ::2]) == i              # the same elements through the same strides
    j = batch.add(x[:, 1::2])                     # the other half: other pointer
    k = batch.add(x[:, :120])                     # same pointer and shape, other strides
    l = batch.add(x[::2])                         # same pointer, other shape
    assert len({i, j, k, l}) == 4
    expected = {idx: [float(t.max()), float(t.min()), pytest.approx(float(t.double().norm()))]
                for idx, t in ((i, x[:, ::2]), (j, x[:, 1::2]), (k, x[:, :120]), (l, x[::2]))}
    cols.mul_(-1)                                 # written through another view: version moved
    m = batch.add(x[:, ::2])
    assert m != i
    values = batch.collect()
    for idx, want in expected.items():
        assert values[idx] == want
    assert values[m][0] == -values[i][1]
    slab = x[:, ::2]
    n_ = batch.add(slab)
    batch.forget(slab)                            # the eager front-end: "written in place"
    assert batch.add(slab) != n_


@needs_kernel
def test_small_cpu_tensors_are_looked_up_too():
    x = torch.randn(100, 50)
    batch = DeviceStatsBatch(["max", "min", "l2norm"], "high")
    i = batch.add(x)
    assert batch.add(x.t()) == i
    x.add_(1.0)
    assert batch.add(x.t()) != i


def test_reuse_needs_the_first_tensor_alive_and_not_forgotten():
    x = torch.randn(500, 140)
    batch = DeviceStatsBatch(["max"], "high")
    first = batch.add(x.view(-1))                # that view object dies right away
    assert batch.add(x) != first                 # its memory could have been reused: computed anew
    second = batch.add(x)
    batch.forget(x)                              # the eager front-end: "written in place"
    assert batch.add(x.t()) != second


@pytest.mark.parametrize("shape", [(5,), (70000,), (3, 70001)])
def test_bool_sum_of_squares_is_its_true_count(shape):
    torch.manual_seed(1)
    t = torch.rand(shape) < 0.3
    batch = DeviceStatsBatch(["avg", "l2norm"], "high")
    batch.add(t)
    [(avg, l2)] = batch.collect()
    n = int(t.sum())
    assert l2 == pytest.approx(math.sqrt(n), rel=1e-15)
    assert avg == pytest.approx(n / t.numel(), rel=1e-15)
