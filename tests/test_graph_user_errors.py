"""The user's own errors are theirs (README, "Graph mode"): an exception an operator of the
user's program raises while a dumped iteration runs propagates unchanged — same type,
message, traceback through the user's code — with no opdump warning, no second run of the
graph and dumping going on in later iterations; only opdump's own failures and the limits
of the operator-by-operator path (out of memory) take the warning and the real path.

Every run is compared with the same program without opdump: ``backend="aot_eager"``
runs the very ATen graphs of the dump path eagerly, so exceptions, buffers, a custom op's
calls and outputs must be identical.  Real torch.compile, real sessions, real files, a
real subprocess for the launcher's exit status.
"""
import copy
import os
import subprocess
import sys
import traceback
import warnings

import pytest
import torch
from torch import nn

import opdump
from opdump.capture.graph import faults
from conftest import write_config
from dumpfiles import tensor_files

CALLS = []          # the custom op's calls: a side effect outside tensors
OOM_ONCE = []       # armed: the custom op's next call fails to allocate (the dump path's extra memory)


@torch.library.custom_op("opdump_user_errors::checked", mutates_args=())
def checked(x: torch.Tensor, limit: float) -> torch.Tensor:
    CALLS.append(1)
    if OOM_ONCE:
        OOM_ONCE.clear()
        torch.empty(1 << 60, dtype=torch.uint8)       # the CPU allocator's real failure
    if x.abs().max() > limit:
        raise ValueError(f"activation above {limit}")
    return x.clone()


checked.register_fake(lambda x, limit: torch.empty_like(x))
checked.register_autograd(lambda ctx, grad: (grad, None))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x, idx):
        self.count.add_(1)                            # in place, before the failing operator
        h = torch.ops.opdump_user_errors.checked(torch.relu(self.lin(x)), 1e3)
        return h[idx].sum()                           # aten.index: IndexError for idx 9


BAD_STEP = 1


def _steps(compiled, model, session=None, bad=BAD_STEP, steps=3, oom_at=None):
    """Train ``steps`` steps (step ``bad`` indexes out of range); per step what the user saw."""
    seen = []
    for step in range(steps):
        torch.manual_seed(step)
        x = torch.randn(3, 4)
        idx = torch.tensor([0, 9] if step == bad else [0, 2])
        calls = len(CALLS)
        if step == oom_at:
            OOM_ONCE.append(1)
        try:
            out = compiled(x, idx)
            out.backward()
            seen.append(("ok", out.item(), model.lin.weight.grad.clone()))
            model.zero_grad(set_to_none=True)
        except Exception as exc:        # noqa: BLE001 - what the user's loop would see
            seen.append(("raised", type(exc), str(exc), traceback.extract_tb(exc.__traceback__)))
        seen.append(("count", model.count.item(), "calls", len(CALLS) - calls))
        if session is not None:
            session.step()
    return seen


def _reference(model, **kw):
    torch._dynamo.reset()
    return _steps(torch.compile(model, backend="aot_eager"), model, **kw)


def _dumped(tmp_path, model, real="aot_eager", stages=(), common=None, **kw):
    """The same steps with opdump dumping every iteration; (what the user saw, opdump's warnings)."""
    cfg = write_config(tmp_path, common={"iteration": "0|1|2", **(common or {})})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with faults.inject(*stages), opdump.Session(cfg) as session:
            seen = _steps(torch.compile(model, backend=session.backend(real)), model, session, **kw)
    return seen, [str(w.message) for w in caught if str(w.message).startswith("opdump")]


def _same(seen, expected):
    """Step by step: the same outcome, the same exception type and message, the same values."""
    assert len(seen) == len(expected)
    for got, want in zip(seen, expected):
        assert got[0] == want[0], (got, want)
        if got[0] == "ok":
            assert got[1] == want[1] and torch.equal(got[2], want[2]), (got, want)
        elif got[0] == "raised":
            assert got[1:3] == want[1:3], (got, want)
        else:
            assert got == want, (got, want)


def test_users_index_error_propagates_unchanged_once_and_dumping_goes_on(tmp_path):
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    seen, opdump_warnings = _dumped(tmp_path, model)
    expected = _reference(reference)
    _same(seen, expected)
    raised = seen[2 * BAD_STEP]
    assert raised[1] is IndexError and raised[2] == "index 9 is out of bounds for dimension 0 with size 3"
    # the graph ran once: the custom op before the failing index ran once (a second run of the
    # graph on the real path, the old behaviour, called it twice); AOTAutograd applies the
    # buffer's in-place update after the graph's last operator, so the failed call left it as
    # it was, as without opdump
    assert seen[2 * BAD_STEP + 1] == ("count", 1.0, "calls", 1)
    assert opdump_warnings == []
    # the traceback runs through the user's code: the call in _steps, then the graph's line
    frames = [(os.path.basename(f.filename), f.name) for f in raised[3]]
    assert ("test_graph_user_errors.py", "_steps") in frames, frames
    # dumping goes on: iteration 2 dumps what iteration 0 dumped
    files = tensor_files(str(tmp_path / "dump"))
    names = {i: {(f.graph, f.op_name, f.io, f.slot) for f in files if f.iteration == i} for i in (0, 2)}
    assert names[0] and names[2] == names[0]
    assert any(f.iteration == 1 and f.op_type == "checked" for f in files)   # dumped up to the failure


