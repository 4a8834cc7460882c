"""Sample dump (``e2e_dump_settings.sample_mode`` 1, README "Debug dumps") on real eager and
torch.compile dumps: each tensor file holds the first ``sample_num`` elements of the tensor,
flattened, checked against an independent forward-hook capture; statistic.csv rows are the
whole-tensor rows of an unsampled run; the manifest and the reader say the files are samples;
``compare`` refuses a sample against whole tensors."""
import csv
import json
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.analysis.compare import CompareError, compare
from opdump.analysis.reader import open_dump
from opdump.capture.eager import EagerCapture
from dumpfiles import execution_order, sanitize, tensor_files
from conftest import write_config

N = 10
STATS = ["max", "min", "l2norm", "avg", "md5"]


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _run(tmp, mode, e2e=None, saved_data="full"):
    """One dumped iteration (forward + backward) of MLP; returns the dump root and the hooks' capture."""
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = write_config(tmp, common={"iteration": "0", "saved_data": saved_data, "statistic_category": STATS},
                       e2e=e2e)
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(4, 8)
    seen = {}
    model.fc1.register_forward_hook(lambda m, i, o: seen.__setitem__("fc1", (i[0].detach().clone(), o.detach().clone())))
    with opdump.Session(cfg) as session:
        if mode == "eager":
            with EagerCapture(session):
                model(x).sum().backward()
        else:
            compiled = torch.compile(model, backend=session.backend("eager"))
            compiled(x).sum().backward()
        session.step()
    torch._dynamo.reset()
    return str(tmp / "dump"), seen


def _rows(root):
    """statistic.csv rows keyed by (graph folder, op name, io, slot), timestamps dropped."""
    out = {}
    for dirpath, _, files in os.walk(root):
        if "statistic.csv" in files:
            with open(os.path.join(dirpath, "statistic.csv"), newline="") as f:
                for r in csv.DictReader(f):
                    r.pop("Timestamp")
                    out[(os.path.relpath(dirpath, root), r["Op Name"], r["IO"], r["Slot"])] = r
    return out


def _fc1_output(root, files):
    order = execution_order(root, 0)
    name = next(n for n in order if n.startswith("Default/") and "fc1-Linear" in n and "addmm" in n)
    hits = [f for f in files if f.op_name == sanitize(name) and f.io == "output"]
    assert len(hits) == 1
    return hits[0]


@pytest.fixture(scope="module")
def eager_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sample_eager")
    return {"host": _run(tmp / "host", "eager", {"sample_mode": 1, "sample_num": N}),
            "device": _run(tmp / "device", "eager", {"sample_mode": 1, "sample_num": N, "stat_calc_mode": "device"},
                           saved_data="tensor"),
            "whole": _run(tmp / "whole", "eager")}


@pytest.mark.parametrize("which", ["host", "device"])
def test_eager_files_are_first_n_elements(eager_runs, which):
    """``host``: host statistics, the whole tensor is copied and the file cut; ``device``:
    no host statistics, only the sample is copied.  Same files either way."""
    root, seen = eager_runs[which]
    files = tensor_files(root)
    assert files
    for f in files:
        a = f.load()
        assert a.ndim == 1 and a.size <= N, (f.path, a.shape)
        assert os.path.getsize(f.path) < 128 + N * 8          # npy header + at most N float64
    out = _fc1_output(root, files).load()
    np.testing.assert_array_equal(out, seen["fc1"][1].reshape(-1)[:N].numpy())
    whole_root, _ = eager_runs["whole"]
    whole = {(f.op_name, f.io, f.slot): f.load() for f in tensor_files(whole_root)}
    assert len(whole) == len(files)
    for f in files:          # every file is the head of the unsampled run's file
        np.testing.assert_array_equal(f.load(), whole[(f.op_name, f.io, f.slot)].reshape(-1)[:N])
    assert any(w.size > N for w in whole.values())


def test_eager_statistics_on_whole_tensor(eager_runs):
    sampled, whole = _rows(eager_runs["host"][0]), _rows(eager_runs["whole"][0])
    assert sampled and sampled.keys() == whole.keys()
    assert sampled == whole                 # shapes, sizes and statistics of the whole tensors


def test_manifest_reader_and_compare(eager_runs):
    root, whole = eager_runs["host"][0], eager_runs["whole"][0]
    manifest = json.load(open(os.path.join(root, "rank_0", ".dump_metadata", "manifest.json")))
    assert manifest["sample_num"] == N
    assert json.load(open(os.path.join(whole, "rank_0", ".dump_metadata", "manifest.json")))["sample_num"] is None
    assert open_dump(root).sample_num == N and open_dump(whole).sample_num is None
    with pytest.raises(CompareError, match=r"sampled \(first 10 elements.*whole tensors"):
        compare(root, whole, progress=False)
    result = compare(root, eager_runs["device"][0], progress=False)      # samples against samples
    assert result.first_divergence is None


def test_graph_mode_samples(tmp_path):
    root, seen = _run(tmp_path, "graph", {"sample_mode": 1, "sample_num": 5})
    files = tensor_files(root)
    assert files and all(f.load().ndim == 1 and f.load().size <= 5 for f in files)
    np.testing.assert_array_equal(_fc1_output(root, files).load(), seen["fc1"][1].reshape(-1)[:5].numpy())
    assert open_dump(root).sample_num == 5
