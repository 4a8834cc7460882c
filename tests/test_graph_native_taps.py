"""Native graph taps (opdump/capture/graph/native_taps.py, ``GraphTaps`` in row_sink.cpp): a
statistics dump of a compiled model writes the same statistic.csv as the Python taps
(``OPDUMP_GRAPH_NATIVE_TAPS=0``), timestamps aside; a failing tap costs one warning and the
step goes on with the same values; a closed session is let go."""
import copy
import csv
import gc
import glob
import os
import warnings
import weakref

import pytest
import torch
from torch import nn

import opdump
from opdump.capture.graph import faults
from opdump.capture.graph.runtime import GraphRuntime
from opdump.stats import native
from conftest import write_config

pytestmark = pytest.mark.skipif(getattr(native.module(), "GraphTaps", None) is None,
                                reason="the native module is not built here (OPDUMP_CPU_KERNEL=0 or no compiler)")


class Net(nn.Module):
    """Operators of every kind the taps meet: tuple outputs with None slots (convolution_backward
    of the first layer), a mutating operator (batch norm's running statistics: ``copy_``), an empty
    tensor (the memo does not take it: Python path), integer outputs, views."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x))).flatten(2).mean(2)          # (n, 4)
        h = torch.cat([h, h * 2, h[:, :0], h.t().t() + 1, h.sigmoid()], 1)   # (n, 16), an empty slice
        h = self.ln(h)
        idx = h.argmax(1)
        return self.fc(h) + idx.unsqueeze(1).to(h.dtype) * 0


def _train(model, compiled, steps=2, session=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        torch.manual_seed(step)
        x, y = torch.randn(3, 3, 6, 6), torch.randint(0, 5, (3,))
        loss = nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if session is not None:
            session.step()
    return losses


def _dump(tmp_path, native_taps: bool, mode: str, input_output: int):
    """statistic.csv rows (timestamps apart) per file, the timestamps, and whether native taps ran."""
    tmp_path.mkdir()
    os.environ["OPDUMP_GRAPH_NATIVE_TAPS"] = "1" if native_taps else "0"
    try:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = Net()
        cfg = write_config(tmp_path, common={"saved_data": "statistic", "input_output": input_output},
                           e2e={"stat_calc_mode": mode})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with opdump.Session(cfg) as session:
                _train(model, torch.compile(model, backend=session.backend("eager")), session=session)
                used = any(o.native is not None and o.session is session
                           for o in gc.get_objects() if type(o) is GraphRuntime)
    finally:
        os.environ.pop("OPDUMP_GRAPH_NATIVE_TAPS", None)
        torch._dynamo.reset()
    rows, stamps = {}, {}
    for path in sorted(glob.glob(str(tmp_path / "dump" / "**" / "statistic.csv"), recursive=True)):
        with open(path, newline="") as f:
            table = list(csv.reader(f))
        key = os.path.relpath(path, tmp_path)
        stamps[key] = [int(r[4]) for r in table[1:]]
        rows[key] = [r[:4] + r[5:] for r in table]
    return rows, stamps, used


@pytest.mark.parametrize("mode,input_output", [("device", 0), ("host", 0), ("device", 1), ("device", 2)])
def test_native_taps_write_the_rows_of_the_python_taps(tmp_path, mode, input_output):
    python_rows, python_stamps, python_used = _dump(tmp_path / "python", False, mode, input_output)
    native_rows, native_stamps, native_used = _dump(tmp_path / "native", True, mode, input_output)
    assert native_used and not python_used
    assert python_rows and native_rows.keys() == python_rows.keys()
    for key in python_rows:
        assert native_rows[key] == python_rows[key], key
        for stamps in (python_stamps[key], native_stamps[key]):     # in recording order, never twice
            assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps), key
    ops = {r[1] for table in native_rows.values() for r in table[1:]}
    assert any("convolution_backward" in name for name in ops) and any("copy_" in name for name in ops)


def test_a_failing_native_tap_warns_once_and_the_step_goes_on(tmp_path):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    cfg = write_config(tmp_path, common={"saved_data": "statistic", "iteration": "0|1"},
                       e2e={"stat_calc_mode": "device"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with faults.inject("tap"), opdump.Session(cfg) as session:
            losses = _train(model, torch.compile(model, backend=session.backend("eager")), session=session)
    torch._dynamo.reset()
    expected = _train(reference, torch.compile(reference, backend="eager"))
    failures = [str(w.message) for w in caught if "is no longer dumped" in str(w.message)]
    assert losses == expected
    assert len(failures) == 1 and "InjectedFault" in failures[0], failures


def test_a_closed_session_is_let_go_by_native_taps(tmp_path):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    cfg = write_config(tmp_path, common={"saved_data": "statistic"}, e2e={"stat_calc_mode": "device"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = opdump.Session(cfg)
        with session:
            compiled = torch.compile(model, backend=session.backend("eager"))
            _train(model, compiled, session=session)
    ref = weakref.ref(session)
    del session
    _train(model, compiled, steps=1)        # the dump path's taps, closed for good: nothing recorded
    gc.collect()
    assert ref() is None
    torch._dynamo.reset()


@pytest.mark.parametrize("saved_data,windows", [("statistic", False), ("tensor", True), ("full", True)])
def test_hold_windows_only_where_tensor_files_are_written(tmp_path, saved_data, windows):
    """A dumped graph call opens a hold window (opdump/recorder/held.py) only when it writes tensor
    files: a statistics-only dump holds nothing, so it pays no window at every call's start and end."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    cfg = write_config(tmp_path, common={"saved_data": saved_data, "iteration": "0"},
                       e2e={"stat_calc_mode": "device"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with opdump.Session(cfg) as session:
            holds = session.recorder.holds
            opened = []
            real_open = holds.open
            holds.open = lambda: opened.append(1) or real_open()
            _train(model, torch.compile(model, backend=session.backend("eager")), steps=1, session=session)
    torch._dynamo.reset()
    assert bool(opened) == windows, (saved_data, len(opened))
    assert glob.glob(str(tmp_path / "dump" / "**" / "statistic.csv" if saved_data != "tensor"
                         else tmp_path / "dump" / "**" / "*.npy"), recursive=True)


# ---------------------------------------------------------------- native row text (rows.py, cell_text.cpp)
class _TextSpy:
    """Around the recorder's ``encode_batch`` (the real one still writes the file): every batch's
    text made both ways, native (``encode_rows``) and Python, kept for the test to compare."""

    def __init__(self, monkeypatch):
        from opdump.recorder import core, rows
        self.rows, self.pairs = rows, []
        real = rows.encode_batch

        def spy(stats, batch, device_cells):
            encode = rows._native_encoder()
            native_text = None if encode is None else rows._encode_native(encode, stats, batch, device_cells)
            python_text = real(stats, batch, device_cells, native_text=False)
            self.pairs.append((native_text, python_text))
            return real(stats, batch, device_cells)

        monkeypatch.setattr(core, "encode_batch", spy)


ALL_CATEGORIES = ["max", "min", "avg", "count", "negative zero count", "positive zero count", "nan count",
                  "negative inf count", "positive inf count", "zero count", "md5", "l2norm"]


@pytest.mark.parametrize("mode,categories", [("device", None), ("host", None), ("device", ALL_CATEGORIES),
                                             ("host", ALL_CATEGORIES)])
def test_native_row_text_equals_the_python_text(tmp_path, monkeypatch, mode, categories):
    """Every statistic.csv batch of a compiled model's dump (native taps for the default categories;
    Python taps and host futures with md5), NaN/Inf values included, is written natively, and its
    bytes are the Python path's."""
    spy = _TextSpy(monkeypatch)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        model.fc.bias[0] = float("inf")             # Inf cells (fc.bias), NaN ones (inf - inf downstream)
        model.fc.bias[1] = -float("inf")
    common = {"saved_data": "statistic", "iteration": "0"}
    if categories:
        common["statistic_category"] = categories
    cfg = write_config(tmp_path, common=common, e2e={"stat_calc_mode": mode})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with opdump.Session(cfg) as session:
            _train(model, torch.compile(model, backend=session.backend("eager")), steps=1, session=session)
    torch._dynamo.reset()
    assert spy.pairs
    for native_text, python_text in spy.pairs:
        assert native_text is not None and native_text == python_text
    text = b"".join(p for _, p in spy.pairs)
    assert b"nan" in text and b"inf" in text
    if categories:
        assert len(text.split(b"\n")[0].split(b",")) >= 10 + len(categories)


class _Named(nn.Module):
    """A module name holding a comma, quotes and unicode; ``odd``: another one with a newline."""

    def __init__(self, odd=""):
        super().__init__()
        self.first = 'fc,"ü"'
        self.second = "tail" + odd
        self.add_module(self.first, nn.Linear(4, 3))
        self.add_module(self.second, nn.Linear(3, 2))

    def forward(self, x):
        return getattr(self, self.second)(torch.relu(getattr(self, self.first)(x)))


def _eager_pairs(root, monkeypatch, model):
    from opdump.capture.eager import EagerCapture
    root.mkdir()
    spy = _TextSpy(monkeypatch)
    cfg = write_config(root, common={"saved_data": "statistic"}, e2e={"stat_calc_mode": "device"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with opdump.Session(cfg) as session, EagerCapture(session):
            for _ in range(2):
                model(torch.randn(2, 4)).sum().backward()
                session.step()
    monkeypatch.undo()
    return spy.pairs


def test_native_row_text_with_odd_names_equals_the_python_text(tmp_path, monkeypatch):
    """Eager capture, names with commas, quotes and unicode: written natively, the Python path's
    bytes; a batch holding a name with a control character is left to the Python path (None),
    which escapes it."""
    torch.manual_seed(0)
    pairs = _eager_pairs(tmp_path / "quoted", monkeypatch, _Named())
    assert pairs and b'""\xc3\xbc""' in b"".join(p for _, p in pairs)
    for native_text, python_text in pairs:
        assert native_text is not None and native_text == python_text
    pairs = _eager_pairs(tmp_path / "newline", monkeypatch, _Named(odd="\nx"))
    assert pairs and b"tail\\nx" in b"".join(p for _, p in pairs)
    for native_text, python_text in pairs:
        assert native_text == (None if b"tail\\nx" in python_text else python_text)
