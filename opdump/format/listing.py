"""The graph listing: ``ms_output_trace_code_graph_{id}.ir`` and its JSON twin.

Why: the ``.ir`` is for people and grep, the ``.json`` for programs; the writer renders
both from the operators capture recorded and the reader parses them back (it also
parses MindSpore's own ``.ir``) (docs/design.md, "Graph listing").

Per operator the ``.ir`` gives its result, the call with inputs and attributes,
input -> output shapes and dtypes, the full name (in the seed's
``full_name_with_scope`` form and MindSpore 2.x's ``Fullname with scope`` form) and
its source lines (:mod:`.sources`).  The JSON (``"format": "opdump-graph-1"``) holds
the same per operator: index, full_name, op_type, overload, scope, selected, inputs,
outputs (``{shape, dtype}``), producers (per input, ``[full name, output slot]`` of the
listed operator that produced it, else null: :func:`input_producers`), source (``{file, line,
code, function}``), args, nonfinite_args (a non-tensor argument is Inf/NaN or a float type's extreme: README, overflow).

Rendering takes any objects with the attributes of ``opdump.capture.op_info.OpInfo``
(duck-typed: format depends on nothing above it).  Guarantees: for operators whose
full names hold no ``)`` followed by the end of a line, :func:`parse_ir` of
:func:`render_ir` gives back every full name, in order, with its source frames and
tensor types; :func:`parse_graph_json` of :func:`render_graph_json` gives back every
field.
"""
from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .sources import SourceFrame, parse_source_line, render_source_line

GRAPH_JSON_FORMAT = "opdump-graph-1"
Meta = Tuple[Tuple[Any, ...], str]          # (shape, dtype name)


def _tensor_type(meta: Meta) -> str:
    shape, dtype = meta
    dims = ", ".join(str(d) for d in shape)
    return f"<Tensor[{dtype}], ({dims})>"


def render_ir(graph_id: int, kind: str, ops: Sequence[Any], params: Sequence[Tuple[str, Optional[Meta]]]) -> str:
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
            lines.append("      " + render_source_line(src.file, src.line, src.code))
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_graph_json(graph_id: int, kind: str, ops: Sequence[Any],
                      params: Sequence[Tuple[str, Optional[Meta]]]) -> str:
    """The machine-readable twin of the ``.ir`` (``ms_output_trace_code_graph_{id}.json``)."""
    def tensors(metas):
        return [{"shape": [str(d) if not isinstance(d, int) else d for d in shape], "dtype": dtype}
                for shape, dtype in metas]

    producers = input_producers(ops)
    doc = {
        "format": GRAPH_JSON_FORMAT,
        "graph_id": graph_id,
        "kind": kind,
        "params": [{"name": n, **(tensors([m])[0] if m else {})} for n, m in params],
        "ops": [{
            "index": op.index, "full_name": op.full_name, "op_type": op.op_type, "overload": op.overload,
            "scope": op.scope, "selected": op.selected,
            "inputs": tensors(op.input_meta), "outputs": tensors(op.output_meta),
            "producers": producers[n],
            "source": [{"file": s.file, "line": s.line, "code": s.code, "function": s.function} for s in op.source],
            "args": {k: str(v) for k, v in op.args.items()},
            "nonfinite_args": bool(getattr(op, "nonfinite_args", False)),
        } for n, op in enumerate(ops)],
    }
    return json.dumps(doc, indent=1)


_ARG_REF_RE = re.compile(r"%([A-Za-z_0-9.]+)(?:\[(\d+)\])?")


def input_producers(ops: Sequence[Any]) -> List[Optional[List[Optional[List[Any]]]]]:
    """Per operator, per input slot: ``[full name, output slot]`` of the listed operator
    that produced the input (the ``%N``/``%N[k]``/``%node`` references of its ``.ir`` line,
    in input order), ``None`` for an input no listed operator produced (a parameter, a
    graph input); the whole list ``None`` when the references cannot be told apart from
    the inputs (their count differs from the number of inputs).  A reference names the
    latest operator listed before it with that index or node name (an operator first
    described in a later iteration may reuse an index)."""
    by_ref: Dict[str, str] = {}
    out: List[Optional[List[Optional[List[Any]]]]] = []
    for op in ops:
        refs = _ARG_REF_RE.findall(str(getattr(op, "arg_text", "") or ""))
        n_in = len(getattr(op, "input_meta", ()) or ())
        if len(refs) != n_in:
            out.append(None)
        else:
            out.append([[by_ref[r], int(k or 0)] if r in by_ref else None for r, k in refs])
        by_ref[str(op.index)] = op.full_name
        node = getattr(op, "node_name", None)
        if node:                                # a graph's references (eager's are indices)
            by_ref[str(node)] = op.full_name
    return out


