"""The column-wise scan of tensor files (opdump/analysis/reader/file_columns.py) gives what
the per-file scan gives (``OPDUMP_READER_COLUMNS=0``): the name fields of any name
(hypothesis over the file-name grammar of opdump/format/files.py: dots in operator names,
signed ids, non-ASCII digits, line breaks, old and foreign forms), the same
:class:`TensorFile` objects in the same order with the same call numbers, the same records,
and the same ``opdump compare`` output (CSV bytes, summary) on generated dumps with odd
names (dots in operator names, equal timestamps, repeated calls, parameters, an old-form
name, a ``mapping.csv`` folder, two ranks, several iterations) and on the real MindSpore
sample.  Files and records are made from the columns without a TensorFile per file.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis_fixtures import MS_SAMPLE, make_dump
from opdump.analysis.reader import open_dump
from opdump.analysis.reader.file_columns import split_names
from opdump.analysis.reader.names_fast import tensor_name_fields
from opdump.format import files as ff

ROOT = Path(__file__).resolve().parent.parent

_TOKENS = ["input", "output", "DefaultFormat", "NCHW", "Float32", "BFloat16", "", "0", "7", "12", "-3", "-",
           "1700000000000123", "Conv2D", "Default/net-Net", "conv1-Conv2d", "a-op1", "Parameter", "npy",
           "x\ny", "\u0663", "0x1", "+1", "1_0", " 1", "in put"]


@st.composite
def _names(draw):
    """File names from the grammar's tokens: the full form (op names with dots, signed ids),
    half of them broken by one changed or missing token, or any tokens joined by dots."""
    if draw(st.integers(0, 3)):
        toks = [draw(st.sampled_from(["Conv2D", "Parameter", "", "a-b", "x\ny"])),
                ".".join(draw(st.lists(st.sampled_from(_TOKENS), min_size=1, max_size=3))),
                draw(st.sampled_from(["0", "-1", "12"])), draw(st.sampled_from(["0", "3", "-2"])),
                draw(st.sampled_from(["1700000000000123", "5", "0"])), draw(st.sampled_from(["input", "output"])),
                draw(st.sampled_from(["0", "1", "10"])), draw(st.sampled_from(["DefaultFormat", "NC1HWC0", ""])),
                draw(st.sampled_from(["Float32", "BFloat16", "", "2x3"]))]
        change = draw(st.integers(0, 2 * len(toks) + 1))
        if change < len(toks):
            toks[change] = draw(st.sampled_from(_TOKENS + ["1.5", "inout", "-"]))
        elif change < 2 * len(toks) - 2:
            del toks[change - len(toks)]
        name = ".".join(toks)
    else:
        name = ".".join(draw(st.lists(st.one_of(st.sampled_from(_TOKENS), st.text(max_size=4)), max_size=12)))
    return name + draw(st.sampled_from([".npy", ".npy", ".npy", ".bin", ""]))


@settings(max_examples=250, deadline=None)
@given(st.lists(_names(), max_size=6))
def test_split_names_agrees_with_the_expression(names):
    for n in names:                                  # each name alone, then the folder's list
        one = split_names([n])
        if ff.FULL_TENSOR_NAME_RE.fullmatch(n) is None:
            assert one is None
        else:
            assert [tuple(row) for row in zip(*one)] == [tensor_name_fields(n)]
    got = split_names(names)
    full = [ff.FULL_TENSOR_NAME_RE.fullmatch(n) is not None for n in names]
    if not all(full):
        assert got is None
        return
    assert [tuple(row) for row in zip(*got)] == [tensor_name_fields(n) for n in names]


# ------------------------------------------------------------------ generated dumps with odd names
def _odd_files(root: Path, scale: float) -> None:
    """Files other tools name with dots in the operator name, two calls at the same timestamp,
    a parameter; an old-form name (no dtype) in one folder; a ``mapping.csv`` folder."""
    rng = np.random.default_rng(1)
    d = root / "rank_0" / "Net" / "0" / "1"
    ts = 1_700_000_000_000_999
    for name in (f"MatMul.Default.net.fc.MatMul-op90.0.0.{ts}.input.0.DefaultFormat.Float32.npy",
                 f"MatMul.Default.net.fc.MatMul-op90.0.0.{ts}.output.0.DefaultFormat.Float32.npy",
                 f"MatMul.Default.net.fc.MatMul-op90.0.0.{ts + 1}.output.0.DefaultFormat.Float32.npy",
                 f"Add.Default.net.Add-op91.-1.2.{ts}.input.1.NCHW.Float32.npy",
                 f"Add.Default.net.Add-op91.-1.2.{ts}.input.0.NCHW.Float32.npy",
                 f"Parameter.net.fc.w.0.0.{ts}.output.0.DefaultFormat.Float32.npy"):
        np.save(d / name, (rng.standard_normal(6) * scale).astype(np.float32))
    old = root / "rank_0" / "Net" / "0" / "2"
    np.save(old / f"Relu.Default.net.Relu-op92.0.0.{ts}.output.0.DefaultFormat.npy", np.ones(3, np.float32) * scale)
    mapped = root / "rank_0" / "Net" / "1" / "0"
    np.save(mapped / "0.npy", np.ones(4, np.float32) * scale)
    with open(mapped / ff.MAPPING_FILE, "w") as f:
        f.write(f"0.npy,Mul.Default.net.Mul-op93.0.0.{ts}.output.0.DefaultFormat.Float32.npy\n")


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("odd")
    for side, scale in (("a", 1.0), ("b", 1.0 + 1e-3)):
        for r in (0, 1):
            make_dump(base / side, iterations=(0, 1, 2), rank=r, seed=0 if side == "a" else 1)
        _odd_files(base / side, scale)
    return base


def _env_read(path, columns: bool):
    old = os.environ.get("OPDUMP_READER_COLUMNS")
    os.environ["OPDUMP_READER_COLUMNS"] = "1" if columns else "0"
    try:
        return open_dump(path)
    finally:
        if old is None:
            del os.environ["OPDUMP_READER_COLUMNS"]
        else:
            os.environ["OPDUMP_READER_COLUMNS"] = old


def _files(d) -> list:
    return [[vars(t) for t in it.files] for r in d.ranks.values() for it in r.iterations]


@pytest.mark.parametrize("which", ["odd", "sample"])
def test_column_scan_equals_the_per_file_scan(odd, which):
    path = odd / "a" if which == "odd" else MS_SAMPLE
    new, old = _env_read(path, True), _env_read(path, False)
    its = [it for r in new.ranks.values() for it in r.iterations]
    by_columns = [it for it in its if it.file_columns is not None]
    if which == "odd":
        assert by_columns and len(by_columns) < len(its)     # the old-form and mapped folders: per file
    rec_new = new.records()
    assert all(it.file_columns is not None for it in by_columns)   # records made without the objects
    pd.testing.assert_frame_equal(rec_new, old.records(), check_exact=True)
    assert _files(new) == _files(old)
    assert all(it.file_columns is None and it._files is not None for it in by_columns)


def test_calls_numbered_in_timestamp_order(odd):
    d = _env_read(odd / "a", True)
    it = next(it for it in d.ranks[0].iterations if it.iteration == 1 and it.graph == 0)
    fc = it.file_columns
    rows = [(of, io, s, c) for of, io, s, c in zip(fc.cols["op_file"], fc.cols["io"], fc.cols["slot"],
                                                     fc.cols["call"]) if of.endswith("MatMul-op90")]
    assert rows == [("Default.net.fc.MatMul-op90", "input", 0, 0), ("Default.net.fc.MatMul-op90", "output", 0, 0),
                    ("Default.net.fc.MatMul-op90", "output", 0, 1)]
    adds = [(io, s) for of, io, s in zip(fc.cols["op_file"], fc.cols["io"], fc.cols["slot"]) if of.endswith("Add-op91")]
    assert adds == [("input", 0), ("input", 1)]                      # equal timestamps: by slot


def _cli(a, b, csv: Path, columns: bool) -> str:
    env = dict(os.environ, OPDUMP_READER_COLUMNS="1" if columns else "0", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "opdump", "compare", str(a), str(b), "--csv", str(csv)],
                       env=env, capture_output=True, text=True, cwd=str(csv.parent))
    assert p.returncode in (0, 1), p.stderr
    return p.stdout.replace(str(csv), "CSV")


@pytest.mark.parametrize("which", ["odd", "sample"])
def test_compare_command_output_unchanged(odd, tmp_path, which):
    if which == "odd":
        a, b = odd / "a", odd / "b"
    else:
        a = MS_SAMPLE
        b = tmp_path / "copy"
        shutil.copytree(MS_SAMPLE, b)
    out_new = _cli(a, b, tmp_path / "new.csv", True)
    out_old = _cli(a, b, tmp_path / "old.csv", False)
    assert out_new == out_old
    assert (tmp_path / "new.csv").read_bytes() == (tmp_path / "old.csv").read_bytes()
    assert len((tmp_path / "new.csv").read_bytes().splitlines()) > 10
