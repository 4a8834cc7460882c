"""The column-wise tensor-file compare (opdump/analysis/compare/tensor_fast.py and
tensor_pairs.py) gives what the per-pair stages give: the same table (values, dtypes, row
order), CSV bytes, summary, first difference, first divergence and unreadable list -- on
generated tensor dumps (random data, perturbed weights, NaN/Inf at different places,
fp16 and bf16-rounded data against fp32, empty, 0-d and int tensors, skipped and random
operators, two ranks, io/iteration/parameter filters) and on real eager captures whose
equal-signature calls the value tie-break re-pairs; and it steps aside (the per-pair
stages answer) where its conditions fail: a shape or element count that differs, an
unreadable header, an operator on one side only.  ``OPDUMP_COMPARE_FAST=0`` forces the
per-pair stages.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from opdump.analysis.compare import compare
from opdump.analysis.compare import run as run_mod

from analysis_fixtures import file_of, make_dump


def _spy(monkeypatch):
    """Record whether the column-wise path answered (its return value is not None)."""
    seen = []
    real = run_mod.tensor_compare

    def spy(*a, **k):
        r = real(*a, **k)
        seen.append(r is not None)
        return r
    monkeypatch.setattr(run_mod, "tensor_compare", spy)
    return seen, real


def _both(monkeypatch, tmp_path, a, b, before=lambda: None, **kw):
    """(per-pair result, column-wise result, whether the column-wise path answered);
    ``before()`` runs before each compare."""
    kw.setdefault("progress", False)
    kw.setdefault("workers", 1)
    monkeypatch.setenv("OPDUMP_COMPARE_FAST", "0")
    before()
    slow = compare(a, b, **kw)
    monkeypatch.setenv("OPDUMP_COMPARE_FAST", "1")
    seen, real = _spy(monkeypatch)
    before()
    fast = compare(a, b, **kw)
    monkeypatch.setattr(run_mod, "tensor_compare", real)
    pd.testing.assert_frame_equal(slow.table, fast.table, check_exact=True)
    assert list(slow.table.dtypes) == list(fast.table.dtypes)
    slow.to_csv(tmp_path / "slow.csv")
    fast.to_csv(tmp_path / "fast.csv")
    assert (tmp_path / "slow.csv").read_bytes() == (tmp_path / "fast.csv").read_bytes()
    assert _same(slow.to_dict(), fast.to_dict())
    for attr in ("first_difference", "first_divergence", "nondeterministic_before", "diverged_parameters",
                 "unreadable", "matched_by", "operators", "warnings", "rule", "rule_note", "unmatched_a",
                 "unmatched_b", "iterations"):
        if hasattr(slow, attr):
            assert _same(getattr(slow, attr), getattr(fast, attr)), attr
    return slow, fast, bool(seen and seen[-1])


def _same(x, y) -> bool:
    """Equal, NaN equal to NaN (summaries hold metric floats)."""
    if isinstance(x, float) and isinstance(y, float):
        return x == y or (x != x and y != y)
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(_same(p, q) for p, q in zip(x, y))
    return x == y


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfast")
    out = {}
    out["a"] = make_dump(root / "a", iterations=(0, 1, 2))
    out["same"] = make_dump(root / "same", iterations=(0, 1, 2))
    out["perturbed"] = make_dump(root / "perturbed", iterations=(0, 1, 2), weight_delta={"fc1.weight": 1e-3},
                                 dropout_seed=1)
    out["nan_a"] = make_dump(root / "nan_a", iterations=(0, 1, 2), nan_weight_at=1)
    out["inf_b"] = make_dump(root / "inf_b", iterations=(0, 1, 2), overflow_at=1, nan_weight_at=2)
    out["fp16"] = make_dump(root / "fp16", iterations=(0, 1, 2), dtype=np.float16)
    out["extra"] = make_dump(root / "extra", iterations=(0, 1, 2), extra_op=True)
    for r in (0, 1):                                   # two ranks
        make_dump(root / "ranks_a", iterations=(0, 1), rank=r)
        make_dump(root / "ranks_b", iterations=(0, 1), rank=r, weight_delta={"fc2.bias": 0.5} if r else None)
    out["ranks_a"], out["ranks_b"] = root / "ranks_a", root / "ranks_b"
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite(root: Path, op: str, io: str, slot: int, arr: np.ndarray, iteration: int = 0, graph: int = 0) -> None:
    """Replace one tensor file's data (same file name: the dtype in the name is kept)."""
    p = file_of(root, op, io, slot, iteration=iteration, graph=graph)
    with open(p, "wb") as f:
        np.save(f, arr, allow_pickle=False)


