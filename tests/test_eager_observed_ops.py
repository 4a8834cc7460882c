"""An eager dump lists the operators the model runs through the dispatcher (README, Eager
mode) -- not the calls that exist only because a dispatch mode is watching.

Under any ``TorchDispatchMode``, autograd's saving and unpacking of an operator's output
(``TensorImpl::shallow_copy_and_detach``), ``.data`` and ``tensor_data()`` call the Python
interpreter's ``detach`` directly, where plain eager runs no operator at all.  The
capture leaves those out; a real ``aten::detach`` (the user's ``x.detach()``,
AccumulateGrad's) stays.

The oracle is independent of opdump: the same program, same seed, run in plain eager
under ``torch.profiler`` (RecordFunction sees exactly the dispatcher's calls), its
top-level ATen operators taken from the event tree, with CompositeImplicitAutograd
operators replaced by what they decompose into (they decompose above the Python key, so
a dispatch mode sees their parts, never them).  The dump is read back through
opdump's reader.
"""
from __future__ import annotations

import functools
from typing import List

import pytest
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

import opdump
from opdump.analysis.reader import open_dump, op_type_of, scope_of
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec


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


# ---------------------------------------------------------------------- the oracle
@functools.lru_cache(maxsize=None)
def _composite(name: str):
    """(some overload of ``name`` is CompositeImplicitAutograd, some is not)."""
    ns, op = name.split("::", 1)
    packet = getattr(getattr(torch.ops, ns), op, None)
    if packet is None:
        return False, True
    some, other = False, False
    for overload in packet.overloads():
        full = name if overload == "default" else f"{name}.{overload}"
        try:
            has = torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeImplicitAutograd")
        except RuntimeError:        # a TorchScript-only overload (aten::to.prim_Device)
            continue
        some, other = some or has, other or not has
    return some, other


def _children(event):
    return sorted(event.cpu_children, key=lambda c: c.time_range.start)


_USER_SCOPE = int(torch._C._profiler.RecordScope.USER_SCOPE)
_ENGINE = "autograd::engine::evaluate_function: "


def plain_eager_ops(fn, inference=False, as_under_a_mode=False) -> List[str]:
    """The operators ``fn`` runs through the dispatcher in plain eager, in the form a
    dispatch mode sees them, read from ``torch.profiler``'s event tree (RecordFunction
    wraps every dispatcher call).

    * A top-level ATen event is one call the mode sees -- unless it is a
      CompositeImplicitAutograd operator: that one decomposes at the Autograd key, above
      the Python key, so the mode sees its parts (its children) instead.  Under
      ``inference`` (inference mode: the Autograd keys are excluded) a composite operator
      reaches the Python key whole.
    * Inside a non-composite operator, a child with a sequence number was dispatched at
      the Autograd key (autograd's own call before the kernel, e.g. the clone of an
      in-place operator's original ``self`` saved for backward): the mode sees it, before
      the operator.  Children without one are the kernel's calls, below the Python key.
    * A ``record_function`` scope (``Optimizer.step#SGD.step``) is the two dispatcher calls
      ``profiler::_record_function_enter_new`` / ``_record_function_exit`` around its body
      (the profiler shows the scope, not the calls).

    ``as_under_a_mode``: also apply the two places where PyTorch itself takes another path
    while any dispatch mode is active (``at::isTensorSubclassLike`` is true then), so that
    the program run under the mode calls a different, real operator:
    ``reshape`` of a viewable tensor calls ``view`` instead of ``_reshape_alias``, and the
    autograd engine sums two gradients of one tensor out of place (``add``) instead of
    in place (``add_``, ``InputBuffer::accumulate``'s ``can_accumulate_inplace``).
    """
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    out: List[str] = []

    def emit(name, parent):
        if as_under_a_mode:
            if name == "_reshape_alias":
                name = "view"
            elif name == "add_" and parent is not None and parent.name.startswith(_ENGINE):
                name = "add"
        out.append(name)

    def visit(event, parent):
        name = event.name
        if name.startswith("aten::"):
            some, other = _composite(name)
            kids = _children(event)
            # a name with both kinds of overloads (aten::sum): a composite one decomposes
            # into aten calls, a kernel's own calls have no sequence number
            if not inference and some and (not other or any(k.name.startswith("aten::") for k in kids)):
                for k in kids:
                    visit(k, event)
                return
            for k in kids:
                if k.name.startswith("aten::") and k.sequence_nr >= 0:
                    visit(k, event)
            emit(name[len("aten::"):], parent)
            return
        user_scope = event.scope == _USER_SCOPE
        if user_scope:
            out.append("_record_function_enter_new")
        for k in _children(event):
            visit(k, event)
        if user_scope:
            out.append("_record_function_exit")

    for event in sorted((e for e in prof.events() if e.cpu_parent is None), key=lambda e: e.time_range.start):
        visit(event, None)
    return out


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
