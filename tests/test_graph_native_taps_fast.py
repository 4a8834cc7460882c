"""The native graph taps' builtins (``GraphTaps.fast()`` in row_sink.cpp, used by
opdump/capture/graph/instrument.py through ``native_taps.methods``): the same rows as the
pybind11-bound taps, bound to the taps object (so ``uninstrument`` finds them), never raising,
and rows and statistics that the garbage collector does not track (they cannot form a cycle)."""
import gc
import threading
import weakref

import pytest
import torch

from opdump.capture.graph import native_taps
from opdump.recorder.copies import Clock
from opdump.stats import native

pytestmark = pytest.mark.skipif(getattr(native.module(), "GraphTaps", None) is None,
                                reason="the native module is not built here (OPDUMP_CPU_KERNEL=0 or no compiler)")

TIMESTAMP = 3      # contract.h RowField: the row's timestamp


class _Recorder:
    """What GraphTaps.open reads of a recorder: its lock, its clock and its pending rows."""

    def __init__(self):
        self._lock = threading.Lock()
        self.clock = Clock()
        self._pending = {}


class _Runtime:
    """The runtime the taps hand calls they do not take to; notes them."""

    def __init__(self):
        self.python = []

    def tap_inputs(self, index, tensors, files=True):
        self.python.append(("inputs", index, len(tensors)))

    def tap_outputs(self, index, value, files=True):
        self.python.append(("outputs", index))

    def _failed(self, exc, where):
        self.python.append(("failed", where))


def _taps(runtime):
    mod = native.module()
    entries, dtypes = [], []
    taps = mod.GraphTaps(mod.StatsMemo(), entries, dtypes, torch.nn.Parameter,
                         [("Add", "Default/Add-op0"), ("Mul", "Default/Mul-op1")], set(), weakref.ref(runtime))
    return taps, entries


def _tensors():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 5, generator=g), torch.randn(7, generator=g)
    return a, b, a.t(), (b, None, a)


def _run(calls):
    runtime = _Runtime()
    taps, entries = _taps(runtime)
    rec = _Recorder()
    taps.open(rec, "folder", True, 0)
    a, b, at, tup = _tensors()
    inputs, outputs, both = calls(taps)
    inputs(0, a, b)
    outputs(0, at)
    both(1, tup, a, at)
    n = taps.close()
    rows = rec._pending["folder"]
    return [r[:TIMESTAMP] + r[TIMESTAMP + 1:] for r in rows], [r[TIMESTAMP] for r in rows], entries, n, runtime


def test_fast_taps_are_builtins_bound_to_the_taps_object():
    taps, _ = _taps(_Runtime())
    fast = native_taps.methods(taps)
    assert [f.__name__ for f in fast] == ["inputs", "outputs", "both"]
    for f in fast:
        assert f.__self__ is taps and getattr(f.__self__, "graph_tap", False)   # what uninstrument looks for
        assert type(f).__name__ == "builtin_function_or_method"
        assert f.__module__ == type(taps).__module__        # FX's code generation needs one
    assert taps.fast() is not None


def test_fast_taps_record_the_rows_of_the_bound_taps():
    fast_rows, fast_ts, fast_entries, n_fast, rt_fast = _run(lambda t: tuple(t.fast()))
    slow_rows, slow_ts, slow_entries, n_slow, rt_slow = _run(lambda t: (t.inputs, t.outputs, t.both))
    assert fast_rows == slow_rows and fast_entries == slow_entries
    assert n_fast == n_slow == len(fast_rows) == 2 + 1 + 2 + 2
    assert fast_ts == sorted(fast_ts) and len(set(fast_ts)) == len(fast_ts)     # the clock's stamps
    assert rt_fast.python == rt_slow.python == []


def test_fast_taps_hand_what_they_do_not_take_to_the_python_taps():
    runtime = _Runtime()
    taps, _ = _taps(runtime)
    rec = _Recorder()
    taps.open(rec, "folder", True, 0)
    inputs, outputs, both = taps.fast()
    inputs(0, torch.randn(3, dtype=torch.complex64))        # a dtype the memo does not read
    outputs(1, {"not": "a tuple"})
    both(1, torch.randn(2), torch.empty(0))                  # an empty input
    inputs(5, torch.randn(2))                                # an index past the operators
    assert runtime.python == [("inputs", 0, 1), ("outputs", 1), ("inputs", 1, 1), ("outputs", 1), ("inputs", 5, 1)]
    assert rec._pending == {}


def test_fast_taps_never_raise():
    runtime = _Runtime()
    taps, _ = _taps(runtime)
    inputs, outputs, both = taps.fast()
    t = torch.randn(3)
    for closed in (True, False):
        if not closed:
            taps.open(_Recorder(), "folder", True, 0)
        assert inputs() is None and outputs() is None and both() is None
        assert outputs(0) is None and both(0) is None
        assert inputs("0", t) is None and outputs(2 ** 80, t) is None and both(None, t, t) is None
    taps.release()
    assert inputs(0, t) is None and outputs(0, t) is None


def test_rows_and_statistics_are_not_tracked_by_the_garbage_collector():
    rows, _, entries, _, _ = _run(lambda t: tuple(t.fast()))
    assert rows and entries
    rec_rows = rows      # the copies above are new tuples: look at the recorder's own rows
    runtime = _Runtime()
    taps, entries = _taps(runtime)
    rec = _Recorder()
    taps.open(rec, "folder", True, 0)
    a, b, at, tup = _tensors()
    taps.fast()[2](1, tup, a, at)
    assert len(rec._pending["folder"]) == len(rec_rows[-4:])
    assert not any(gc.is_tracked(r) for r in rec._pending["folder"])
    assert entries and not any(gc.is_tracked(e) for e in entries)
