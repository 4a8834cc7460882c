"""compare at memory speed (issue 25) gives the same numbers as before, to the last digit.

``reference_tensor_metrics`` below is a verbatim copy of the metric implementation that
``opdump.analysis.metrics`` had before the streaming / byte-identical / fused rewrite
(only renamed). Every metric of every generated pair -- through ``tensor_metrics`` on
arrays and through ``pair_metrics`` on real ``.npy`` files -- must equal it exactly
(NaN where it is NaN, same Python type). The reference runs with numpy's BLAS on one
thread, as the new code always does: OpenBLAS splits a dot product of more than 10,000
elements over its threads, so the old code's last digits depended on the core count
(``test_blas_thread_count_no_longer_changes_the_digits`` shows it).
"""
from __future__ import annotations

import math
from typing import Any, Dict

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from opdump.analysis import blas as B
from opdump.analysis import metrics as M
from opdump.analysis.common import iter_chunks
from opdump.analysis.reader import load_array
from opdump.analysis.reader import npy as N

METRIC_CHUNK = 1 << 16


def _real(a: np.ndarray) -> np.ndarray:
    if np.iscomplexobj(a):
        a = np.ascontiguousarray(a)
        return a.view(a.real.dtype)
    return a


def reference_tensor_metrics(a: np.ndarray, b: np.ndarray, chunk: int = METRIC_CHUNK) -> Dict[str, Any]:
    """Metrics of ``a`` (compared) against ``b`` (reference), flattened, in float64.

    Non-finite values: positions where both hold the same NaN/±Inf agree; any other
    position where either is non-finite counts in ``nonfinite_mismatch``.  The error
    metrics use the positions where both are finite.  ``max_rel_err`` and the
    ``within_*`` shares use ``|a-b| / |b|`` (0 where both are 0, inf where only b is 0).
    ``cosine`` is NaN when exactly one side is all zeros, 1 when both are."""
    a, b = _real(a), _real(b)
    out: Dict[str, Any] = {"shape_a": tuple(a.shape), "shape_b": tuple(b.shape),
                           "np_dtype_a": str(a.dtype), "np_dtype_b": str(b.dtype)}
    if a.size != b.size:
        out.update({"error": f"element count differs: {a.size} vs {b.size}", "n": 0})
        return out
    dot = na2 = nb2 = ssq = sabs = 0.0
    max_abs = max_rel = max_ref = 0.0
    w1 = w5 = n = mism = 0
    m = min(chunk, max(1, a.size))
    bufa, bufb, bufd, buft = (np.empty(m, np.float64) for _ in range(4))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for ca, cb in zip(iter_chunks(a, chunk), iter_chunks(b, chunk)):
            k = ca.size
            xa, xb, d, t = bufa[:k], bufb[:k], bufd[:k], buft[:k]
            xa[...] = ca
            xb[...] = cb
            fa, fb = np.isfinite(xa), np.isfinite(xb)
            if not (fa.all() and fb.all()):
                both = fa & fb
                neither = ~fa & ~fb
                same = neither & ((np.isnan(xa) & np.isnan(xb)) | (xa == xb))
                mism += int(k - both.sum() - same.sum())
                xa, xb = xa[both], xb[both]
                k = xa.size
                if k == 0:
                    continue
                d, t = d[:k], t[:k]
            np.subtract(xa, xb, out=d)
            np.abs(d, out=d)
            dot += float(np.dot(xa, xb))
            na2 += float(np.dot(xa, xa))
            nb2 += float(np.dot(xb, xb))
            ssq += float(np.dot(d, d))
            sabs += float(d.sum())
            max_abs = max(max_abs, float(d.max()))
            np.abs(xb, out=t)
            max_ref = max(max_ref, float(t.max()))
            np.divide(d, t, out=t)                 # 0/0 -> NaN (an exact zero: relative error 0)
            mr = float(np.fmax.reduce(t))
            if mr == mr:
                max_rel = max(max_rel, mr)
            w1 += int(np.count_nonzero(~(t >= 1e-3)))
            w5 += int(np.count_nonzero(~(t >= 5e-3)))
            n += k
    if na2 == 0.0 and nb2 == 0.0:
        cos = 1.0 if n else float("nan")
    elif na2 == 0.0 or nb2 == 0.0:
        cos = float("nan")
    else:
        cos = dot / math.sqrt(na2 * nb2)
        cos = max(-1.0, min(1.0, cos))
    out.update({
        "n": n, "cosine": cos, "max_abs_err": max_abs if n else float("nan"),
        "max_rel_err": max_rel if n else float("nan"),
        "rmse": math.sqrt(ssq / n) if n else float("nan"), "euclidean": math.sqrt(ssq),
        "mean_abs_err": sabs / n if n else float("nan"),
        "within_1e-3": w1 / n if n else float("nan"), "within_5e-3": w5 / n if n else float("nan"),
        "max_abs_ref": max_ref, "nonfinite_mismatch": mism,
    })
    return out



