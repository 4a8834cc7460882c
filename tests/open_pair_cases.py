"""(Run by tests/test_compare_open_pair.py in a fresh pytest process.) Opening B in a forked child while A is read (opdump/analysis/compare/open_pair.py):
the same compare as opening both here (``OPDUMP_COMPARE_PARALLEL_OPEN=0``) -- table,
summary, CSV -- on generated statistics and tensor dumps; B's errors and warnings as
without the child; no child left behind."""
from __future__ import annotations

import importlib
import os
import warnings

import pandas as pd
import pytest

from opdump.analysis.compare import compare
from analysis_fixtures import make_dump
from test_compare_stat_fastpath import write_stats_dump

open_pair = importlib.import_module("opdump.analysis.compare.open_pair")


@pytest.fixture(autouse=True)
def _one_thread():
    """No other Python thread (the child is forked only then): an earlier test's progress
    bar may have left tqdm's monitor thread running; it is stopped here."""
    import threading
    try:
        from tqdm import tqdm
        if tqdm.monitor is not None:
            tqdm.monitor.exit()
            tqdm.monitor = None
    except ImportError:  # pragma: no cover - tqdm is a dependency
        pass
    assert threading.active_count() == 1, threading.enumerate()


def _run(a, b, monkeypatch, mode: str, **kw):
    monkeypatch.setenv("OPDUMP_COMPARE_PARALLEL_OPEN", mode)
    r = compare(str(a), str(b), progress=False, **kw)
    return r, open_pair.last_mode


def _no_children() -> bool:
    """The last forked child (if any) is gone: reaped, not running nor a zombie."""
    if not open_pair.last_pid:
        return True
    try:
        os.waitpid(open_pair.last_pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.mark.parametrize("kind", ["statistics", "tensors"])
def test_child_open_gives_the_same_compare(kind, tmp_path, monkeypatch):
    if kind == "statistics":
        a = write_stats_dump(tmp_path / "a", iterations=(0, 1), nonfinite=True)
        b = write_stats_dump(tmp_path / "b", iterations=(0, 1), nonfinite=True, seed=0, swap_ties=True, perturb=1e-3)
    else:
        a = make_dump(tmp_path / "a", saved_data="tensor", iterations=(0, 1))
        b = make_dump(tmp_path / "b", saved_data="tensor", iterations=(0, 1), seed=3)
    here, mode_here = _run(a, b, monkeypatch, "0")
    child, mode_child = _run(a, b, monkeypatch, "1")
    assert (mode_here, mode_child) == ("here", "child")
    pd.testing.assert_frame_equal(here.table, child.table, check_exact=True)
    assert here.to_dict() == child.to_dict()
    assert here.summary() == child.summary()
    here.to_csv(tmp_path / "here.csv")
    child.to_csv(tmp_path / "child.csv")
    assert (tmp_path / "here.csv").read_bytes() == (tmp_path / "child.csv").read_bytes()
    assert _no_children()


def test_b_not_a_dump_raises_as_before(tmp_path, monkeypatch):
    a = write_stats_dump(tmp_path / "a", iterations=(0,))
    (tmp_path / "empty").mkdir()
    errors = []
    for mode in ("0", "1"):
        monkeypatch.setenv("OPDUMP_COMPARE_PARALLEL_OPEN", mode)
        with pytest.raises(Exception) as e:
            compare(str(a), str(tmp_path / "empty"), progress=False)
        errors.append((type(e.value), str(e.value)))
        assert open_pair.last_mode == "here"            # the child failed: B opened here
    assert errors[0] == errors[1]
    assert _no_children()


def test_a_not_a_dump_raises_and_reaps_the_child(tmp_path, monkeypatch):
    b = write_stats_dump(tmp_path / "b", iterations=(0,))
    monkeypatch.setenv("OPDUMP_COMPARE_PARALLEL_OPEN", "1")
    with pytest.raises(Exception):
        compare(str(tmp_path / "missing"), str(b), progress=False)
    assert open_pair.last_pid and _no_children()


def test_warnings_of_b_are_shown_here(tmp_path, monkeypatch):
    """A warning the reader gives while opening B in the child (B's manifest says the run
    was interrupted) is shown in this process, as when B is opened here."""
    a = make_dump(tmp_path / "a", saved_data="statistic", iterations=(0,))
    b = make_dump(tmp_path / "b", saved_data="statistic", iterations=(0,), manifest=False)
    shown = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("OPDUMP_COMPARE_PARALLEL_OPEN", mode)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            compare(str(a), str(b), progress=False)
        shown[mode] = sorted(str(x.message) for x in w if "incomplete" in str(x.message))
        assert open_pair.last_mode == ("child" if mode == "1" else "here")
    assert shown["0"] and shown["1"] == shown["0"]


def test_switch_and_idle_cpu_rule(monkeypatch):
    monkeypatch.setenv("OPDUMP_COMPARE_PARALLEL_OPEN", "0")
    assert not open_pair.enabled()
    monkeypatch.setenv("OPDUMP_COMPARE_PARALLEL_OPEN", "1")
    assert open_pair.enabled()
    monkeypatch.delenv("OPDUMP_COMPARE_PARALLEL_OPEN")
    monkeypatch.setattr(os, "getloadavg", lambda: (50.0, 50.0, 50.0))
    assert not open_pair.enabled()                       # every CPU busy: B is read here
