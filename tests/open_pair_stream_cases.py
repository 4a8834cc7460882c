"""(Run by tests/test_compare_open_pair_stream.py in a fresh pytest process.) B's dump streamed
from the forked child (opdump/analysis/compare/open_pair.py: the parent unpickles while the
child pickles): a dump larger than the pipe and its buffers arrives whole (the same compare as
opening both here); a child that dies mid-stream, or exits 0 after a torn pickle, or sends
bytes after the pickle, costs only time -- B is opened here, same results, no child left."""
from __future__ import annotations

import importlib
import os
import pickle

import pandas as pd
import pytest

from analysis_fixtures import make_dump
from open_pair_cases import _no_children, _one_thread, _run  # noqa: F401 (fixture re-used)

open_pair = importlib.import_module("opdump.analysis.compare.open_pair")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    return (make_dump(root / "a", saved_data="tensor", iterations=tuple(range(6))),
            make_dump(root / "b", saved_data="tensor", iterations=tuple(range(6)), seed=3))


def _same(x, y, tmp_path):
    pd.testing.assert_frame_equal(x.table, y.table, check_exact=True)
    assert x.summary() == y.summary()
    x.to_csv(tmp_path / "x.csv")
    y.to_csv(tmp_path / "y.csv")
    assert (tmp_path / "x.csv").read_bytes() == (tmp_path / "y.csv").read_bytes()


def test_a_dump_larger_than_the_buffers_streams_whole(pair, tmp_path, monkeypatch):
    real = open_pair._send
    size_file = tmp_path / "size"

    def spy(w, obj):                      # in the child: the pickle's size, told through a file
        size_file.write_text(str(len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))))
        real(w, obj)
    monkeypatch.setattr(open_pair, "_send", spy)
    monkeypatch.setattr(open_pair, "_BUFFER", 4096)                  # the pipe's 64 KiB and two small buffers
    here, mode_here = _run(*pair, monkeypatch, "0")
    child, mode_child = _run(*pair, monkeypatch, "1")
    assert (mode_here, mode_child) == ("here", "child")
    assert int(size_file.read_text()) > (64 << 10) + 2 * 4096         # more than the buffers hold
    _same(here, child, tmp_path)
    assert _no_children()


def _torn(w, obj):                        # half a pickle, then a clean exit (code 0)
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    with os.fdopen(w, "wb") as f:
        f.write(data[:len(data) // 2])


def _dies(w, obj):                        # half a pickle, then the child is gone
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    os.write(w, data[:1 << 16])
    os._exit(9)


def _trailing(w, obj):                    # a whole pickle and bytes after it
    with os.fdopen(w, "wb") as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.write(b"\x00" * (3 << 20))


@pytest.mark.parametrize("send", [_torn, _dies, _trailing])
def test_a_broken_stream_opens_b_here(pair, tmp_path, monkeypatch, send):
    here, _ = _run(*pair, monkeypatch, "0")
    monkeypatch.setattr(open_pair, "_send", send)
    got, mode = _run(*pair, monkeypatch, "1")
    assert mode == "here" and open_pair.last_pid
    _same(here, got, tmp_path)
    assert _no_children()