def reference_pair_metrics(path_a, path_b, chunk: int = METRIC_CHUNK) -> Dict[str, Any]:
    """The former pair_metrics on readable files (np.load, then the metric pass)."""
    return reference_tensor_metrics(load_array(str(path_a)), load_array(str(path_b)), chunk)


def _same(new: Dict[str, Any], ref: Dict[str, Any]) -> None:
    assert set(new) == set(ref), (set(new) ^ set(ref))
    for k, r in ref.items():
        v = new[k]
        assert type(v) is type(r), (k, v, r)
        if isinstance(r, float) and math.isnan(r):
            assert math.isnan(v), (k, v, r)
        else:
            assert v == r, (k, v, r, float(v).hex() if isinstance(v, float) else v,
                            float(r).hex() if isinstance(r, float) else r)


def _ref(a, b, chunk=METRIC_CHUNK):
    with B.single_thread_blas():
        return reference_tensor_metrics(a, b, chunk)


def _check_arrays(a, b, chunk=METRIC_CHUNK):
    _same(M.tensor_metrics(a, b, chunk), _ref(a, b, chunk))


def _check_files(tmp_path, a, b, chunk=METRIC_CHUNK, name="x"):
    pa, pb = tmp_path / f"{name}_a.npy", tmp_path / f"{name}_b.npy"
    np.save(pa, a)
    np.save(pb, b)
    with B.single_thread_blas():
        ref = reference_pair_metrics(pa, pb, chunk)
    _same(M.pair_metrics(str(pa), str(pb), chunk), ref)
    _same(M.pair_metrics(str(pa), str(pb), chunk, N.npy_layout(str(pa)), N.npy_layout(str(pb))), ref)
    small = M.SMALL_BYTES
    M.SMALL_BYTES = -1                  # every pair streamed (else up to 1 MB is read whole)
    try:
        _same(M.pair_metrics(str(pa), str(pb), chunk), ref)
    finally:
        M.SMALL_BYTES = small
    return ref


def _bf16(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).bfloat16().float().numpy()


RNG = np.random.default_rng(25)


def _pairs():
    """(name, a, b): the generated cases."""
    out = []
    for n in (0, 1, 7, 65535, 65536, 65537, 200_003):
        a = RNG.standard_normal(n).astype(np.float32)
        out.append((f"perturbed{n}", (a * np.float32(1 + 1e-6)).astype(np.float32), a))
        out.append((f"identical{n}", a.copy(), a))
        out.append((f"bf16_vs_fp32_{n}", _bf16(a), a))
    a = RNG.standard_normal(300_000).astype(np.float32)
    for where in (0, 1, 65535, 65536, 299_999):
        for bad in (np.nan, np.inf, -np.inf):
            x, y = a.copy(), a * np.float32(0.999)
            x[where] = bad
            out.append((f"a_{bad}_at{where}", x, y))
            y2 = y.copy()
            y2[where] = bad
            out.append((f"both_{bad}_at{where}", x, y2))              # same non-finite: agrees
            out.append((f"b_{bad}_at{where}", a.copy(), y2))
            out.append((f"ident_{bad}_at{where}", x, x.copy()))      # byte-identical with NaN/Inf
    x = a.copy()
    x[::3] = np.nan
    out.append(("nan_every_third_identical", x, x.copy()))
    out.append(("nan_vs_inf", np.full(5, np.nan, np.float32), np.full(5, np.inf, np.float32)))
    out.append(("all_nan_identical", np.full(70_000, np.nan, np.float32), np.full(70_000, np.nan, np.float32)))
    out.append(("zeros", np.zeros(70_000, np.float32), np.zeros(70_000, np.float32)))
    out.append(("zero_vs_ones", np.zeros(10, np.float32), np.ones(10, np.float32)))
    out.append(("negzero_vs_zero", -np.zeros(10, np.float32), np.zeros(10, np.float32)))
    out.append(("scalar_0d", np.array(3.5, np.float32), np.array(3.25, np.float32)))
    out.append(("scalar_0d_identical", np.array(3.5, np.float32), np.array(3.5, np.float32)))
    out.append(("empty_2d", np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)))
    out.append(("fp16_vs_fp32", a.astype(np.float16), a))
    out.append(("fp16_identical", a.astype(np.float16), a.astype(np.float16)))
    out.append(("fp64_vs_fp32", a.astype(np.float64) * 1.0000001, a))
    out.append(("fp64_identical", a.astype(np.float64), a.astype(np.float64)))
    big = np.array([1e200, -3e250, 1e-300, 5.0], np.float64)
    out.append(("fp64_squares_overflow", big, big * 1.5))
    out.append(("fp64_squares_overflow_identical", big, big.copy()))
    out.append(("fp32_extremes", np.array([3.4e38, -3.4e38, 1e-45, 0.0], np.float32),
                np.array([3.4e38, 3.4e38, 1e-45, 1e-45], np.float32)))
    out.append(("fp32_extremes_identical", np.array([3.4e38, -3.4e38, 1e-45], np.float32),
                np.array([3.4e38, -3.4e38, 1e-45], np.float32)))
    i = RNG.integers(-2**31, 2**31, 100_000).astype(np.int64)
    out.append(("int64", i, i + 1))
    out.append(("int64_identical", i, i.copy()))
    out.append(("int64_extremes_identical", np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max]),
                np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max])))
    out.append(("int32_vs_int64", i.astype(np.int32), i))
    out.append(("uint8", RNG.integers(0, 256, 1000).astype(np.uint8), RNG.integers(0, 256, 1000).astype(np.uint8)))
    bo = RNG.integers(0, 2, 70_000).astype(bool)
    out.append(("bool", bo, ~bo))
    out.append(("bool_identical", bo, bo.copy()))
    out.append(("bigendian", a.astype(">f4"), a))
    out.append(("bigendian_identical", a.astype(">f4"), a.astype(">f4")))
    out.append(("count_differs", a[:10], a[:11]))
    out.append(("shape_differs_same_count", a[:12].reshape(3, 4), a[:12].reshape(4, 3)))
    big_ident = RNG.standard_normal(700_000).astype(np.float32)       # 2.8 MB: several comparison blocks
    late = big_ident.copy()
    late[-1] += 1
    out.append(("multiblock_identical", big_ident, big_ident.copy()))
    out.append(("multiblock_differs_in_last_block", late, big_ident))
    return out


