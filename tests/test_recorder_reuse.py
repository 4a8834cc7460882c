"""The recorder computes statistics once per tensor and shares host copies between an
operator's output and a later operator's input — but never across an in-place update."""
import csv
import os

import numpy as np
import pytest
import torch
from torch import nn

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
