"""Watcher mode in graph mode (``dump_scene`` "watcher" with opdump's ``torch.compile``
backend; README, "Debug dumps").

Why: a dumped iteration of a compiled model already runs AOTAutograd's ATen graphs operator
by operator (:mod:`opdump.capture.graph.capture`); in watcher mode each of those operators
goes to one :class:`~.watcher.Watcher` per session (so a watched output of the forward graph
is still checked while the backward and a compiled optimizer run), finished at every
iteration end.

What it can see: AOTAutograd's graphs are functional, so an in-place write between
operators becomes an operator making a new tensor that the graph's later readers take
instead (``h.data.mul_(0.5)``: ``mul(detach(h), 0.5)``).  Such an operator is known by its
provenance (``node.meta["from_node"]``: the Dynamo node it came from is an in-place call,
``mul_``, ``add_``, ``x *= …``, ``x[i] = …``), its being no view, and its first argument (the watched output itself, or an alias
of it through ``detach``/``alias``): its value is the watched output's new value
(:meth:`.watcher.Watcher.replaced`; B1 of the seventh hold-out trial, where graph mode said "no
watched output changed").  The rest: the writes to graph inputs at the end of a graph
(``copy_`` into a mutated input or buffer) and writes made outside the graph (eager code,
another graph), which the version counter or the iteration's last checksum reveal.  Writes
inside inductor's compiled kernels of iterations that do not dump are not watched (those
iterations run the real backend).  A write to a slice of a watched output is functionalised
into an operator on the slice and a ``slice_scatter`` into the whole, which is the new value.

How: :func:`instrument_watcher` puts taps into an ATen graph, bound methods of one
:class:`WatcherTaps` per graph: ``begin`` first (the call's iteration folder when the
iteration dumps), ``after(index, value)`` after each operator (its outputs; a mutating
operator's outputs are also what it wrote), ``end`` before the output (the statistics of
the snapshots are flushed).  Parameters and lifted constants are not dumped.

Guarantees: a tap never raises (a failure stops the graph's capture through its runtime's
``_failed``, one warning, the step goes on); taps only read tensors.
"""
from __future__ import annotations

import weakref
from typing import Optional, Sequence

import torch
import torch.fx as fx

from ..capture.graph.taps import CallTaps, insert_taps, value_leaves
from .watcher import Watcher

_HUBS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _SessionWatcher:
    """The session's one watcher for its graphs."""

    def __init__(self, session):
        self.session = session
        self.last_folder: Optional[str] = None
        self.watcher = Watcher(session.config, self._record, lambda: session.recorder, lambda: self.last_folder,
                               lambda: session.layout, lambda name: None)
        session.on_iteration_end(self.watcher.finish)
        session.on_close(self._close)

    def _record(self, op, tensors, folder: str) -> None:
        self.session.recorder.record_all(folder, op, "output", tensors)

    def _close(self) -> None:
        _HUBS.pop(self.session, None)


def session_watcher(session) -> _SessionWatcher:
    """The watcher of ``session``'s graphs (made at the first graph compiled)."""
    found = _HUBS.get(session)
    if found is None:
        found = _HUBS[session] = _SessionWatcher(session)
    return found


#: ``operator`` functions of augmented assignment (``x *= 2`` in a compiled region)
_AUGMENTED = frozenset({"iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior", "ixor",
                        "ilshift", "irshift", "imatmul", "setitem"})
#: ATen operators whose output is the whole of their input (``.data`` is ``detach``)
_WHOLE_ALIAS = ("detach", "alias", "lift_fresh")


def _call_name(target) -> str:
    """The called name in a Dynamo node's target as provenance records it: ``'mul_'``,
    ``"<method 'mul_' of 'torch._C.TensorBase' objects>"``, ``'<built-in function imul>'``."""
    text = str(target)
    if text.startswith("<method '"):
        return text[len("<method '"):].split("'", 1)[0]
    if text.startswith("<built-in function "):
        return text[len("<built-in function "):].rstrip(">")
    return text.rsplit(".", 1)[-1]


def _from_inplace(node: fx.Node) -> bool:
    """Did functionalisation make ``node`` of an in-place call (its Dynamo provenance)?"""
    todo, seen = list(node.meta.get("from_node") or ()), 0
    while todo and seen < 64:
        src = todo.pop()
        seen += 1
        name = _call_name(getattr(src, "target", ""))
        if (name.endswith("_") and not name.endswith("__")) or name in _AUGMENTED:
            return True
        todo.extend(getattr(src, "from_node", None) or ())
    return False


def _aten_name(node: fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target)).split(".", 1)[0]


def functionalised_writes(nodes: Sequence[fx.Node]) -> dict:
    """``{index of a node: (index of the node whose output it replaces, slot)}``: the nodes of
    ``nodes`` that functionalisation made of an in-place write to the output of another node
    of ``nodes`` (directly, or through whole aliases: ``detach``, ``alias``)."""
    import operator
    at = {n: k for k, n in enumerate(nodes)}
    out = {}
    for k, node in enumerate(nodes):
        if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        if getattr(node.target, "is_view", False) or not _from_inplace(node):
            continue                        # a view the write goes through (slice of h[:1] = 0) makes no value
        base, slot = node.args[0], 0
        while base not in at or _aten_name(base) in _WHOLE_ALIAS:
            if base.op != "call_function" or not base.args or not isinstance(base.args[0], fx.Node):
                break
            if base.target is operator.getitem and isinstance(base.args[1], int):
                base, slot = base.args[0], base.args[1]
            elif _aten_name(base) in _WHOLE_ALIAS:
                base = base.args[0]
            else:
                break
        if base in at and at[base] != k and _aten_name(base) not in _WHOLE_ALIAS:
            out[k] = (at[base], slot)
    return out


class WatcherTaps(CallTaps):
    """What a watched ATen graph calls while it runs (see the module docstring)."""

    def __init__(self, runtime, hub: _SessionWatcher, writes: Optional[dict] = None):
        super().__init__(runtime)
        self.hub = hub
        self.writes = writes or {}          # functionalised in-place writes (functionalised_writes)

    def opened(self, folder: str) -> None:
        self.hub.last_folder = folder

    def after(self, index: int, value) -> None:
        folder = self.folder
        if folder is None:
            return
        rt = self.runtime
        if rt.session is None:
            self.folder = None
            return
        op = rt.ops[index]
        try:
            outputs = value_leaves(value)
            if op.mutates:
                for t in outputs:
                    if isinstance(t, torch.Tensor):
                        rt.recorder.forget(t)
            self.hub.watcher.after(op, outputs, outputs if op.mutates else (), folder)
            write = self.writes.get(index)
            if write is not None and outputs:
                self.hub.watcher.replaced(op, rt.ops[write[0]].full_name, write[1], outputs[0])
        except Exception as exc:  # noqa: BLE001
            rt._failed(exc, f"the outputs of {op.full_name}")


def instrument_watcher(gm: fx.GraphModule, runtime, nodes: Sequence[fx.Node]) -> fx.GraphModule:
    """Insert the watcher taps for ``nodes`` (aligned with ``runtime.ops``) and recompile ``gm``."""
    taps = WatcherTaps(runtime, session_watcher(runtime.session), functionalised_writes(nodes))
    return insert_taps(gm, nodes, runtime.ops, taps.begin, taps.end,
                       after=lambda node, op: [(taps.after, (op.index, node))])