PAIRS = _pairs()


@pytest.mark.parametrize("name,a,b", PAIRS, ids=[p[0] for p in PAIRS])
def test_arrays_same_digits(name, a, b):
    _check_arrays(a, b)
    _check_arrays(a, b, chunk=1000)


@pytest.mark.parametrize("name,a,b", PAIRS, ids=[p[0] for p in PAIRS])
def test_files_same_digits(tmp_path, name, a, b):
    _check_files(tmp_path, a, b)
    _check_files(tmp_path, a, b, chunk=1000, name="small_chunks")


def test_complex_and_fortran_files_same_digits(tmp_path):
    c = (RNG.standard_normal(5000) + 1j * RNG.standard_normal(5000)).astype(np.complex64)
    _check_files(tmp_path, c, c * np.complex64(1.001), name="complex")
    _check_files(tmp_path, c, c.copy(), name="complex_same")
    f = np.asfortranarray(RNG.standard_normal((300, 200)).astype(np.float32))
    _check_files(tmp_path, f, np.ascontiguousarray(f) * np.float32(1.01), name="fortran")
    _check_files(tmp_path, f, np.asfortranarray(f * np.float32(1.01)), name="fortran_both")


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1), chunk=st.sampled_from([1, 7, 256, 65536]),
       kind=st.sampled_from(["perturbed", "bf16", "identical", "nonfinite", "scaled", "int"]))
def test_random_pairs_same_digits(n, seed, chunk, kind):
    r = np.random.default_rng(seed)
    b = (r.standard_normal(n) * 10.0 ** r.integers(-30, 30)).astype(np.float32)
    if kind == "perturbed":
        a = b + r.standard_normal(n).astype(np.float32) * np.float32(1e-3)
    elif kind == "bf16":
        a = _bf16(b)
    elif kind == "identical":
        a = b.copy()
    elif kind == "nonfinite":
        a = b.copy()
        for arr in (a, b):
            if n:
                idx = r.integers(0, n, r.integers(1, 5))
                arr[idx] = r.choice([np.nan, np.inf, -np.inf], idx.size)
    elif kind == "scaled":
        a = b * np.float32(r.uniform(-2, 2))
    else:
        b = r.integers(-1000, 1000, n).astype(np.int32)
        a = b + r.integers(0, 2, n).astype(np.int32)
    _check_arrays(a, b, chunk)


def test_random_files_with_hypothesis_like_sizes(tmp_path):
    for seed in range(6):
        r = np.random.default_rng(seed)
        n = int(r.integers(1, 400_000))
        b = r.standard_normal(n).astype(np.float32)
        a = b.copy()
        a[r.integers(0, n, 3)] += np.float32(1e-2)
        _check_files(tmp_path, a, b, name=f"r{seed}")


