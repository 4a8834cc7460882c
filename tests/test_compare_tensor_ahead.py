"""The tensor metrics started ahead of the pairing (opdump/analysis/compare/tensor_ahead.py):
with two workers the column-wise compare gives exactly what the per-pair stages give
(``OPDUMP_COMPARE_FAST=0``), the metrics computed ahead are really used, pairs that the
pairing makes differently (the value tie-break) or whose header differs from what the
worker read are computed again, and no worker process or thread outlives the compare.
"""
from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

from opdump.analysis.compare import compare
from opdump.analysis.compare import tensor_ahead

from analysis_fixtures import make_dump
from test_compare_tensor_fast import _both, _capture, _copy, _rewrite


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("tahead")
    out = {"a": make_dump(root / "a", iterations=(0, 1, 2))}
    out["perturbed"] = make_dump(root / "perturbed", iterations=(0, 1, 2), weight_delta={"fc1.weight": 1e-3},
                                 dropout_seed=1)
    out["inf_b"] = make_dump(root / "inf_b", iterations=(0, 1, 2), overflow_at=1, nan_weight_at=2)
    out["fp16"] = make_dump(root / "fp16", iterations=(0, 1, 2), dtype=np.float16)
    for r in (0, 1):
        make_dump(root / "ranks_a", iterations=(0, 1), rank=r)
        make_dump(root / "ranks_b", iterations=(0, 1), rank=r, weight_delta={"fc2.bias": 0.5} if r else None)
    out["ranks_a"], out["ranks_b"] = root / "ranks_a", root / "ranks_b"
    return out


def _spy_take(monkeypatch):
    """Record (pairs answered ahead, pairs left to the pool) of every Ahead.take."""
    seen = []
    real = tensor_ahead.Ahead.take

    def take(self, tasks):
        got, rest = real(self, tasks)
        seen.append((len(got), len(rest)))
        return got, rest
    monkeypatch.setattr(tensor_ahead.Ahead, "take", take)
    return seen


POOL = {"workers": 2, "parallel_min": 1}


@pytest.mark.parametrize("b", ["a", "perturbed", "inf_b", "fp16"])
def test_same_results_with_the_metrics_ahead(monkeypatch, tmp_path, dumps, b):
    seen = _spy_take(monkeypatch)
    _, fast, taken = _both(monkeypatch, tmp_path, dumps["a"], dumps[b], **POOL)
    assert taken
    assert seen and seen[-1][0] == (fast.table["mode"] == "tensor").sum() and seen[-1][1] == 0


def test_edge_arrays_two_ranks_and_filters(monkeypatch, tmp_path, dumps):
    a, b = _copy(dumps["a"], tmp_path / "ea"), _copy(dumps["perturbed"], tmp_path / "eb")
    relu, mul = "Default/Net/relu-op2", "Default/Net/mul-op8"
    for root, k in ((a, 0), (b, 1)):
        _rewrite(root, relu, "output", 0, np.zeros((0, 16), np.float32))                       # empty
        _rewrite(root, mul, "input", 1, np.array(2.0 + k, np.float32))                          # 0-d
    seen = _spy_take(monkeypatch)
    _, _, taken = _both(monkeypatch, tmp_path, a, b, **POOL)
    assert taken and seen[-1][0] > 0
    for kw in ({}, {"io": "output"}, {"include_parameters": False}, {"iterations": [(0, 1)]}, {"rank": 1}):
        _, _, taken = _both(monkeypatch, tmp_path, dumps["ranks_a"], dumps["ranks_b"], **POOL, **kw)
        assert taken, kw


def test_pairs_made_otherwise_are_computed_again(monkeypatch, tmp_path):
    """Equal-signature calls run in the other order: the value tie-break pairs them across
    positions, so what the workers computed position by position is not theirs."""
    plain, swap = _capture(tmp_path / "plain", False), _capture(tmp_path / "swap", True)
    seen = _spy_take(monkeypatch)
    _, fast, taken = _both(monkeypatch, tmp_path, swap, plain, **POOL)
    assert taken and seen[-1][0] > 0 and seen[-1][1] > 0
    muls = fast.table[fast.table["op_type"] == "mul"]
    assert len(muls) and (muls["max_abs_err"] == 0).all()


def test_a_header_other_than_the_workers_is_not_used(dumps):
    """A task whose layout differs from the one the worker read goes to the pool."""
    from opdump.analysis.reader import open_dump
    from opdump.analysis.reader.npy import npy_layout
    from opdump.analysis.compare.stat_fast import _its, _positions
    ra, rb = open_dump(dumps["a"]).records(), open_dump(dumps["perturbed"]).records()
    ra, rb = ra[ra["path"].notna()].reset_index(drop=True), rb[rb["path"].notna()].reset_index(drop=True)
    its = [(ia, ia) for ia in sorted(set(_its(ra)))]
    ahead = tensor_ahead.start([(ra, rb)], [tensor_ahead.positions_of(_its(ra), _its(rb), its, _positions)], 2, 1)
    assert ahead is not None
    pa, pb = ra["path"].tolist()[:2], rb["path"].tolist()[:2]
    tasks = []
    for k in range(2):
        la, lb = npy_layout(pa[k]), npy_layout(pb[k])
        if k == 1:
            lb = (lb[0], np.dtype(np.float64) if lb[1] != np.float64 else np.dtype(np.float32), lb[2], lb[3])
        tasks.append((k, pa[k], pb[k], 0, la, lb))
    got, rest = ahead.take(tasks)
    assert list(got) == [0] and [t[0] for t in rest] == [1]
    assert ahead.executor is None and not multiprocessing.active_children()


