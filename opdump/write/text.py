"""Names taken from a model made safe for every text file of a dump.

A module may be registered under any string (``add_module("a\\nb", …)``); a newline,
a NUL or another control character in a name would split a line of the execution
order or put a raw NUL into ``statistic.csv``.  :func:`escape_controls` writes each
such character as the backslash escape Python's ``repr`` uses (``\\n``, ``\\x00``,
``\\u2028``) — the form in which graph capture already receives module names from
Dynamo, so eager and graph mode name a module alike — every name stays on one line,
and ordinary names are unchanged.
"""
from __future__ import annotations

import re

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
    """``text`` with every control character written as a backslash escape."""
    return _CONTROLS.sub(_escape, text) if _CONTROLS.search(text) else text
