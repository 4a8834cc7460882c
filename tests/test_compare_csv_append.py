"""Appending the child's half of a compare CSV (opdump/analysis/compare/csv_halves._append_file):
the kernel's copy (os.copy_file_range) and the read/write fallback -- a file system that
refuses the copy from the start, or after part of it -- leave the same bytes: the text
written before, then the part file's bytes, exactly once."""
from __future__ import annotations

import os

import pytest

from opdump.analysis.compare import csv_halves

HEAD = "a,b\n1,é\n"
PART = ("2,ü\n" * 300_000).encode("utf-8")          # several MB: more than one chunk of the fallback


def _append(tmp_path, monkeypatch=None, refuse_after=None):
    part = tmp_path / "t.csv.rows"
    part.write_bytes(PART)
    target = tmp_path / "t.csv"
    if refuse_after is not None:
        real = os.copy_file_range
        calls = []

        def copy(src, dst, count, *a):
            calls.append(count)
            if len(calls) > refuse_after:
                raise OSError(95, "Operation not supported")
            return real(src, dst, min(count, 1 << 20), *a)      # part of it, then refused
        monkeypatch.setattr(os, "copy_file_range", copy)
    with open(target, "w", encoding="utf-8", newline="") as f:
        f.write(HEAD)
        f.flush()
        csv_halves._append_file(str(part), f)
    return target.read_bytes()


@pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="os.copy_file_range is Linux-only (Python 3.8+)")
def test_kernel_copy_appends_the_part(tmp_path):
    assert _append(tmp_path) == HEAD.encode("utf-8") + PART


@pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="os.copy_file_range is Linux-only (Python 3.8+)")
@pytest.mark.parametrize("refuse_after", [0, 2])
def test_refused_copy_falls_back_to_the_same_bytes(tmp_path, monkeypatch, refuse_after):
    assert _append(tmp_path, monkeypatch, refuse_after) == HEAD.encode("utf-8") + PART


def test_without_copy_file_range(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "copy_file_range", raising=False)
    assert _append(tmp_path) == HEAD.encode("utf-8") + PART
