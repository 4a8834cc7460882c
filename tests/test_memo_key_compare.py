"""Guards of the memo's key and of the taps' shape-text cache (stats_memo.h MemoKey::operator==,
row_batch.h shape_of), written for a change of their compares that was measured and not kept:
views of the same first element and element count that differ only in sizes or strides are other
memory to the memo; a GraphTaps slot whose shape changes (same rank, same element count) gets the
new shape text."""
import threading
import weakref

import pytest
import torch

from opdump.recorder.copies import Clock
from opdump.stats import native

memo_or_none = native.new_stats_memo()
pytestmark = pytest.mark.skipif(memo_or_none is None, reason="the native module could not be built here "
                                                              "(no C++ compiler, or OPDUMP_CPU_KERNEL=0)")


def test_gapped_views_differing_only_in_geometry_are_distinct():
    x = torch.arange(64.0).reshape(8, 8)
    a = x[:, :2]                   # sizes (8, 2), strides (8, 1): 16 elements from x[0, 0]
    b = x[:4, :4]                  # sizes (4, 4), strides (8, 1): 16 elements from x[0, 0]
    c = x[::2, :4]                 # sizes (4, 4), strides (16, 1)
    assert a.data_ptr() == b.data_ptr() == c.data_ptr() and a.numel() == b.numel() == c.numel()
    m = native.new_stats_memo()
    va, vb, vc = m.stats(a, 0), m.stats(b, 1), m.stats(c, 2)
    assert isinstance(va, tuple) and isinstance(vb, tuple) and isinstance(vc, tuple)
    assert va == (57.0, 0.0, float(a.sum()), float((a * a).sum()), 16)
    assert vb[2] == float(b.sum()) and vc[2] == float(c.sum())
    assert m.reads == 3
    assert m.stats(x[:4, :4], 3) == 1 and m.stats(x[:, :2], 4) == 0    # the same geometry: found


class _Recorder:                  # what GraphTaps.open reads of a recorder
    def __init__(self):
        self._lock = threading.Lock()
        self.clock = Clock()
        self._pending = {}


class _Runtime:                   # no call may go to the Python taps here
    def tap_inputs(self, *args):
        raise AssertionError("a tap went to the Python taps")
    tap_outputs = tap_inputs

    def _failed(self, exc, where):
        raise AssertionError(f"the taps failed at {where}: {exc}")


def test_a_slots_shape_text_follows_a_changed_shape_of_the_same_rank_and_size():
    """GraphTaps keeps a shape text per (operator, side, slot) across calls: a new shape of the
    same rank and element count at that slot gets its own text and byte count."""
    mod = native.module()
    memo, entries, dtypes, runtime = mod.StatsMemo(), [], [], _Runtime()
    taps = mod.GraphTaps(memo, entries, dtypes, torch.nn.Parameter, [("Mul", "Default/Mul-op0")], set(),
                         weakref.ref(runtime))
    outputs = taps.fast()[1]
    x, y = torch.randn(12), torch.randn(6)
    first = [(2, 6), (6, 2), (6, 2), (3, 4), (12,), (1, 12)]
    second = [(2, 3), (3, 2), (2, 3), (6,), (6, 1), (1, 6)]
    texts = []
    for call, (a, b) in enumerate(zip(first, second)):
        rec = _Recorder()
        taps.open(rec, "folder", True, call)
        outputs(0, (x.view(a), y.view(b)))
        assert taps.close() == 2
        texts.append([(row[8], row[6]) for row in rec._pending["folder"]])
        memo.clear()
        del entries[:], dtypes[:]
    text = lambda shape: "(" + ",".join(map(str, shape)) + ")"
    assert texts == [[(text(a), 48), (text(b), 24)] for a, b in zip(first, second)]
