"""overflow / watch / ls on bad input (README, "Analysis"): nothing to analyse is an error
(exit 2, one line saying where it looked); an unreadable `.npy` (truncated, garbage, a
header lying about its size) is reported by path with its reason and the rest analysed; a
malformed statistic.csv cell is an error (file, line, column), never a NaN; a file name
that is not UTF-8 never makes printing fail.

The dumps are real eager captures of a tiny model (the model of
tests/test_compare_bad_input.py), corrupted on disk; the CLI runs as real subprocesses."""
import csv
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import opdump
from opdump.analysis.overflow import find_overflow
from opdump.analysis.reader import open_dump
from opdump.analysis.watch import watch
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec

REPO = Path(__file__).resolve().parents[1]


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _capture(root, **cfg):
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(DumpConfig(path=str(root), iteration=IterationSpec(ranges=((0, 0),)), **cfg)) as s, \
            EagerCapture(s):
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return root


@pytest.fixture(scope="module")
def tensors(tmp_path_factory):
    return _capture(tmp_path_factory.mktemp("badin") / "t")


@pytest.fixture(scope="module")
def stats(tmp_path_factory):
    # no NaN/Inf counts: a NaN max/min/avg/l2norm is what says a tensor holds NaN
    return _capture(tmp_path_factory.mktemp("badin") / "s", saved_data="statistic",
                    statistic_category=("max", "min", "avg", "l2norm"))


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "opdump", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=env)


def _lie(path: Path) -> None:
    """Rewrite the header to claim 2**40 float32 elements (4 TiB) in a file of a few bytes."""
    data = path.read_bytes()
    hlen = struct.unpack("<H", data[8:10])[0]
    new = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }"
    path.write_bytes(data[:8] + struct.pack("<H", hlen) + new.ljust(hlen - 1).encode("latin1") + b"\n"
                     + data[10 + hlen:])


def _corrupt(root: Path):
    """Three floating output files made unreadable: truncated, garbage, lying header."""
    files = sorted(p for p in (root / "rank_0").rglob("*.npy") if ".output.0." in p.name and "addmm" in p.name)
    files += sorted(p for p in (root / "rank_0").rglob("*.npy") if ".output.0." in p.name and "relu" in p.name)
    assert len(files) >= 3, files
    a, b, c = files[:3]
    a.write_bytes(a.read_bytes()[:-8])
    b.write_bytes(b"\x00garbage" * 7)
    _lie(c)
    return [a, b, c]


# ----------------------------------------------------------------------------- 1. nothing to analyse
def test_empty_rank_folder_is_nothing_to_analyse(tmp_path):
    (tmp_path / "e" / "rank_0").mkdir(parents=True)
    ov = _cli("overflow", tmp_path / "e", "-q")
    assert ov.returncode == 2, ov
    assert "nothing to analyse" in ov.stderr and "rank_0" in ov.stderr and "no NaN/Inf found" not in ov.stdout
    w = _cli("watch", tmp_path / "e", "--cond", "nan", "-q")
    assert w.returncode == 2, w
    assert "nothing to analyse" in w.stderr and "no hit" not in w.stdout
    for args in (("ls", tmp_path / "e"), ("locate", tmp_path / "e", "train.py:3")):
        r = _cli(*args)
        assert r.returncode == 2 and "nothing to analyse" in r.stderr and "rank_0" in r.stderr, (args, r)


def test_selection_with_nothing_in_it_is_an_error(tensors):
    d = open_dump(tensors)
    assert find_overflow(d, iterations=[7], progress=False).nothing
    assert watch(d, ["nan"], op="no_such_op", progress=False).nothing
    assert not watch(d, ["nan"], progress=False).nothing


# ----------------------------------------------------------------------------- 2. unreadable tensor files
def test_unreadable_files_are_reported_and_the_rest_analysed(tensors, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tensors, bad)
    victims = _corrupt(bad)
    d = open_dump(bad)
    hits = watch(d, ["nan", "too_large:max_gt=-1e30"], progress=False)
    reported = dict(hits.unreadable)
    assert set(map(str, victims)) <= set(reported)
    assert "the header describes" in reported[str(victims[2])]     # checked before any allocation
    # the rest is analysed: every other floating tensor hits max_gt=-1e30
    assert len(hits) >= 10 and not any(h.path in reported for h in hits)
    rep = find_overflow(d, progress=False)
    assert set(map(str, victims)) <= set(dict(rep.unreadable)) and not rep.found

    w = _cli("watch", bad, "--cond", "nan", "-q")
    assert w.returncode == 0, w
    for v in victims:
        assert f"cannot read {v}" in w.stderr
    assert f"{len(hits.unreadable)} file(s) or statistics rows could not be read" in w.stdout
    ov = _cli("overflow", bad, "-q", "--json")
    assert ov.returncode == 0, ov
    out = json.loads(ov.stdout)
    assert {u["path"] for u in out["unreadable"]} >= set(map(str, victims)) and not out["found"]
    assert all(f"cannot read {v}" in ov.stderr for v in victims)


