"""The native graph taps' per-slot objects (``GraphTaps.slot_text``/``int_of`` in row_sink.cpp):
a slot's shape text and byte count, and the batch entries' numbers, are made once and shared by
the rows of every later call (no allocation per row, ~1,250 rows a step on a small decoder), and
made again when the slot's sizes or element size change."""
import weakref

import pytest
import torch

from opdump.stats import native
from opdump.stats.contract import ROW_FIELDS
from test_graph_native_taps_fast import _Recorder

pytestmark = pytest.mark.skipif(getattr(native.module(), "GraphTaps", None) is None,
                                reason="the native module is not built here (OPDUMP_CPU_KERNEL=0 or no compiler)")

NBYTES, SHAPE, HANDLE = (ROW_FIELDS.index(f) for f in ("nbytes", "shape", "device_handle"))


class _Runtime:
    def tap_inputs(self, index, tensors, files=True):
        raise AssertionError("a call the native taps take went to the Python taps")

    tap_outputs = tap_inputs

    def _failed(self, exc, where):
        raise AssertionError(f"the taps failed at {where}: {exc}")


def _taps():
    mod = native.module()
    memo, entries, dtypes = mod.StatsMemo(), [], []
    runtime = _Runtime()
    taps = mod.GraphTaps(memo, entries, dtypes, torch.nn.Parameter, [("Add", "Default/Add-op0")], set(),
                         weakref.ref(runtime))
    return taps, memo, entries, dtypes, runtime


def _call(taps, memo, entries, dtypes, iteration, *values):
    """One dumped call (a batch: entries numbered from 0) tapping ``values`` as operator 0's outputs."""
    rec = _Recorder()
    taps.open(rec, "folder", True, iteration)
    outputs = taps.fast()[1]
    for v in values:
        outputs(0, v)
    taps.close()
    rows = list(rec._pending["folder"])
    memo.clear()
    del entries[:], dtypes[:]
    return rows


def test_rows_share_their_slot_objects_across_calls():
    taps, memo, entries, dtypes, _rt = _taps()
    g = torch.Generator().manual_seed(0)
    first = _call(taps, memo, entries, dtypes, 0, torch.randn(300, 7, generator=g), torch.randn(300, 7, generator=g))
    second = _call(taps, memo, entries, dtypes, 1, torch.randn(300, 7, generator=g))
    rows = first + second
    assert [r[NBYTES] for r in rows] == [300 * 7 * 4] * 3 and [r[SHAPE] for r in rows] == ["(300,7)"] * 3
    assert rows[0][NBYTES] is rows[1][NBYTES] is rows[2][NBYTES]     # made once for the slot
    assert rows[0][SHAPE] is rows[2][SHAPE]
    assert [r[HANDLE] for r in rows] == [0, 1, 0]      # each call's batch numbers its entries from 0
    assert rows[0][HANDLE] is rows[2][HANDLE]


def test_slot_objects_follow_sizes_and_element_size():
    taps, memo, entries, dtypes, _rt = _taps()
    values = [torch.ones(2, 3), torch.ones(3, 2), torch.ones(2, 3, dtype=torch.int64), torch.ones(2, 3),
              torch.ones(()), torch.ones(5, dtype=torch.uint8)]
    rows = [r for i, v in enumerate(values) for r in _call(taps, memo, entries, dtypes, i, v)]
    assert [(r[NBYTES], r[SHAPE]) for r in rows] == [(24, "(2,3)"), (24, "(3,2)"), (48, "(2,3)"), (24, "(2,3)"),
                                                     (4, "()"), (5, "(5)")]
    assert [r[HANDLE] for r in rows] == [0] * len(values)
