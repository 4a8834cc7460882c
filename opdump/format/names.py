"""Operator names and their file-name form.

Why: every dump file name embeds the operator's type and full name; the writer and
the reader must agree on how those become file-name tokens, or files cannot be mapped
back to operators (docs/design.md, "Names").

Guarantees:

* :func:`sanitize` is the one rule: ``.``, ``/``, ``\\``, space, ``:*?"<>|`` and the
  control characters (U+0000-U+001F, U+007F) become ``_``; an empty name becomes
  ``_``.  The result never contains a ``.`` (so the fields of a file name split on
  dots unambiguously) nor a path separator (so it can never leave its folder).
  Everything else, unicode included, is kept.  It is not reversible: readers map
  files back by sanitising the full names they know and matching.
* :func:`full_name` / :func:`parse_full_name` are inverse on every name
  ``{scope}/{op_type}-op{index}`` with a non-empty op type.
"""
from __future__ import annotations

import functools
import re
from typing import Optional, Tuple

#: the characters :func:`sanitize` replaces (the rest of a name is kept as is)
UNSAFE_CHARACTERS = "./\\ " + ':*?"<>|' + "".join(chr(c) for c in range(0x20)) + "\x7f"
_UNSAFE = re.compile("[" + re.escape(UNSAFE_CHARACTERS) + "]")


def sanitize(name: str) -> str:
    """``name`` as it appears inside a dump file name (see the module docstring)."""
    return _UNSAFE.sub("_", name) or "_"


@functools.lru_cache(maxsize=65536)
def file_stem(op_type: str, op_name: str) -> str:
    """``{op_type}.{op_name}``, both sanitized: how every file of an operator starts.
    Memoized (eager mode asks again on every call of an operator)."""
    return f"{sanitize(op_type)}.{sanitize(op_name)}"


# ---------------------------------------------------------------- text files
# C0 and C1 control characters, DEL, and the Unicode line/paragraph separators
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: "re.Match[str]") -> str:
    ch = m.group(0)
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character (C0, C1, DEL, U+2028, U+2029) written as the
    backslash escape Python's ``repr`` uses (``\\n``, ``\\x00``, ``\\u2028``).

    Why: a module may be registered under any string; a newline or NUL in a name would
    split a line of the execution order or put a raw NUL into ``statistic.csv``.  Dynamo
    hands graph capture module names in this form already, so eager and graph mode name a
    module alike.  Guarantees: the result holds no line break; ordinary names are
    returned unchanged."""
    return _CONTROLS.sub(_escape, text) if _CONTROLS.search(text) else text


# ---------------------------------------------------------------- full names
_OPID_RE = re.compile(r"(?P<type>.+?)-op(?P<id>\d+)\Z", re.S)


def full_name(scope: str, op_type: str, index: int) -> str:
    """``Default/Net/conv3-Conv2d`` + ``convolution`` + 12 -> ``Default/Net/conv3-Conv2d/convolution-op12``."""
    return f"{scope}/{op_type}-op{index}"


def parse_full_name(name: str) -> Tuple[str, str, Optional[int]]:
    """(scope, op_type, index) of a full name; index None when the last segment has no
    ``-op<N>`` (a MindSpore name such as ``Default/Return``)."""
    scope, _, last = name.rpartition("/")
    m = _OPID_RE.match(last)
    if m:
        return scope, m.group("type"), int(m.group("id"))
    return scope, last, None


def op_type_of(name: str) -> str:
    """``Default/Net/conv3-Conv2d/convolution-op12`` -> ``convolution``."""
    return parse_full_name(name)[1]


def scope_of(name: str) -> str:
    """``Default/Net/conv3-Conv2d/convolution-op12`` -> ``Default/Net/conv3-Conv2d``."""
    return name.rsplit("/", 1)[0] if "/" in name else ""


#: the scope prefix of backward operators, and the scope segment of optimizer operators
BACKWARD_PREFIX = "Gradients/"
OPTIMIZER_SEGMENT = "optimizer-"


def kind_of_name(name: str, graph_kind: Optional[str] = None) -> str:
    """forward | backward | optimizer (| inference, as the graph says)."""
    if name.startswith(BACKWARD_PREFIX):
        return "backward"
    if "/" + OPTIMIZER_SEGMENT in name or name.startswith(OPTIMIZER_SEGMENT):
        return "optimizer"
    if graph_kind in ("backward", "inference"):
        return graph_kind
    return "forward"
