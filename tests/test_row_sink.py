"""The native row sink (``row_sink.cpp``) builds exactly the statistic.csv rows, and the
statistics, that ``Recorder.record_all``'s Python loop builds, and hands back every call it
does not take without touching anything."""
import pytest
import torch

import opdump
from opdump.capture.op_info import OpInfo
from opdump.stats import native
from conftest import write_config

pytestmark = pytest.mark.skipif(native.module() is None,
                                reason="the native module could not be built here (a warning says why)")

STATS = ["max", "min", "avg", "l2norm", "count"]


def _tensors():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 8, generator=g)
    ints = torch.randint(-50, 50, (5, 4), generator=g, dtype=torch.int32)
    param = torch.nn.Parameter(torch.randn(3, 3, generator=g))
    return [
        [base, None, base.t()],                      # a view of memory already read: the same entry
        [base[:, 2:5], base[1:4, ::2]],              # slices with gaps (copied once, read natively)
        [ints, ints.to(torch.bool), ints.to(torch.uint8), ints.to(torch.bfloat16), ints.to(torch.float16)],
        [torch.tensor(2.5), torch.empty(0, 3)],      # 0-dim; empty (declined by the memo: Python adds it)
        [base.double(), torch.randn(2, 2, dtype=torch.complex64, generator=g)],   # declined dtypes
        [param, base.expand(2, 6, 8)],               # a Parameter; overlapping memory (stride 0)
        [torch.full((4,), float("nan")), torch.tensor([float("inf"), -1.0])],
    ]


def _record(tmp_path, native: bool):
    tmp_path.mkdir()
    cfg = write_config(tmp_path, common={"iteration": "0", "saved_data": "statistic", "statistic_category": STATS},
                       e2e={"stat_calc_mode": "device"})
    with opdump.Session(cfg) as session:
        rec = session.recorder
        if not native:
            rec._sink = None
        rows, cells = [], []
        for k, tensors in enumerate(_tensors()):
            op = OpInfo(k, "op", "Default", "default", (), ())
            rec.record_all("folder", op, "output", tensors)
            if native:
                assert rec._sink is not None, "the native path was not taken"
            pending = rec._pending.pop("folder")
            gathered = rec.stats.device_gather()
            cells.append(gathered.joined())
            rows.append([r[:3] + (r[3] - pending[0][3],) + r[4:] for r in pending])    # timestamps relative
        return rows, cells


def test_native_rows_equal_the_python_loop(tmp_path):
    native_rows, native_cells = _record(tmp_path / "native", True)
    python_rows, python_cells = _record(tmp_path / "python", False)
    assert native_rows == python_rows
    assert native_cells == python_cells
    first = native_rows[0]
    assert [r[5] for r in first] == [0, 2] and [r[3] for r in first] == [0, 2]     # None slot kept its number
    assert first[0][9] == first[1][9]              # base.t() reused base's entry
    assert [r[8] for r in native_rows[3]] == ["()", "(0,3)"]


def _sink(tmp_path):
    cfg = write_config(tmp_path, common={"iteration": "0", "saved_data": "statistic", "statistic_category": STATS},
                       e2e={"stat_calc_mode": "device"})
    session = opdump.Session(cfg)
    return session, session.recorder.stats.device_row_sink()


@pytest.mark.parametrize("odd", [torch.empty(2, 2, device="meta"), torch.eye(3).to_sparse(), 7, "text"],
                         ids=["meta", "sparse", "int", "str"])
def test_calls_it_does_not_take_append_nothing(tmp_path, odd):
    session, sink = _sink(tmp_path)
    try:
        rows = []
        entries = len(session.recorder.stats._batch)
        assert sink.record(rows, "op", "Default/op-op0", "input", 100, [torch.ones(2), odd]) == -1
        assert rows == [] and len(session.recorder.stats._batch) == entries
        assert sink.record(rows, "op", "Default/op-op0", "input", 100, (torch.ones(2), None)) == 1
        assert rows[0][3] == 100 and rows[0][7] is torch.float32 and rows[0][8] == "(2)"
    finally:
        session.close()
