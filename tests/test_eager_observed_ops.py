"""An eager dump lists the operators the model runs through the dispatcher (README, Eager
mode) -- not the calls that exist only because a dispatch mode is watching.

Under any ``TorchDispatchMode``, autograd's saving and unpacking of an operator's output
(``TensorImpl::shallow_copy_and_detach``), ``.data`` and ``tensor_data()`` call the Python
interpreter's ``detach`` directly, where plain eager runs no operator at all.  The
capture leaves those out; a real ``aten::detach`` (the user's ``x.detach()``,
AccumulateGrad's) stays.

The oracle (tests/eager_oracle.py) is independent of opdump: the same program, same seed, run in plain eager
under ``torch.profiler`` (RecordFunction sees exactly the dispatcher's calls), its
top-level ATen operators taken from the event tree, with CompositeImplicitAutograd
operators replaced by what they decompose into (they decompose above the Python key, so
a dispatch mode sees their parts, never them).  The dump is read back through
opdump's reader.
"""
from __future__ import annotations

import os
import sys
from typing import List

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

import opdump
from opdump.analysis.reader import open_dump, op_type_of, scope_of
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec
from eager_oracle import plain_eager_ops

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:           # bench/models.py: the benchmark's models
    sys.path.insert(0, _REPO)


# ---------------------------------------------------------------------- the dump's side
def dump_ops(tmp_path, run, dumped=(0, 0), **kw) -> List[str]:
    """Full names (execution order) of iteration ``dumped[0]`` of ``run(session)``'s eager dump."""
    cfg = DumpConfig(path=str(tmp_path), iteration=IterationSpec(ranges=(dumped,)), eager_capture="all", **kw)
    with opdump.Session(cfg) as session, EagerCapture(session):
        run()
    dump = open_dump(tmp_path)
    (it,) = [i for i in dump.ranks[0].iterations if i.graph == 0 and i.iteration == dumped[0]]
    return list(it.execution_order)


def types(names: List[str]) -> List[str]:
    return [op_type_of(n) for n in names]


# ---------------------------------------------------------------------- the detach cases
class LinRelu(nn.Module):
    def __init__(self, user_detach=False, data=False):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.user_detach, self.data = user_detach, data

    def forward(self, x):
        y = torch.relu(self.lin(x))
        if self.user_detach:
            y = y + y.detach()
        if self.data:
            y = y * self.lin.weight.data.sum()
        return y


def _step(model, x):
    model(x).sum().backward()


def test_mode_only_detach_calls_are_not_dumped(tmp_path):
    """Linear+ReLU forward/backward: relu's output is saved for threshold_backward.  Under
    the mode that shows as a detach after relu and one before threshold_backward; plain
    eager runs neither (the profiler sees only AccumulateGrad's two).  Fails without the
    filter (the dump then has four detach)."""
    torch.manual_seed(0)
    model, x = LinRelu(), torch.randn(4, 3)
    names = dump_ops(tmp_path, lambda: _step(model, x))
    assert types(names) == ["t", "addmm", "relu", "sum", "ones_like", "expand", "threshold_backward",
                            "t", "mm", "t", "sum", "view", "detach", "t", "detach"]
    detach = [n for n in names if op_type_of(n) == "detach"]
    assert [scope_of(n) for n in detach] == ["Gradients/Default/LinRelu/lin-Linear"] * 2    # AccumulateGrad
    torch.manual_seed(0)
    reference = LinRelu()
    assert types(names) == plain_eager_ops(lambda: _step(reference, x))


def test_user_detach_and_data_access(tmp_path):
    """The user's ``y.detach()`` is a dispatcher call: dumped, in its module's scope.
    ``weight.data`` is not one (``variable_data()``): not dumped."""
    torch.manual_seed(0)
    model, x = LinRelu(user_detach=True, data=True), torch.randn(4, 3)
    names = dump_ops(tmp_path, lambda: _step(model, x))
    forward = [op_type_of(n) for n in names if scope_of(n) == "Default/LinRelu"]
    assert forward == ["relu", "detach", "add", "sum", "mul"]
    torch.manual_seed(0)
    reference = LinRelu(user_detach=True, data=True)
    assert types(names) == plain_eager_ops(lambda: _step(reference, x))


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_detach_without_autograd(tmp_path, context):
    """With autograd off nothing is saved: the user's detach (on a tensor that requires
    grad, and on one that does not) is dumped, ``.data`` is not."""
    torch.manual_seed(0)
    model, x = LinRelu(user_detach=True, data=True), torch.randn(4, 3)

    def run():
        with getattr(torch, context)():
            y = model(x)
            y.detach()          # outside the module: "all" captures it too
            x.detach()

    names = dump_ops(tmp_path, run)
    inference = context == "inference_mode"
    linear = ["linear"] if inference else ["t", "addmm"]    # composite: whole under inference mode
    assert types(names) == linear + ["relu", "detach", "add", "sum", "mul", "detach", "detach"]
    assert types(names) == plain_eager_ops(run, inference=inference)