def test_a_custom_ops_own_error_is_the_users(tmp_path):
    """An error raised inside a custom op of the user's program (here at step 0, the first
    dumped call) propagates unchanged, once."""
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        model.lin.weight.mul_(1e6)                    # activations above the op's limit: ValueError
    reference = copy.deepcopy(model)
    seen, opdump_warnings = _dumped(tmp_path, model, bad=None, steps=2)
    expected = _reference(reference, bad=None, steps=2)
    _same(seen, expected)
    assert seen[0][:3] == ("raised", ValueError, "activation above 1000.0")
    assert seen[1] == ("count", 0.0, "calls", 1)
    assert opdump_warnings == []


def test_out_of_memory_on_the_dump_path_reruns_on_the_real_path_once(tmp_path):
    """A real allocator failure on the dump path: one warning, the call runs again on the real
    path and succeeds; the buffer's in-place update is applied once (the failed call applied
    none), the custom op — a side effect outside tensors — ran twice, as documented."""
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    seen, opdump_warnings = _dumped(tmp_path, model, bad=None, oom_at=1)
    expected = _reference(reference, bad=None)
    assert len(opdump_warnings) == 1 and "can't allocate memory" in opdump_warnings[0], opdump_warnings
    assert "is no longer dumped" in opdump_warnings[0]
    assert seen[3] == ("count", 2.0, "calls", 2)     # once applied; the op ran on both paths
    seen[3], expected[3] = seen[3][:2], expected[3][:2]
    _same(seen, expected)
    assert {f.iteration for f in tensor_files(str(tmp_path / "dump"))} == {0, 1}   # not after the failure


@pytest.mark.parametrize("stage", ["tap", "dumped call"])
def test_opdumps_own_failure_still_warns_once_and_takes_the_real_path(tmp_path, stage):
    """A failure of opdump's own (injected in a tap, or as the dump path is entered): one
    warning naming the graph, the real path, the same values; the user's error at step 1 then
    comes from the real path, unchanged, with no second warning."""
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    seen, opdump_warnings = _dumped(tmp_path, model, stages=(stage,))
    expected = _reference(reference)
    _same(seen, expected)
    assert len(opdump_warnings) == 1 and "InjectedFault" in opdump_warnings[0], opdump_warnings
    assert "the graph of Net" in opdump_warnings[0]


