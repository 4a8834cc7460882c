"""Host statistics against an independent numpy reference."""
import hashlib
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from opdump.stats import CATEGORIES, host_statistics
from opdump.stats.host import CHUNK_ELEMENTS, reduce_tensor
from opdump.stats.categories import lookup
from opdump.stats.formatting import element_format_dtype

ALL = list(CATEGORIES)            # MindSpore's 12 + finite max/min
NAN, INF = float("nan"), float("inf")


def raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes in its own dtype, C order, without going through opdump."""
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    if t.dtype.is_floating_point and t.element_size() == 1:
        return t.view(torch.int8).numpy().tobytes()
    return t.numpy().tobytes()


def reference(t: torch.Tensor) -> dict:
    """Expected raw values, computed with plain numpy on a float64 / int64 copy."""
    with np.errstate(all="ignore"):
        return _reference(t)


def _reference(t: torch.Tensor) -> dict:
    if t.is_complex():
        return {c: None for c in ALL}
    n = t.numel()
    if t.dtype.is_floating_point:
        v = t.to(torch.float64).numpy().reshape(-1)
    else:
        v = t.to(torch.int64).numpy().reshape(-1)
    f = v.astype(np.float64)
    fin = v[np.isfinite(f)]
    md5 = hashlib.md5(raw_bytes(t)).hexdigest()
    empty = n == 0
    return {
        "max": None if empty else v.max(),
        "min": None if empty else v.min(),
        "avg": None if empty else f.mean(),
        "count": n,
        "negative zero count": int((f < 0).sum()),
        "positive zero count": int((f > 0).sum()),
        "nan count": int(np.isnan(f).sum()),
        "negative inf count": int((f == -np.inf).sum()),
        "positive inf count": int((f == np.inf).sum()),
        "zero count": int((f == 0).sum()),
        "md5": md5,
        "l2norm": None if empty else float(np.linalg.norm(f)),
        "finite max": fin.max() if fin.size else None,
        "finite min": fin.min() if fin.size else None,
    }


def parse(cell: str):
    if cell == "":
        return None
    try:
        return int(cell)
    except ValueError:
        try:
            return float(cell)
        except ValueError:
            return cell


def check(t: torch.Tensor, cells, categories=ALL, rel=1e-12):
    ref = reference(t)
    assert len(cells) == len(categories)
    for name, cell in zip(categories, cells):
        exp, got = ref[name], parse(cell)
        kind = lookup(name).kind
        if exp is None:
            assert got is None, (name, cell)
        elif kind == "text" or kind == "count":
            assert got == exp, (name, cell, exp)
        elif isinstance(exp, (np.integer, int)) and not t.dtype.is_floating_point:
            assert got == int(exp) and "." not in cell, (name, cell, exp)
        elif math.isnan(exp):
            assert cell == "nan", (name, cell)
        elif kind == "element":       # exact, read back in the tensor's precision
            np_type = element_format_dtype(t.dtype)
            assert np_type(cell) == np_type(exp), (name, cell, exp)
        else:
            assert got == pytest.approx(float(exp), rel=rel, abs=0), (name, cell, exp)


SPECIAL = [1.0, -2.0, 0.0, -0.0, NAN, INF, -INF, 0.1, 3.0e38, -1e-3]

CASES = {
    "f32_special": torch.tensor(SPECIAL, dtype=torch.float32),
    "f32_plain": torch.linspace(-3, 5, 101, dtype=torch.float32).reshape(101, 1),
    "f64_special": torch.tensor(SPECIAL, dtype=torch.float64),
    "f16_special": torch.tensor([1.0, -2.0, 0.0, -0.0, NAN, INF, -INF, 0.1, 65504.0]).to(torch.float16),
    "f16_plain": (torch.arange(-20, 20, dtype=torch.float32) / 7).to(torch.float16),
    "bf16_special": torch.tensor(SPECIAL).to(torch.bfloat16),
    "bf16_plain": (torch.arange(-20, 20, dtype=torch.float32) / 7).to(torch.bfloat16).reshape(5, 8),
    "only_nan": torch.tensor([NAN, NAN]),
    "only_inf": torch.tensor([INF, -INF, INF]),
    "inf_and_finite": torch.tensor([INF, 2.0, -5.0]),
    "zero_dim": torch.tensor(3.5),
    "zero_dim_nan": torch.tensor(NAN),
    "empty_1d": torch.empty(0),
    "empty_2d": torch.empty(2, 0, 3),
    "empty_int": torch.empty(0, dtype=torch.int32),
    "int8": torch.tensor([-128, 0, 5, 127], dtype=torch.int8),
    "int32": torch.tensor([[-7, 0], [3, 2**30]], dtype=torch.int32),
    "int64": torch.tensor([-(2**40), 0, 0, 17], dtype=torch.int64),
    "uint8": torch.tensor([0, 255, 3], dtype=torch.uint8),
    "uint16": torch.tensor([0, 65535, 3], dtype=torch.uint16),
    "bool": torch.tensor([True, False, True, True]),
    "bool_2d": torch.tensor([[False, False]]),
    "big": torch.linspace(-1, 1, CHUNK_ELEMENTS * 2 + 17, dtype=torch.float32),
}
if hasattr(torch, "float8_e4m3fn"):
    CASES["f8_e4m3fn"] = torch.tensor([1.0, -2.0, 0.0, 0.1, 448.0, -448.0, NAN]).to(torch.float8_e4m3fn)
if hasattr(torch, "float8_e5m2"):
    CASES["f8_e5m2"] = torch.tensor([1.0, -2.0, 0.0, INF, -INF, NAN, 0.3]).to(torch.float8_e5m2)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_category_matches_numpy(name):
    t = CASES[name]
    cells = host_statistics(t, ALL)
    check(t, cells)


@pytest.mark.parametrize("name", ["f32_special", "bf16_special", "f16_special", "int32", "bool", "f32_plain"])
def test_chunking_does_not_change_results(name):
    t = CASES[name]
    cats = [lookup(c).host for c in ALL]
    whole = reduce_tensor(t, cats)
    tiny = reduce_tensor(t, cats, chunk_elements=3)
    for a, b, c in zip(whole, tiny, ALL):
        if c in ("avg", "l2norm"):
            assert b == pytest.approx(a, rel=1e-12, nan_ok=True)
        elif isinstance(a, float) and math.isnan(a):
            assert math.isnan(b)
        else:
            assert (a == b) or (np.isnan(a) and np.isnan(b)), c


def test_default_categories_reveal_nan():
    t = torch.tensor([1.0, NAN, 3.0])
    assert host_statistics(t, ["max", "min", "l2norm"]) == ["nan", "nan", "nan"]
    assert host_statistics(t, ["finite max", "finite min", "nan count"]) == ["3.0", "1.0", "1"]


def test_inf_propagates_and_finite_ignores_it():
    t = torch.tensor([INF, 2.0, -5.0])
    assert host_statistics(t, ["max", "min", "avg", "l2norm"]) == ["inf", "-5.0", "inf", "inf"]
    assert host_statistics(t, ["finite max", "finite min"]) == ["2.0", "-5.0"]
    assert host_statistics(torch.tensor([INF, -INF]), ["avg", "finite max", "finite min"]) == ["nan", "", ""]


def test_complex_row_is_empty():
    t = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    assert host_statistics(t, ALL) == [""] * len(ALL)


def test_empty_tensor_cells():
    cells = dict(zip(ALL, host_statistics(torch.empty(0, 4), ALL)))
    assert cells["count"] == "0" and cells["nan count"] == "0"
    assert cells["md5"] == hashlib.md5(b"").hexdigest()
    for c in ("max", "min", "avg", "l2norm", "finite max", "finite min"):
        assert cells[c] == ""


def test_md5_uses_original_dtype_bytes():
    x = torch.tensor([1.5, -2.25, 3.0e10])
    bf = x.to(torch.bfloat16)
    [md5] = host_statistics(bf, ["md5"])
    assert md5 == hashlib.md5(bf.view(torch.int16).numpy().tobytes()).hexdigest()
    assert md5 != hashlib.md5(bf.to(torch.float32).numpy().tobytes()).hexdigest()
    assert len(bf.view(torch.int16).numpy().tobytes()) == 6


def test_md5_of_non_contiguous_is_c_order():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    [md5] = host_statistics(t, ["md5"])
    assert md5 == hashlib.md5(np.ascontiguousarray(t.numpy()).tobytes()).hexdigest()


def test_requires_grad_and_views_are_fine():
    w = torch.randn(4, 5, requires_grad=True)
    view = w[:, 1:3]
    check(view.detach(), host_statistics(view, ALL))


def test_device_tensor_rejected():
    meta = torch.empty(3, device="meta")
    with pytest.raises(ValueError):
        host_statistics(meta, ["max"])


def test_float_formatting_round_trips_in_own_precision():
    t32 = torch.tensor([0.1, -7.0e-9, 1.0e20], dtype=torch.float32)
    assert host_statistics(t32, ["max", "min"]) == ["1e+20", "-7e-09"]
    [mx] = host_statistics(torch.tensor([0.1], dtype=torch.float32), ["max"])
    assert mx == "0.1" and np.float32(mx) == np.float32(0.1)
    [h] = host_statistics(torch.tensor([0.1], dtype=torch.float16), ["max"])
    assert np.float16(h) == np.float16(0.1) and h == "0.1"
    [b] = host_statistics(torch.tensor([0.1]).to(torch.bfloat16), ["max"])
    assert torch.tensor(float(b)).to(torch.bfloat16) == torch.tensor(0.1).to(torch.bfloat16)
    [d] = host_statistics(torch.tensor([0.1], dtype=torch.float64), ["max"])
    assert d == "0.1"
    [i] = host_statistics(torch.tensor([3, 4]), ["avg"])
    assert i == "3.5"
    # the sign of a zero max/min is order-dependent when both zeros are present: never written
    assert host_statistics(torch.tensor([-0.0]), ["max"]) == ["0.0"]
    assert host_statistics(torch.tensor([-0.0, 0.0, -1.0]), ["max"]) == ["0.0"]


def test_avg_accumulates_in_float64():
    # 2**24 + 1 ones: a float32 accumulator would stop at 2**24
    n = 2**24 + 3
    t = torch.ones(n, dtype=torch.float32)
    t[0] = 2.0 ** 24
    assert float(host_statistics(t, ["avg"])[0]) == pytest.approx((2.0**24 + n - 1) / n, rel=1e-15)


def test_float64_l2norm_does_not_overflow():
    t = torch.tensor([1e200, -1e200, 3.0], dtype=torch.float64)
    [l2] = host_statistics(t, ["l2norm"])
    assert float(l2) == pytest.approx(math.sqrt(2) * 1e200, rel=1e-15)
    assert host_statistics(torch.tensor([1e200, INF], dtype=torch.float64), ["l2norm"]) == ["inf"]
    assert host_statistics(torch.tensor([1e200, NAN], dtype=torch.float64), ["l2norm"]) == ["nan"]


def test_unknown_category_suggests_nearest():
    with pytest.raises(ValueError, match="l2norm"):
        host_statistics(torch.ones(2), ["l2 norm"])


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(dtype=st.sampled_from([np.float32, np.float64, np.float16]),
                  shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
                  elements=st.floats(allow_nan=True, allow_infinity=True, width=16)))
def test_random_float_tensors(arr):
    t = torch.from_numpy(arr.copy())
    check(t, host_statistics(t, ALL), rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([torch.float32, torch.float16,
                                                                       torch.bfloat16, torch.float64]))
def test_cell_formatters_equal_the_reference_rules(x, dtype):
    """The writer's per-dtype formatters (no special cases) write what format_float writes."""
    from opdump.stats.formatting import cell_formatter, element_format_dtype, format_float
    np_type = element_format_dtype(dtype)
    with np.errstate(over="ignore"):
        element = float(np_type(x))             # a value the tensor could hold (beyond its range: inf)
    want = "0.0" if element == 0 else format_float(element, np_type)
    assert cell_formatter("element", dtype)(element) == want
    assert cell_formatter("computed", dtype)(x) == format_float(x, np.float64)
    assert cell_formatter("element", dtype)(None) == cell_formatter("computed", dtype)(None) == ""
