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

Native tap (``graph_watch.cpp``): where the native module has it, the graph calls a C++
``after`` instead of :meth:`OverflowTaps.after` (a builtin bound to one ``GraphWatchTaps``
per graph, sharing the session's ``GraphWatch``, what it knows this iteration).  Why: on a
model of small operators (AlexNet on CPU) the Python tap and the watch's Python behind it
were half of what the watch added to the step, and almost every operator needs none of it:
an operator whose floating outputs are all finite gets no verdict.  The native tap reads
each floating CPU output's finiteness (``finite_read``), skips what the watch skips
(:func:`_native_kinds`: outputs of ``ALWAYS_FINITE`` operators, of finite-preserving ones
whose inputs are known finite or were never read) and returns; any other operator (a
non-finite output, a tensor it does not handle, an in-place or ``UNINITIALIZED`` operator,
a finite-preserving one with an input the Python watch may hold a reading of) goes to
:meth:`OverflowTaps.after` with the same arguments.  Measured (AlexNet training step, one
thread, the training thread's CPU time over ``aot_eager``, 41 alternated rounds, load 1.3):
+1.0 ms with the Python tap, +0.0-0.2 ms with the native one (85 taps a step, none handed over).  ``OPDUMP_GRAPH_NATIVE_WATCH=0`` in
the environment (read when a graph is instrumented) keeps the Python tap for every
operator: the reference the parity tests compare with.

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
from ..stats import native
from .overflow import OverflowWatch
from .overflow_rules import ALWAYS_FINITE, FINITE_PRESERVING, UNINITIALIZED

_WATCHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

ENV_SWITCH = "OPDUMP_GRAPH_NATIVE_WATCH"
#: kind bits of graph_watch.cpp
_PRESERVING, _ALWAYS, _PYTHON = 2, 4, 16


def native_enabled() -> bool:
    """``OPDUMP_GRAPH_NATIVE_WATCH`` is not 0 (the native tap is used where the module has it)."""
    return native.switched_on(ENV_SWITCH)


def _native_kinds(ops) -> List[int]:
    """Per operator, what the Python watch does with it without reading (graph_watch.cpp's bits),
    from :mod:`.overflow_rules` as :meth:`.overflow_now.CpuPath._add_now` applies them to a graph
    operator (no bound rules: the graph tap gives no keyword arguments; no ``scales_down``: nor
    positional ones): an in-place operator (its pre-write copies) and an ``UNINITIALIZED`` one
    go to Python."""
    kinds = []
    for op in ops:
        kind = 0
        if op.mutates or op.op_type in UNINITIALIZED:
            kind = _PYTHON
        elif not op.nonfinite_args:
            if op.op_type in ALWAYS_FINITE:
                kind = _ALWAYS
            elif op.op_type in FINITE_PRESERVING and op.overload != "dtype":
                kind = _PRESERVING
        kinds.append(kind)
    return kinds


class _SessionWatch:
    """The session's one watch for its graphs, finished at every iteration end."""

    def __init__(self, session):
        self.session = session
        self.watch = OverflowWatch(session.config.overflow_number, self._record, None, lambda: session.layout,
                                   submit=lambda job: session.writer.submit(job))
        cls = getattr(native.module(), "GraphWatch", None)
        #: what the native taps know this iteration (graph_watch.cpp), None: Python taps
        self.native = cls() if cls is not None else None
        session.on_iteration_end(self.watch.finish)
        if self.native is not None:
            session.on_iteration_end(lambda iteration: self.native.clear())
        session.on_close(self._close)

    def _record(self, op, inputs, outputs, folder: str) -> None:
        recorder = self.session.recorder
        if inputs:
            recorder.record_all(folder, op, "input", inputs)
        if outputs:
            recorder.record_all(folder, op, "output", outputs)

    def _close(self) -> None:
        _WATCHES.pop(self.session, None)
        if self.native is not None:
            self.native.clear()


def session_watch(session) -> OverflowWatch:
    """The overflow watch of ``session``'s graphs (made at the first graph compiled)."""
    found = _WATCHES.get(session)
    if found is None:
        found = _WATCHES[session] = _SessionWatch(session)
    return found.watch


def native_counts(session) -> tuple:
    """``(outputs read, operators handed to the Python tap, operators not read)`` by the native
    taps of ``session``'s graphs so far; None when its graphs use the Python taps."""
    found = _WATCHES.get(session)
    return found.native.counts() if found is not None and found.native is not None else None


class OverflowTaps(CallTaps):
    """What an overflow-watched ATen graph calls while it runs (see the module docstring)."""

    def __init__(self, runtime, watch: OverflowWatch):
        super().__init__(runtime)
        self.watch = watch
        self._before: Dict[int, tuple] = {}
        # the native tap's object (graph_watch.cpp's GraphWatchTaps), weakly: it holds this object's
        # ``after`` and the graph's code holds it (no reference cycle through C++); None: Python taps
        self._native = lambda: None

    def begin(self, placeholders: Sequence) -> None:
        native = self._native()
        if native is not None:
            native.close()                  # a call that raised never reached its end
        super().begin(placeholders)

    def opened(self, folder: str) -> None:
        self._before.clear()
        self.watch.touch(folder)
        native = self._native()
        if native is not None:              # the batched CPU path (tests) sees every operator
            native.open(self.watch.READ_CPU_NOW)

    def closing(self) -> None:
        native = self._native()
        if native is not None:
            native.close()
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


def _native_after(taps: OverflowTaps, shared):
    """The native ``after`` tap of ``taps``' graph (graph_watch.cpp), or None (Python taps)."""
    cls = getattr(native.module(), "GraphWatchTaps", None) if shared is not None and native_enabled() else None
    if cls is None:
        return None
    obj = cls(shared, _native_kinds(taps.runtime.ops), weakref.WeakMethod(taps.after))
    after = obj.fast()
    if after is None:
        return None
    after.__module__ = type(obj).__module__     # FX's code generation names a builtin by its module
    taps._native = weakref.ref(obj)
    return after


def instrument_overflow(gm: fx.GraphModule, runtime, nodes: Sequence[fx.Node], watch: OverflowWatch) -> OverflowTaps:
    """Insert the overflow taps for ``nodes`` (aligned with ``runtime.ops``) and recompile ``gm``;
    the native ``after`` tap where the session's watch has one (see the module docstring)."""
    taps = OverflowTaps(runtime, watch)
    found = _WATCHES.get(runtime.session) if runtime.session is not None else None
    after = _native_after(taps, found.native if found is not None and found.watch is watch else None) or taps.after

    def before(node, op):
        slots = _written_slots(node, tensor_inputs(node)) if op.mutates else None
        return [(taps.before, (op.index, tensor_inputs(node), slots))] if slots else []

    insert_taps(gm, nodes, runtime.ops, taps.begin, taps.end, before,
                lambda node, op: [(after, (op.index, tensor_inputs(node), node))])
    return taps
