"""The one error type a bad configuration raises.

Its message always names the file, the field, the value and what is allowed, so
that ``opdump run`` can print it alone (no traceback) and exit non-zero.
"""
from __future__ import annotations

import reprlib
from typing import Any, Optional


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 6, 240, 240, 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = 16


def _shown(value: Any) -> str:
    """A short one-line repr of any value a config can hold (deep nesting and huge numbers included)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"<an integer of {len(str(value)) if value.bit_length() < 13000 else 'thousands of'} digits>"
    try:
        return _REPR.repr(value)
    except (RecursionError, ValueError):
        return f"<a {type(value).__name__} too large to show>"


def _one_line(text: str) -> str:
    """``text`` with every control character escaped (a key or file name may hold a newline)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ConfigError(ValueError):
    """A configuration value that opdump refuses, with everything needed to fix it."""

    def __init__(self, field: str, value: Any, allowed: str, file: Optional[str] = None):
        self.field = field
        self.value = value
        self.allowed = allowed
        self.file = file
        super().__init__(self._message())

    def _message(self) -> str:
        where = f"{self.file}: " if self.file else ""
        shown = self.value if isinstance(self.value, str) and self.value.startswith("<") else _shown(self.value)
        return _one_line(f"{where}{self.field}: {shown}: {self.allowed}")

    def with_file(self, file: Optional[str]) -> "ConfigError":
        """The same error, naming the config file it came from."""
        return ConfigError(self.field, self.value, self.allowed, file)
