"""Small pairs compared in batches (opdump/analysis/metrics_batch.py, issue 25) give the
numbers the former per-pair implementation gives, to the last digit.

The reference is ``reference_pair_metrics`` of tests/test_compare_speed_equivalence.py
(a verbatim copy of the metric code before the speed work, reading with ``np.load``).
Every case there, plus cases aimed at the batch's own shortcuts -- equal values decided
without the dot products (``-0.0`` against ``0.0``, NaN with other payloads, which must
not count as identical unless the old pass said so), finiteness read from the per-pair
maxima, pairs of mixed dtypes and sizes in one batch, unreadable files in the middle of a
batch -- goes through :func:`batch_metrics` and through compare's worker pool.
"""
from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from opdump.analysis import blas as B
from opdump.analysis import metrics as M
from opdump.analysis.compare.pool import run_pairs
from opdump.analysis.metrics_batch import batch_metrics, batchable
from opdump.analysis.reader import npy as N
from test_compare_speed_equivalence import PAIRS, _same, reference_pair_metrics


def _nan_with_payload(payload: int, dtype=np.float32) -> np.ndarray:
    if dtype == np.float32:
        return np.frombuffer(struct.pack("<I", 0x7FC00000 | payload), np.float32)
    return np.frombuffer(struct.pack("<Q", 0x7FF8000000000000 | payload), np.float64)


def _extra_pairs():
    r = np.random.default_rng(7)
    out = []
    for n in (1, 7, 8, 9, 100, 4096, 65536):
        z = np.zeros(n, np.float32)
        out.append((f"negzero_vs_zero_{n}", -z, z))
        x = r.standard_normal(n).astype(np.float32)
        y = x.copy()
        y[:: 3] = -0.0
        x2 = y.copy()
        x2[:: 3] = 0.0
        out.append((f"signed_zeros_mixed_{n}", x2, y))
        out.append((f"identical_{n}", x, x.copy()))
        out.append((f"perturbed_{n}", x * np.float32(1.0001), x))
        out.append((f"fp64_negzero_{n}", -np.zeros(n), np.zeros(n)))
    for dt in (np.float32, np.float64):
        x = r.standard_normal(50).astype(dt)
        a, b = x.copy(), x.copy()
        a[3] = _nan_with_payload(1, dt)[0]
        b[3] = _nan_with_payload(2, dt)[0]
        out.append((f"nan_payloads_differ_{np.dtype(dt).name}", a, b))
        b2 = x.copy()
        b2[4] = _nan_with_payload(1, dt)[0]
        out.append((f"nan_other_place_{np.dtype(dt).name}", a, b2))
        a3 = x.copy()
        a3[0] = np.inf
        out.append((f"inf_in_a_only_{np.dtype(dt).name}", a3, x.copy()))
        out.append((f"inf_in_b_only_{np.dtype(dt).name}", x.copy(), a3))
    big = np.array([1.7e308, -1.7e308, 3.0], np.float64)
    out.append(("fp64_difference_overflows", big, -big))
    out.append(("fp64_equal_huge", big, big.copy()))
    sq = np.array([1e100, 2.0], np.float64)          # sum of squares 1e200: its square overflows
    out.append(("fp64_equal_square_of_sum_overflows", sq, sq.copy()))
    out.append(("fp16_identical_small", np.arange(33, dtype=np.float16), np.arange(33, dtype=np.float16)))
    out.append(("fp16_vs_fp32_small", np.arange(33, dtype=np.float16), np.arange(33, dtype=np.float32) * 1.001))
    out.append(("int64_extremes_small", np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0]),
                np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0])))
    out.append(("int64_near_extremes", np.array([np.iinfo(np.int64).max, 5]), np.array([np.iinfo(np.int64).max - 1, 5])))
    out.append(("uint8_small", np.arange(200, dtype=np.uint8), np.arange(200, dtype=np.uint8)[::-1].copy()))
    out.append(("bool_small", np.array([True, False, True]), np.array([True, True, False])))
    out.append(("bool_identical_small", np.array([True, False, True]), np.array([True, False, True])))
    out.append(("bigendian_small", np.arange(20, dtype=">f4"), np.arange(20, dtype="<f4")))
    out.append(("bigendian_identical_small", np.arange(20, dtype=">f4"), np.arange(20, dtype=">f4")))
    out.append(("scalar_0d_negzero", np.array(-0.0, np.float32), np.array(0.0, np.float32)))
    out.append(("zero_vs_small", np.zeros(10, np.float32), np.full(10, 1e-30, np.float32)))
    out.append(("relative_errors_between_limits", np.full(10, 1.002, np.float32), np.ones(10, np.float32)))
    return out


CASES = PAIRS + _extra_pairs()


