""":func:`opdump.format.names.sanitize`, memoised for the reader.

Why: reading a statistics dump sanitises every row's operator name four times (the call
counter, the name map, the records join, the execution positions) -- 1.2 million calls of
one regular expression on a 136,000-row compare, over a few hundred distinct names.
Guarantee: the same string as :func:`~opdump.format.names.sanitize` for every name.
"""
from __future__ import annotations

from functools import lru_cache

from ...format.names import sanitize as _sanitize

__all__ = ["sanitize"]


@lru_cache(maxsize=1 << 16)
def sanitize(name: str) -> str:
    """``name`` as it appears in a dump file name (memoised :func:`opdump.format.names.sanitize`)."""
    return _sanitize(name)
