"""Device formats <-> host layouts (opdump.format.device_formats).

Every device array here is built by an independent reference written below: explicit
Python loops over the host indices, each placing one element at the flat device index
the reference formulas give (MindSpore's device-shape transfer, the table in the
module's docstring), padding left zero. The
module must turn that array back into the host tensor exactly (flat and device-shaped),
and its from_host must build the very same device array.
"""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from opdump.format.device_formats import UnknownFormat, device_shape, from_host, to_host


def ceil(a, b):
    return (a + b - 1) // b


def c0_of(dtype):
    return 32 if np.dtype(dtype) in (np.dtype("int8"), np.dtype("uint8")) else 16


# ---- reference: host ndarray -> (flat device array, device shape), by loops ----------

def ref_nc1hwc0(x, C0):
    N, C, H, W = x.shape
    C1 = ceil(C, C0)
    dev = np.zeros(N * C1 * H * W * C0, x.dtype)
    for n, c, h, w in itertools.product(range(N), range(C), range(H), range(W)):
        dev[n * C1 * H * W * C0 + (c // C0) * H * W * C0 + h * W * C0 + w * C0 + c % C0] = x[n, c, h, w]
    return dev, (N, C1, H, W, C0)


def ref_ndc1hwc0(x, C0):
    N, C, D, H, W = x.shape
    C1 = ceil(C, C0)
    dev = np.zeros(N * D * C1 * H * W * C0, x.dtype)
    for n, c, d, h, w in itertools.product(*map(range, x.shape)):
        i = n * D * C1 * H * W * C0 + d * C1 * H * W * C0 + (c // C0) * H * W * C0 + h * W * C0 + w * C0 + c % C0
        dev[i] = x[n, c, d, h, w]
    return dev, (N, D, C1, H, W, C0)


def ref_fractal_z_groups(x, C0, groups):
    """FRACTAL_Z (4-D host) / FRACTAL_Z_3D (5-D host), any groups; the MindSpore
    NCHW_TO_FRAC_Z_WITH_GROUPS loop (groups = 1 is the plain layout)."""
    x5 = x.reshape(x.shape[0], x.shape[1], 1, *x.shape[2:]) if x.ndim == 4 else x
    N, cin, D, H, W = x5.shape
    cout = N // groups
    e_mult = min(math.lcm(cin, C0) // cin, math.lcm(cout, 16) // cout, groups)
    cin_opt = ceil(e_mult * cin, C0) * C0
    cout_opt = ceil(e_mult * cout, 16) * 16
    c1 = cin_opt // C0
    g_blocks = ceil(groups, e_mult)
    dev = np.zeros(g_blocks * D * c1 * H * W * cout_opt * C0, x.dtype)
    for g in range(groups):
        for d in range(D):
            for c in range(cin):
                for h in range(H):
                    for w in range(W):
                        for n in range(cout):
                            e = g % e_mult
                            dst_ci, dst_co, src_co = e * cin + c, e * cout + n, g * cout + n
                            i = ((g // e_mult) * D * c1 * H * W * cout_opt * C0
                                 + d * c1 * H * W * cout_opt * C0
                                 + (dst_ci // C0) * H * W * cout_opt * C0
                                 + h * W * cout_opt * C0 + w * cout_opt * C0
                                 + dst_co * C0 + dst_ci % C0)
                            dev[i] = x5[src_co, c, d, h, w]
    return dev, (g_blocks * D * c1 * H * W, cout_opt // 16, 16, C0)


def ref_fractal_z(x, C0):
    """The document's groups=1 formula (written separately from the groups loop)."""
    N, C, H, W = x.shape
    C1, Np = ceil(C, C0), ceil(N, 16) * 16
    dev = np.zeros(C1 * H * W * Np * C0, x.dtype)
    for n, c, h, w in itertools.product(*map(range, x.shape)):
        dev[(c // C0) * H * W * Np * C0 + h * W * Np * C0 + w * Np * C0 + n * C0 + c % C0] = x[n, c, h, w]
    return dev, (C1 * H * W, Np // 16, 16, C0)


def ref_fractal_z_3d(x, C0):
    N, C, D, H, W = x.shape
    C1, Np = ceil(C, C0), ceil(N, 16) * 16
    dev = np.zeros(D * C1 * H * W * Np * C0, x.dtype)
    for n, c, d, h, w in itertools.product(*map(range, x.shape)):
        i = d * C1 * H * W * Np * C0 + (c // C0) * H * W * Np * C0 + h * W * Np * C0 + w * Np * C0 + n * C0 + c % C0
        dev[i] = x[n, c, d, h, w]
    return dev, (D * C1 * H * W, Np // 16, 16, C0)


def ref_fractal_nz(x, W0):
    shape = x.shape
    batch, H, W = (shape[:-2], shape[-2], shape[-1]) if len(shape) >= 2 else ((), 1, shape[0])
    B = int(np.prod(batch)) if batch else 1
    xb = x.reshape(B, H, W)
    H1, W1 = ceil(H, 16), ceil(W, W0)
    dev = np.zeros(B * W1 * H1 * 16 * W0, x.dtype)
    for b, h, w in itertools.product(range(B), range(H), range(W)):
        dev[b * W1 * H1 * 16 * W0 + (w // W0) * H1 * 16 * W0 + h * W0 + w % W0] = xb[b, h, w]
    return dev, tuple(batch) + (W1, H1, 16, W0)


def ref_c1hwncoc0(x, C0):
    N, C, H, W = x.shape
    C1 = ceil(C, C0)
    dev = np.zeros(C1 * H * W * N * C0 * C0, x.dtype)
    for n, c, h, w in itertools.product(*map(range, x.shape)):
        k = c % C0
        dev[(c // C0) * H * W * N * C0 * C0 + h * W * N * C0 * C0 + w * N * C0 * C0 + n * C0 * C0 + k * C0 + k] = x[n, c, h, w]
    return dev, (C1, H, W, N, C0, C0)


def ref_permuted(x, order):
    """Plain layout given as a string over the host axes' letters, e.g. 'NHWC' of NCHW."""
    host = "NCHW" if x.ndim == 4 else "NCDHW"
    dims = dict(zip(host, x.shape))
    dev_shape = tuple(dims[a] for a in order)
    dev = np.zeros(x.size, x.dtype)
    for idx in itertools.product(*map(range, x.shape)):
        pos = dict(zip(host, idx))
        flat = 0
        for a in order:
            flat = flat * dims[a] + pos[a]
        dev[flat] = x[idx]
    return dev, dev_shape


def host(shape, dtype, seed=0):
    """Distinct non-zero values, so a misplaced element or a padding zero shows."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if np.dtype(dtype).kind == "f":
        v = rng.permutation(n).astype(np.float64) + 1.0
    else:
        v = (np.arange(n) % 120) + 1
    return v.reshape(shape).astype(dtype)


def check(x, fmt, ref, groups=1, c0=None):
    dev, dshape = ref
    for arr in (dev, dev.reshape(dshape)):  # flat, as read from a file, and device-shaped
        got = to_host(arr, fmt, x.shape, groups, c0=c0)
        assert got.shape == x.shape and got.dtype == x.dtype
        np.testing.assert_array_equal(got, x)
    built = from_host(x, fmt, groups, c0=c0)
    assert built.shape == dshape == device_shape(fmt, x.shape, x.dtype, groups, c0=c0)
    np.testing.assert_array_equal(built.reshape(-1), dev)


DTYPES = [np.float16, np.float32, np.int8, np.uint8, np.int32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 2, 2), (1, 17, 3, 1), (2, 33, 1, 2), (1, 16, 2, 2)])
def test_nc1hwc0(dtype, shape):
    x = host(shape, dtype)
    check(x, "NC1HWC0", ref_nc1hwc0(x, c0_of(dtype)))
    check(x, "FORMAT_NC1HWC0", ref_nc1hwc0(x, c0_of(dtype)))


def test_nc1hwc0_c04_and_short_shapes():
    x = host((2, 5, 2, 3), np.float16)
    check(x, "NC1HWC0_C04", ref_nc1hwc0(x, 4))
    bias = host((19,), np.float32)  # a 1-D tensor is laid out as (1, C, 1, 1)
    dev, _ = ref_nc1hwc0(bias.reshape(1, 19, 1, 1), 16)
    np.testing.assert_array_equal(to_host(dev, "NC1HWC0", (19,)), bias)
    two = host((3, 7), np.float16)  # (N, C) -> (N, C, 1, 1)
    dev, _ = ref_nc1hwc0(two.reshape(3, 7, 1, 1), 16)
    np.testing.assert_array_equal(to_host(dev, "NC1HWC0", (3, 7)), two)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 3, 2, 2, 2), (2, 17, 1, 2, 3)])
def test_ndc1hwc0(dtype, shape):
    x = host(shape, dtype)
    check(x, "NDC1HWC0", ref_ndc1hwc0(x, c0_of(dtype)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5, 2, 2), (17, 18, 1, 2), (32, 16, 1, 1)])
def test_fractal_z(dtype, shape):
    x = host(shape, dtype)
    ref = ref_fractal_z(x, c0_of(dtype))
    check(x, "FRACTAL_Z", ref)
    # the groups loop with groups=1 is the same layout (two references agree)
    gdev, gshape = ref_fractal_z_groups(x, c0_of(dtype), 1)
    np.testing.assert_array_equal(gdev, ref[0])
    assert gshape == ref[1]


@pytest.mark.parametrize("dtype", [np.float16, np.int8])
@pytest.mark.parametrize("shape, groups", [
    ((6, 1, 3, 3), 6),     # depthwise: cin = 1, cout = 1
    ((12, 5, 2, 1), 3),    # cout = 4, cin = 5
    ((8, 3, 1, 2), 2),
    ((40, 7, 1, 1), 5),    # cout = 8
    ((34, 2, 2, 1), 17),   # more groups than one block holds (e_mult < groups)
])
def test_fractal_z_groups(dtype, shape, groups):
    x = host(shape, dtype)
    check(x, "FRACTAL_Z", ref_fractal_z_groups(x, c0_of(dtype), groups), groups)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8])
@pytest.mark.parametrize("shape", [(3, 5, 2, 2, 1), (17, 18, 1, 2, 2)])
def test_fractal_z_3d(dtype, shape):
    x = host(shape, dtype)
    check(x, "FRACTAL_Z_3D", ref_fractal_z_3d(x, c0_of(dtype)))


@pytest.mark.parametrize("shape, groups", [((6, 2, 2, 1, 2), 3), ((34, 1, 1, 2, 1), 17)])
def test_fractal_z_3d_groups(shape, groups):
    x = host(shape, np.float16)
    check(x, "FRACTAL_Z_3D", ref_fractal_z_groups(x, 16, groups), groups)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5,), (3, 7), (17, 33), (16, 16), (2, 3, 5, 17), (1, 40)])
def test_fractal_nz(dtype, shape):
    x = host(shape, dtype)
    check(x, "FRACTAL_NZ", ref_fractal_nz(x, c0_of(dtype)))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8])
@pytest.mark.parametrize("shape", [(2, 3, 2, 2), (3, 17, 1, 2)])
def test_c1hwncoc0(dtype, shape):
    x = host(shape, dtype)
    check(x, "C1HWNCoC0", ref_c1hwncoc0(x, c0_of(dtype)))


@pytest.mark.parametrize("fmt, shape", [
    ("NHWC", (2, 3, 4, 5)), ("HWCN", (2, 3, 4, 5)), ("CHWN", (2, 3, 4, 5)),
    ("NDHWC", (2, 3, 4, 1, 5)), ("DHWCN", (2, 3, 4, 1, 5)), ("DHWNC", (2, 3, 4, 1, 5)),
])
def test_permuted_plain_layouts(fmt, shape):
    x = host(shape, np.float32)
    check(x, fmt, ref_permuted(x, fmt))


@pytest.mark.parametrize("fmt, shape", [("NCHW", (2, 3, 4, 5)), ("ND", (7, 3)), ("ND", ()),
                                        ("NCDHW", (1, 2, 3, 4, 5)), ("NC", (4, 6))])
def test_identity_layouts(fmt, shape):
    x = host(shape, np.float16)
    check(x, fmt, (x.reshape(-1).copy(), shape))


def test_int4_c0_is_given_explicitly():
    """int4 unpacked to int8 has C0 = 64 on the device: from the device shape or c0=64."""
    x = host((1, 70, 1, 2), np.int8)
    dev, dshape = ref_nc1hwc0(x, 64)
    np.testing.assert_array_equal(to_host(dev.reshape(dshape), "NC1HWC0", x.shape), x)
    np.testing.assert_array_equal(to_host(dev, "NC1HWC0", x.shape, c0=64), x)


@pytest.mark.parametrize("fmt", ["FRACTAL_ZN_LSTM", "NC1KHKWHWC0", "FORMAT_YUV", "", "RESERVED"])
def test_unknown_format_raises(fmt):
    with pytest.raises(UnknownFormat):
        to_host(np.zeros(16, np.float16), fmt, (16,))
    with pytest.raises(UnknownFormat):
        from_host(np.zeros(16, np.float16), fmt)


def test_size_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"NC1HWC0.*needs a device array of 32 elements"):
        to_host(np.zeros(31, np.float16), "NC1HWC0", (1, 3, 1, 2))


FORMATS = {
    "NC1HWC0": (4, lambda x, k: ref_nc1hwc0(x, k)),
    "NDC1HWC0": (5, lambda x, k: ref_ndc1hwc0(x, k)),
    "FRACTAL_Z": (4, lambda x, k: ref_fractal_z(x, k)),
    "FRACTAL_Z_3D": (5, lambda x, k: ref_fractal_z_3d(x, k)),
    "C1HWNCoC0": (4, lambda x, k: ref_c1hwncoc0(x, k)),
    "FRACTAL_NZ": (None, lambda x, k: ref_fractal_nz(x, k)),
}


@settings(max_examples=60, deadline=None)
@given(fmt=st.sampled_from(sorted(FORMATS)), dtype=st.sampled_from([np.float16, np.int8, np.float32]),
       dims=st.lists(st.integers(1, 5), min_size=5, max_size=5), c=st.integers(1, 40),
       nz_rank=st.integers(1, 4), seed=st.integers(0, 2 ** 16))
def test_round_trip_hypothesis(fmt, dtype, dims, c, nz_rank, seed):
    rank, ref = FORMATS[fmt]
    if rank is None:
        # (W,) or batch dims + (H, W)
        shape = (c,) if nz_rank == 1 else tuple(dims[:nz_rank - 2]) + (dims[-1] * 4, c)
    else:
        shape = (dims[0] * 4, c) + tuple(dims[1:rank - 1])
    x = host(shape, dtype, seed)
    check(x, fmt, ref(x, c0_of(dtype)))


@settings(max_examples=30, deadline=None)
@given(cin=st.integers(1, 9), cout=st.integers(1, 9), groups=st.integers(2, 9),
       hw=st.tuples(st.integers(1, 2), st.integers(1, 2)), d=st.integers(0, 2),
       dtype=st.sampled_from([np.float16, np.int8]))
def test_groups_hypothesis(cin, cout, groups, hw, d, dtype):
    shape = (groups * cout, cin) + ((d,) if d else ()) + hw
    x = host(shape, dtype)
    fmt = "FRACTAL_Z_3D" if d else "FRACTAL_Z"
    check(x, fmt, ref_fractal_z_groups(x, c0_of(dtype), groups), groups)
