"""Operator full names and source frames shared by both capture front-ends (README, Output layout).

full name = scope + ``/`` + ``<OpType>-op<N>``; scope ``Default/<Root>/<name-Class>/…``
for forward operators, ``Gradients/<forward scope>`` for backward ones.
"""
from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

from ..format.names import escape_controls
from .op_info import SourceLine, visible_frames

_ROOT_PREFIX = re.compile(r"^L\['[^']*'\]")
_GETATTR = re.compile(r"getattr\((.*),\s*'([^']*)'\)")
_CALL = re.compile(r"@\d+")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)\n(?P<code>[^\n]*)')


def op_type_of(target) -> Tuple[str, str]:
    """(op type, overload) of an ATen OpOverload: ``aten.convolution.default`` → (convolution, default)."""
    name = getattr(target, "_opname", None) or getattr(target, "__name__", str(target)).split(".")[0]
    overload = getattr(target, "_overloadname", "default")
    return str(name), str(overload)


def _clean_path(path: str) -> str:
    """``L['self'].features.0.conv`` → ``features.0.conv``; the root alone → ``""``."""
    while True:
        m = _GETATTR.search(path)
        if not m:
            break
        path = path[: m.start()] + f"{m.group(1)}.{m.group(2)}" + path[m.end():]
    path = _ROOT_PREFIX.sub("", path)
    path = path.replace("._modules['", ".").replace("']", "").replace("['", ".")
    return path.lstrip(".")


def module_scope(stack: Sequence[Tuple[str, str]], root_class: Optional[str]) -> str:
    """Scope from (module path, class name) pairs, outermost first.

    Each module contributes ``name-Class`` where name is its path relative to the
    enclosing module on the stack (``name@k-Class`` for its k-th extra call, as in
    eager mode); the root contributes its class name alone.
    """
    parts: List[str] = []
    prev = ""
    root = root_class
    for raw_path, cls in stack:
        path = _clean_path(raw_path)            # may carry "@k" markers: a module's k-th extra call
        plain = _CALL.sub("", path)
        if plain == "":
            root = root or cls
            continue
        if prev and plain.startswith(prev + "."):
            rel = ".".join(path.split(".")[prev.count(".") + 1:])
        else:
            rel = path
        parts.append(escape_controls(f"{rel}-{cls}"))   # a newline/NUL in a module name: one line per name
        prev = plain
    head = ["Default"] + ([escape_controls(root)] if root else [])
    return "/".join(head + parts)


def backward_scope(forward_scope: str) -> str:
    return f"Gradients/{forward_scope}"


def parse_stack_trace(stack_trace: Optional[str]) -> Tuple[SourceLine, ...]:
    """The user-visible frames of an FX ``stack_trace`` string, outermost first: the same
    rule as eager mode (:func:`opdump.capture.op_info.visible_frames`: library code such as
    ``transformers`` kept, torch, the standard library and opdump dropped)."""
    if not stack_trace:
        return ()
    return visible_frames([
        SourceLine(m.group("file"), int(m.group("line")), m.group("code").strip(), m.group("func").strip())
        for m in _FRAME.finditer(stack_trace)
    ])


def class_name(cls) -> str:
    return getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1].rstrip("'>")


def stack_pairs(nn_module_stack) -> Tuple[Tuple[str, str], ...]:
    """FX ``nn_module_stack`` meta (dict key → (path, class)) as (path, class name) pairs."""
    if not nn_module_stack:
        return ()
    pairs = []
    for key, (path, cls) in nn_module_stack.items():
        call = str(key).partition("@")[2]         # Dynamo keys a module's later calls "<id>@k"
        pairs.append((f"{path}@{call}" if call else str(path), class_name(cls)))
    return tuple(pairs)


def stack_ids(nn_module_stack) -> Tuple[str, ...]:
    return tuple(str(k) for k in (nn_module_stack or {}).keys())

