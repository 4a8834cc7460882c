"""The overflow-only dump in graph mode (``op_debug_mode`` 3 with opdump's ``torch.compile``
backend; README, "Debug dumps").

Why: a dumped iteration of a compiled model already runs AOTAutograd's ATen graphs
operator by operator (:mod:`opdump.capture.graph.capture`); with ``op_debug_mode`` 3 each of
those operators goes to the same :class:`~.overflow.OverflowWatch` as eager mode (one watch
per session for all its graphs, so forward, backward and optimizer graphs are judged in
execution order by the one rule of :mod:`.origin`).

How: :func:`instrument_overflow` puts three kinds of taps into an ATen graph, bound methods
of one :class:`OverflowTaps` per graph:

* ``begin`` first: the graph call opens its iteration folder when the iteration dumps;
* after each operator, ``after(index, inputs, value)``: the operator's tensor inputs and
  outputs go to the watch.  The tap is the inputs' last use in the generated code, so FX
  keeps them alive until then, and the watch keeps references (never copies) until it has
  read their flags;
* before an operator that writes an argument in place (rare in AOTAutograd's functional
  graphs: input mutations' ``copy_``), ``before(index, inputs, slots)``: the watch judges
  its batch if it holds the written tensor, and the written arguments are cloned so the
  recorded inputs are the values before the write;
* ``end`` before the output: the batch is judged (one host read of the flags per graph
  call) and the statistics of recorded operators are flushed.

Parameters and lifted constants are not dumped (only overflowing operators are).

Guarantees: a tap never raises (a failure stops the graph's capture through its runtime's
``_failed``, one warning, the step goes on); the taps only read tensors (and clone written
arguments), so the graph computes exactly what it computes without them.
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Sequence

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..capture.graph.ops import tensor_inputs
from ..capture.graph.taps import CallTaps, insert_taps, value_leaves
from .overflow import OverflowWatch

_WATCHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _SessionWatch:
    """The session's one watch for its graphs, finished at every iteration end."""

    def __init__(self, session):
        self.session = session
        self.watch = OverflowWatch(session.config.overflow_number, self._record, None, lambda: session.layout,
                                   submit=lambda job: session.writer.submit(job))
        session.on_iteration_end(self.watch.finish)
        session.on_close(self._close)

    def _record(self, op, inputs, outputs, folder: str) -> None:
        recorder = self.session.recorder
        if inputs:
            recorder.record_all(folder, op, "input", inputs)
        if outputs:
            recorder.record_all(folder, op, "output", outputs)

    def _close(self) -> None:
        _WATCHES.pop(self.session, None)


def session_watch(session) -> OverflowWatch:
    """The overflow watch of ``session``'s graphs (made at the first graph compiled)."""
    found = _WATCHES.get(session)
    if found is None:
        found = _WATCHES[session] = _SessionWatch(session)
    return found.watch


class OverflowTaps(CallTaps):
    """What an overflow-watched ATen graph calls while it runs (see the module docstring)."""

    def __init__(self, runtime, watch: OverflowWatch):
        super().__init__(runtime)
        self.watch = watch
        self._before: Dict[int, tuple] = {}

    def opened(self, folder: str) -> None:
        self._before.clear()
        self.watch.touch(folder)

    def closing(self) -> None:
        self.watch.flush()

    def before(self, index: int, inputs: Sequence, slots: Sequence[int]) -> None:
        if self.folder is None or self.runtime.session is None:
            return
        try:
            written = [inputs[k] for k in slots]
            self.watch.before_write(written)
            saved = [t.detach().clone() if k in slots else t for k, t in enumerate(inputs)]
            self._before[index] = (saved, [saved[k] for k in slots], written)
        except Exception as exc:  # noqa: BLE001
            self.runtime._failed(exc, f"the inputs of {self.runtime.ops[index].full_name}")

    def after(self, index: int, inputs: Sequence, value) -> None:
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
            cloned = ()
            if op.mutates:
                saved, cloned, written = self._before.pop(index, (inputs, (), ()))
                inputs = saved
                for t in written:
                    rt.recorder.forget(t)
                if not any(isinstance(t, torch.Tensor) for t in outputs):
                    outputs = list(written)       # an in-place operator returning nothing: what it wrote
            self.watch.add(op, inputs, outputs, op.nonfinite_args, cloned, folder)
        except Exception as exc:  # noqa: BLE001
            rt._failed(exc, f"the outputs of {op.full_name}")


def _written_slots(node: fx.Node, inputs: Sequence[fx.Node]) -> List[int]:
    """Positions in ``inputs`` of the arguments ``node``'s schema says it writes."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    written = set()
    for k, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = node.args[k] if k < len(node.args) else node.kwargs.get(arg.name)
        written.update(v for v in pytree.tree_leaves(value) if isinstance(v, fx.Node))
    return [k for k, n in enumerate(inputs) if n in written]


def instrument_overflow(gm: fx.GraphModule, runtime, nodes: Sequence[fx.Node], watch: OverflowWatch) -> OverflowTaps:
    """Insert the overflow taps for ``nodes`` (aligned with ``runtime.ops``) and recompile ``gm``."""
    taps = OverflowTaps(runtime, watch)

    def before(node, op):
        slots = _written_slots(node, tensor_inputs(node)) if op.mutates else None
        return [(taps.before, (op.index, tensor_inputs(node), slots))] if slots else []

    insert_taps(gm, nodes, runtime.ops, taps.begin, taps.end, before,
                lambda node, op: [(taps.after, (op.index, tensor_inputs(node), node))])
    return taps