# ----------------------------------------------------------------------------- 3. malformed statistic cells
def _edit_stat(root: Path, column: str, value: str, row_index: int = 0) -> Path:
    path = next((root / "rank_0").rglob("statistic.csv"))
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    col = rows[0].index(column)
    rows[1 + row_index][col] = value
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def test_malformed_statistic_cell_is_an_error_not_a_nan(stats, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(stats, bad)
    assert find_overflow(open_dump(bad), progress=False).found is False
    path = _edit_stat(bad, "Max Value", "NOT_A_NUMBER", row_index=5)
    rep = find_overflow(open_dump(bad), progress=False)
    assert not rep.found, rep.origin                      # no NaN origin that does not exist
    (where, why), = rep.unreadable
    assert where == str(path) and "line 7" in why and "'Max Value'" in why and "NOT_A_NUMBER" in why
    ov = _cli("overflow", bad, "-q")
    assert ov.returncode == 0 and "no NaN/Inf found" in ov.stdout, ov
    assert "NOT_A_NUMBER" in ov.stderr and "'Max Value'" in ov.stderr
    w = _cli("watch", bad, "--cond", "nan", "-q")
    assert w.returncode == 0 and "NOT_A_NUMBER" in w.stderr, w


def test_refused_csv_line_is_reported_by_file_and_line(stats, tmp_path):
    """A line the CSV parser refuses (a 200,000-character field) is reported with its file
    and line; the other rows are analysed (was: the whole command failed naming no file)."""
    bad = tmp_path / "bad"
    shutil.copytree(stats, bad)
    path = next((bad / "rank_0").rglob("statistic.csv"))
    lines = path.read_text().splitlines(True)
    lines.insert(3, 'x,"' + "A" * 200_000 + '",1\n')
    path.write_text("".join(lines))
    rep = find_overflow(open_dump(bad), progress=False)
    assert rep.unreadable == [(str(path), "line 4: unreadable CSV line (field larger than field limit (131072))")]
    assert rep.unknown_tensors == 0 and rep.scanned_tensors > 50 and not rep.found
    w = _cli("watch", bad, "--cond", "nan", "-q")
    assert w.returncode == 0 and f"cannot read {path}: line 4" in w.stderr, w


def test_cells_mindspore_writes_are_valid(stats, tmp_path):
    """nan / inf / -inf / empty cells are values (an empty cell: a category not computed)."""
    ok = tmp_path / "ok"
    shutil.copytree(stats, ok)
    _edit_stat(ok, "L2Norm Value", "", row_index=1)
    _edit_stat(ok, "Avg Value", "-inf", row_index=2)
    rep = find_overflow(open_dump(ok), progress=False)
    assert rep.unreadable == []
    assert not any("stat_errors" in r and isinstance(r.get("stat_errors"), str)
                   for r in open_dump(ok).records().to_dict("records"))
    nan = tmp_path / "nan"
    shutil.copytree(stats, nan)
    _edit_stat(nan, "Max Value", "nan", row_index=5)
    rep = find_overflow(open_dump(nan), progress=False)
    assert rep.found and rep.unreadable == []              # a real NaN is still found


# ----------------------------------------------------------------------------- 4. non-UTF-8 names
@pytest.mark.skipif(sys.platform == "darwin", reason="macOS file systems refuse names that are not UTF-8")
def test_non_utf8_file_name_never_breaks_printing(tensors, tmp_path):
    odd = tmp_path / "odd"
    shutil.copytree(tensors, odd)
    victim = sorted((odd / "rank_0").rglob("*addmm*.output.0.*.npy"))[0]
    new = os.fsencode(str(victim)).replace(b"addmm", b"addmm\xff", 1)
    os.rename(os.fsencode(str(victim)), new)
    env = dict(os.environ, PYTHONIOENCODING="utf-8", LC_ALL="C.UTF-8")
    for args, code in ((("ls", odd, "--tensors", "--paths", "--limit", "1000"), 0),
                       (("watch", odd, "--cond", "too_large:max_gt=-1e30", "-q"), 1),
                       (("overflow", odd, "-q"), 0)):
        r = _cli(*args, env=env)
        assert "Traceback" not in r.stderr and "UnicodeEncodeError" not in r.stderr, (args, r.stderr)
        assert r.returncode == code, (args, r.returncode, r.stderr)
        if args[0] == "ls":
            assert "addmm\\udcff" in r.stdout or "addmm\\xff" in r.stdout, r.stdout
