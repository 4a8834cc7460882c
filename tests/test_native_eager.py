"""The native eager observer (opdump/capture/eager/native, README "Eager mode"): real models,
real dumps, compared file by file with the Python capture's.

What is proven here, on AlexNet, the bench's transformer encoder and Llama-style decoder and a
tiny GPT-2 (random init): with ``OPDUMP_NATIVE_EAGER=1`` the dump's files are the Python
capture's -- every iteration's statistic.csv rows (all columns but the timestamp, same order),
its execution order, the listing -- whichever path served each iteration.  The first dumped
iteration is the Python capture's with the observer probing beside it; the observer serves
later iterations only where its probe named that iteration as the capture did.  A pattern it
does not model met in a served iteration drops that iteration (one warning, nothing written for
it), the Python capture serves the next ones, and the training is unharmed.
"""
import csv
import os
import sys
import warnings

import pytest
import torch

import opdump
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec
from opdump.stats import native

_TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_TESTS), "bench"))
sys.path.insert(0, _TESTS)
import models as bench_models  # noqa: E402  (bench/models.py)

ENV = "OPDUMP_NATIVE_EAGER"
_observer_built = native.module() is not None and hasattr(native.module(), "eager_observer")
pytestmark = pytest.mark.skipif(not _observer_built, reason="opdump's native module is not built on this machine")


@pytest.fixture(autouse=True, scope="module")
def _as_in_a_fresh_eager_process():
    """The native path stays off in a process that has compiled anything (README, native
    statistics path: operators of a compiled region must not be dumped by the observer); these
    tests stand for a fresh eager process, so Dynamo's frame counters, left by earlier test
    files in the same pytest process, are set aside while they run and put back after."""
    from torch._dynamo.utils import counters
    saved = dict(counters["frames"])
    counters["frames"].clear()
    yield
    counters["frames"].update(saved)


def test_a_process_that_compiled_keeps_the_python_capture(tmp_path, monkeypatch):
    """Once Dynamo has compiled a frame in the process, the observer never serves (the Python
    capture tells compiled regions apart; the observer cannot): the dump is the Python capture's."""
    from torch._dynamo.utils import counters
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    try:
        _, live, warned = run(tmp_path, _bench("alexnet"), None, monkeypatch, steps=2)
        assert live == [False, False] and not warned
    finally:
        counters["frames"].clear()
        torch._dynamo.reset()


# ---------------------------------------------------------------------- runs
def _zoo(name, batch, autocast=False):
    """A zoo model (tests/zoo/models.py: transformers configs, tiny, random init), AdamW."""
    def make():
        from zoo import models as zoo
        torch.manual_seed(0)
        model = getattr(zoo, name)()
        make_batch = zoo._image_batch(8) if batch == "image" else getattr(zoo, batch)
        inputs = make_batch(torch.Generator().manual_seed(0))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(**inputs).loss
            loss.backward()
            opt.step()
        return step
    return make


def _bench(name):
    def make():
        return getattr(bench_models, name)(quick=True).step
    return make


WORKLOADS = {"alexnet": _bench("alexnet"), "transformer": _bench("transformer"), "decoder": _bench("decoder"),
             "gpt2": _zoo("gpt2", "_token_batch"), "llama": _zoo("llama", "_token_batch"),
             "bert": _zoo("bert", "_class_batch"), "vit": _zoo("vit", "image"),
             "resnet": _zoo("resnet", "image")}


def run(root, make_step, native_on, monkeypatch, steps=3, **settings):
    """Dump iterations 0..steps-1 of ``make_step()``'s training; (root, whether the observer was
    ready to serve after each step, the native path's warnings)."""
    if native_on is None:                   # the default (on)
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, "1" if native_on else "0")
    cfg = DumpConfig(path=str(root), iteration=IterationSpec(ranges=((0, steps - 1),)),
                     **{"saved_data": "statistic", "stat_calc_mode": "device", **settings})
    step = make_step()
    live = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session, EagerCapture(session) as cap:
            for _ in range(steps):
                step()
                live.append(cap._native_live)
    return str(root), live, [w for w in caught if "native eager" in str(w.message)]


def rank_dir(root):
    return os.path.join(root, "rank_0")


def iteration_dir(root, it):
    return os.path.join(rank_dir(root), "Net", "0", str(it))


