"""Names taken from a model made safe for every text file of a dump.

A module may be registered under any string (``add_module("a\\nb", …)``); a newline,
a NUL or another control character in a name would split a line of the execution
order or put a raw NUL into ``statistic.csv``.  :func:`escape_controls` writes each
such character as a visible backslash escape (``\\x0a``, ``\\u2028``), so every name
stays on one line, distinct names stay distinct, and ordinary names are unchanged.
"""
from __future__ import annotations

import re

# C0 and C1 control characters, DEL, and the Unicode line/paragraph separators
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(m: "re.Match[str]") -> str:
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character written as a backslash escape."""
    return _CONTROLS.sub(_escape, text) if _CONTROLS.search(text) else text
