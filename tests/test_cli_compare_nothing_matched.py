"""``opdump compare`` in which no operator of A pairs with one of B compared nothing operator by
operator: exit 2 (nothing to compare) with a line saying so, not 0 "first divergence: none".
Hold-out trial 6, B2: a PyTorch dump of the MindSpore sample's TinyMLP (the sample's own
weights and data) against the sample paired only its ``Parameter.*`` files and exited 0."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from analysis_fixtures import MS_SAMPLE

OPDUMP = [sys.executable, "-m", "opdump"]
SAMPLE_IT = os.path.join(str(MS_SAMPLE), "rank_0", "MLP", "0")


def _sample(iteration, pattern):
    files = glob.glob(os.path.join(SAMPLE_IT, str(iteration), pattern))
    assert len(files) == 1, (pattern, files)
    return torch.from_numpy(np.load(files[0]))


@pytest.fixture(scope="module")
def torch_mlp_dump(tmp_path_factory):
    """The sample's TinyMLP (Dense-ReLU-Dense, SGD momentum 0.9) in PyTorch, with the sample's
    initial weights (its iteration-0 MatMul/BiasAdd input.1) and data, two dumped steps."""
    root = tmp_path_factory.mktemp("b2")
    net = nn.Sequential()
    net.fc1, net.relu, net.fc2 = nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)
    with torch.no_grad():
        for k in ("fc1", "fc2"):
            scope = f"Default_network-WithLossCell__backbone-TinyMLP_{k}-Dense"
            getattr(net, k).weight.copy_(_sample(0, f"MatMul.{scope}_MatMul-op0.*.input.1.*"))
            getattr(net, k).bias.copy_(_sample(0, f"BiasAdd.{scope}_BiasAdd-op0.*.input.1.*"))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    cfg = root / "c.json"
    cfg.write_text(json.dumps({"common_dump_settings": {"path": str(root / "dump"), "net_name": "MLP",
                                                        "iteration": "0-1", "saved_data": "tensor"}}))
    with opdump.Session(str(cfg)) as s, EagerCapture(s):
        for it in range(2):
            x, y = _sample(it, "Parameter.inputs0.*"), _sample(it, "Parameter.inputs1.*").long()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()
    return str(root / "dump")


def test_no_operator_matched_is_nothing_to_compare(torch_mlp_dump, tmp_path):
    r = subprocess.run(OPDUMP + ["compare", torch_mlp_dump, str(MS_SAMPLE), "--csv", str(tmp_path / "t.csv")],
                       capture_output=True, text=True, timeout=300)
    assert "operators matched: 0 of" in r.stdout, r.stdout + r.stderr          # the summary is still printed
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no operator of A was paired with one of B" in r.stderr and "--mapping" in r.stderr, r.stderr


def test_json_output_keeps_the_status(torch_mlp_dump, tmp_path):
    r = subprocess.run(OPDUMP + ["compare", torch_mlp_dump, str(MS_SAMPLE), "--json", "--csv", "-"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert json.loads(r.stdout)["operators"]["matched_a"] == 0
