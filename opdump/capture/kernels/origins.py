"""Which ATen operators a kernel computes: inductor's provenance → opdump's operator names.

Inductor lowers a graph that AOTAutograd already decomposed (``native_layer_norm``
became ``var_mean``, ``rsqrt``, ``mul``…); every node keeps ``original_aten`` (the
operator it came from), ``nn_module_stack`` and ``stack_trace``.  Nodes that come
from one call of one ATen operator share its ``original_aten`` and autograd
sequence number (``seq_nr``; without one, they are consecutive in the graph),
so the graph given to inductor is read back into *operator instances*, named as the operator
dump names them (``{scope}/{op_type}-op{N}``, README "Output layout").  ``N``
counts the instances of the graph inductor was given, which is not always the
operator dump's graph: the operator dump also lists operators inductor's graph
drops (``detach``) and its backward is partitioned differently, so ``N`` can
differ.  What matches across the two dumps is the scope, the type, the innermost
source line and the ``occurrence`` (k-th operator with those three, in graph order).

Provenance (``kernel:handle`` → post-grad node names) maps each kernel to the
instances it computes.  A node made by a post-grad pass (not in the graph read
before lowering) is matched by its ``original_aten``, scope and source line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx as fx

from ..aten_ops import NOT_OPERATORS
from ..naming import backward_scope, module_scope, op_type_of, parse_stack_trace, stack_pairs
from ..op_info import SourceLine


@dataclass
class FusedOp:
    """One ATen operator instance computed (wholly or partly) by a kernel."""
    full_name: str
    op_type: str
    scope: str
    source: Tuple[SourceLine, ...]
    occurrence: int = 0          # k-th operator of this type, scope and innermost source line (0-based)


def _key(node: fx.Node, kind: str, root: Optional[str]) -> Optional[Tuple[str, str, str]]:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    target = node.meta.get("original_aten") or node.target
    op_type = op_type_of(target)[0]
    if op_type in NOT_OPERATORS:
        return None
    if kind == "backward":
        stack = node.meta.get("fwd_nn_module_stack") or node.meta.get("nn_module_stack")
        scope = backward_scope(module_scope(stack_pairs(stack), root))
    else:
        scope = module_scope(stack_pairs(node.meta.get("nn_module_stack")), root)
    return op_type, scope, node.meta.get("stack_trace") or ""


class Origins:
    """Operator instances of the graph handed to inductor (read before it is lowered)."""

    def __init__(self, gm: fx.GraphModule, kind: str, root: Optional[str]):
        self.kind, self.root = kind, root
        self.instances: List[FusedOp] = []
        self.by_node: Dict[str, int] = {}
        self.by_key: Dict[Tuple[str, str, str], int] = {}
        prev_key, prev_decomposed = None, False
        counts: Dict[tuple, int] = {}         # (scope, type, innermost source line) -> operators seen
        groups: Dict[tuple, int] = {}        # (key, seq_nr) of a decomposed operator -> its instance
        for node in gm.graph.nodes:
            key = _key(node, kind, root)
            if key is None:
                if node.op == "call_function" and node.meta.get("original_aten") is not None and prev_key:
                    self.by_node[node.name] = len(self.instances) - 1    # getitem of a decomposed op
                continue
            decomposed = node.meta.get("original_aten") not in (None, node.target)
            seq_nr = node.meta.get("seq_nr")
            group = (key, seq_nr) if decomposed and seq_nr is not None else None
            if group is not None and group in groups:        # another piece of an operator seen before
                self.by_node[node.name] = groups[group]
                prev_key, prev_decomposed = key, decomposed
                continue
            if not (decomposed and prev_decomposed and key == prev_key):
                op_type, scope, trace = key
                index = len(self.instances)
                source = parse_stack_trace(trace)
                where = (scope, op_type, (source[-1].file, source[-1].line) if source else None)
                k = counts.get(where, 0)
                counts[where] = k + 1
                self.instances.append(FusedOp(f"{scope}/{op_type}-op{index}", op_type, scope, source, k))
                self.by_key.setdefault(key, index)
            self.by_node[node.name] = len(self.instances) - 1
            if group is not None:
                groups[group] = len(self.instances) - 1
            prev_key, prev_decomposed = key, decomposed

    def instance_of(self, node_name: Optional[str], lowered: Optional[fx.GraphModule]) -> Optional[FusedOp]:
        """The operator instance a (post-grad) node belongs to, if it can be told."""
        if node_name is None:
            return None
        index = self.by_node.get(node_name)
        if index is None and lowered is not None:
            node = next((n for n in lowered.graph.nodes if n.name == node_name), None)
            key = _key(node, self.kind, self.root) if node is not None else None
            index = self.by_key.get(key) if key else None
        return self.instances[index] if index is not None else None

    def fused(self, node_names: Sequence[str], lowered: Optional[fx.GraphModule]) -> List[FusedOp]:
        """The operator instances behind ``node_names`` (post-grad node names), in graph order."""
        found: List[int] = []
        extra: List[FusedOp] = []
        nodes = {n.name: n for n in lowered.graph.nodes} if lowered is not None else {}
        for name in node_names:
            index = self.by_node.get(name)
            if index is None and name in nodes:
                key = _key(nodes[name], self.kind, self.root)
                index = self.by_key.get(key) if key else None
                if index is None and key:
                    op_type, scope, trace = key
                    extra.append(FusedOp(f"{scope}/{op_type}", op_type, scope, parse_stack_trace(trace)))
            if index is not None and index not in found:
                found.append(index)
        return [self.instances[i] for i in sorted(found)] + extra
