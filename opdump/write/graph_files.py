"""Writing a graph's listing: the ``.ir``, its JSON twin and the execution-order CSV.

The texts are rendered by :mod:`opdump.format.listing` / :mod:`opdump.format.layout`;
this module only writes them (whole files, temp + rename, through
:meth:`~opdump.write.layout.Layout.write_small`).  Graph mode and eager mode both call
:func:`write_listing`: one writer for the listing.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from ..format.layout import EXECUTION_ORDER_HEADER, render_execution_order
from ..format.listing import render_graph_json, render_ir

__all__ = ["write_listing", "render_ir", "render_graph_json", "render_execution_order",
           "EXECUTION_ORDER_HEADER"]


def write_listing(layout, graph_id: int, kind: str, ops: Sequence[Any],
                  params: Sequence[Tuple[str, Optional[Tuple]]]) -> bytes:
    """Write ``graphs/ms_output_trace_code_graph_{id}.{ir,json}`` and
    ``execution_order/ms_execution_order_graph_{id}.csv`` for ``ops`` (in execution order).
    Returns the execution-order CSV's bytes (eager mode also stores them per iteration)."""
    order = render_execution_order(op.full_name for op in ops).encode()
    layout.write_small(layout.ir_path(graph_id), render_ir(graph_id, kind, ops, params).encode())
    layout.write_small(layout.ir_path(graph_id, "json"), render_graph_json(graph_id, kind, ops, params).encode())
    layout.write_small(layout.execution_order_path(graph_id), order)
    return order
