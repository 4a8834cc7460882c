"""The native cell formatter (opdump/stats/cell_text.cpp) writes exactly what formatting.py writes.

The Python formatters are the reference (their own rules are checked against numpy and
Python in test_stats_host.py); here every float16 value, millions of float32 and float64
bit patterns, the notation thresholds and the CPU kernel's tuples are compared cell by cell.
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from opdump.stats import native as native_module
from opdump.stats.categories import lookup
from opdump.stats.device import DeviceStatsBatch
from opdump.stats.engine import DeviceCells
from opdump.stats.formatting import cell_formatter, native_codes, native_precision

pytestmark = pytest.mark.skipif(not native_module.enabled_by_environment(),
                                reason="OPDUMP_CPU_KERNEL=0: the native module is switched off on purpose")

ELEMENT_CODES = ([0], [-1])       # one "max"-like element column, not from a fused tuple
NUMPY_2 = int(np.__version__.split(".")[0]) >= 2


@pytest.fixture(scope="module")
def native():
    fn = native_module.cell_formatter()
    assert fn is not None, "g++ and ninja are on this machine: the native module must build"
    return fn


def _column(native, values, dtype, kind="element"):
    kinds = [{"element": 0, "computed": 1, "count": 2}[kind]]
    return native([[v] for v in values], [native_precision(dtype)] * len(values), kinds, [-1])


def _reference(values, dtype, kind="element"):
    fmt = cell_formatter(kind, dtype)
    return [fmt(v) for v in values]


def _mismatches(values, got, want):
    return [(v, g, w) for v, g, w in zip(values, got, want) if g != w][:10]


@pytest.mark.skipif(not NUMPY_2, reason="the reference formatter follows the installed numpy's str(), "
                                        "whose float16/float32 notation thresholds changed in numpy 2")
def test_every_float16_value(native):
    bits = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    values = [float(v) for v in bits]                      # NaN, ±inf and ±0 included
    assert not _mismatches(values, _column(native, values, torch.float16), _reference(values, torch.float16))


@pytest.mark.skipif(not NUMPY_2, reason="the reference formatter follows the installed numpy's str(), "
                                        "whose float16/float32 notation thresholds changed in numpy 2")
def test_float32_bit_patterns_and_thresholds(native):
    rng = np.random.default_rng(0)
    random = rng.integers(0, 1 << 32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array([2.0 ** k for k in range(-149, 128)]
                     + [1e6, 999999.94, 1e-4, 9.9999997e-05, 1.0001e-4, 123456.0, 1234567.0,
                        3.4028235e38, 1.4e-45, 0.1, 16777216.0], dtype=np.float32)
    values = [float(v) for v in np.concatenate([random, edges, -edges])]
    for dtype in (torch.float32, torch.bfloat16):          # bfloat16 elements print as float32
        got = _column(native, values, dtype)
        assert not _mismatches(values, got, _reference(values, dtype))


def test_float64_repr_and_integers(native):
    rng = np.random.default_rng(1)
    values = [float(v) for v in rng.integers(0, 1 << 63, 200_000, dtype=np.uint64).view(np.float64)]
    values += [1e16, 9999999999999998.0, 1e-4, 1e-5, 5e-324, 1.7976931348623157e308, 0.1, 123.0,
               0.0, -0.0, math.inf, -math.inf, math.nan]
    values += [-v for v in values]
    assert not _mismatches(values, _column(native, values, torch.float32, "computed"),
                           _reference(values, torch.float32, "computed"))
    assert not _mismatches(values, _column(native, values, torch.float64), _reference(values, torch.float64))
    ints = [0, -1, 7, 2 ** 63 - 1, -2 ** 63, 2 ** 70, -(2 ** 64) - 3, True, 3.9]
    for dtype in (torch.int64, torch.bool, torch.uint8):
        assert _column(native, ints, dtype) == _reference(ints, dtype)
    assert _column(native, ints, torch.float32, "count") == _reference(ints, torch.float32, "count")
    assert _column(native, [None], torch.float32) == [""]


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True, width=64),
       st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]))
def test_any_double_rounded_to_the_element_dtype(native, x, dtype):
    """Element cells round a float64 value to the tensor's precision first, as np.float32(x) does."""
    if not NUMPY_2 and dtype in (torch.float16, torch.float32, torch.bfloat16):
        return
    for kind in ("element", "computed"):
        assert _column(native, [x], dtype, kind) == _reference([x], dtype, kind)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.bool])
def test_kernel_tuples_give_the_python_rows(native, dtype):
    """A batch whose values come from the CPU kernel: the native text of its tuples equals the
    Python formatting of the values derived from them (avg = sum / numel, l2norm = sqrt)."""
    categories = ["max", "min", "avg", "l2norm", "count"]
    batch = DeviceStatsBatch(categories, "high")
    tensors = [torch.randn(n).mul(100).to(dtype) for n in (1, 7, 1000, 70_000)]
    tensors.append(torch.tensor([0.0, -0.0, 3.5]).to(dtype))
    for t in tensors:
        batch.add(t)
    gathered = batch.gather()
    assert any(type(e) is tuple for e in gathered.entries())      # the kernel's tuples are kept raw
    cats = [lookup(c) for c in categories]
    kinds, fused = native_codes(cats)
    got = native(gathered.entries(), [native_precision(d) for d in gathered.dtypes], kinds, fused)
    want = [",".join(cell_formatter(c.kind, d)(v) for c, v in zip(cats, vals))
            for vals, d in zip(gathered.values(), gathered.dtypes)]
    assert got == want
    assert DeviceCells(gathered, categories).joined() == want


def test_rejects_malformed_entries(native):
    with pytest.raises(ValueError):
        native([[1.0, 2.0]], [2], [0], [-1])                 # two values, one category
    with pytest.raises(ValueError):
        native([(1.0, 2.0)], [2], [0], [0])                  # a short kernel tuple
    with pytest.raises(ValueError):
        native([[1.0]], [2, 2], [0], [-1])                   # precisions do not match the entries
