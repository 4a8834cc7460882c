"""The CPU statistics kernel's additions, bit for bit (opdump/stats/cpu_kernel.cpp ``reduce_range``).

statistic.csv's avg and L2 norm cells come from the kernel's sum and sum of squares, so any
change to the order of its additions may change their text.  The order is rebuilt here in
numpy (per 65,536-element chunk; per 1,024-element block, 16 lanes summed in order from zero —
float32 lanes from 16,384 elements on, float64 below — block sums into float64 lane totals in
block order; lanes added in order, then the tail, then the chunks in order) and the kernel
must give exactly those floats.  Also: max/min keep the first of equal values (+0 / -0) as a
sequential scan does, and NaN is found wherever it is (the kernel looks for it only when its
sums are NaN)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opdump.stats import native

LANES, BLOCK, CHUNK, SMALL = 16, 1024, 1 << 16, 1 << 14

mod = native.module()
pytestmark = pytest.mark.skipif(mod is None, reason="the native module is not built here (OPDUMP_CPU_KERNEL=0 "
                                                    "or no compiler)")


def _range(x: np.ndarray, lane_type) -> tuple:
    """reduce_range's sums of one chunk (float32 elements), in its order."""
    n = x.size
    full = n - n % LANES
    sd = np.zeros(LANES)
    qd = np.zeros(LANES)
    for b in range(0, full, BLOCK):
        block = x[b:min(full, b + BLOCK)].reshape(-1, LANES).astype(lane_type)
        # reducing axis 0 of a C-ordered array adds its rows one after another: lane order
        sd += np.add.reduce(block, axis=0, dtype=lane_type).astype(np.float64)
        qd += np.add.reduce(block * block, axis=0, dtype=lane_type).astype(np.float64)
    s = q = 0.0
    for j in range(LANES):
        s += float(sd[j])
        q += float(qd[j])
    for v in x[full:]:
        s += float(v)
        q += float(v) * float(v)
    return s, q


def reference_sums(x: np.ndarray) -> tuple:
    x = np.ascontiguousarray(x, dtype=np.float32).ravel()
    if x.size < SMALL:
        return _range(x, np.float64)
    s = q = 0.0
    for c in range(0, x.size, CHUNK):
        cs, cq = _range(x[c:c + CHUNK], np.float32)
        s, q = s + cs, q + cq
    return s, q


SIZES = [1, 15, 16, 17, 1023, 1024, 2047, 2048, 2049, 3 * 1024 + 5, 16383, 16384, 16400, 2 * 1024 * 8 + 16 * 3 + 7,
         65536, 65536 + 2048 + 3, 193600, 3 * 65536 + 1024 * 5 + 17]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("threads", [1, 2])
def test_sums_are_the_documented_additions(n, threads):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3], n)).astype(np.float32)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        mx, mn, s, q = mod.fused_stats(torch.from_numpy(x))
    finally:
        torch.set_num_threads(old)
    rs, rq = reference_sums(x)
    assert (s, q) == (rs, rq)
    assert (mx, mn) == (float(x.max()), float(x.min()))


@pytest.mark.parametrize("n", [16, 2048, 4096 + 16, 70000, 200000])
def test_equal_extremes_keep_the_first_one(n):
    """Zeros of both signs only: every element ties, the scan keeps the first: element 0's sign."""
    rng = np.random.default_rng(n)
    for first in (0.0, -0.0):
        x = np.where(rng.random(n) < 0.5, np.float32(0.0), np.float32(-0.0)).astype(np.float32)
        x[0] = first
        mx, mn, _, _ = mod.fused_stats(torch.from_numpy(x))
        assert math.copysign(1.0, mx) == math.copysign(1.0, first)
        assert math.copysign(1.0, mn) == math.copysign(1.0, first)


@pytest.mark.parametrize("n", [7, 16, 2048, 5000, 70000])
def test_nan_anywhere_and_infinities_without_nan(n):
    rng = np.random.default_rng(n + 1)
    base = rng.standard_normal(n).astype(np.float32)
    for where in {0, n // 3, n - 1}:
        x = base.copy()
        x[where] = np.nan
        mx, mn, s, q = mod.fused_stats(torch.from_numpy(x))
        assert math.isnan(mx) and math.isnan(mn) and math.isnan(s), where
    if n >= 2:
        x = base.copy()
        x[0], x[-1] = np.inf, -np.inf                       # a NaN sum, no NaN element
        mx, mn, s, _ = mod.fused_stats(torch.from_numpy(x))
        assert (mx, mn) == (math.inf, -math.inf) and math.isnan(s)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_types_sum_their_float_values_in_the_same_order(dtype):
    rng = np.random.default_rng(3)
    t = torch.from_numpy(rng.standard_normal(70000).astype(np.float32)).to(dtype)
    mx, mn, s, q = mod.fused_stats(t)
    rs, rq = reference_sums(t.float().numpy())
    assert (s, q) == (rs, rq)
    assert (mx, mn) == (float(t.max()), float(t.min()))
