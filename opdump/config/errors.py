"""The one error type a bad configuration raises.

Its message always names the file, the field, the value and what is allowed, so
that ``opdump run`` can print it alone (no traceback) and exit non-zero.
"""
from __future__ import annotations

from typing import Any, Optional


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
        shown = self.value if isinstance(self.value, str) and self.value.startswith("<") else repr(self.value)
        return f"{where}{self.field}: {shown}: {self.allowed}"

    def with_file(self, file: Optional[str]) -> "ConfigError":
        """The same error, naming the config file it came from."""
        return ConfigError(self.field, self.value, self.allowed, file)
