"""Where taps go in an ATen graph, shared by every pass that observes a graph op by op
(the dump's :func:`~.instrument.instrument`, the overflow watch's and the watcher's passes in
:mod:`opdump.debug`).

Guarantees of :func:`insert_taps`: ``begin(placeholders)`` is the first call after the
placeholders, ``end()`` the last before the output; per operator, what ``before``/``after``
return is inserted right before/after it (the tap after an operator is then its inputs' last
use, so FX keeps them alive until it ran); nothing else changes; the graph is linted and
recompiled by FX codegen."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

#: a call to insert: (function, args), or None
Call = Optional[Tuple[Callable, tuple]]


def insert_taps(gm: fx.GraphModule, nodes: Sequence[fx.Node], ops: Sequence, begin: Callable, end: Callable,
                before: Callable[[fx.Node, object], List[Call]] = lambda node, op: [],
                after: Callable[[fx.Node, object], List[Call]] = lambda node, op: []) -> fx.GraphModule:
    """Insert ``begin``/``end`` and, for each node with its op (aligned), the calls ``before``
    and ``after`` give; recompile ``gm``."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first_real = next(n for n in graph.nodes if n.op != "placeholder")
    with graph.inserting_before(first_real):
        graph.call_function(begin, (placeholders,))
    for node, op in zip(nodes, ops):
        for call in before(node, op):
            if call is not None:
                with graph.inserting_before(node):
                    graph.call_function(*call)
        for call in reversed(after(node, op)):      # inserting_after(node) puts each one first
            if call is not None:
                with graph.inserting_after(node):
                    graph.call_function(*call)
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    with graph.inserting_before(output):
        graph.call_function(end, ())
    graph.lint()
    gm.recompile()
    return gm


def value_leaves(value) -> List:
    """An operator's result as a flat list (a tensor, a tuple/list of tensors and Nones, or
    any pytree)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and all(v is None or isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return pytree.tree_leaves(value)


class CallTaps:
    """``begin``/``end`` of one graph's taps for a mode that sees its operators one by one
    (the overflow watch, the watcher): ``begin`` notes the call and, when the iteration
    dumps, opens its folder (:attr:`folder`, None otherwise); ``end`` closes it and flushes
    the recorder's statistics.  Subclasses add the per-operator taps and override the hooks
    :meth:`opened` and :meth:`closing`.  No exception leaves a tap: a failure goes to the
    runtime's ``_failed`` (one warning, the step goes on)."""

    #: :func:`opdump.capture.graph.instrument.uninstrument` removes calls to objects saying so
    graph_tap = True

    def __init__(self, runtime):
        self.runtime = runtime
        self.folder: Optional[str] = None

    def opened(self, folder: str) -> None:
        """A dumped call starts writing into ``folder``."""

    def closing(self) -> None:
        """A dumped call ends (before the statistics flush)."""

    def begin(self, placeholders: Sequence) -> None:
        self.folder = None
        rt = self.runtime
        session = rt.session
        if session is None:
            return
        try:
            session.note_graph_ran(rt.graph_id)
            if session.is_dumping():
                folder = session.iteration_dir(rt.graph_id)
                self.opened(folder)
                self.folder = folder
        except Exception as exc:  # noqa: BLE001 - the dump must never break the step
            rt._failed(exc, "the start of a dumped call")

    def end(self) -> None:
        if self.folder is None:
            return
        self.folder = None
        rt = self.runtime
        try:
            self.closing()
            if rt.recorder is not None:
                rt.recorder.flush_statistics()
        except Exception as exc:  # noqa: BLE001
            rt._failed(exc, "the end of a dumped call")
