"""Watcher mode in graph mode (``dump_scene`` "watcher" with opdump's ``torch.compile``
backend; README, "Debug dumps").

Why: a dumped iteration of a compiled model already runs AOTAutograd's ATen graphs operator
by operator (:mod:`opdump.capture.graph.capture`); in watcher mode each of those operators
goes to one :class:`~.watcher.Watcher` per session (so a watched output of the forward graph
is still checked while the backward and a compiled optimizer run), finished at every
iteration end.

What it can see: AOTAutograd's graphs are functional, so in-place writes between operators
are rewritten away inside a graph; what remains are the writes to graph inputs at the end
of a graph (``copy_`` into a mutated input or buffer) and writes made outside the graph
(eager code, another graph), which the version counter or the iteration's last checksum
reveal.  Writes inside inductor's compiled kernels of iterations that do not dump are not
watched (those iterations run the real backend).

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


class WatcherTaps(CallTaps):
    """What a watched ATen graph calls while it runs (see the module docstring)."""

    def __init__(self, runtime, hub: _SessionWatcher):
        super().__init__(runtime)
        self.hub = hub

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
        except Exception as exc:  # noqa: BLE001
            rt._failed(exc, f"the outputs of {op.full_name}")


def instrument_watcher(gm: fx.GraphModule, runtime, nodes: Sequence[fx.Node]) -> fx.GraphModule:
    """Insert the watcher taps for ``nodes`` (aligned with ``runtime.ops``) and recompile ``gm``."""
    taps = WatcherTaps(runtime, session_watcher(runtime.session))
    return insert_taps(gm, nodes, runtime.ops, taps.begin, taps.end,
                       after=lambda node, op: [(taps.after, (op.index, node))])
