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
    inputs: List[str] = field(default_factory=list)    # intermediate buffers (buf*) the call reads
    reads: List[str] = field(default_factory=list)     # those of them that are its own arguments (live)


_CPP_KERNEL = re.compile(r"void\s+kernel\s*\((?P<params>[^)]*)\)")


def _role(param: str) -> str:
    """``in`` / ``out`` / ``inout`` of a kernel parameter by inductor's naming (in_ptr, out_ptr, in_out_ptr)."""
    names = re.findall(r"\b(in_out_ptr|out_ptr)\d+\b", param)    # C++ (at::BFloat16* in_out_ptr0) or Triton
    if not names:
        return "in"
    return "inout" if names[0] == "in_out_ptr" else "out"


def _cpp_signatures(tree: ast.Module) -> Dict[str, List[str]]:
    """``name = async_compile.cpp_pybinding(['const float*', 'float*', ...], src)`` → argument roles
    (the parameter names of ``kernel(...)`` in ``src``; without them, non-const pointers are outputs)."""
    out: Dict[str, List[str]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "cpp_pybinding" and call.args and isinstance(call.args[0], ast.List)):
            continue
        types = [e.value for e in call.args[0].elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        roles = ["out" if t.strip().endswith("*") and not t.strip().startswith("const") else "in" for t in types]
        src = call.args[1].value if len(call.args) > 1 and isinstance(call.args[1], ast.Constant) else ""
        m = _CPP_KERNEL.search(str(src))
        if m:
            named = [_role(p) for p in m.group("params").split(",") if p.strip()]
            if len(named) == len(roles):
                roles = named
        out[node.targets[0].id] = roles
    return out


_TRITON_DEF = re.compile(r"def\s+(?P<name>\w+)\((?P<params>[^)]*)\)")


def _triton_signatures(tree: ast.Module) -> Dict[str, List[str]]:
    """``name = async_compile.triton('name', '''...def name(in_ptr0, out_ptr0, ...)''')`` → argument roles."""
    out: Dict[str, List[str]] = {}
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
            out[node.targets[0].id] = [_role(p) for p in params]
    return out


def _roles(stmt: ast.stmt, cpp, triton) -> Optional[List[str]]:
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not isinstance(call, ast.Call):
        return None
    func = call.func
    if isinstance(func, ast.Name):
        return cpp.get(func.id)
    if isinstance(func, ast.Attribute) and func.attr == "run" and isinstance(func.value, ast.Name):
        return triton.get(func.value.id)
    return None


def _outputs(stmt: ast.stmt, cpp: Dict[str, List[str]], triton: Dict[str, List[str]]) -> List[str]:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return [stmt.targets[0].id]                       # buf6 = torch.ops.aten.x.default(...)
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return []
    call = stmt.value
    for kw in call.keywords:
        if kw.arg == "out":                               # extern_kernels.mm(a, b, out=buf3)
            return [ast.unparse(kw.value)]
    roles = _roles(stmt, cpp, triton)
    if roles is None:
        return []
    return [ast.unparse(arg) for arg, role in zip(call.args, roles) if role != "in"]


def _reuses(tree: ast.Module) -> Dict[str, str]:
    """``buf2 = buf1`` / ``buf4 = reinterpret_tensor(buf3, ...)`` (inductor's buffer reuse): new → old."""
    out: Dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.startswith("buf")):
            continue
        value = node.value
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id == "reinterpret_tensor" and value.args):
            value = value.args[0]
        if isinstance(value, ast.Name) and value.id.startswith("buf"):
            out[node.targets[0].id] = value.id
    return out


def buffer_names(expressions) -> List[str]:
    """The ``buf*`` names an expression list refers to (``reinterpret_tensor(buf3, ...)`` → buf3)."""
    names: List[str] = []
    for text in expressions:
        for node in ast.walk(ast.parse(text, mode="eval")):
            if isinstance(node, ast.Name) and node.id.startswith("buf") and node.id not in names:
                names.append(node.id)
    return names


def _inputs(stmt: ast.stmt, outputs: List[str], cpp, triton, reuses: Dict[str, str]) -> List[str]:
    """The buffers a call reads: its ``buf*`` arguments that it does not only write; an
    argument written in place (``in_out_ptr``) is read as the buffer it reuses, if any."""
    call = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    if not isinstance(call, ast.Call):
        return []
    roles = _roles(stmt, cpp, triton) or []
    read, inout = [], []
    for i, arg in enumerate(call.args):
        role = roles[i] if i < len(roles) else ("in" if not roles else "out")
        if role == "in":
            read.append(ast.unparse(arg))
        elif role == "inout":
            inout.append(ast.unparse(arg))
    read += [ast.unparse(k.value) for k in call.keywords if k.arg != "out"]
    written = set(buffer_names(outputs)) - set(buffer_names(inout))
    names = [n for n in buffer_names(read) if n not in written]
    for name in buffer_names(inout):
        while name in reuses:
            name = reuses[name]
        if name not in names:
            names.append(name)
    return names


def instrument_wrapper(source: str, tag: str = "") -> Tuple[str, List[KernelCall]]:
    """The wrapper ``source`` with a tap after every marked kernel call, and those calls.

    ``tag`` is added as a first comment line so that the instrumented module is
    a module of its own (inductor's code cache keys modules by their source)."""
    tree = ast.parse(source)
    cpp, triton, reuses = _cpp_signatures(tree), _triton_signatures(tree), _reuses(tree)
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
        inputs = _inputs(stmt, outs, cpp, triton, reuses)
        args = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        reads = [n for n in inputs if n in args and n not in buffer_names(outs)]
        call = KernelCall(index, kernel, handle, stmt.lineno, outs, inputs, reads)
        calls.append(call)
        if outs:
            indent = lines[stmt.lineno - 1][: stmt.col_offset]
            ins = f"({', '.join(reads)},)" if reads else "()"
            inserts.append((stmt.end_lineno, f"{indent}{TAP}({index}, ({', '.join(outs)},), {ins})"))
    for after, text in sorted(inserts, reverse=True):
        lines.insert(after, text)
    shift = 1 if tag else 0
    for call in calls:                                     # line numbers in the final text
        call.line += shift + sum(1 for after, _ in inserts if after < call.line)
    head = [f"# {tag}"] if tag else []
    return "\n".join(head + lines) + "\n", calls
