"""Hostile module names (a newline, a NUL, a comma, a quote) keep every text file of a
dump valid: one execution-order line per operator, statistic.csv valid CSV with one row
per tensor, no raw NUL anywhere, and the reader maps every file back (eager and graph
mode name the module alike)."""
import csv
import io
import json
import os

import pytest
import torch
import torch.nn as nn

import opdump
from conftest import write_config
from opdump.capture.eager import EagerCapture

HOSTILE = 'odd\nname\x00,"x"'


def _dump(tmp_path, graph):
    cfg = write_config(tmp_path, common={"saved_data": "full", "iteration": "0-1"})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model.add_module(HOSTILE, nn.Tanh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(cfg) as session:
        run = torch.compile(model, backend=session.backend("eager")) if graph else model
        capture = None if graph else EagerCapture(session).start()
        for _ in range(2):
            run(torch.randn(4, 8)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        if capture is not None:
            capture.stop()
    return tmp_path / "dump"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    return {mode: _dump(tmp_path_factory.mktemp(mode), mode == "graph") for mode in ("eager", "graph")}


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_every_text_file_stays_valid(dumps, mode):
    root = dumps[mode] / "rank_0"
    npy = list(root.rglob("*.npy"))
    for path in root.rglob("*"):
        if path.is_file() and path.suffix != ".npy":
            data = path.read_bytes()
            assert b"\x00" not in data, path
            data.decode("utf-8")
    for listing in (root / "graphs").glob("*.json"):
        ops = [op["full_name"] for op in json.loads(listing.read_text())["ops"]]
        gid = listing.stem.rsplit("_", 1)[1]
        order = (root / "execution_order" / f"ms_execution_order_graph_{gid}.csv").read_text().split("\n")
        assert order[1:-1] == ops and order[-1] == ""          # one line per operator, same names
    rows = 0
    for path in root.rglob("statistic.csv"):
        table = list(csv.reader(io.StringIO(path.read_text(), newline="")))
        assert all(len(r) == len(table[0]) for r in table)
        rows += len(table) - 1
    assert rows == len(npy)


def test_the_reader_maps_every_file_and_both_modes_agree(dumps):
    scopes = {}
    for mode, root in dumps.items():
        records = opdump.load(str(root)).records()
        assert len(records) == len(list(root.rglob("*.npy")))
        assert records["op"].notna().all()
        scopes[mode] = {name.rsplit("/", 1)[0] for name in records["op"] if "odd" in name}
        assert scopes[mode] and all("\n" not in s and "\x00" not in s for s in scopes[mode])
    assert "Default/Sequential/odd\\nname\\x00,\"x\"-Tanh" in scopes["eager"]
    assert scopes["eager"] == scopes["graph"]
