"""The FX pass that puts taps into an ATen graph, and the pass that takes them out.

Guarantees of :func:`instrument`:
* a ``begin`` call first (opens the iteration folder, dumps constants,
  parameters and graph inputs) and an ``end`` call before the output (flushes
  statistics);
* before each selected operator, a tap on its tensor inputs — so inputs are
  captured before the operator runs and an in-place operator cannot alter them;
  after it, a tap on its tensor outputs (``input_output`` decides which exist);
  with native taps (:mod:`.native_taps`), an operator that writes none of its
  arguments gets one tap after it for both sides (its inputs are unchanged);
* nothing else changes: the operators, their order and the graph's outputs are
  untouched, and the graph is compiled by FX codegen (no interpreter loop).
The taps are bound methods of the graph's :class:`~.runtime.GraphRuntime`, so
the generated code refers to its own runtime only (no module-level registry).

Guarantee of :func:`uninstrument`: every tap node is removed (taps have no
users), whatever state an interrupted :func:`instrument` left, and the graph is
recompiled: it computes exactly what it computed before instrumenting.
"""
from __future__ import annotations

from typing import Sequence

import torch.fx as fx

from .native_taps import build as build_native_taps, methods as native_methods
from .ops import tensor_inputs
from .runtime import GraphRuntime
from .taps import insert_taps


def instrument(gm: fx.GraphModule, runtime: GraphRuntime, nodes: Sequence[fx.Node],
               dump_inputs: bool, dump_outputs: bool) -> fx.GraphModule:
    """Insert the taps for ``nodes`` (aligned with ``runtime.ops``) and recompile ``gm``."""
    if runtime.session.config.dump_scene == "watcher":     # watcher mode: every operator to the watcher
        from ...debug.watcher_graph import instrument_watcher
        return instrument_watcher(gm, runtime, nodes)
    taps = runtime.native = build_native_taps(runtime)
    if taps is not None:
        tap_in, tap_out, tap_both = native_methods(taps)

    def taps_before(node, op):
        ins = tensor_inputs(node) if op.selected and dump_inputs else None
        if not ins:
            return []
        if taps is None or op.mutates:
            return [(runtime.tap_inputs, (op.index, ins))]
        # an operator that writes none of its arguments: its inputs are the same after it ran,
        # so one native tap after it takes both sides (see taps_after)
        return [] if dump_outputs else [(tap_in, (op.index, *ins))]

    def taps_after(node, op):
        if not (op.selected and dump_outputs):
            return []
        if taps is None or op.mutates:
            return [(runtime.tap_outputs, (op.index, node))]
        ins = tensor_inputs(node) if dump_inputs else None
        return [(tap_both, (op.index, node, *ins))] if ins else [(tap_out, (op.index, node))]

    return insert_taps(gm, nodes, runtime.ops, runtime.begin, runtime.end, taps_before, taps_after)


def uninstrument(gm: fx.GraphModule) -> fx.GraphModule:
    """Remove every tap node from ``gm``, point exception-dump guards back at their operators,
    and recompile it."""
    graph = gm.graph
    for node in list(graph.nodes):
        owner = getattr(node.target, "__self__", None) if node.op == "call_function" else None
        if isinstance(owner, GraphRuntime) or getattr(owner, "graph_tap", False):   # graph_tap: the overflow taps
            graph.erase_node(node)
        elif owner is None and hasattr(node.target, "opdump_target"):  # an exception-dump guard
            node.target = node.target.opdump_target
    gm.recompile()
    return gm