def test_unreadable_and_truncated_files(tmp_path):
    a = np.arange(1000, dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    raw = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(raw[:-8])
    (tmp_path / "junk.npy").write_bytes(b"not a npy file")
    for bad in ("t.npy", "junk.npy", "missing.npy"):
        m = M.pair_metrics(str(tmp_path / "a.npy"), str(tmp_path / bad))
        assert m["unreadable"] == str(tmp_path / bad) and m["n"] == 0 and "cannot read" in m["error"]
    # a layout taken before the file was cut: the size is checked again when opened
    lay = N.npy_layout(str(tmp_path / "a.npy"))
    np.save(tmp_path / "c.npy", a)
    (tmp_path / "c.npy").write_bytes(raw[:-8])
    m = M.pair_metrics(str(tmp_path / "a.npy"), str(tmp_path / "c.npy"), layout_b=lay)
    assert m["unreadable"] == str(tmp_path / "c.npy") and "truncated" in m["error"]


def test_blas_thread_count_no_longer_changes_the_digits():
    """Why the reference runs on one BLAS thread: with OpenBLAS on more threads the former
    code's dot products (over 10,000 elements) may differ in the last digits; the new code
    pins one thread, so its numbers do not depend on the machine's cores."""
    if B.set_blas_threads(1) is None:
        pytest.skip("numpy does not use OpenBLAS here: nothing to pin")
    r = np.random.default_rng(1)
    x, y = r.standard_normal(65536), r.standard_normal(65536)
    one = np.dot(x, y)
    B.set_blas_threads(2)
    try:
        new = M.tensor_metrics(x, y)
        assert B._blas()[1]() == 2          # restored after the call
    finally:
        B.set_blas_threads(1)
    _same(new, M.tensor_metrics(x, y))
    assert float(np.dot(x, y)) == float(one)


@pytest.mark.parametrize("dt", ["<f4", ">f4", "f2", "f8", "i8", "u1", "?", "c8", "<U3", "V4", "M8[s]"])
def test_header_index_equals_numpys_parser(tmp_path, dt):
    """compare's one-regex header parser gives numpy's (shape, order, dtype, offset), or
    hands the file to numpy's parser."""
    for shape in [(), (0,), (5,), (3, 4), (2, 3, 4, 5), (0, 3), (10 ** 6,)]:
        for order in "CF":
            p = tmp_path / "x.npy"
            np.save(p, np.zeros(shape, dt, order=order))
            with open(p, "rb") as f:
                np.lib.format.read_magic(f)
                shape_, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                want = (tuple(shape_), dtype, f.tell(), fortran)
            assert N.npy_layout(str(p)) == want
            fast = N._fast_header(p.read_bytes()[:512])
            assert fast is None or (fast[0], fast[2], fast[3], fast[1]) == want
    with open(tmp_path / "v2.npy", "wb") as f:          # version 2.0 header
        np.lib.format.write_array(f, np.arange(7, dtype=np.float32), version=(2, 0))
    assert N.npy_layout(str(tmp_path / "v2.npy"))[:3] == ((7,), np.dtype("float32"), 128)


_RSS_CHILD = r"""
import sys, json
import numpy as np
from opdump.analysis import metrics as M


def kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


a, b = sys.argv[1], sys.argv[2]
np.save(a[:-4] + "_tiny.npy", np.zeros(8, np.float32))
M.pair_metrics(a[:-4] + "_tiny.npy", a[:-4] + "_tiny.npy")        # buffers and imports in place
with open("/proc/self/clear_refs", "w") as f:                     # reset the peak (VmHWM) to now
    f.write("5")
before = kib("VmRSS")
m = M.pair_metrics(a, b)
same = M.pair_metrics(a, a)
print(json.dumps({"grow_kib": kib("VmHWM") - before, "n": m["n"], "cos": m["cosine"], "same_n": same["n"]}))
"""


def test_memory_stays_bounded_on_a_large_pair(tmp_path):
    """A 48 MB pair is streamed through fixed buffers: the process's peak RSS grows by a few
    MB, not by the files (reading them whole, or touching a memory map of them, adds ~96 MB)."""
    import json
    import subprocess
    import sys
    n = 12 << 20                                   # 12 Mi float32 = 48 MiB per file
    r = np.random.default_rng(3)
    a = r.standard_normal(n, dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", a * np.float32(1.0001))
    del a
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(tmp_path / "a.npy"), str(tmp_path / "b.npy")],
                         capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["n"] == n and res["same_n"] == n and res["cos"] > 0.999
    assert res["grow_kib"] < 16 * 1024, res


def _clear_refs_works() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


if not _clear_refs_works():   # the peak-RSS reset needs Linux >= 4.0 and a writable /proc
    test_memory_stays_bounded_on_a_large_pair = pytest.mark.skip(
        reason="cannot reset the peak RSS (/proc/self/clear_refs) on this system")(test_memory_stays_bounded_on_a_large_pair)
