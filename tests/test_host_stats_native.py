"""Host-mode statistics of CPU tensors come from the native single pass (cpu_kernel.cpp
``host_stats``, through opdump/stats/host_batch.py) with no host copy, and equal the numpy
host path (opdump/stats/host.py, the semantics' definition) to the last printed digit."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from opdump.config.model import DumpConfig
from opdump.stats import StatsEngine, native
from opdump.stats.host import REDUCERS, host_statistics, reduce_tensor
from opdump.stats.host_batch import HostStatsBatch

pytestmark = pytest.mark.skipif(native.module() is None,
                                reason="the native module could not be built here (a warning says why)")

FUSED = ["max", "min", "avg", "l2norm", "count"]
ALL = FUSED + ["finite max", "finite min", "nan count", "zero count", "negative zero count",
               "positive zero count", "negative inf count", "positive inf count"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool]
NAN, INF = float("nan"), float("inf")


def engine_cells(t, cats):
    e = StatsEngine(categories=cats, stat_calc_mode="host")
    h = e.device_launch(t)
    return e.row_cells(e.device_collect()[h], e.host_cells(t) if e.needs_host_copy else None)


def make(n, dtype, seed, specials=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 10 ** (torch.rand(n, generator=g, dtype=torch.float64) * 8 - 4)
    for pos, v in specials:
        if n:
            x[pos % n] = v
    if dtype is torch.bool:
        return x > 0
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return x.clamp(info.min, info.max).to(dtype)
    return x.to(dtype)


SIZES = [0, 1, 15, 16, 17, 1000, 16384, 65536, 65537, 3 * 65536 + 19]
SPECIALS = [(), ((3, NAN),), ((-1, INF),), ((0, -INF), (5, INF)), ((65536, NAN),), ((70000, INF),)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_engine_rows_equal_the_numpy_host_path(dtype):
    for i, n in enumerate(SIZES):
        for j, sp in enumerate(SPECIALS if dtype.is_floating_point else SPECIALS[:1]):
            t = make(n, dtype, seed=100 * i + j, specials=sp)
            assert engine_cells(t, ALL) == host_statistics(t, ALL), (dtype, n, sp)


def test_the_native_pass_gives_the_numpy_sums_bit_for_bit():
    host_stats = native.host_stats()
    reducers = [REDUCERS[c] for c in ("max", "min", "avg", "l2norm")]
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.bool):
        for n in (1, 17, 65536 + 3, 5 * 65536 + 1):
            t = make(n, dtype, seed=n)
            mx, mn, s, q = host_stats(t)
            want = reduce_tensor(t, reducers)
            assert (s / n, math.sqrt(q)) == (want[2], want[3]), (dtype, n)
            assert float(mx) == float(want[0]) and float(mn) == float(want[1])


def test_non_contiguous_zero_dim_and_views():
    base = make(6 * 7 * 40, torch.float32, seed=5).reshape(6, 7, 40)
    cases = [base.transpose(0, 2), base.permute(1, 2, 0), base[:, ::2, 1:], base[..., 3], base.expand(2, 6, 7, 40),
             torch.tensor(2.5), torch.tensor(NAN), torch.empty(0, 3), base.to(memory_format=torch.contiguous_format)
             .unsqueeze(0).to(memory_format=torch.channels_last), torch.ones(3, dtype=torch.bool).expand(4, 3)]
    for t in cases:
        assert engine_cells(t, ALL) == host_statistics(t, ALL), t.shape


def test_md5_comes_from_the_host_copy_and_the_rest_from_the_tensor():
    e = StatsEngine(categories=["max", "md5", "l2norm"], stat_calc_mode="host")
    assert e.host_categories == ("md5",)
    t = make(5000, torch.bfloat16, seed=9)
    assert engine_cells(t, ["max", "md5", "l2norm"]) == host_statistics(t, ["max", "md5", "l2norm"])


def test_host_mode_makes_no_host_copy_and_reads_natively():
    # the default categories: everything from the native pass, no copy for the writer
    cfg = DumpConfig(path="/tmp/x", saved_data="statistic")
    e = StatsEngine(cfg)
    assert cfg.stat_calc_mode == "host" and not e.needs_host_copy and e.device_only
    batch = HostStatsBatch(e.categories)
    sink = batch.row_sink()
    assert sink is not None
    rows = []
    x = make(4096, torch.float32, seed=1)
    assert sink.record(rows, "Add", "Default/add-op0", "output", 7, [x, x.view(64, 64).t()]) == 2
    assert len(batch) == 1 and batch._memo.host and batch._memo.reads == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=0, max_size=300),
       st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]),
       st.integers(1, 5))
def test_hypothesis_values(values, dtype, stride):
    t = torch.tensor(values, dtype=torch.float64).to(dtype)[::stride]
    assert engine_cells(t, ALL) == host_statistics(t, ALL)


def test_float64_overflow_rescaled_in_both():
    t = torch.tensor([1e200, -3e199, 5.0], dtype=torch.float64)
    cells = engine_cells(t, ["l2norm"])
    assert cells == host_statistics(t, ["l2norm"]) and math.isfinite(float(cells[0]))
    assert float(cells[0]) == pytest.approx(math.hypot(*t.tolist()), rel=1e-15)