@pytest.mark.parametrize("b", ["same", "perturbed", "nan_a", "inf_b", "fp16"])
def test_same_results_as_the_per_pair_stages(monkeypatch, tmp_path, dumps, b):
    slow, fast, taken = _both(monkeypatch, tmp_path, dumps["a"], dumps[b])
    assert taken
    t = fast.table
    assert (t["mode"] == "tensor").any() and (t["verdict"] == "skipped").any()      # empty_like's garbage
    if b == "perturbed":
        assert (t["verdict"] == "diverged").any() or (t["verdict"] == "warning").any()
        assert (t["verdict"] == "nondeterministic").any()                           # the dropout's mask
    if b == "same":
        assert fast.first_difference is None and t.loc[t["mode"] == "tensor", "identical"].all()


def test_nonfinite_on_the_other_side_and_reversed(monkeypatch, tmp_path, dumps):
    """NaN in A's weight at one iteration, Inf/NaN in B's at others; also B against A."""
    _, fast, taken = _both(monkeypatch, tmp_path, dumps["inf_b"], dumps["nan_a"])
    assert taken and (fast.table["nonfinite_mismatch"].fillna(0) > 0).any()
    _, _, taken = _both(monkeypatch, tmp_path, dumps["nan_a"], dumps["a"])
    assert taken


def test_edge_arrays_empty_0d_int_bf16(monkeypatch, tmp_path, dumps):
    """Empty, 0-d, int and bf16-rounded files on both sides (same shapes: the join holds)."""
    a, b = _copy(dumps["a"], tmp_path / "ea"), _copy(dumps["perturbed"], tmp_path / "eb")
    rng = np.random.default_rng(5)
    relu, addmm, mul = "Default/Net/relu-op2", "Default/Net/fc2-Linear/addmm-op7", "Default/Net/mul-op8"
    for root, k in ((a, 0), (b, 1)):
        _rewrite(root, relu, "output", 0, np.zeros((0, 16), np.float32))                       # empty
        _rewrite(root, mul, "input", 1, np.array(2.0 + k, np.float32))                          # 0-d
        _rewrite(root, addmm, "output", 0, rng.integers(-5, 5, (4, 4)).astype(np.int64))        # int
        x = rng.standard_normal((4, 16)).astype(np.float32)
        if k:
            x = torch.from_numpy(x).bfloat16().float().numpy()                                # bf16-rounded
        _rewrite(root, relu, "output", 0, x, iteration=1)
    slow, fast, taken = _both(monkeypatch, tmp_path, a, b)
    assert taken
    t = fast.table
    assert (t["shape_a"] == "()").any() and (t["shape_a"] == "(0,16)").any()


def test_two_ranks_and_filters(monkeypatch, tmp_path, dumps):
    a, b = dumps["ranks_a"], dumps["ranks_b"]
    for kw in ({}, {"io": "output"}, {"include_parameters": False}, {"iterations": [(0, 1)]}, {"rank": 1},
               {"rank": 0, "rank_b": 1}):
        _, fast, taken = _both(monkeypatch, tmp_path, a, b, **kw)
        assert taken, kw


def test_worker_pool(monkeypatch, tmp_path, dumps):
    """The metrics from worker processes (two workers, every pair in the pool)."""
    _, _, taken = _both(monkeypatch, tmp_path, dumps["a"], dumps["perturbed"], workers=2, parallel_min=1)
    assert taken


def test_steps_aside_where_its_conditions_fail(monkeypatch, tmp_path, dumps):
    """Shape (same count), element count, an unreadable header, an extra operator: the
    per-pair stages answer, with the same results."""
    relu = "Default/Net/relu-op2"
    cases = {}
    b = _copy(dumps["perturbed"], tmp_path / "shape")
    _rewrite(b, relu, "output", 0, np.ones((16, 4), np.float32))
    cases["shape"] = b
    b = _copy(dumps["perturbed"], tmp_path / "count")
    _rewrite(b, relu, "output", 0, np.ones((4, 15), np.float32))
    cases["count"] = b
    b = _copy(dumps["perturbed"], tmp_path / "trunc")
    p = file_of(b, relu, "output", 0)
    p.write_bytes(p.read_bytes()[:100])
    cases["truncated"] = b
    cases["extra"] = dumps["extra"]
    for name, b in cases.items():
        slow, fast, taken = _both(monkeypatch, tmp_path, dumps["a"], b)
        assert not taken, name
    assert slow.unmatched_b or (slow.table["verdict"] == "unmatched").any()


# -- real captures: equal-signature calls the value tie-break re-pairs --------------------
class Twice(torch.nn.Module):
    """Two equal-signature ``mul`` calls in one scope, run in either order."""

    def __init__(self, swap=False):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.swap = swap

    def forward(self, x):
        h = self.fc(x)
        if self.swap:
            b = h * 3.0
            a = h * 2.0
        else:
            a = h * 2.0
            b = h * 3.0
        return (a - b).add(1.0).sum()


