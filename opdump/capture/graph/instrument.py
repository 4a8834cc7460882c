"""The FX pass that puts taps into an ATen graph.

Guarantees of :func:`instrument`:
* a ``_begin`` call first (opens the iteration folder, dumps parameters and
  graph inputs) and an ``_end`` call before the output (flushes statistics);
* before each selected operator, a tap on its tensor inputs — so inputs are
  captured before the operator runs and an in-place operator cannot alter them;
  after it, a tap on its tensor outputs (``input_output`` decides which exist);
* nothing else changes: the operators, their order and the graph's outputs are
  untouched, and the graph is compiled by FX codegen (no interpreter loop).
The taps look their :class:`GraphRuntime` up by integer id in a module list, so
the generated code holds no reference to a session.
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..op_info import OpInfo
from .ops import tensor_inputs

_RUNTIMES: List[Optional["GraphRuntime"]] = []


class GraphRuntime:
    """Per-graph state the taps need: the session, the graph id, the operators."""

    def __init__(self, session, graph_id: int, kind: str, ops: Sequence[OpInfo],
                 params: Sequence[Tuple[int, str]]):
        self.session = session
        self.recorder = session.recorder
        self.graph_id = graph_id
        self.kind = kind
        self.ops = list(ops)
        self.params = list(params)           # (placeholder position, dump name)
        self.folder: Optional[str] = None
        self.kernel_args = session.config.save_kernel_args
        self.id = len(_RUNTIMES)
        _RUNTIMES.append(self)

    def begin(self, placeholders: Sequence) -> None:
        session = self.session
        session.note_graph_ran(self.graph_id)
        if not session.is_dumping():
            self.folder = None
            return
        self.folder = folder = session.iteration_dir(self.graph_id)
        if self.params:
            self.recorder.record_parameters(folder, [(name, placeholders[position]) for position, name in self.params
                                                     if isinstance(placeholders[position], torch.Tensor)])
        if self.kernel_args:
            for op in self.ops:
                if op.selected:
                    self.recorder.record_kernel_args(folder, op)

    def end(self) -> None:
        if self.folder is not None:
            self.recorder.flush_statistics()
        self.folder = None


def _begin(rid: int, placeholders) -> None:
    _RUNTIMES[rid].begin(placeholders)


def _end(rid: int) -> None:
    _RUNTIMES[rid].end()


def _tap_inputs(rid: int, index: int, tensors) -> None:
    rt = _RUNTIMES[rid]
    if rt.folder is None:
        return
    rt.recorder.record_all(rt.folder, rt.ops[index], "input", tensors)


def _tap_outputs(rid: int, index: int, value) -> None:
    rt = _RUNTIMES[rid]
    if rt.folder is None:
        return
    op = rt.ops[index]
    # Output slots are positions among the output's leaves, so a None output
    # (e.g. convolution_backward's grad_input of a first layer) keeps its slot.
    if isinstance(value, torch.Tensor):
        leaves = (value,)
    elif isinstance(value, (tuple, list)) and all(v is None or isinstance(v, torch.Tensor) for v in value):
        leaves = value           # the usual multi-output form: no pytree walk
    else:
        leaves = pytree.tree_leaves(value)
    if op.mutates:                 # written in place: what was recorded of it before is stale
        for t in leaves:
            if isinstance(t, torch.Tensor):
                rt.recorder.forget(t)
    rt.recorder.record_all(rt.folder, op, "output", leaves)


def instrument(gm: fx.GraphModule, runtime: GraphRuntime, nodes: Sequence[fx.Node],
               dump_inputs: bool, dump_outputs: bool) -> fx.GraphModule:
    """Insert the taps for ``nodes`` (aligned with ``runtime.ops``) and recompile ``gm``."""
    graph = gm.graph
    rid = runtime.id
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first_real = next(n for n in graph.nodes if n.op != "placeholder")
    with graph.inserting_before(first_real):
        graph.call_function(_begin, (rid, placeholders))
    for node, op in zip(nodes, runtime.ops):
        if not op.selected:
            continue
        if dump_inputs:
            ins = tensor_inputs(node)
            if ins:
                with graph.inserting_before(node):
                    graph.call_function(_tap_inputs, (rid, op.index, ins))
        if dump_outputs:
            with graph.inserting_after(node):
                graph.call_function(_tap_outputs, (rid, op.index, node))
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    with graph.inserting_before(output):
        graph.call_function(_end, (rid,))
    graph.lint()
    gm.recompile()
    return gm