def test_views_and_inplace_on_views(tmp_path):
    """Views, an in-place write through a view (autograd rebases the history: CopySlices),
    and the backward through it: the same operators as plain eager."""
    class ViewNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x) * 2
            v = y[:, 1:3]
            v.mul_(torch.sigmoid(v))
            w = y.view(-1).unsqueeze(0).t()
            return torch.tanh(w).transpose(0, 1)

    torch.manual_seed(0)
    model, x = ViewNet(), torch.randn(3, 4)
    names = dump_ops(tmp_path, lambda: _step(model, x))
    torch.manual_seed(0)
    reference = ViewNet()
    expected = plain_eager_ops(lambda: _step(reference, x), as_under_a_mode=True)
    assert types(names) == expected
    assert expected.count("detach") == 2        # AccumulateGrad of weight and bias only
    assert "clone" in expected[:expected.index("mul_")]     # autograd's copy of mul_'s original self


# ---------------------------------------------------------------------- whole models
def _gpt2_workload():
    pytest.importorskip("transformers", reason="transformers is a test dependency (tests/zoo)")
    from bench.models import Workload
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    ids = torch.randint(0, 64, (2, 8))
    return Workload("gpt2", "tiny GPT-2, random weights, dropout 0.1", model,
                    torch.optim.AdamW(model.parameters(), lr=1e-3), ids, ids,
                    lambda out, y: nn.functional.cross_entropy(out.logits.flatten(0, 1), y.flatten()))


def _bench(name):
    def build():
        from bench import models
        if name == "decoder":
            pytest.importorskip("transformers", reason="transformers is a test dependency (tests/zoo)")
        return models.BUILDERS[name](quick=True)
    return build


@pytest.mark.parametrize("build", [_bench("alexnet"), _bench("transformer"), _bench("decoder"), _gpt2_workload],
                         ids=["alexnet", "transformer", "decoder", "gpt2"])
def test_dump_lists_the_operators_plain_eager_runs(tmp_path, build):
    """A training step (zero_grad, forward with dropout, loss, backward, optimizer) of each
    model: the dumped iteration's operators are the plain-eager profiler's, step for step
    (with ``eager_oracle.UNDER_A_MODE`` applied; before the filter every model differed by one
    ``detach`` per output saved for backward)."""
    work = build()

    def run():
        work.step()                 # iteration 0 (optimizer state made), not dumped
        torch.manual_seed(1)
        work.step()                 # iteration 1

    names = dump_ops(tmp_path, run, dumped=(1, 1))
    reference = build()
    reference.step()
    torch.manual_seed(1)
    expected = plain_eager_ops(reference.step, as_under_a_mode=True)
    # the iteration ends in optimizer.step()'s post hook, inside the step's record_function
    # scope: the scope's exit call is the first operator of the next iteration
    assert expected[0] == "_record_function_enter_new" and expected[-1] == "_record_function_exit"
    expected = ["_record_function_exit"] + expected[:-1]
    assert types(names) == expected
    assert "detach" in expected          # AccumulateGrad's stay