def test_eager_capture_lets_the_users_error_through_unchanged(tmp_path):
    """Eager capture: the same error, unchanged, no warning; the next iteration dumps the same
    operators under the same names (the failed forward left no scope behind)."""
    from opdump.capture.eager import EagerCapture

    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    cfg = write_config(tmp_path, common={"iteration": "0|1|2"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session, EagerCapture(session):
            seen = _steps(model, model, session)
    expected = _steps(reference, reference)
    _same(seen, expected)
    assert seen[2 * BAD_STEP][1] is IndexError
    assert [str(w.message) for w in caught if str(w.message).startswith("opdump")] == []
    files = tensor_files(str(tmp_path / "dump"))
    names = {i: {(f.op_name, f.io, f.slot) for f in files if f.iteration == i} for i in (0, 2)}
    assert names[0] and names[2] == names[0]


SCRIPT = '''
import sys
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, idx):
        return self.lin(x)[idx].sum()

model = torch.compile(Net(), backend="aot_eager")
for step in range(3):
    idx = torch.tensor([0, 9] if step == 1 else [0, 2])
    try:
        model(torch.randn(3, 4), idx).backward()
    except IndexError:
        if len(sys.argv) > 1:
            sys.exit(int(sys.argv[1]))
        raise
'''


def test_launcher_keeps_the_scripts_exit_status(tmp_path):
    """``opdump run`` of a script whose compiled model raises at step 1: Python's status 1 and
    the user's traceback, no opdump warning; a script that exits with its own status keeps it."""
    script = tmp_path / "train_fails.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("OPDUMP_CONFIG", "MINDSPORE_DUMP_CONFIG")}
    for args, status in (([], 1), (["7"], 7)):
        cfg = write_config(tmp_path, common={"iteration": "0|1|2", "path": str(tmp_path / f"dump{status}")},
                           name=f"dump{status}.json")
        proc = subprocess.run([sys.executable, "-m", "opdump", "run", "--config", cfg, str(script), *args],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == status, proc.stderr
        assert "opdump:" not in proc.stderr, proc.stderr
        if status == 1:
            assert proc.stderr.rstrip().endswith("IndexError: index 9 is out of bounds for dimension 0 with size 3")
            assert f'File "{script}", line 18' in proc.stderr, proc.stderr
        # the session still closed and flushed: step 0, and step 1 up to the failing operator
        assert {f.iteration for f in tensor_files(str(tmp_path / f"dump{status}"))} == {0, 1}


def test_overflow_watch_keeps_watching_after_the_users_error(tmp_path):
    """``op_debug_mode`` 3 (the overflow watch's taps, then the guards): the same exception, no
    warning, and the watch still reports overflows, in the failed iteration and after it."""
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    seen, opdump_warnings = _dumped(tmp_path, model, common={"op_debug_mode": 3}, steps=2)
    _same(seen, _reference(reference, steps=2))
    assert opdump_warnings == []
    torch._dynamo.reset()
    with torch.no_grad():
        model.lin.bias.fill_(float("nan"))            # every step overflows
    cfg = write_config(tmp_path, common={"iteration": "all", "op_debug_mode": 3}, name="watch.json",
                       extra={"opdump_settings": {"existing": "overwrite"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session:
            seen = _steps(torch.compile(model, backend=session.backend("aot_eager")), model, session,
                          bad=0, steps=2)
    assert seen[0][1] is IndexError and seen[2][0] == "ok"
    reports = list((tmp_path / "dump").rglob("overflow.json"))
    # (graph, iteration): the failed forward's NaN is reported at iteration 0, and iteration 1's
    # forward and backward are still watched
    assert sorted(p.parts[-3:-1] for p in reports) == [("0", "0"), ("0", "1"), ("1", "1")], reports
    assert [str(w.message) for w in caught if "is no longer dumped" in str(w.message)] == []


@torch.library.custom_op("opdump_user_errors::bump", mutates_args=("buf",))
def bump(buf: torch.Tensor, x: torch.Tensor) -> None:
    if x.max() > 100:
        raise ValueError("bump: input above 100")
    buf.add_(1)


class Asserting(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bumps", torch.zeros(()))

    def forward(self, x, idx):
        torch._assert_async(x.sum() > -100, "the batch sum must stay above -100")   # not a dumped operator
        torch.ops.opdump_user_errors.bump(self.bumps, x)      # a mutating custom op: auto_functionalized
        return (x * 2)[idx].sum()


def test_an_assertion_and_a_mutating_custom_op_in_the_graph_are_the_users(tmp_path):
    """``torch._assert_async`` is no dumped operator (no file, no name) and a mutating custom op
    runs as a higher-order operator (``auto_functionalized``), but both are the program's calls:
    their errors propagate unchanged, no warning, the next iterations dump."""
    model = Asserting()
    cfg = write_config(tmp_path, common={"iteration": "all"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session:
            compiled = torch.compile(model, backend=session.backend("aot_eager"))
            outcomes = []
            for step in range(4):
                x = torch.full((3,), {1: -50.0, 2: 200.0}.get(step, 1.0))
                try:
                    outcomes.append(compiled(x, torch.tensor([0, 2])).item())
                except (RuntimeError, ValueError) as exc:
                    outcomes.append(f"{type(exc).__name__}: {exc}")
                session.step()
    assert outcomes == [4.0, "RuntimeError: the batch sum must stay above -100", "ValueError: bump: input above 100", 4.0]
    assert model.bumps.item() == 2.0                  # steps 0 and 3; the failed calls applied nothing
    assert [str(w.message) for w in caught if str(w.message).startswith("opdump")] == []
    assert {f.iteration for f in tensor_files(str(tmp_path / "dump"))} == {0, 1, 2, 3}


class KernelIndex(nn.Module):
    """An index the user got wrong at step 1: inductor's own bounds check raises."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, idx):
        return self.fc(x)[idx].sum()


def test_kernel_dump_user_error_propagates_without_a_warning(tmp_path):
    """``graph_dump: "kernels"``: an error raised by inductor's code of the user's program in a
    dumped call is the user's too (compile.py marks it): no opdump warning, no re-run, and
    the next iteration still dumps its kernels."""
    torch._dynamo.reset()
    cfg = write_config(tmp_path, common={"iteration": "all", "saved_data": "statistic"},
                       extra={"opdump_settings": {"graph_dump": "kernels"}})
    torch.manual_seed(0)
    model = KernelIndex()
    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session:
            compiled = torch.compile(model, backend=session.backend(), dynamic=False)
            compiled(x, torch.tensor([0, 1]))
            session.step()
            with pytest.raises(RuntimeError, match="out of bounds"):
                compiled(x, torch.tensor([0, 100]))
            session.step()
            compiled(x, torch.tensor([2, 3]))
            session.step()
    torch._dynamo.reset()
    assert not [w for w in caught if "opdump" in str(w.message)], [str(w.message) for w in caught]
    graph0 = os.path.join(str(tmp_path / "dump"), "rank_0", "Net", "0")
    assert os.path.exists(os.path.join(graph0, "2", "statistic.csv"))
