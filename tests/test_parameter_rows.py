"""Parameters recorded by ONE native row-sink call (``Recorder.record_parameters`` through
``opdump/recorder/parameter_rows.py``) give exactly the rows and statistics of one
call per parameter, and a list the sink does not take wholly falls back to that loop."""
import pytest
import torch

import opdump
from opdump.format.files import PARAMETER_TYPE
from opdump.recorder import core
from opdump.stats import native
from conftest import write_config

pytestmark = pytest.mark.skipif(native.module() is None,
                                reason="the native module could not be built here (a warning says why)")

STATS = ["max", "min", "avg", "l2norm", "count"]


def _items():
    g = torch.Generator().manual_seed(5)
    w = torch.nn.Parameter(torch.randn(4, 3, generator=g))
    return [
        [("conv.weight", w), ("conv.bias", torch.randn(4, generator=g)),
         ("tied.weight", w),                                   # the same tensor again: the same entry
         ("fc.weight", torch.nn.Parameter(torch.randn(2, 5, generator=g).t())),   # a transposed view
         ("buf", torch.randint(0, 9, (3,), generator=g))],
        [("a", torch.ones(2)), ("none", None), ("b", torch.full((2, 2), float("nan")))],
        [("a", torch.ones(2)), ("odd", 7), ("b", torch.zeros(3))],        # not taken whole: one by one
        [("a", torch.ones(2)), ("empty", torch.empty(0, 2))],          # (an empty tensor: the Python path's)
    ]


def _record(tmp_path, batched: bool, monkeypatch):
    tmp_path.mkdir()
    if not batched:
        monkeypatch.setattr(core, "parameter_rows", lambda *a: False)   # the one-call-per-parameter loop
    cfg = write_config(tmp_path, common={"iteration": "0", "saved_data": "statistic", "statistic_category": STATS},
                       e2e={"stat_calc_mode": "device"})
    with opdump.Session(cfg) as session:
        rec = session.recorder
        out = []
        for items in _items():
            n0 = rec.tensors_recorded
            rec.record_parameters("folder", items)
            assert rec._sink is not None, "the native path was not taken"
            pending = rec._pending.pop("folder")
            cells = rec.stats.device_gather().joined()
            # timestamps as offsets, except a row of the Python path (its own clock read): its rank
            t0, n = pending[0][3], len(items)
            out.append(([r[:3] + (r[3] - t0 if r[3] - t0 < n else sorted(p[3] for p in pending).index(r[3]),)
                         + r[4:] for r in pending], cells, rec.tensors_recorded - n0))
    monkeypatch.undo()
    return out


def test_one_call_gives_the_rows_of_one_call_per_parameter(tmp_path, monkeypatch):
    batched = _record(tmp_path / "batched", True, monkeypatch)
    one_by_one = _record(tmp_path / "loop", False, monkeypatch)
    assert batched == one_by_one
    rows = batched[0][0]
    assert [r[1] for r in rows] == ["conv.weight", "conv.bias", "tied.weight", "fc.weight", "buf"]
    assert {r[0] for r in rows} == {PARAMETER_TYPE} and {r[5] for r in rows} == {0}
    assert [r[3] for r in rows] == [0, 1, 2, 3, 4]               # item k at ts + k
    assert rows[0][9] == rows[2][9]                               # the tied weight read once
    assert [r[1] for r in batched[1][0]] == ["a", "b"] and [r[3] for r in batched[1][0]] == [0, 2]
    assert batched[0][2] == 5 and batched[1][2] == 2
    assert [r[1] for r in batched[3][0]] == ["a", "empty"] and batched[3][0][1][9] is not None


def test_the_batched_call_is_what_serves_a_graph_call(tmp_path):
    """Without the batched call the sink is called once per parameter: counted here."""
    cfg = write_config(tmp_path, common={"iteration": "0", "saved_data": "statistic", "statistic_category": STATS},
                       e2e={"stat_calc_mode": "device"})
    with opdump.Session(cfg) as session:
        rec = session.recorder
        sink = rec._native_sink()
        calls = []
        real = sink.record

        class Counting:
            _batch = sink._batch

            def record(self, *args):
                calls.append(args[2])
                return real(*args)
        rec._sink = Counting()
        rec.record_parameters("folder", [(f"p{k}", torch.randn(3)) for k in range(5)])
        assert len(calls) == 1 and len(rec._pending["folder"]) == 5
        rec._pending.clear()
        rec.stats.device_gather()
