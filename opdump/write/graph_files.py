"""The per-graph files: ``.ir`` listing, its machine-readable JSON twin, and the
execution-order CSV (seed 000; SPEC F17, F18).

The ``.ir`` is for people and grep: per operator its result, the call with its
inputs and attributes, input → output shapes and dtypes, the full name (in both
the seed's ``full_name_with_scope`` form and MindSpore 2.x's ``Fullname with
scope`` form), and the source lines as ``# In file <path>(<line>)/ <code>/``.
"""
from __future__ import annotations

import json
from typing import Iterable, List, Sequence, Tuple

from ..capture.op_info import OpInfo

EXECUTION_ORDER_HEADER = "NodeExecutionOrder-FullNameWithScope"


def _tensor_type(meta: Tuple) -> str:
    shape, dtype = meta
    dims = ", ".join(str(d) for d in shape)
    return f"<Tensor[{dtype}], ({dims})>"


def render_ir(graph_id: int, kind: str, ops: Sequence[OpInfo], params: Sequence[Tuple[str, Tuple]]) -> str:
    """The ``ms_output_trace_code_graph_{id}.ir`` text."""
    lines: List[str] = [f"# IR entry: @graph_{graph_id}", f"# Graph kind: {kind}", "",
                        f"# Total params: {len(params)}", "# Params:"]
    for i, (name, meta) in enumerate(params):
        lines.append(f"%para{i + 1}_{name}: {_tensor_type(meta) if meta else '<Scalar>'}")
    lines += ["", f"# Total operators: {len(ops)}", "", f"subgraph @graph_{graph_id}() {{"]
    for op in ops:
        attrs = ", ".join(f"{k}: {v}" for k, v in op.args.items())
        lines.append(f"  %{op.index}({op.node_name}) = {op.op_type}.{op.overload}({op.arg_text})"
                     + (f" {{{attrs}}}" if attrs else ""))
        ins = ", ".join(_tensor_type(m) for m in op.input_meta)
        outs = ", ".join(_tensor_type(m) for m in op.output_meta)
        lines.append(f"      : ({ins}) -> ({outs})")
        lines.append(f"      : full_name_with_scope: ({op.full_name})")
        lines.append(f"      # Fullname with scope: ({op.full_name})")
        for src in op.source:
            lines.append(f"      {src.ir()}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_graph_json(graph_id: int, kind: str, ops: Sequence[OpInfo], params: Sequence[Tuple[str, Tuple]]) -> str:
    """The machine-readable twin of the ``.ir`` (``ms_output_trace_code_graph_{id}.json``)."""
    def tensors(metas):
        return [{"shape": [str(d) if not isinstance(d, int) else d for d in shape], "dtype": dtype}
                for shape, dtype in metas]

    doc = {
        "format": "opdump-graph-1",
        "graph_id": graph_id,
        "kind": kind,
        "params": [{"name": n, **(tensors([m])[0] if m else {})} for n, m in params],
        "ops": [{
            "index": op.index, "full_name": op.full_name, "op_type": op.op_type, "overload": op.overload,
            "scope": op.scope, "selected": op.selected,
            "inputs": tensors(op.input_meta), "outputs": tensors(op.output_meta),
            "source": [{"file": s.file, "line": s.line, "code": s.code, "function": s.function} for s in op.source],
            "args": {k: str(v) for k, v in op.args.items()},
        } for op in ops],
    }
    return json.dumps(doc, indent=1)


def render_execution_order(full_names: Iterable[str]) -> str:
    return EXECUTION_ORDER_HEADER + "\n" + "".join(f"{n}\n" for n in full_names)