def _files(tmp_path, cases):
    """(task, reference) per case: the files written, layouts read as compare's index does."""
    out = []
    for i, (name, a, b) in enumerate(cases):
        pa, pb = tmp_path / f"{i}_{name}_a.npy", tmp_path / f"{i}_{name}_b.npy"
        np.save(pa, a)
        np.save(pb, b)
        with B.single_thread_blas():
            ref = reference_pair_metrics(pa, pb)
        task = (i, str(pa), str(pb), a.nbytes + b.nbytes, N.npy_layout(str(pa)), N.npy_layout(str(pb)))
        out.append((name, task, ref))
    return out


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return _files(tmp_path_factory.mktemp("batch"), CASES)


def test_the_batch_path_is_taken():
    """The cases cover the batch itself, not only its per-pair fallbacks."""
    lay = lambda a: ((a.shape), a.dtype, 128, False)                      # noqa: E731
    assert batchable(lay(np.zeros(7, np.float32)), lay(np.zeros(7, np.float16)))
    assert batchable(lay(np.zeros((), np.float32)), lay(np.zeros((), np.float32)))
    assert not batchable(lay(np.zeros(0, np.float32)), lay(np.zeros(0, np.float32)))
    assert not batchable(lay(np.zeros(65537, np.float32)), lay(np.zeros(65537, np.float32)))
    assert not batchable(lay(np.zeros(7, np.complex64)), lay(np.zeros(7, np.complex64)))
    assert sum(1 for _n, a, b in CASES if 0 < a.size <= M.METRIC_CHUNK and a.size == b.size) > 80


def test_one_batch_of_everything_same_digits(cases):
    tasks = [t for _n, t, _r in cases]
    random.Random(3).shuffle(tasks)
    got = dict(batch_metrics(tasks))
    assert len(got) == len(cases)
    for name, task, ref in cases:
        try:
            _same(got[task[0]], ref)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_pairs_alone_and_in_small_groups_same_digits(cases):
    for size in (1, 5):
        for s in range(0, len(cases), size):
            part = cases[s:s + size]
            got = dict(batch_metrics([t for _n, t, _r in part]))
            for name, task, ref in part:
                try:
                    _same(got[task[0]], ref)
                except AssertionError as e:
                    raise AssertionError(f"{name} (groups of {size}): {e}") from None


def test_identical_shortcut_does_not_swallow_signed_zeros_or_payloads(cases):
    """-0.0 vs 0.0 and NaN payloads: the bytes differ; the result is whatever the old pass says
    (here: NaN with another payload at the same place agrees, a NaN elsewhere does not)."""
    by = {n: r for n, _t, r in cases}
    assert by["nan_payloads_differ_float32"]["nonfinite_mismatch"] == 0
    assert by["nan_other_place_float32"]["nonfinite_mismatch"] == 2
    assert by["negzero_vs_zero_7"]["cosine"] == 1.0 and by["negzero_vs_zero_7"]["max_abs_err"] == 0.0


def test_unreadable_files_in_a_batch(tmp_path):
    good = np.arange(100, dtype=np.float32)
    paths = {}
    for name in ("a", "b", "c", "t", "d"):
        paths[name] = str(tmp_path / f"{name}.npy")
        np.save(paths[name], good * (2 if name == "b" else 1))
    lay = N.npy_layout(paths["a"])
    raw = open(paths["t"], "rb").read()
    with open(paths["t"], "wb") as f:                 # cut after its layout was read
        f.write(raw[:-8])
    missing = str(tmp_path / "missing.npy")
    tasks = [(0, paths["a"], paths["b"], 800, lay, lay), (1, paths["a"], paths["t"], 800, lay, lay),
             (2, missing, paths["c"], 800, lay, lay), (3, paths["t"], missing, 800, lay, lay),
             (4, paths["c"], paths["d"], 800, lay, lay)]
    got = dict(batch_metrics(tasks))
    for idx, pa, pb, *_ in tasks:
        _same(got[idx], M.pair_metrics(pa, pb, M.METRIC_CHUNK, lay, lay))
    assert got[1]["unreadable"] == paths["t"] and "truncated" in got[1]["error"]
    assert got[2]["unreadable"] == missing and got[3]["unreadable"] == paths["t"]
    assert got[4]["cosine"] == 1.0 and "error" not in got[0]


@pytest.mark.parametrize("workers", [1, 2])
def test_worker_pool_same_digits(cases, workers):
    """compare's pool (real worker processes with 2): small pairs in batches, large ones alone."""
    tasks = [t for _n, t, _r in cases]
    got = run_pairs(tasks, workers, parallel_min=2, progress=False)
    for name, task, ref in cases:
        try:
            _same(got[task[0]], ref)
        except AssertionError as e:
            raise AssertionError(f"{name} (workers {workers}): {e}") from None