def stat_rows(root, it):
    """statistic.csv rows of one iteration, without the timestamp column."""
    with open(os.path.join(iteration_dir(root, it), "statistic.csv"), newline="") as f:
        rows = list(csv.reader(f))
    stamp = rows[0].index("Timestamp")
    return [r[:stamp] + r[stamp + 1:] for r in rows]


# in-place random fills: their input is the uninitialised memory they overwrite (dropout's mask)
_FILLS = ("bernoulli_", "uniform_", "normal_", "random_", "exponential_", "geometric_", "log_normal_", "cauchy_")


def _stable(rows, reference):
    """``rows`` with the statistics of uninitialised memory (``empty*`` outputs, a random fill's
    input) taken from ``reference``: those values differ from run to run whatever captures them
    (the other columns -- name, slot, dtype, shape -- are still compared)."""
    out = []
    for r, ref in zip(rows, reference):
        garbage = r[0].startswith(("empty", "new_empty")) or (r[0] in _FILLS and r[4] == "input")
        out.append(ref if garbage and r[:9] == ref[:9] else r)
    return out + rows[len(reference):]


def files_of(root):
    """Every file of the dump (relative path -> bytes: orders, listing…), statistic.csv files
    left out (compared row by row, without timestamps) and the run's own metadata
    (``.dump_metadata``: the dump's path, byte counts that include the text of uninitialised
    memory's statistics)."""
    out = {}
    base = rank_dir(root)
    for folder, _, names in os.walk(base):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, base)
            if name == "statistic.csv" or rel.startswith(".dump_metadata" + os.sep):
                out[rel] = None
                continue
            with open(path, "rb") as f:
                out[rel] = f.read()
    return out


def assert_same_dump(py_root, nat_root, iterations, missing=()):
    """The native run's dump is the Python run's: same files, same bytes, same statistic.csv
    rows but timestamps; ``missing``: iterations the native run dropped (no folder at all)."""
    py_files, nat_files = files_of(py_root), files_of(nat_root)
    dropped = {os.path.join("Net", "0", str(it)) for it in missing}
    expected = {k: v for k, v in py_files.items() if os.path.dirname(k) not in dropped}
    assert sorted(nat_files) == sorted(expected)
    for rel, data in expected.items():
        assert nat_files[rel] == data, rel
    for it in iterations:
        if it in missing:
            assert not os.path.exists(os.path.join(iteration_dir(nat_root, it), "statistic.csv"))
            continue
        py, nat = stat_rows(py_root, it), stat_rows(nat_root, it)
        assert _stable(nat, py) == py, it


# ---------------------------------------------------------------------- parity
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    out = {}
    try:
        for name, make in WORKLOADS.items():
            base = tmp_path_factory.mktemp(name)
            out[name] = (run(base / "python", make, False, mp), run(base / "native", make, True, mp))
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_native_dump_is_the_python_capture_dump(runs, name):
    """Iteration 0: the Python capture with the probe beside it; iterations 1-2: the observer
    (ready after step 0, uninstalled after step 2, the last dumped one); same dump."""
    (py_root, py_live, py_warned), (nat_root, nat_live, warned) = runs[name]
    assert not any(py_live) and not py_warned
    assert nat_live == [True, True, False], "the observer serves iterations 1 and 2"
    assert not warned, [str(w.message) for w in warned]
    assert_same_dump(py_root, nat_root, (0, 1, 2))


@pytest.mark.parametrize("name", ["alexnet", "decoder"])
def test_native_dump_is_the_python_capture_dump_with_host_statistics(tmp_path, monkeypatch, name):
    """``stat_calc_mode: "host"`` (the default): the same rows, from the same native memo."""
    (py_root, _, _), (nat_root, nat_live, warned) = [
        run(tmp_path / kind, WORKLOADS[name], kind == "native", monkeypatch, stat_calc_mode="host")
        for kind in ("python", "native")]
    assert nat_live == [True, True, False] and not warned
    assert_same_dump(py_root, nat_root, (0, 1, 2))


