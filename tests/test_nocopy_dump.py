"""Tensor files written from the tensors' own memory (opdump/recorder/held.py): no copy-out
on the training thread inside a graph call, and never a file with values written after
the tensor was recorded.

The writer is held back on purpose (every writer thread busy with a job waiting on an
event, real threads and real files) while the step goes on and writes in place what it
recorded: the graph's output (user code), the parameters (the optimizer), the gradients
(``zero_grad(set_to_none=False)``) and the input.  Every file must equal the same file of
a reference run whose writer was drained before any of those writes, and the key tensors
must equal an independent capture (a plain eager run on a copy of the model)."""
import copy
import os
import threading
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.recorder.held import Holds
from opdump.write.buffers import HostBuffers
from opdump.write.dtypes import to_numpy
from dumpfiles import tensor_files
from conftest import write_config


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _block(writer, threads: int) -> threading.Event:
    """Every writer thread busy until the returned event is set."""
    gate = threading.Event()
    started = threading.Barrier(threads + 1)

    def wait():
        started.wait()
        gate.wait()
    for _ in range(threads):
        writer.submit(wait)
    started.wait()
    return gate


def _step(tmp, *, late: bool, budget_mb: int = 256):
    """One dumped training step of a compiled Net; ``late``: the writer is held back during
    the step and everything recorded is written in place before it may run."""
    torch._dynamo.reset()
    cfg = write_config(tmp, common={"iteration": "0"},
                       extra={"opdump_settings": {"writer_threads": 2, "writer_queue_mb": budget_mb}})
    torch.manual_seed(0)
    model = Net()
    initial = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    x_at_record = x.clone()
    with opdump.Session(cfg) as session:
        compiled = torch.compile(model, backend=session.backend("eager"))
        gate = _block(session.writer, 2) if late else None
        out = compiled(x)
        out_at_record = out.detach().clone()
        loss = nn.functional.cross_entropy(out, y)
        if not late:
            session.writer.flush()
        loss.backward()
        if not late:
            session.writer.flush()
        with torch.no_grad():
            out.mul_(0)                    # user code writes the graph's output
            x.add_(1)                      # ...and its input
        opt.step()                         # the optimizer writes the parameters
        opt.zero_grad(set_to_none=False)   # ...and zeroes the gradients in place
        if gate is not None:
            gate.set()
        session.writer.flush()
        holds, buffers = session.recorder.holds, session.recorder.buffers
        counts = dict(held=holds.held, secured=holds.secured, kept=holds.kept, dropped=holds.dropped,
                      copies=buffers.copies, files=session.writer.files_written)
    torch._dynamo.reset()
    files = {(f.graph, f.op_type, f.op_name, f.io, f.slot): f for f in tensor_files(str(tmp / "dump"))}
    return dict(files=files, counts=counts, initial=initial, x=x_at_record, y=y, out=out_at_record)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {"late": _step(tmp_path_factory.mktemp("late"), late=True),
            "reference": _step(tmp_path_factory.mktemp("reference"), late=False)}


def test_every_file_equals_the_value_at_record_time(runs):
    late, ref = runs["late"]["files"], runs["reference"]["files"]
    assert late.keys() == ref.keys() and len(late) > 20
    for key, f in late.items():
        a, b = f.load(), ref[key].load()
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), key
    assert runs["late"]["counts"]["dropped"] == 0


def test_key_tensors_match_an_independent_eager_run(runs):
    run = runs["late"]
    files = list(run["files"].values())
    params = dict(run["initial"].named_parameters())
    dumped_params = {f.op_name: f for f in files if f.op_type == "Parameter"}
    for name, p in params.items():   # the values before the optimizer step wrote them
        assert np.array_equal(dumped_params[name.replace(".", "_")].load(), p.detach().numpy()), name
    assert np.array_equal(dumped_params["inputs0"].load(), run["x"].numpy())      # before x.add_(1)
    expected_out = run["initial"](run["x"]).detach().numpy()
    assert np.array_equal(run["out"].numpy(), expected_out)
    forward = [f for f in files if f.graph == 0 and f.io == "output" and f.op_type == "addmm"]
    assert any(f.load().shape == expected_out.shape and np.array_equal(f.load(), expected_out) for f in forward)
    inputs = [f for f in files if f.graph == 0 and f.io == "input" and f.load().shape == tuple(run["x"].shape)]
    assert inputs and all(np.array_equal(f.load(), run["x"].numpy()) for f in inputs)
    reference = copy.deepcopy(run["initial"])
    nn.functional.cross_entropy(reference(run["x"]), run["y"]).backward()
    grads = [f.load() for f in files if f.graph == 1 and f.io == "output"]
    for name, p in reference.named_parameters():      # the gradients, before zero_grad zeroed them
        g = p.grad.numpy()
        assert any(a.shape == g.shape and np.allclose(a, g, rtol=1e-5, atol=1e-6) for a in grads), name


def test_the_copy_is_skipped(runs):
    c = runs["late"]["counts"]
    # writer held back: every held tensor outlived its graph call; the private ones stayed held
    assert c["held"] > 0 and c["kept"] > 0
    assert c["copies"] < c["files"], c
    assert c["held"] == c["secured"] + c["kept"], c


