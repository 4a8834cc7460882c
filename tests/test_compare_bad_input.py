"""compare on bad input (README, "Analysis" > compare): a corrupt, truncated, empty or
lying `.npy` file is reported by path with its reason and the rest is compared; a dump
with nothing in it, or two dumps with no iteration in common, are errors (exit 2).

The dumps are real eager captures of a tiny model, corrupted on disk."""
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.analysis.compare import CompareError, compare
from opdump.analysis.reader.npy import checked_header
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _run(root, iterations=((0, 0),), steps=1):
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    with opdump.Session(DumpConfig(path=str(root), iteration=IterationSpec(ranges=iterations))) as s, \
            EagerCapture(s):
        for _ in range(steps):
            model(torch.randn(4, 8, generator=gen)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return root


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("bad") / "ref")


def _files(root, pattern):
    return sorted((root / "rank_0").rglob(pattern))


def _corrupt(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) - 8])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(b"\x00garbage" * 7)
    elif how == "huge":            # a header claiming 2**40 float32 elements (4 TiB)
        hlen = struct.unpack("<H", data[8:10])[0]
        header = data[10:10 + hlen].decode("latin1")
        new = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }"
        path.write_bytes(data[:8] + struct.pack("<H", hlen) + new.ljust(hlen - 1).encode("latin1") + b"\n"
                         + data[10 + hlen:])
        assert len(header) == hlen


@pytest.mark.parametrize("how", ["truncated", "empty", "garbage", "huge"])
def test_one_bad_file_is_reported_and_the_rest_compared(ref, tmp_path, how):
    bad = tmp_path / "bad"
    shutil.copytree(ref, bad)
    victim = next(p for p in _files(bad, "*.npy") if "addmm" in p.name and ".output.0." in p.name)
    _corrupt(victim, how)
    for a, b in ((bad, ref), (ref, bad)):           # on either side
        r = compare(a, b, progress=False, workers=1)
        assert [p for p, _ in r.unreadable] == [str(victim)], r.unreadable
        reason = r.unreadable[0][1]
        assert reason and "Traceback" not in reason
        t = r.table
        rows = t[(t["path_a"] == str(victim)) | (t["path_b"] == str(victim))]
        assert list(rows["verdict"]) == ["unreadable"] and str(victim) in rows["reason"].iloc[0]
        assert r.counts["pass"] >= len(t) - 2 and "diverged" not in r.counts
        assert str(victim) in r.summary()


def test_header_size_is_checked_before_allocating(ref, tmp_path):
    f = tmp_path / "huge.npy"
    shutil.copy(next(iter(_files(ref, "*.npy"))), f)
    _corrupt(f, "huge")
    with pytest.raises(ValueError, match="truncated or corrupt: the header describes"):
        checked_header(str(f))
    np.save(tmp_path / "ok.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert checked_header(str(tmp_path / "ok.npy"))[:2] == ((2, 3), np.dtype("float32"))


def test_workers_report_bad_files_too(ref, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(ref, bad)
    victims = [p for p in _files(bad, "*.npy") if ".output.0." in p.name][:3]
    for v in victims:
        _corrupt(v, "huge")
    r = compare(bad, ref, progress=False, workers=2, parallel_min=1)
    assert sorted(p for p, _ in r.unreadable) == sorted(map(str, victims))


def test_nothing_to_compare_is_an_error(ref, tmp_path):
    empty = tmp_path / "empty"
    (empty / "rank_0").mkdir(parents=True)
    with pytest.raises(CompareError, match="nothing to compare"):
        compare(empty, ref, progress=False)
    p = subprocess.run([sys.executable, "-m", "opdump", "compare", str(ref), str(empty), "-q", "--csv",
                        str(tmp_path / "t.csv")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "nothing to compare" in p.stderr and "Traceback" not in p.stderr


def test_no_common_iteration_is_an_error(tmp_path):
    a = _run(tmp_path / "a", iterations=((0, 1),), steps=2)
    b = _run(tmp_path / "b", iterations=((2, 3),), steps=4)
    with pytest.raises(CompareError, match="--iterations"):
        compare(a, b, progress=False)
    r = compare(a, b, iterations=[(1, 3)], progress=False)
    assert r.operators["matched_a"] == r.operators["calls_a"] > 0
