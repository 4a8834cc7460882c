"""Statistics in real dumps: statistic.csv next to the .npy files, every row matched to
its file by timestamp and recomputed independently with numpy."""
import csv
import hashlib
import json
import os

import numpy as np
import pytest
import torch
from torch import nn

import opdump
from dumpfiles import tensor_files
from conftest import write_config

ALL = ["max", "min", "avg", "count", "negative zero count", "positive zero count", "nan count",
       "negative inf count", "positive inf count", "zero count", "md5", "l2norm"]
COLUMNS = ["Max Value", "Min Value", "Avg Value", "Count", "Negative Zero Count", "Positive Zero Count",
           "NaN Count", "Negative Inf Count", "Positive Inf Count", "Zero Count", "MD5", "L2Norm Value"]
HEADER = "Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x, idx):
        y = self.fc(x)
        y = y / (x.sum(dim=1, keepdim=True) * 0)        # ±inf and nan on purpose
        return torch.nan_to_num(y).sum() + y.gather(1, idx).float().sum() * 0, (idx > 1)


def run(tmp_path, common=None, e2e=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = write_config(tmp_path, common={"iteration": "0", **(common or {})}, e2e=e2e)
    torch.manual_seed(0)
    with opdump.Session(cfg) as session:
        model = torch.compile(Net(), backend=session.backend("eager"))
        out, _ = model(torch.randn(4, 6), torch.tensor([[0], [1], [2], [3]]))
        out.backward()
    return str(tmp_path / "dump")


def read_rows(root):
    rows = []
    for dirpath, _, files in os.walk(root):
        if "statistic.csv" in files:
            with open(os.path.join(dirpath, "statistic.csv"), newline="") as f:
                text = f.read()
            lines = text.splitlines()
            rows += [(dirpath, lines[0], r) for r in csv.DictReader(lines)]
    return rows


def expected(array: np.ndarray, raw: bytes):
    a = array.astype(np.float64)
    return {
        "Max Value": np.max(a) if a.size else None, "Min Value": np.min(a) if a.size else None,
        "Avg Value": np.mean(a) if a.size else None, "Count": a.size,
        "Negative Zero Count": int((a < 0).sum()), "Positive Zero Count": int((a > 0).sum()),
        "NaN Count": int(np.isnan(a).sum()), "Negative Inf Count": int(np.isneginf(a).sum()),
        "Positive Inf Count": int(np.isposinf(a).sum()), "Zero Count": int((a == 0).sum()),
        "MD5": hashlib.md5(raw).hexdigest(), "L2Norm Value": np.sqrt(np.sum(a * a)) if a.size else None,
    }


def close(cell: str, value) -> bool:
    if value is None:
        return cell == ""
    if isinstance(value, str):
        return cell == value
    got = float(cell)
    if np.isnan(value):
        return np.isnan(got)
    return got == value or abs(got - value) <= 1e-6 * max(1.0, abs(value))


def test_full_rows_match_npy_files(tmp_path):
    root = run(tmp_path, common={"saved_data": "full", "statistic_category": ALL})
    rows = read_rows(root)
    assert rows
    assert {header for _, header, _ in rows} == {HEADER + "," + ",".join(COLUMNS)}
    files = {(f.ts, f.io, f.slot): f for f in tensor_files(root)}
    assert len(files) == len(rows), "one row per dumped tensor"
    seen_nan = seen_inf = False
    for _, _, row in rows:
        f = files[(int(row["Timestamp"]), row["IO"], int(row["Slot"]))]
        array = f.load()
        assert row["Data Type"] == f.dtype
        assert row["Shape"] == "(" + ",".join(str(d) for d in array.shape) + ")"
        assert int(row["Data Size"]) == array.nbytes
        for column, value in expected(array, np.ascontiguousarray(array).tobytes()).items():
            assert close(row[column], value), (row["Op Name"], column, row[column], value)
        seen_nan |= int(row["NaN Count"]) > 0
        seen_inf |= int(row["Positive Inf Count"]) + int(row["Negative Inf Count"]) > 0
        if row["Op Type"] != "Parameter":
            assert row["Op Name"].startswith(("Default/", "Gradients/")) and "/" in row["Op Name"]
    assert seen_nan and seen_inf


def test_statistic_only_writes_no_npy(tmp_path):
    root = run(tmp_path, common={"saved_data": "statistic"})
    assert tensor_files(root) == []
    rows = read_rows(root)
    assert rows and {h for _, h, _ in rows} == {HEADER + ",Max Value,Min Value,L2Norm Value"}


def test_device_mode_agrees_with_host(tmp_path):
    cats = ["max", "min", "avg", "l2norm", "nan count"]
    host = read_rows(run(tmp_path / "h", common={"saved_data": "statistic", "statistic_category": cats}))
    dev = read_rows(run(tmp_path / "d", common={"saved_data": "statistic", "statistic_category": cats},
                        e2e={"stat_calc_mode": "device"}))
    assert len(host) == len(dev)
    key = lambda r: (r[2]["Op Name"], r[2]["IO"], r[2]["Slot"])
    for (_, _, h), (_, _, d) in zip(sorted(host, key=key), sorted(dev, key=key)):
        assert key((0, 0, h)) == key((0, 0, d))
        for column in ("Max Value", "Min Value", "NaN Count"):
            assert h[column] == d[column], column
        for column in ("Avg Value", "L2Norm Value"):
            if h[column] in ("", "nan", "inf", "-inf"):
                assert h[column] == d[column]
            else:
                assert abs(float(h[column]) - float(d[column])) <= 1e-5 * max(1.0, abs(float(h[column])))


def test_device_mode_warns_once_at_start_about_host_fallback(tmp_path):
    cfg = write_config(tmp_path, common={"saved_data": "statistic", "statistic_category": ["max", "md5"]},
                       e2e={"stat_calc_mode": "device"})
    with pytest.warns(UserWarning, match="md5") as record:
        opdump.Session(cfg).close()
    assert sum("md5" in str(w.message) for w in record) == 1
