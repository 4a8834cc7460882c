"""Queued statistic.csv rows as C++ records (``RowBatch``, opdump/stats/row_batch.h): the native
eager observer and the native graph taps append records to it, the writer makes their text from
them (cell_text.cpp ``encode_rows``), and whoever reads rows gets the tuples a list would hold.

What is proven here: a RowBatch reads as the list of the same row tuples (index, slice,
iteration, appends from Python kept in order); on real dumps -- eager (the native observer) and
compiled (the native graph taps), device and host statistics, several statistic column sets --
every batch the writer is given is a RowBatch holding records whose statistic.csv bytes are those
the list of its tuples gives through the native encoder and through the Python path (today's
paths); md5 and the column sets the native memo does not give keep the list; the row sink's
operator and parameter rows as records are the list path's.
"""
import gc
import os
import sys
import warnings
import weakref

import pytest
import torch

import opdump
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec
from opdump.recorder import core, rows as row_text
from opdump.stats import native
from test_graph_native_taps_fast import _Recorder, _Runtime, _tensors

pytestmark = pytest.mark.skipif(native.module() is None,
                                reason="the native module is not built here (OPDUMP_CPU_KERNEL=0 or no compiler)")

_TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_TESTS), "bench"))
import models as bench_models  # noqa: E402  (bench/models.py)

TIMESTAMP = 3      # contract.h RowField


class _BatchRecorder(_Recorder):
    """A recorder whose rows are a RowBatch (Recorder._rows_of, the native row sink in use)."""

    def _rows_of(self, folder):
        rows = self._pending.get(folder)
        if rows is None:
            rows = self._pending[folder] = native.module().RowBatch()
        return rows


def _tap(rec):
    """The fast taps' calls of test_graph_native_taps_fast on ``rec``; the rows it holds after."""
    mod = native.module()
    runtime = _Runtime()
    taps = mod.GraphTaps(mod.StatsMemo(), [], [], torch.nn.Parameter,
                         [("Add", "Default/Add-op0"), ("Mul", "Default/Mul-op1")], set(), weakref.ref(runtime))
    taps.open(rec, "folder", True, 0)
    a, b, at, tup = _tensors()
    inputs, outputs, both = taps.fast()
    inputs(0, a, b)
    outputs(0, at)
    both(1, tup, a, at)
    n = taps.close()
    assert runtime.python == [] and n == 7
    return rec._pending["folder"]


def test_a_row_batch_reads_as_the_list_of_its_rows():
    batch = _tap(_BatchRecorder())
    plain = _tap(_Recorder())
    assert type(batch).__name__ == "RowBatch" and type(plain) is list
    rows = list(batch)
    assert len(batch) == len(rows) == len(plain) == 7 and bool(batch)
    strip = [r[:TIMESTAMP] + r[TIMESTAMP + 1:] for r in rows]
    assert strip == [r[:TIMESTAMP] + r[TIMESTAMP + 1:] for r in plain]
    assert all(type(r) is tuple and not gc.is_tracked(r) for r in rows)
    assert [r[TIMESTAMP] for r in rows] == sorted(r[TIMESTAMP] for r in rows)
    assert batch[0] == rows[0] and batch[-1] == rows[-1] and batch[2:5] == rows[2:5]
    with pytest.raises(IndexError):
        batch[7]
    # rows from Python are kept as they are, in order
    extra = ("Mul", "Default/Mul-op9", 0, 5, "output", 0, 4, torch.float32, "(1)", None, None)
    batch.append(extra)
    batch += [extra, extra]
    assert len(batch) == 10 and batch[7] is extra and list(batch)[:7] == rows and batch.records == 7
    with pytest.raises(TypeError):
        batch.append([1, 2])


def test_a_row_batch_is_written_as_the_list_of_its_rows():
    batch = _tap(_BatchRecorder())
    batch.append(("Mul", 'Default/"quoted",name', 0, 99, "output", 0, 4, torch.float32, "(1)", None, None))
    encode = native.module().encode_rows
    cells = [f"{i}.5,-{i},{i * 3}" for i in range(8)]
    for by_row, cell_list in ((False, cells), (True, [f"c{i}" for i in range(len(batch))])):
        expected = encode(list(batch), cell_list, by_row, ",,", {}, row_text.dtype_name)
        assert expected is not None
        assert encode(batch, cell_list, by_row, ",,", {}, row_text.dtype_name) == expected
    # a handle beyond the cells: None (the caller's Python path), as for the list
    assert encode(batch, cells[:1], False, ",,", {}, row_text.dtype_name) is None


# ---------------------------------------------------------------------- real dumps
@pytest.fixture
def written(monkeypatch):
    """Every (stats, batch, device cells) the recorder hands the writer, kept."""
    seen = []
    write = core.Recorder._write_rows

    def keep(self, folder, batch, device_cells):
        seen.append((self.stats, batch, device_cells))
        return write(self, folder, batch, device_cells)
    monkeypatch.setattr(core.Recorder, "_write_rows", keep)
    return seen