def test_nothing_left_running_and_the_switch(monkeypatch, dumps):
    seen = _spy_take(monkeypatch)
    before = set(threading.enumerate())             # threads other tests left (tqdm's monitor...)
    compare(dumps["a"], dumps["perturbed"], progress=False, **POOL)
    assert seen and not set(threading.enumerate()) - before and not multiprocessing.active_children()
    monkeypatch.setenv("OPDUMP_COMPARE_AHEAD", "0")
    seen.clear()
    compare(dumps["a"], dumps["perturbed"], progress=False, **POOL)
    assert not seen
    monkeypatch.delenv("OPDUMP_COMPARE_AHEAD")
    compare(dumps["a"], dumps["perturbed"], progress=False, workers=1, parallel_min=1)
    assert not seen                                   # one worker: the metric stage stays here


def test_whole_file_read_gives_the_header_index_answer(tmp_path):
    """A worker's one-``pread`` read of a small file gives the layout (or the exception, same
    type and text) the header index gives with the same scan size -- plain, Fortran, 0-d,
    empty, version 2, object, truncated, bad magic, empty file, and a size that is no longer
    the file's -- and the bytes only when the file still has that size."""
    import os
    from opdump.analysis.reader import npy as N
    arrays = {"plain": np.arange(12, dtype=np.float32).reshape(3, 4), "zero_d": np.array(3.5),
              "fortran": np.asfortranarray(np.ones((3, 5), np.int64)), "empty": np.zeros((0, 7), np.float16),
              "big": np.ones(40_000, np.float32)}                # above WHOLE_MAX: header only
    paths = []
    for name, arr in arrays.items():
        np.save(tmp_path / f"{name}.npy", arr, allow_pickle=False)
        paths.append(str(tmp_path / f"{name}.npy"))
    with open(tmp_path / "v2.npy", "wb") as f:
        np.lib.format.write_array(f, np.ones(4, np.int32), version=(2, 0))
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "truncated.npy", np.ones(100, np.float64))
    (tmp_path / "truncated.npy").write_bytes((tmp_path / "truncated.npy").read_bytes()[:300])
    (tmp_path / "magic.npy").write_bytes(b"not a numpy file at all" * 10)
    (tmp_path / "nothing.npy").write_bytes(b"")
    paths += [str(tmp_path / f"{n}.npy") for n in ("v2", "objects", "truncated", "magic", "nothing")]
    for p in paths:
        real = os.path.getsize(p)
        for size in {real, max(0, real - 1), real + 1, 0}:
            got, data = tensor_ahead._read_whole(p, size)
            want = N.npy_layouts_sized([p], [size])[0]
            if isinstance(want, Exception):
                assert type(got) is type(want) and str(got) == str(want), (p, size)
            else:
                assert got == want, (p, size)
            if data is not None:
                assert size == real <= tensor_ahead.WHOLE_MAX and data == open(p, "rb").read()


def test_progress_bar_counts_the_pairs_computed_ahead(monkeypatch, dumps):
    """With ``progress`` the bar (tqdm through common.progress_bar; off a terminal tqdm
    draws nothing) is advanced by every pair the workers compared ahead, and closed."""
    from opdump.analysis import common
    made = []
    real = common.progress_bar

    class Counting:
        def __init__(self, bar, total):
            self.bar, self.total, self.n, self.closed = bar, total, 0, False

        def update(self, k):
            self.n += k
            self.bar.update(k)

        def close(self):
            self.closed = True
            self.bar.close()

    def bar(enabled, total, desc, unit):
        b = real(enabled, total, desc, unit)
        if b is not None:
            b = Counting(b, total)
            made.append(b)
        return b
    monkeypatch.setattr(common, "progress_bar", bar)
    seen = _spy_take(monkeypatch)
    compare(dumps["a"], dumps["perturbed"], progress=True, **POOL)
    assert seen and made
    assert made[0].n == made[0].total >= seen[-1][0] > 0 and made[0].closed


def test_not_started_where_the_column_wise_pairing_steps_aside(monkeypatch, tmp_path, dumps):
    """An operator on one side only (a different row count) or renamed: the per-pair stages
    pair the records, so nothing is computed ahead to be thrown away."""
    from analysis_fixtures import file_of
    started = []
    real = tensor_ahead.start

    def spy(*a, **k):
        r = real(*a, **k)
        started.append(r is not None)
        return r
    monkeypatch.setattr(tensor_ahead, "start", spy)
    extra = make_dump(tmp_path / "extra", iterations=(0, 1, 2), extra_op=True)
    _, _, taken = _both(monkeypatch, tmp_path, dumps["a"], extra, **POOL)
    assert not taken and started == [False]
    renamed = _copy(dumps["perturbed"], tmp_path / "renamed")
    p = file_of(renamed, "Default/Net/relu-op2", "output", 0)
    p.rename(p.with_name(p.name.replace("relu", "gelu")))
    started.clear()
    _, _, taken = _both(monkeypatch, tmp_path, dumps["a"], renamed, **POOL)
    assert not taken and started == [False]
    started.clear()
    _, _, taken = _both(monkeypatch, tmp_path, dumps["a"], dumps["perturbed"], **POOL)
    assert taken and started == [True]