# ---------------------------------------------------------------------- where it is not used
@pytest.mark.parametrize("settings", [
    {"saved_data": "full"},                                   # tensor files
    {"dump_mode": 1, "kernels": ("Default/AlexNet/conv1-Conv2d",)},   # a selection
    {"statistic_category": ("max", "min", "md5")},            # md5: host copies
])
def test_not_used_outside_statistics_only_dumps(tmp_path, monkeypatch, settings):
    _, live, warned = run(tmp_path, _bench("alexnet"), True, monkeypatch, steps=2, **settings)
    assert live == [False, False] and not warned


def test_on_by_default_and_off_by_switch(tmp_path, monkeypatch):
    _, live, _ = run(tmp_path / "default", _bench("alexnet"), None, monkeypatch, steps=2)
    assert live == [True, False]
    _, live, _ = run(tmp_path / "off", _bench("alexnet"), False, monkeypatch, steps=2)
    assert live == [False, False]


# ---------------------------------------------------------------------- what it does not model
_LIB = torch.library.Library("opdump_native_test", "DEF")
_LIB.define("twice(Tensor x) -> Tensor")
# a kernel on the Autograd key that calls an operator itself: the Python capture sees that
# `mul` first, then nothing of `twice` (it never reaches the Python key); the observer sees
# `twice` first and cannot rebuild that order
_LIB.impl("twice", lambda x: torch.ops.aten.mul.Tensor(x, 2.0), "Autograd")


class Twice(torch.nn.Module):
    """``twice`` from step ``from_step`` on (a program whose operators change between steps)."""

    def __init__(self, from_step):
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)
        self.from_step = from_step
        self.step = 0

    def forward(self, x):
        y = self.fc(x)
        if self.step >= self.from_step:
            y = torch.ops.opdump_native_test.twice(y)
        self.step += 1
        return y.relu().sum()


def sgd_training(losses, make_model, make_input):
    """``make()`` -> ``step()``: SGD steps on ``make_model()`` (seeded, then ``make_input()``),
    each loss appended to ``losses``."""
    def make():
        torch.manual_seed(0)
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = make_input()

        def step():
            opt.zero_grad()
            loss = model(x)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return step
    return make


def _twice_training(losses, from_step):
    return sgd_training(losses, lambda: Twice(from_step), lambda: torch.randn(3, 6))


def _plain_losses(from_step, steps=4):
    plain = []
    step = _twice_training(plain, from_step)()
    for _ in range(steps):
        step()
    return plain


def _both_twice(tmp_path, monkeypatch, from_step):
    """The Python and the native run, made from one line (the listing's source stacks hold
    this test file's lines too)."""
    losses = {"python": [], "native": []}
    runs = [run(tmp_path / kind, _twice_training(losses[kind], from_step), kind == "native", monkeypatch, steps=4)
            for kind in ("python", "native")]
    return runs[0], runs[1], losses["python"], losses["native"]


def test_pattern_met_in_the_probe_keeps_the_python_capture(tmp_path, monkeypatch):
    """``twice`` from step 0: the probe meets it beside the Python capture; the observer never
    serves, one warning, the dump is the Python capture's in every iteration."""
    (py_root, _, _), (nat_root, live, warned), py_losses, nat_losses = _both_twice(tmp_path, monkeypatch, 0)
    assert len(warned) == 1 and "above autograd" in str(warned[0].message)
    assert live == [False, False, False, False]
    assert nat_losses == py_losses == _plain_losses(0)
    assert_same_dump(py_root, nat_root, (0, 1, 2, 3))


def test_failure_in_a_served_iteration_drops_it_and_training_goes_on(tmp_path, monkeypatch):
    """``twice`` from step 2: the observer serves iteration 1, meets ``twice`` in iteration 2:
    nothing of iteration 2 is written (never rows of both paths, never rows the Python capture
    would not write), one warning, the Python capture serves iteration 3, losses unchanged."""
    (py_root, _, _), (nat_root, live, warned), py_losses, nat_losses = _both_twice(tmp_path, monkeypatch, 2)
    assert len(warned) == 1, [str(w.message) for w in warned]
    assert "above autograd" in str(warned[0].message) and "iteration 2 is not dumped" in str(warned[0].message)
    assert live == [True, True, False, False]
    assert nat_losses == py_losses == _plain_losses(2)
    assert_same_dump(py_root, nat_root, (0, 1, 2, 3), missing=(2,))