class _Forward(TorchDispatchMode):
    """A user's own dispatch mode: forwards every call (through the dispatcher)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("where", ["below", "above"])
def test_alongside_a_user_mode(tmp_path, where):
    """With another dispatch mode on the stack.  Entered before the capture (below it): the
    dump is plain eager's -- the mode-only detach calls reach opdump's mode first, and what
    the user's mode does with a call after opdump forwarded it is below the capture, as
    for every operator.  Entered after (above it): the user's mode is handed those detach
    calls first and re-issues them through the dispatcher -- real calls of the program
    (the profiler of plain eager with the user's mode sees them too), so they are dumped."""
    torch.manual_seed(0)
    model, x = LinRelu(), torch.randn(4, 3)

    def run():
        if where == "above":
            with _Forward():
                _step(model, x)
        else:
            _step(model, x)

    if where == "below":
        with _Forward():
            names = dump_ops(tmp_path, run)
    else:
        names = dump_ops(tmp_path, run)
    plain = ["t", "addmm", "relu", "sum", "ones_like", "expand", "threshold_backward",
             "t", "mm", "t", "sum", "view", "detach", "t", "detach"]
    if where == "below":
        assert types(names) == plain
    else:
        assert types(names) == plain[:3] + ["detach"] + plain[3:6] + ["detach"] + plain[6:]
        torch.manual_seed(0)
        reference = LinRelu()
        with_user_mode = plain_eager_ops(lambda: _in_mode(reference, x))
        assert sorted(types(names)) == sorted(with_user_mode)   # the same calls (the profiler nests
        # the re-issued detach inside relu's event, so its position there is not the mode's)


def _in_mode(model, x):
    with _Forward():
        _step(model, x)


def test_torch_func_grad(tmp_path):
    """``torch.func.grad`` (functorch's grad transform: autograd at an inner level): the
    saved relu output is no operator there either."""
    torch.manual_seed(0)
    model, x = LinRelu(), torch.randn(4, 3)
    params = dict(model.named_parameters())

    def run():
        torch.func.grad(lambda p, x: torch.func.functional_call(model, p, (x,)).sum())(params, x)

    names = dump_ops(tmp_path, run)
    assert types(names) == ["t", "addmm", "relu", "sum", "ones_like", "expand", "threshold_backward",
                            "t", "mm", "t", "sum", "view", "t"]
    assert types(names) == plain_eager_ops(run)


class _Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.blk = nn.Sequential(nn.Linear(3, 3), nn.Tanh())

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        return checkpoint(self.blk, self.a(x), use_reentrant=False)


def test_activation_checkpointing(tmp_path):
    """Non-reentrant activation checkpointing: ``blk`` is recomputed in the backward.  The
    checkpoint's pack hook calls ``x.detach()`` on what the recomputation saves (addmm's
    two inputs, tanh's output): real dispatcher calls, dumped.  Known difference to the
    oracle, exactly those three: the profiler nests them inside ``addmm``/``tanh`` without
    a sequence number, where the oracle cannot tell a saved-tensor hook's call from a
    kernel's own (which the mode never sees)."""
    torch.manual_seed(0)
    model, x = _Checkpointed(), torch.randn(2, 3)
    names = dump_ops(tmp_path, lambda: _step(model, x))
    recompute = ["t", "detach", "detach", "addmm", "tanh", "detach"]
    forward = ["t", "addmm", "t", "addmm", "tanh", "sum", "ones_like", "expand"]
    got = types(names)
    torch.manual_seed(0)
    reference = _Checkpointed()
    expected = plain_eager_ops(lambda: _step(reference, x), as_under_a_mode=True)
    start = len(forward)
    assert got[:start] == expected[:start] == forward
    assert got[start:start + len(recompute)] == recompute                  # the recomputation
    assert expected[start:start + 3] == ["t", "addmm", "tanh"]               # its detach calls nested
    assert got[start + len(recompute):] == expected[start + 3:]             # the rest: equal
    assert got[start + len(recompute)] == "tanh_backward"                    # no unpack detach before it


def test_parameter_made_in_the_step(tmp_path):
    """``nn.Parameter(t)`` detaches ``t`` with every dispatch mode stashed
    (``_make_subclass``): no mode is handed that detach.  Known difference, exactly it."""
    def run():
        nn.Parameter(torch.ones(2))

    names = dump_ops(tmp_path, run)
    assert types(names) == ["ones"]
    assert plain_eager_ops(run) == ["ones", "detach"]


# ---------------------------------------------------------------------- the debug modes
def _debug_order(cfg_path, run) -> List[str]:
    with opdump.Session(cfg_path) as session, EagerCapture(session):
        run()
    dump = open_dump(os.path.join(os.path.dirname(cfg_path), "dump"))
    (it,) = [i for i in dump.ranks[0].iterations if i.graph == 0]
    return list(it.execution_order)


@pytest.mark.parametrize("mode", ["overflow", "watcher"])
def test_debug_modes_are_handed_the_same_operators(tmp_path, mode):
    """The overflow watch and the watcher are handed the operators after the filter: their
    iteration's execution order is the plain dump's (no detach after relu)."""
    from conftest import write_config
    if mode == "overflow":
        cfg = write_config(tmp_path, {"op_debug_mode": 3, "iteration": "0"})
    else:
        cfg = write_config(tmp_path, {"input_output": 2, "iteration": "0"}, e2e={"watcher": {"watcher_nodes": ["relu"]}})
    torch.manual_seed(0)
    model, x = LinRelu(), torch.randn(4, 3)
    names = _debug_order(cfg, lambda: model(x).sum().backward())      # "model" capture: no sum/ones_like
    assert types(names) == ["t", "addmm", "relu", "expand", "threshold_backward",
                            "t", "mm", "t", "sum", "view", "detach", "t", "detach"]


class _RaisesAfterRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return torch.mm(torch.relu(self.lin(x)), torch.ones(5, 5))       # 4x2 @ 5x5: raises


def test_exception_dump_numbers_operators_as_the_dump_does(tmp_path):
    """op_debug_mode 4 names the operator that raised with the same N as a plain dump:
    relu's saved output is no operator, so the raising mm is op5 after randn, t, addmm, relu
    and ones (op6 before the filter: a detach after relu)."""
    import json
    from conftest import write_config
    cfg = write_config(tmp_path, {"op_debug_mode": 4})
    torch.manual_seed(0)
    model = _RaisesAfterRelu()
    with opdump.Session(cfg) as session, EagerCapture(session):
        with pytest.raises(RuntimeError):
            model(torch.randn(4, 3))
    (path,) = (tmp_path / "dump").rglob("exception.json")
    (record,) = json.loads(path.read_text())["exceptions"]
    assert record["op"] == "Default/_RaisesAfterRelu/mm-op5"
