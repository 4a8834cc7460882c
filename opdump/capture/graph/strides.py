"""An FX pass that lets the dump path survive kernels whose real strides differ from their meta.

AOTAutograd traces with fake tensors, and some CPU kernels return other strides
than their meta functions promise (seen: ``native_layer_norm_backward`` on a
transposed gradient, whose layout ``native_dropout_backward`` then keeps).  A
later ``aten.view`` of such a tensor raises "view size is not compatible with
input tensor's size and stride" — in ``backend="aot_eager"`` as in opdump's dump
path, which runs the same graphs operator by operator (inductor decomposes
these operators and is not affected).  A dumped iteration must not crash the
training, so:

Guarantee of :func:`tolerate_real_strides`: every ``aten.view`` /
``aten._unsafe_view`` node runs as that view, and only when the tensor it gets
cannot be viewed to the size, as ``aten.reshape`` (a copy with the same values).
In an AOT graph that is safe: the graph is functional, so nothing writes through
the view afterwards.  The nodes keep their names and places; the operator names
and graph files (made before this pass) are unchanged.
"""
from __future__ import annotations

import torch
import torch.fx as fx

_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)
_view = torch.ops.aten.view.default
_reshape = torch.ops.aten.reshape.default


#: how many views fell back to reshape in this process (tests check the case is exercised)
fallbacks = 0


def view_or_reshape(tensor: torch.Tensor, size):
    """``aten.view``, or ``aten.reshape`` when the tensor's real strides forbid the view."""
    global fallbacks
    try:
        return _view(tensor, size)
    except RuntimeError:
        fallbacks += 1
        return _reshape(tensor, size)   # a wrong size fails here too, with reshape's message


def tolerate_real_strides(gm: fx.GraphModule) -> int:
    """Point the view nodes of ``gm`` at :func:`view_or_reshape`; returns how many.

    Run after the graph's operators were read (names) and before it is recompiled.
    """
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _VIEWS and not node.kwargs:
            node.target = view_or_reshape
            count += 1
    return count