class Shifting(torch.nn.Module):
    """A program the observer serves while it changes: from step 2 an extra operator runs
    first (every later operator's index, so its name, moves), the batch grows every step
    (every shape moves), and from step 3 a listed operator's number argument (a Python float
    torch wraps into a 0-d tensor) is -inf: the listing marks it ``nonfinite_args``."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 5)
        self.fc2 = torch.nn.Linear(5, 4)
        self.step = 0

    def forward(self, x):
        if self.step >= 2:
            x = x * 2.0
        shift = float("-inf") if self.step >= 3 else 0.0
        self.step += 1
        h = self.fc1(x).tanh()
        return self.fc2(h).relu().sum() + (h + shift).exp().sum()


def _shifting_training():
    torch.manual_seed(0)
    model = Shifting()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(2 + i, 6) for i in range(5)]

    def step():
        opt.zero_grad()
        model(batches[model.step]).backward()
        opt.step()
    return step


def test_served_iterations_follow_names_and_shapes_that_move(tmp_path, monkeypatch):
    """The observer makes each operator index's name, listing lookup and shape texts once and
    reuses them while the index holds the same operator in the same scope and shape: here
    iteration 2 inserts an operator (new to the listing, every later name moves) and every
    iteration's batch is larger; iterations 1-4 are served and their dump is still the Python
    capture's (a name or shape text reused for another operator or shape would differ)."""
    # both runs made from one line (the listing's source stacks hold this test file's lines too)
    (py_root, _, _), (nat_root, live, warned) = [run(tmp_path / kind, _shifting_training, kind == "native", monkeypatch,
                                                     steps=5) for kind in ("python", "native")]
    assert not warned, [str(w.message) for w in warned]
    assert live == [True, True, True, True, False]
    assert any(r[1] == "Default/Shifting/mul-op0" for r in stat_rows(nat_root, 2))
    listing = files_of(nat_root)[os.path.join("graphs", "ms_output_trace_code_graph_0.json")]
    assert b'"nonfinite_args": true' in listing
    assert_same_dump(py_root, nat_root, (0, 1, 2, 3, 4))


def test_autocast_keeps_the_python_capture(tmp_path, monkeypatch):
    """bf16 autocast: the Autocast key sits above autograd and its kernels call the operator
    again (``cat`` calls ``cat`` after casting its inputs), an order the observer cannot
    rebuild: the probe meets it in iteration 0, one warning, the Python capture serves every
    iteration and the dump is its dump."""
    make = _zoo("llama", "_token_batch", autocast=True)
    # both runs from one line: the listing's source stacks hold this file's lines too
    (py_root, py_live, py_warned), (nat_root, live, warned) = [
        run(tmp_path / kind, make, kind == "native", monkeypatch) for kind in ("python", "native")]
    assert not any(py_live) and not py_warned
    assert len(warned) == 1 and "above autograd" in str(warned[0].message), [str(w.message) for w in warned]
    assert live == [False, False, False]
    assert_same_dump(py_root, nat_root, (0, 1, 2))


def test_autocast_by_default_falls_back_without_a_warning(tmp_path, monkeypatch):
    """The same program with the native path on by default (not asked for by name): the probe
    turns it away and nothing is lost (the Python capture dumped the probed iteration and
    serves the rest), so no warning; the dump is the Python capture's."""
    make = _zoo("llama", "_token_batch", autocast=True)
    (py_root, _, _), (nat_root, live, warned) = [
        run(tmp_path / kind, make, None if kind == "default" else False, monkeypatch) for kind in ("python", "default")]
    assert live == [False, False, False] and not warned, [str(w.message) for w in warned]
    assert_same_dump(py_root, nat_root, (0, 1, 2))


def test_cuda_in_the_process_keeps_the_python_capture_unless_asked(tmp_path, monkeypatch):
    """CUDA initialised in the process (patched: this machine has no GPU, the real case cannot
    run here): the native path is on by default only for CPU programs, so it stays off unless
    OPDUMP_NATIVE_EAGER=1 asks for it."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    _, live, warned = run(tmp_path / "default", _bench("alexnet"), None, monkeypatch, steps=2)
    assert live == [False, False] and not warned
    _, live, _ = run(tmp_path / "asked", _bench("alexnet"), True, monkeypatch, steps=2)
    assert live == [True, False]
