"""Old import path of :func:`opdump.format.names.escape_controls` (names taken from a model
made safe for every text file of a dump; the rule is part of the format, docs/design.md
"Names")."""
from __future__ import annotations

from ..format.names import escape_controls

__all__ = ["escape_controls"]