# ---------------------------------------------------------------- parsing
def parse_graph_json(doc: Dict[str, Any]) -> Tuple[Optional[str], List[Dict[str, Any]]]:
    """(graph kind, operators) of a parsed graph JSON document.  Each operator:
    ``{full_name, op_type, scope, sources: [SourceFrame], inputs, outputs, args, nonfinite_args,
    overload, producers}`` (``op_type``/``scope``/``overload``/``producers`` None when the
    document lacks them); entries without a full
    name or with malformed source frames are skipped, never raised."""
    ops = []
    for o in doc.get("ops", []) or []:
        if not isinstance(o, dict) or not o.get("full_name"):
            continue
        sources = []
        for s in o.get("source", []) or []:
            try:
                sources.append(SourceFrame(str(s.get("file", "")), int(s.get("line", 0)), s.get("line_end"),
                                           None, None, str(s.get("code", "") or "").strip()))
            except (TypeError, ValueError, AttributeError):
                pass
        ops.append({"full_name": o["full_name"], "op_type": o.get("op_type"), "scope": o.get("scope"),
                    "sources": sources, "inputs": list(o.get("inputs", []) or []),
                    "outputs": list(o.get("outputs", []) or []), "args": dict(o.get("args", {}) or {}),
                    "nonfinite_args": o.get("nonfinite_args") is True,
                    "overload": o.get("overload") if isinstance(o.get("overload"), str) else None,
                    "producers": _producers(o.get("producers"))})
    return doc.get("kind"), ops


def _producers(value: Any) -> Optional[List[Optional[Tuple[str, int]]]]:
    """A listing's ``producers`` entry as (full name, output slot) per input; None when
    absent or malformed (older listings have none)."""
    if not isinstance(value, list):
        return None
    out: List[Optional[Tuple[str, int]]] = []
    for v in value:
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], int):
            out.append((v[0], v[1]))
        elif v is None:
            out.append(None)
        else:
            return None
    return out


_FULLNAME_RES = (
    re.compile(r"#\s*Fullname with scope:\s*\((?P<name>.+)\)\s*$"),
    re.compile(r"full_name_with_scope:\s*\((?P<name>.+)\)\s*$"),
)
_IR_NODE_RE = re.compile(r"^\s*%\d+(?:\([^)]*\))?\s*=\s*(?P<prim>[^\s(]+)")
_IR_BARE_NODE_RE = re.compile(r"^ {0,2}(?P<prim>[A-Za-z_][\w.]*)\(")        # Return(%1) …
_IR_TYPES_RE = re.compile(r"^\s*:\s*\((?P<ins>.*)\)\s*->\s*\((?P<outs>.*)\)\s*$")
_IR_TENSOR_RE = re.compile(r"<(?:Ref\[)?Tensor\[(?P<dtype>\w+)\]\]?,\s*\((?P<shape>[^)]*)\)")


def _parse_ir_types(text: str) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    m = _IR_TYPES_RE.match(text)
    if not m:
        return [], []

    def _t(s):
        out = []
        for tm in _IR_TENSOR_RE.finditer(s):
            shape = [int(x) for x in re.findall(r"-?\d+", tm.group("shape"))]
            out.append({"dtype": tm.group("dtype"), "shape": shape})
        return out
    return _t(m.group("ins")), _t(m.group("outs"))


def parse_ir(text: str) -> List[Dict[str, Any]]:
    """Operators of a ``.ir`` text: ``[{full_name, sources: [SourceFrame], inputs, outputs}]``.

    Accepts MindSpore 2.x (``# Fullname with scope: (…)``, ``# In file f:l~l, c~c/ code/``)
    and opdump's / the seed's form (``: full_name_with_scope: (…)``, ``# In file f(l)/ code/``).
    """
    ops: List[Dict[str, Any]] = []
    cur: Optional[Dict[str, Any]] = None
    for line in text.split("\n"):
        m = _IR_NODE_RE.match(line) or _IR_BARE_NODE_RE.match(line)
        if m and not line.lstrip().startswith(("#", ":")):
            cur = {"full_name": None, "sources": [], "inputs": [], "outputs": [], "prim": m.group("prim")}
            ops.append(cur)
            continue
        if cur is None:
            continue
        s = line.strip()
        if s.startswith("}"):
            cur = None
            continue
        if cur["full_name"] is None:
            for rx in _FULLNAME_RES:
                m = rx.search(s)
                if m:
                    cur["full_name"] = m.group("name").strip()
                    break
            else:
                if not cur["inputs"] and not cur["outputs"] and s.startswith(":"):
                    cur["inputs"], cur["outputs"] = _parse_ir_types(s)
                elif s.startswith("#") and "In file" in s:
                    fr = parse_source_line(s)
                    if fr:
                        cur["sources"].append(fr)
            continue
        if "In file" in s:
            fr = parse_source_line(s)
            if fr:
                cur["sources"].append(fr)
    return [o for o in ops if o["full_name"]]
