"""Writing a graph's listing: the ``.ir``, its JSON twin and the execution-order CSV.

The texts are rendered by :mod:`opdump.format.listing` / :mod:`opdump.format.layout`;
this module only writes them (whole files, temp + rename, through
:meth:`~opdump.write.layout.Layout.write_small`).  Graph mode and eager mode both call
:func:`write_listing` and :func:`write_execution_order`: one writer for each file.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Sequence, Tuple

from ..format.layout import execution_order_file_name, render_execution_order
from ..format.listing import render_graph_json, render_ir

__all__ = ["write_listing", "write_execution_order"]


def write_listing(layout, graph_id: int, kind: str, ops: Sequence[Any],
                  params: Sequence[Tuple[str, Optional[Tuple]]]) -> None:
    """Write the listing of graph ``graph_id``: ``graphs/ms_output_trace_code_graph_{id}.ir``
    and its ``.json`` twin, for ``ops`` (objects shaped like ``capture.op_info.OpInfo``)."""
    layout.write_small(layout.ir_path(graph_id), render_ir(graph_id, kind, ops, params).encode())
    layout.write_small(layout.ir_path(graph_id, "json"), render_graph_json(graph_id, kind, ops, params).encode())


def write_execution_order(layout, graph_id: int, full_names: Iterable[str], folder: Optional[str] = None) -> None:
    """Write an execution-order CSV: the graph's (``execution_order/ms_execution_order_graph_{id}.csv``)
    or, with ``folder``, one iteration's own (``{folder}/ms_execution_order_graph_{id}.csv``;
    eager graphs, whose operators may differ between iterations)."""
    path = (layout.execution_order_path(graph_id) if folder is None
            else os.path.join(folder, execution_order_file_name(graph_id)))
    layout.write_small(path, render_execution_order(full_names).encode())
