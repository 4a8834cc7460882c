"""The overflow watch's reading of a large CPU tensor (opdump/stats/finite_bound.cpp; README
"Debug dumps") split in 1 MiB chunks over the intra-op threads: the same (value, signed) as
one pass, whatever chunk holds the NaN, the Inf, the largest magnitude or the only negative
element -- the first, a middle one, the last (a partial chunk), an element on a boundary --
for each floating dtype, and with one torch thread (the serial path) as with two."""
import math

import pytest
import torch

from opdump.stats import native

finite_bound = native.finite_bound()
pytestmark = pytest.mark.skipif(finite_bound is None,
                                reason="the native module (opdump/stats/finite_bound.cpp) is not built here")

CHUNK_BYTES = 1 << 20


def _expected(t):
    d = t.double()
    if torch.isnan(d).any():
        return math.nan, bool(torch.signbit(t).any())
    return float(d.abs().max()), bool(torch.signbit(t).any())


def _same(got, want):
    (v, s), (wv, ws) = got, want
    assert s == ws
    assert (math.isnan(v) and math.isnan(wv)) or v == wv


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_large_reads_match_one_pass(dtype, threads):
    per_chunk = CHUNK_BYTES // torch.empty((), dtype=dtype).element_size()
    n = 3 * per_chunk + 12345                      # three whole chunks and a partial one
    g = torch.Generator().manual_seed(0)
    base = torch.rand(n, generator=g, dtype=torch.float32).to(dtype)     # all >= +0: unsigned
    _same(finite_bound(base), _expected(base))
    for where in (0, per_chunk - 1, per_chunk, 2 * per_chunk + 7, n - 1):
        for value in (math.nan, math.inf, -math.inf, 60000.0, -0.0, -1.0):
            t = base.clone()
            t[where] = value
            got = finite_bound(t)
            _same(got, _expected(t))
            if value != value:
                assert math.isnan(got[0])
            elif math.isinf(value):
                assert got[0] == math.inf
            elif value == 60000.0:
                assert got[0] == float(torch.tensor(60000.0, dtype=dtype))
            else:
                assert got[1] is True                  # the one signed element is seen in any chunk


def test_large_strided_view_is_read_whole(threads):
    """A dense view with other strides (a transpose) is read over its storage range: the chunks
    cover every element."""
    per_chunk = CHUNK_BYTES // 4
    t = torch.rand(1024, 3 * per_chunk // 1024 + 3)
    t[-1, -1] = math.inf
    _same(finite_bound(t.t()), _expected(t))
    t[5, 7] = math.nan
    assert math.isnan(finite_bound(t.t())[0])
