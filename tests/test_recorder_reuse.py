"""The recorder computes statistics once per tensor and shares host copies between an
operator's output and a later operator's input — but never across an in-place update."""
import csv
import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import opdump
from opdump.capture.eager import EagerCapture
from dumpfiles import tensor_files
from conftest import write_config


class InPlace(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        y.add_(1.0)            # same tensor object, new version
        return y * 2


@pytest.mark.parametrize("mode", ["host", "device"])
def test_statistics_follow_inplace_updates(tmp_path, mode):
    cfg = write_config(tmp_path, common={"iteration": "0", "saved_data": "full",
                                         "statistic_category": ["max", "min", "avg"]},
                       e2e={"stat_calc_mode": mode})
    x = torch.tensor([[-1.0, 2.0], [3.0, -4.0]])
    with opdump.Session(cfg) as session, EagerCapture(session):
        InPlace()(x)
    root = str(tmp_path / "dump")
    files = {(f.ts): f for f in tensor_files(root)}
    rows = []
    for dirpath, _, names in os.walk(root):
        if "statistic.csv" in names:
            rows += list(csv.DictReader(open(os.path.join(dirpath, "statistic.csv"))))
    assert rows
    for row in rows:      # every row agrees with its own file, reuse or not
        arr = files[int(row["Timestamp"])].load()
        assert float(row["Max Value"]) == arr.max() and float(row["Min Value"]) == arr.min()
    mul_in = next(r for r in rows if r["Op Type"] == "mul" and r["IO"] == "input")
    relu_out = next(r for r in rows if r["Op Type"] == "relu" and r["IO"] == "output")
    assert float(relu_out["Max Value"]) == 3.0 and float(mul_in["Max Value"]) == 4.0
    np.testing.assert_array_equal(files[int(mul_in["Timestamp"])].load(), [[1.0, 3.0], [4.0, 1.0]])


class ViewsAndInPlace(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        v = y.t()              # a view: its statistics are y's
        s = v * 1.0
        y[2:].add_(1.0)        # written through another view: v's values change too
        return v * 2 + s


def test_statistics_of_views_follow_an_inplace_update_of_their_base(tmp_path):
    """Views reuse the statistics of the memory they read only while nothing wrote to it."""
    cfg = write_config(tmp_path, common={"iteration": "0", "saved_data": "full",
                                         "statistic_category": ["max", "min", "l2norm"]},
                       e2e={"stat_calc_mode": "device"})
    x = torch.arange(-6.0, 6.0).reshape(3, 4)
    with opdump.Session(cfg) as session, EagerCapture(session):
        ViewsAndInPlace()(x)
    root = str(tmp_path / "dump")
    files = {f.ts: f for f in tensor_files(root)}
    rows = []
    for dirpath, _, names in os.walk(root):
        if "statistic.csv" in names:
            rows += list(csv.DictReader(open(os.path.join(dirpath, "statistic.csv"))))
    assert len(rows) >= 10
    for row in rows:
        arr = files[int(row["Timestamp"])].load().astype(np.float64)
        assert float(row["Max Value"]) == arr.max() and float(row["Min Value"]) == arr.min(), row
        assert float(row["L2Norm Value"]) == pytest.approx(np.sqrt((arr ** 2).sum()), rel=1e-6), row
    muls = [r for r in rows if r["Op Type"] == "mul" and r["IO"] == "input" and r["Slot"] == "0"]
    assert [float(r["Max Value"]) for r in muls] == [5.0, 6.0]      # before and after add_


class _Reference(TorchDispatchMode):
    """An independent capture: each operator's tensor inputs (before it runs) and outputs
    (after; the written arguments of an operator returning nothing), cloned."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        ins = [t.clone() for t in flat]
        out = func(*args, **kwargs)
        schema = func._schema
        if schema.returns:
            outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        else:
            written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
            outs = [t for t in pytree.tree_leaves([args[i] if i < len(args) else kwargs[a.name]
                                                   for i, a in enumerate(schema.arguments) if a.name in written])
                    if isinstance(t, torch.Tensor)]
        self.seen.append((func.overloadpacket.__name__, ins, [t.clone() for t in outs]))
        return out


class InPlaceChain(nn.Module):
    """The optimizer's pattern on large tensors: chains of in-place updates, each result
    read by the next operator; plus an ``out=`` variant, a ``_foreach_`` op, and a write
    through a view."""

    def forward(self, x, g):
        a = x * 1.0
        a.mul_(0.9)
        a.addcmul_(g, g, value=0.1)
        d = a.sqrt()
        d.add_(1e-3)
        b = torch.zeros_like(a)
        torch.div(x, d, out=b)
        torch._foreach_mul_([a, b], 0.5)
        v = a.t()
        v.mul_(-1.0)
        return a + b + d


@pytest.mark.parametrize("saved_data", ["statistic", "full"])
def test_inplace_chains_read_each_result_once_and_stay_exact(tmp_path, saved_data):
    """An in-place operator's output is read once: the next operator reading it reuses its
    statistics (and copy) even though autograd bumps its version after the dispatch mode
    returned (``Recorder.settle``) — and every row still holds the values of an independent
    capture, through ``out=``, ``_foreach_`` and view writes."""
    torch.manual_seed(0)
    x = torch.rand(400, 300) + 0.5           # 120000 elements: past the small-tensor size
    g = torch.randn(400, 300)
    ref = _Reference()
    x1, x2 = x.clone(), x.clone()
    with ref:
        InPlaceChain()(x1, g)
    expected = [(name, io, slot, t) for name, ins, outs in ref.seen
                for io, ts in (("input", ins), ("output", outs)) for slot, t in enumerate(ts)]

    cfg = write_config(tmp_path, common={"iteration": "0", "saved_data": saved_data,
                                         "statistic_category": ["max", "min", "l2norm"]},
                       e2e={"stat_calc_mode": "device"})
    with opdump.Session(cfg) as session, EagerCapture(session):
        batch = session.recorder.stats._batch
        kernel = batch._resolve_kernel()
        memo = batch._memo          # the native memo: reads and reuse of CPU tensors
        InPlaceChain()(x2, g)
    rows = []
    for dirpath, _, names in os.walk(str(tmp_path / "dump")):
        if "statistic.csv" in names:
            rows += list(csv.DictReader(open(os.path.join(dirpath, "statistic.csv"))))
    rows.sort(key=lambda r: int(r["Timestamp"]))
    got = [(r["Op Type"], r["IO"], int(r["Slot"])) for r in rows]
    assert got == [(name, io, slot) for name, io, slot, _ in expected]
    for row, (name, io, slot, t) in zip(rows, expected):
        arr = t.numpy()       # float32: max/min are written as the shortest float32 text
        assert np.float32(row["Max Value"]) == arr.max() and np.float32(row["Min Value"]) == arr.min(), (row, name)
        norm = np.sqrt((arr.astype(np.float64) ** 2).sum())
        assert float(row["L2Norm Value"]) == pytest.approx(norm, rel=1e-6), (row, name)
    if kernel is not None:
        # 32 rows of large tensors hold 16 distinct values (x, g, each result, and the view
        # a.t() counted twice: inside the mode a view has a fresh version counter); without
        # the settle, the results of mul_, addcmul_, add_, div(out=) and the view's mul_
        # would each be read again by the operator after them (22 reads)
        assert 0 < memo.reads <= 16, memo.reads
