"""The operators a program runs through the dispatcher in plain eager, read from
``torch.profiler`` (RecordFunction wraps every dispatcher call), in the form a
``TorchDispatchMode`` is handed them: an oracle for eager dumps independent of opdump
(tests/test_eager_observed_ops.py; README, Eager mode).
"""
from __future__ import annotations

import functools
from typing import List

import torch
from torch.profiler import ProfilerActivity, profile


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
_ADD_OUT_OF_PLACE = {"aten::linear", "aten::_scaled_dot_product_attention_math"}

#: Where the operators a dispatch mode is handed differ from plain eager's dispatcher calls
#: by PyTorch's own design -- for every mode, not only opdump's; ``plain_eager_ops(...,
#: as_under_a_mode=True)`` applies them.  (The mode's *own* extra calls, the detach of
#: ``shallow_copy_and_detach``, are what the capture leaves out: not listed here.)
UNDER_A_MODE = {
    "_reshape_alias -> view": "reshape of a viewable tensor: at::isTensorSubclassLike is true while a "
                              "mode is active, and reshape then calls view",
    "add_ -> add (engine)": "the autograd engine sums two gradients of one tensor out of place "
                            "(InputBuffer::accumulate: can_accumulate_inplace is false for subclass-like)",
    "add_ -> add (linear, sdpa math)": "linear's bias on a 3-D input, the attention mask in "
                                       "_scaled_dot_product_attention_math: add_ in plain eager, "
                                       "add when a tensor is subclass-like",
    "detach_ (dropped)": "implemented at the Autograd key with no redispatch: no mode is ever handed it "
                         "(torch.tensor() calls it on its result)",
    "empty, to before lift_fresh (dropped)": "torch.tensor() builds its data with the Python key excluded; "
                                             "a mode is handed only lift_fresh",
    # not rewritten here (no model makes a parameter in its step): test_parameter_made_in_the_step
    "detach of nn.Parameter(t)": "_make_subclass detaches t with the dispatch modes stashed",
}


def plain_eager_ops(fn, inference=False, as_under_a_mode=False) -> List[str]:
    """The operators ``fn`` runs through the dispatcher in plain eager, in the form a
    dispatch mode sees them, read from ``torch.profiler``'s event tree (RecordFunction
    wraps every dispatcher call).

    * A top-level ATen event is one call the mode sees -- unless it is a
      CompositeImplicitAutograd operator: that one decomposes at the Autograd key, above
      the Python key, so the mode sees its parts (its children) instead.  Under
      ``inference`` (inference mode: the Autograd keys are excluded) a composite operator
      reaches the Python key whole.
    * Inside a non-composite operator that was dispatched at the Autograd key (it has a
      sequence number), a child with a sequence number is autograd's own call before the
      kernel (the clone of an in-place operator's original ``self`` saved for backward):
      the mode sees it, before the operator.  Every other child is a call of the kernel,
      which runs after the mode was handed the operator, and is not seen.
    * A ``record_function`` scope (``Optimizer.step#SGD.step``) is the two dispatcher calls
      ``profiler::_record_function_enter_new`` / ``_record_function_exit`` around its body
      (the profiler shows the scope, not the calls).

    ``as_under_a_mode``: also apply the places where PyTorch itself takes another path
    while a dispatch mode is active, or hides a call from every mode -- the dump cannot
    list what the mode is never handed (:data:`UNDER_A_MODE`).
    """
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    out: List[str] = []

    def emit(name, parent):
        if as_under_a_mode:
            parent_name = parent.name if parent is not None else ""
            if name == "_reshape_alias":
                name = "view"
            elif name == "add_" and (parent_name.startswith(_ENGINE) or parent_name in _ADD_OUT_OF_PLACE):
                name = "add"
            elif name == "detach_":
                return
            elif name == "lift_fresh":
                if out and out[-1] == "to":
                    out.pop()
                if out and out[-1] == "empty":
                    out.pop()
        out.append(name)

    def decomposes(event, kids) -> bool:
        """A CompositeImplicitAutograd call, decomposed above the Python key."""
        if inference:
            return False
        some, other = _composite(event.name)
        if not some:
            return False
        if not other:
            return True
        # a name with both kinds of overloads (aten::split: .sizes is composite, .Tensor is
        # not): recorded with grad mode on, a decomposition's parts are dispatched at the
        # Autograd key too (sequence numbers), a kernel's calls below it are not
        if event.sequence_nr >= 0:
            return any(k.sequence_nr >= 0 for k in kids)
        return any(k.name.startswith("aten::") for k in kids)

    def visit(event, parent):
        name = event.name
        if name.startswith("aten::"):
            kids = _children(event)
            if decomposes(event, kids):
                for k in kids:
                    visit(k, event)
                return
            if event.sequence_nr >= 0:      # dispatched at the Autograd key: autograd's own calls
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
