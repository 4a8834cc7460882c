"""Taps after each kernel call of an inductor wrapper module, anchored on inductor's own marks.

With ``config.trace.provenance_tracking_level`` on, inductor writes a comment
``# [Provenance debug handles] <kernel>:<handle>`` right before every kernel call
of its (Python) wrapper code — generated C++ kernels, Triton kernels (``.run``),
extern calls (``extern_kernels.mm(..., out=buf3)``) and fallback operators
(``buf6 = torch.ops.aten.convolution_backward.default(...)``) — and records
``<kernel>:<handle>`` → the post-grad FX nodes it computes.  This module reads
those marks: the statement after each mark is that kernel's call, and one line
``_opdump_kernel_tap(<n>, <its output buffers>)`` is inserted after it.

Guarantees:
* only lines are *added*, each after a complete call statement; the kernels'
  source, the calls and every other line are unchanged, so the module computes
  exactly what the unmarked module computes (the kernels are compiled from the
  same source, i.e. loaded from the same cache entry);
* a kernel's output buffers are what the call writes: ``out=`` of an extern
  call; the assigned name of an allocating call (a tuple stays a tuple: its
  positions are the output slots); for a generated C++ kernel the arguments its
  signature declares non-``const`` (``out_ptr``/``in_out_ptr``); for a Triton
  kernel the arguments named ``out_ptr*``/``in_out_ptr*`` in its ``def``;
* a call whose outputs cannot be told is skipped (listed with no outputs),
  never guessed.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

TAP = "_opdump_kernel_tap"
_MARK = re.compile(r"^\s*# \[Provenance debug handles\] (?P<kernel>.+):(?P<handle>\d+)\s*$")


@dataclass
class KernelCall:
    """One kernel call of the wrapper, in execution order."""
    index: int                    # position among the graph's kernel calls
    kernel: str                   # inductor's name: cpp_fused_add_relu_0, extern_kernels.mm, ...
    handle: int                   # provenance debug handle (key ``kernel:handle``)
    line: int                     # line of the call in the instrumented module (1-based)
    outputs: List[str] = field(default_factory=list)   # the output expressions, as written


def _cpp_signatures(tree: ast.Module) -> Dict[str, List[bool]]:
    """``name = async_compile.cpp_pybinding(['const float*', 'float*', ...], src)`` → written-to flags."""
    out: Dict[str, List[bool]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "cpp_pybinding" and call.args and isinstance(call.args[0], ast.List)):
            continue
        types = [e.value for e in call.args[0].elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        out[node.targets[0].id] = [t.strip().endswith("*") and not t.strip().startswith("const") for t in types]
    return out


_TRITON_DEF = re.compile(r"def\s+(?P<name>\w+)\((?P<params>[^)]*)\)")


def _triton_signatures(tree: ast.Module) -> Dict[str, List[bool]]:
    """``name = async_compile.triton('name', '''...def name(in_ptr0, out_ptr0, ...)''')`` → written-to flags."""
    out: Dict[str, List[bool]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "triton"
                and len(call.args) >= 2 and isinstance(call.args[1], ast.Constant)):
            continue
        m = _TRITON_DEF.search(str(call.args[1].value))
        if m:
            params = [p.split(":")[0].strip() for p in m.group("params").split(",") if p.strip()]
            out[node.targets[0].id] = [p.startswith(("out_ptr", "in_out_ptr")) for p in params]
    return out


def _outputs(stmt: ast.stmt, cpp: Dict[str, List[bool]], triton: Dict[str, List[bool]]) -> List[str]:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return [stmt.targets[0].id]                       # buf6 = torch.ops.aten.x.default(...)
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return []
    call = stmt.value
    for kw in call.keywords:
        if kw.arg == "out":                               # extern_kernels.mm(a, b, out=buf3)
            return [ast.unparse(kw.value)]
    func = call.func
    flags: Optional[List[bool]] = None
    if isinstance(func, ast.Name):
        flags = cpp.get(func.id)
    elif isinstance(func, ast.Attribute) and func.attr == "run" and isinstance(func.value, ast.Name):
        flags = triton.get(func.value.id)
    if flags is None:
        return []
    return [ast.unparse(arg) for arg, written in zip(call.args, flags) if written]


def instrument_wrapper(source: str, tag: str = "") -> Tuple[str, List[KernelCall]]:
    """The wrapper ``source`` with a tap after every marked kernel call, and those calls.

    ``tag`` is added as a first comment line so that the instrumented module is
    a module of its own (inductor's code cache keys modules by their source)."""
    tree = ast.parse(source)
    cpp, triton = _cpp_signatures(tree), _triton_signatures(tree)
    lines = source.splitlines()
    marked: List[Tuple[int, str, ast.stmt]] = []          # (handle, kernel, statement)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if not isinstance(stmt, ast.stmt) or stmt.lineno < 2:
                continue
            m = _MARK.match(lines[stmt.lineno - 2])
            if m:
                marked.append((int(m.group("handle")), m.group("kernel"), stmt))
    marked.sort(key=lambda item: item[2].lineno)
    calls: List[KernelCall] = []
    inserts: List[Tuple[int, str]] = []                    # (after line, text)
    for index, (handle, kernel, stmt) in enumerate(marked):
        outs = _outputs(stmt, cpp, triton)
        call = KernelCall(index, kernel, handle, stmt.lineno, outs)
        calls.append(call)
        if outs:
            indent = lines[stmt.lineno - 1][: stmt.col_offset]
            inserts.append((stmt.end_lineno, f"{indent}{TAP}({index}, ({', '.join(outs)},))"))
    for after, text in sorted(inserts, reverse=True):
        lines.insert(after, text)
    shift = 1 if tag else 0
    for call in calls:                                     # line numbers in the final text
        call.line += shift + sum(1 for after, _ in inserts if after < call.line)
    head = [f"# {tag}"] if tag else []
    return "\n".join(head + lines) + "\n", calls