def _capture(root, swap):
    import opdump
    from opdump.capture.eager import EagerCapture
    from opdump.config import DumpConfig, IterationSpec
    torch.manual_seed(0)
    model = Twice(swap)
    cfg = DumpConfig(path=str(root), iteration=IterationSpec(ranges=((0, 0),)))
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    with opdump.Session(cfg) as s, EagerCapture(s):
        model(x).backward()
    return root


def test_tie_break_on_real_captures(monkeypatch, tmp_path):
    plain, swap = _capture(tmp_path / "plain", False), _capture(tmp_path / "swap", True)
    slow, fast, taken = _both(monkeypatch, tmp_path, swap, plain)
    assert taken
    muls = fast.table[fast.table["op_type"] == "mul"]
    assert len(muls) and (muls["max_abs_err"] == 0).all()           # re-paired by value, as per pair
    _, _, taken = _both(monkeypatch, tmp_path, plain, plain)
    assert taken


def test_a_file_gone_after_its_header_was_read(monkeypatch, tmp_path, dumps):
    """A file removed between the header index and the metric pass (a dump being cleaned
    up): its pair is unreadable, named in the summary, the same way on both paths."""
    b = _copy(dumps["perturbed"], tmp_path / "gone")
    target = str(file_of(b, "Default/Net/relu-op2", "output", 0, iteration=1))
    keep = tmp_path / "kept.npy"
    shutil.copy(target, keep)
    real = run_mod._layouts

    def layouts_then_remove(paths, *sizes):
        out = real(paths, *sizes)
        if target in paths:
            Path(target).unlink()
        return out
    monkeypatch.setattr(run_mod, "_layouts", layouts_then_remove)
    slow, fast, taken = _both(monkeypatch, tmp_path, dumps["a"], b, before=lambda: shutil.copy(keep, target))
    assert taken and [p for p, _ in fast.unreadable] == [target]
    assert (fast.table["verdict"] == "unreadable").sum() == 1


def test_header_index_with_the_scans_sizes(tmp_path):
    """``npy_layouts_sized`` (one system call a file less) gives what ``npy_layout`` gives
    -- the layout, or an exception with the same text -- for plain, Fortran-order, version
    2, object, truncated, bad-magic and empty files, and when the size is unknown (0)."""
    import os
    from opdump.analysis.reader import npy as N
    files = {}
    files["plain"] = np.arange(12, dtype=np.float32).reshape(3, 4)
    files["fortran"] = np.asfortranarray(np.ones((3, 5), np.int64))
    files["zero_d"] = np.array(3.5)
    files["empty"] = np.zeros((0, 7), np.float16)
    paths = []
    for name, arr in files.items():
        p = tmp_path / f"{name}.npy"
        np.save(p, arr, allow_pickle=False)
        paths.append(str(p))
    p = tmp_path / "v2.npy"
    with open(p, "wb") as f:
        np.lib.format.write_array(f, np.ones(4, np.int32), version=(2, 0))
    paths.append(str(p))
    p = tmp_path / "objects.npy"
    np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    paths.append(str(p))
    p = tmp_path / "truncated.npy"
    np.save(p, np.ones(100, np.float64))
    p.write_bytes(p.read_bytes()[:300])
    paths.append(str(p))
    p = tmp_path / "magic.npy"
    p.write_bytes(b"not a numpy file at all" * 10)
    paths.append(str(p))
    p = tmp_path / "nothing.npy"
    p.write_bytes(b"")
    paths.append(str(p))

    def one(path):
        try:
            return N.npy_layout(path)
        except Exception as e:  # noqa: BLE001
            return e
    sizes = [os.path.getsize(x) for x in paths]
    for got, want in zip(N.npy_layouts_sized(paths, sizes) + N.npy_layouts_sized(paths, [0] * len(paths)),
                         [one(x) for x in paths] * 2):
        if isinstance(want, Exception):
            assert type(got) is type(want) and str(got) == str(want)
        else:
            assert got == want


def test_the_real_mindspore_sample(monkeypatch, tmp_path):
    """MindSpore's own CPU dump of an MLP (tests/data/mindspore_cpu_mlp) against a copy whose
    first weight file is scaled: the column-wise path answers, with the per-pair results."""
    from analysis_fixtures import MS_SAMPLE
    b = _copy(MS_SAMPLE, tmp_path / "ms_b")
    folder = next(p for p in sorted((b / "rank_0").rglob("*.npy")) if "Parameter" in p.name or "input" in p.name)
    arr = np.load(folder)
    np.save(folder, (arr * 1.001).astype(arr.dtype) if arr.dtype.kind == "f" else arr, allow_pickle=False)
    _, fast, taken = _both(monkeypatch, tmp_path, MS_SAMPLE, b)
    assert taken and len(fast.table)