def test_one_mib_budget(tmp_path):
    cfg = write_config(tmp_path, common={"iteration": "0"}, extra={"opdump_settings": {"writer_queue_mb": 1}})
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512))
    x = torch.randn(256, 512)              # activations of 0.5-1 MiB, weights of 2 MiB: beyond the budget
    with opdump.Session(cfg) as session:
        out = torch.compile(model, backend=session.backend("eager"))(x)
        expected = out.detach().clone()
        with torch.no_grad():
            out.mul_(0)
        held = session.recorder.holds.held
    torch._dynamo.reset()
    files = tensor_files(str(tmp_path / "dump"))
    assert held > 0 and session.writer.errors == []
    assert any(f.io == "output" and np.array_equal(f.load(), expected.numpy()) for f in files)
    assert not any(f.load().shape == expected.shape and not f.load().any() for f in files)


class _Layout:
    """What Holds.write needs of the session's layout: the open dump tree (None: plain paths)."""
    tree = None


def test_a_tensor_written_while_held_is_dropped_whole(tmp_path):
    holds = Holds(HostBuffers(1 << 20))
    t = torch.arange(100_000, dtype=torch.float32)
    window = holds.open()
    entry = holds.hold(window, t)
    t.add_(1)                              # a write opdump did not see coming (the net's case)
    path = str(tmp_path / "x.npy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert holds.write(_Layout(), path, entry, to_numpy) == 0
    assert os.listdir(tmp_path) == [] and holds.dropped == 1          # no file, no temporary
    assert any("left out" in str(w.message) for w in caught)
    entry.release()


def test_secured_entry_is_written_from_its_copy(tmp_path):
    holds = Holds(HostBuffers(1 << 20))
    t = torch.arange(100_000, dtype=torch.float32)
    expected = t.clone()
    window = holds.open()
    entry = holds.hold(window, t)
    holds.close(window)                    # t is referenced here: not private, copied
    t.mul_(0)
    assert holds.secured == 1 and holds.kept == 0
    path = str(tmp_path / "x.npy")
    assert holds.write(_Layout(), path, entry, to_numpy) == t.nbytes
    assert np.array_equal(np.load(path), expected.numpy())
    entry.release()


def test_private_entry_stays_held(tmp_path):
    holds = Holds(HostBuffers(1 << 20))
    window = holds.open()
    entry = holds.hold(window, torch.arange(100_000, dtype=torch.float32) * 2)   # no one else keeps it
    holds.close(window)
    assert holds.kept == 1 and holds.secured == 0 and entry.copy is None
    path = str(tmp_path / "x.npy")
    holds.write(_Layout(), path, entry, to_numpy)
    assert np.array_equal(np.load(path), np.arange(100_000, dtype=np.float32) * 2)
    entry.release()


def test_numpy_backed_tensor_is_not_private():
    holds = Holds(HostBuffers(1 << 20))
    array = np.zeros(100_000, dtype=np.float32)
    window = holds.open()
    holds.hold(window, torch.from_numpy(array))    # the only torch tensor, but numpy keeps the bytes
    holds.close(window)
    assert holds.secured == 1 and holds.kept == 0


def test_eager_in_place_write_after_record_keeps_the_recorded_value(tmp_path):
    """Eager capture keeps the copy: an operator's output written in place by the next
    operator is dumped with the value it had."""
    cfg = write_config(tmp_path, common={"iteration": "0"})

    class Scale(nn.Module):
        def forward(self, x):
            y = x * 3
            y.mul_(2)
            return y

    x = torch.randn(64, 64)
    with opdump.Session(cfg) as session, EagerCapture(session):
        gate = _block(session.writer, 2)
        Scale()(x)
        gate.set()
    files = tensor_files(str(tmp_path / "dump"))
    mul = [f for f in files if f.op_type == "mul" and f.io == "output"]
    assert mul and np.array_equal(mul[0].load(), (x * 3).numpy())


class OutOfRange(nn.Module):
    """Its forward raises an IndexError from an operator (the user's bug) after fc1 ran."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)

    def forward(self, x):
        h = self.fc1(x)
        return h[torch.tensor([1000])]


def test_a_users_error_secures_the_held_tensors_before_user_code_runs(tmp_path):
    """A dumped graph call that raises the user's error (it propagates, opdump/capture/graph/
    errors.py) never reaches its end tap: its hold window is closed as the error leaves the
    call, so the parameters held at its start are copied before the user's code writes them
    (here: an update in place after catching the error); without that, the version net would
    drop their files."""
    torch._dynamo.reset()
    cfg = write_config(tmp_path, common={"iteration": "0"},
                       extra={"opdump_settings": {"writer_threads": 2}})
    torch.manual_seed(0)
    model = OutOfRange()
    weight_at_call = model.fc1.weight.detach().clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session:
            compiled = torch.compile(model, backend=session.backend("eager"))
            gate = _block(session.writer, 2)
            with pytest.raises(IndexError):
                compiled(torch.randn(8, 64))
            with torch.no_grad():
                model.fc1.weight.add_(1.0)          # user code, after catching the error
            gate.set()
            session.writer.flush()
            holds = session.recorder.holds
            assert holds.held > 0 and holds.secured > 0 and holds.dropped == 0
    torch._dynamo.reset()
    assert not [w for w in caught if "opdump" in str(w.message)]
    params = {f.op_name: f for f in tensor_files(str(tmp_path / "dump")) if f.op_type == "Parameter"}
    assert np.array_equal(params["fc1_weight"].load(), weight_at_call.numpy())
