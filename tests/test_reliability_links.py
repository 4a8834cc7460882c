"""Links planted inside a dump never send data outside it (README, "Reliability"): every
folder and file is reached from the open rank folder with O_NOFOLLOW; a link is a write
error — one warning, dumping stops, the training is unharmed, the outside untouched."""
import os
import warnings

import pytest
import torch
import torch.nn as nn

import opdump
from conftest import write_config
from opdump.capture.eager import EagerCapture


def _train(session=None, steps=3, plant=None, long_name=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    if long_name:
        model.add_module("x" * 250, nn.Tanh())            # file names over 255 bytes: mapping.csv
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    capture = EagerCapture(session).start() if session is not None else None
    try:
        for step in range(steps):
            if plant is not None:
                plant(step)
            x = torch.randn(4, 8)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    finally:
        if capture is not None:
            capture.stop()
    return losses


def _graph_folders(root):
    net = root / "rank_0" / "Net"
    return [net / g for g in os.listdir(net)] if net.is_dir() else []


def _run(tmp_path, plant, saved="tensor", long_name=False, before=None):
    cfg = write_config(tmp_path, common={"saved_data": saved})
    root = tmp_path / "dump"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = opdump.Session(cfg)
        if before is not None:
            before(root)
        with session:
            losses = _train(session, plant=lambda step: plant(root, step), long_name=long_name)
    ours = [str(w.message) for w in caught if str(w.message).startswith("opdump: writing the dump failed")]
    return losses, ours


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "outside"
    d.mkdir()
    (d / "keep.txt").write_text("keep\n")
    return d


def _untouched(outside):
    assert sorted(os.listdir(outside)) == ["keep.txt"] and (outside / "keep.txt").read_text() == "keep\n"


def test_linked_iteration_folder(tmp_path, outside):
    def plant(root, step):
        if step == 1:
            for g in _graph_folders(root):
                os.symlink(outside, g / "1")
    losses, ours = _run(tmp_path, plant)
    assert losses == _train()
    assert len(ours) == 1 and "symbolic link" in ours[0], ours
    _untouched(outside)
    manifest = opdump.load(str(tmp_path / "dump")).ranks[0].manifest
    assert manifest["complete"] is False and "symbolic link" in manifest["errors"][0]


@pytest.mark.parametrize("name,saved,long_name", [("statistic.csv", "statistic", False),
                                                  ("mapping.csv", "tensor", True)])
def test_linked_text_file(tmp_path, outside, name, saved, long_name):
    target = outside / "keep.txt"

    def plant(root, step):
        if step == 1:
            for g in _graph_folders(root):
                (g / "1").mkdir()
                os.symlink(target, g / "1" / name)
    losses, ours = _run(tmp_path, plant, saved=saved, long_name=long_name)
    assert losses == _train(long_name=long_name)
    assert len(ours) == 1 and "symbolic link" in ours[0], ours
    _untouched(outside)


def test_linked_metadata_folder(tmp_path, outside):
    def before(root):
        os.symlink(outside, root / "rank_0" / ".dump_metadata")
    losses, ours = _run(tmp_path, lambda root, step: None, before=before)
    assert losses == _train()
    assert len(ours) == 1 and "symbolic link" in ours[0], ours
    _untouched(outside)
