"""Source frames as the analysis sees them: which files are library code (so an operator
is reported by the user's own line) and reading the operators of a ``.ir`` file.  The
``# In file`` grammar and :class:`SourceFrame` are :mod:`opdump.format.sources`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List

from ...format.listing import parse_ir as _parse_ir_text
from ...format.sources import SourceFrame, parse_source_line

__all__ = ["SourceFrame", "parse_source_line", "is_library_file", "parse_ir"]

_LIB_RE = re.compile(
    r"((site|dist)-packages[/\\](torch|functorch|torchgen|mindspore)[/\\]|"
    r"[/\\]lib[/\\]python\d[\d.]*[/\\](?!(site|dist)-packages[/\\])|^<|[/\\]torch[/\\](nn|_dynamo|fx|"
    r"_functorch|autograd|utils|_tensor|overrides|_ops|_refs|_decomp|_prims|functional)|"
    r"[/\\]opdump[/\\](capture|write|stats|select|debug|recorder))"
)


def is_library_file(path: str) -> bool:
    """Framework code (torch, MindSpore, the standard library, opdump itself) vs code the user
    sees as theirs: their own files and libraries such as ``transformers``, whose lines are
    an operator's source (README, Analysis: locate)."""
    return bool(_LIB_RE.search(path or ""))


def parse_ir(path: Path) -> List[Dict[str, Any]]:
    """Operators of a ``.ir`` file (:func:`opdump.format.listing.parse_ir`)."""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        return _parse_ir_text(f.read())