def _check(seen, batches_expected):
    assert seen
    kinds = {type(b).__name__ for _, b, _ in seen}
    assert kinds == ({"RowBatch"} if batches_expected else {"list"}), kinds
    if batches_expected:                # records made natively, not tuples appended
        assert all(b.records > 0 for _, b, _ in seen)
    for stats, batch, cells in seen:
        rows = list(batch)
        text = row_text.encode_batch(stats, batch, cells)
        assert text == row_text.encode_batch(stats, rows, cells)      # the native encoder, on tuples
        assert text == row_text._encode_python(stats, rows, cells)    # the Python path
        assert text.count(b"\n") == len(rows) > 0


_ALL_FUSED = ("l2norm", "count", "avg", "min", "max")


@pytest.mark.parametrize("mode,categories,batches", [
    ("device", None, True), ("device", _ALL_FUSED, True), ("device", ("max", "zero count", "md5"), False),
    ("host", None, True), ("host", ("max", "md5"), False)])
def test_eager_rows_are_written_as_today(tmp_path, monkeypatch, written, mode, categories, batches):
    """The native eager observer (iterations 1-2 of the bench's decoder, quick) appends records."""
    from torch._dynamo.utils import counters
    saved = dict(counters["frames"])
    counters["frames"].clear()          # a fresh eager process (see test_native_eager)
    monkeypatch.delenv("OPDUMP_NATIVE_EAGER", raising=False)
    extra = {} if categories is None else {"statistic_category": categories}
    cfg = DumpConfig(path=str(tmp_path), iteration=IterationSpec(ranges=((0, 2),)), saved_data="statistic",
                     stat_calc_mode=mode, **extra)
    step = bench_models.decoder(quick=True).step
    live = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with opdump.Session(cfg) as session, EagerCapture(session) as cap:
                for _ in range(3):
                    step()
                    live.append(cap._native_live)
    finally:
        counters["frames"].update(saved)
    assert live[0] or not batches        # device statistics: the observer served iterations 1 and 2
    _check(written, batches)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 5)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x))).flatten(2).mean(2)
        return self.fc(torch.cat([h[:, :0], h], 1))      # an empty slice: a Python-taps row among records


@pytest.mark.parametrize("mode,categories,batches", [
    ("device", None, True), ("device", _ALL_FUSED, True), ("host", None, True), ("host", ("min", "md5"), False)])
def test_graph_rows_are_written_as_today(tmp_path, written, mode, categories, batches):
    """The native graph taps of a compiled model append records (its parameters' rows too)."""
    from conftest import write_config
    common = {"saved_data": "statistic"}
    if categories is not None:
        common["statistic_category"] = list(categories)
    cfg = write_config(tmp_path, common=common, e2e={"stat_calc_mode": mode})
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with opdump.Session(cfg) as session:
                compiled = torch.compile(model, backend=session.backend("eager"))
                for step in range(2):
                    torch.manual_seed(step)
                    loss = torch.nn.functional.cross_entropy(compiled(torch.randn(3, 3, 6, 6)), torch.randint(0, 5, (3,)))
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    session.step()
    finally:
        torch._dynamo.reset()
    _check(written, batches)


def test_parameter_and_operator_rows_of_the_row_sink_are_records(tmp_path, monkeypatch):
    """Recorder.record_parameters / record_all's native sink (RowSink.record_into): the rows, their
    statistics and the batch entries of the list path, appended as records."""
    import test_parameter_rows
    batches = test_parameter_rows._record(tmp_path / "batch", True, monkeypatch)
    monkeypatch.setattr(core, "_ROW_BATCH", False)
    lists = test_parameter_rows._record(tmp_path / "list", True, monkeypatch)
    assert batches == lists

    cfg = DumpConfig(path=str(tmp_path / "ops"), saved_data="statistic", stat_calc_mode="device")
    with opdump.Session(cfg) as session:
        rec = session.recorder
        sink = rec._native_sink()
        batch, plain = rec._new_rows(), []
        g = torch.Generator().manual_seed(1)
        a, b = torch.randn(3, 4, generator=g), torch.randn(2, generator=g)
        for rows in (batch, plain):      # the second time the memo gives the handles of the first
            assert sink.record(rows, "Add", "Default/Add-op0", "input", 100, (a, None, b, a.t())) == 3
        assert list(batch) == plain and batch.records == 3
        assert sink.record(batch, "Parameter", ["w", "v"], "output", 200, (b, a)) == 2
        made = list(batch)
        assert [r[1] for r in made] == ["Default/Add-op0"] * 3 + ["w", "v"] and batch.records == 5
        assert [r[3] for r in made] == [100, 102, 103, 200, 201] and [r[5] for r in made] == [0, 2, 3, 0, 0]
        assert [r[9] for r in made[3:]] == [made[1][9], made[0][9]]      # b and a: read once
        rec._pending.clear()
        rec.stats.device_gather()
