"""Read an ATen FX graph (from AOTAutograd) into :class:`OpInfo` records.

Guarantees: one OpInfo per operator node (an ``OpOverload`` call other than the
symbolic-size queries), numbered in graph order, which is the order FX codegen
executes them; names depend only on the graph, so the same program gets the
same names in every run.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..aten_ops import NOT_OPERATORS
from ..naming import backward_scope, module_scope, op_type_of, parse_stack_trace, stack_ids, stack_pairs
from ..op_info import OpInfo, is_nonfinite_scalar
from .frame_scope import FrameScope
from ...format.dtypes import dtype_name

def is_operator(node: fx.Node) -> bool:
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and op_type_of(node.target)[0] not in NOT_OPERATORS)


def tensor_inputs(node: fx.Node) -> List[fx.Node]:
    """The input nodes of ``node`` holding tensors, in argument order (these are the input slots)."""
    flat, _ = pytree.tree_flatten((node.args, node.kwargs))
    return [a for a in flat if isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)]


def _meta(val) -> Tuple[Tuple[Any, ...], str]:
    return tuple(val.shape), dtype_name(val.dtype)


def _describe(value) -> str:
    if isinstance(value, fx.Node):
        return f"%{value.name}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v) for v in value)
        return f"[{inner}]"
    return repr(value)


def _non_tensor_args(node: fx.Node) -> Dict[str, Any]:
    schema = getattr(node.target, "_schema", None)
    named: Dict[str, Any] = {}
    if schema is not None:
        for arg, value in zip(schema.arguments, node.args):
            named[arg.name] = value
    named.update(node.kwargs)
    out = {}
    for key, value in named.items():
        flat, _ = pytree.tree_flatten(value)
        if any(isinstance(v, fx.Node) and isinstance(v.meta.get("val"), torch.Tensor) for v in flat):
            continue
        out[key] = _describe(value) if any(isinstance(v, fx.Node) for v in flat) else value
    return out


def _sum_stack(node: fx.Node, op_type: str, pos: Dict[fx.Node, int]):
    """The module stack of a backward gradient sum (an ``add`` AOTAutograd inserts where a
    forward tensor has several uses; it has no forward node): that of its input computed
    last, as in eager mode, where autograd sums a gradient when its last contribution
    arrives, inside the backward of the module that produced it (README, Eager mode: scopes)."""
    if op_type != "add":
        return None
    inputs = tensor_inputs(node)
    if not inputs:
        return None
    last = max(inputs, key=lambda n: pos.get(n, -1))
    return last.meta.get("fwd_nn_module_stack") or last.meta.get("nn_module_stack")


def read_ops(gm: fx.GraphModule, kind: str, root_class: Optional[str],
             frame: Optional[FrameScope] = None) -> List[Tuple[fx.Node, OpInfo]]:
    """(node, OpInfo) for every operator of ``gm``; ``kind`` is forward, backward or inference;
    ``frame`` rewrites the module stacks of a frame compiled after a graph break."""
    fix = frame.stack if frame is not None else (lambda stack: stack)
    result = []
    pos = {n: i for i, n in enumerate(gm.graph.nodes)} if kind == "backward" else {}
    for node in gm.graph.nodes:
        if not is_operator(node):
            continue
        op_type, overload = op_type_of(node.target)
        meta = node.meta
        if kind == "backward":
            stack = fix(meta.get("fwd_nn_module_stack") or meta.get("nn_module_stack") or _sum_stack(node, op_type, pos))
            scope = backward_scope(module_scope(stack_pairs(stack), root_class))
        else:
            stack = fix(meta.get("nn_module_stack"))
            scope = module_scope(stack_pairs(stack), root_class)
        outputs = [v for v in pytree.tree_flatten(meta.get("val"))[0] if isinstance(v, torch.Tensor)]
        info = OpInfo(
            index=len(result), op_type=op_type, scope=scope, overload=overload,
            module_ids=stack_ids(stack), source=parse_stack_trace(meta.get("stack_trace")),
            args=_non_tensor_args(node),
            input_meta=[_meta(n.meta["val"]) for n in tensor_inputs(node)],
            output_meta=[_meta(v) for v in outputs],
            node_name=node.name,
            nonfinite_args=any(map(is_nonfinite_scalar, pytree.tree_leaves((node.args, node.kwargs)))),
            mutates=bool(getattr(getattr(node.target, "_schema", None), "is_mutable", False)),
            arg_text=", ".join(_describe(a) for a in node.args)
            + "".join(f", {k}={_describe(v)}" for k, v in node.kwargs.items()),
        )
        result.append((node, info))
    return result
