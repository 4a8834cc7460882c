"""The per-graph listing files: ``.ir``, ``.json`` and the execution order.

Written once per ATen graph at compile time (README, "Output layout"); the
shapes come from the graph's metadata, so nothing here touches a tensor.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
import torch.fx as fx

from ..op_info import OpInfo
from ...format.dtypes import dtype_name


def write_graph_files(layout, gm: fx.GraphModule, graph_id: int, kind: str, ops: Sequence[OpInfo],
                      params: Sequence[Tuple[int, str]]) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    described = []
    for pos, name in params:
        val = placeholders[pos].meta.get("val")
        meta = (tuple(val.shape), dtype_name(val.dtype)) if isinstance(val, torch.Tensor) else None
        described.append((name, meta))
    layout.write_listing(graph_id, kind, ops, described)
    layout.write_execution_order(graph_id, [op.full_name for op in ops])
