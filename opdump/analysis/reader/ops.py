"""Operators: :class:`OpInfo`, one operator of a graph (full name, type, scope, kind,
position in the execution order, source frames and signature), with the user's innermost
source frame it is reported by.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ...format.names import sanitize
from .sources import SourceFrame, is_library_file


@dataclass
class OpInfo:
    """An operator of a graph: its full name, type, scope, source frames and signature."""

    rank: int
    graph: int
    full_name: str
    op_type: str
    scope: str
    kind: str = "forward"               # forward | backward | optimizer | inference
    index: Optional[int] = None         # position in the execution order (first occurrence)
    sources: List[SourceFrame] = field(default_factory=list)
    inputs: List[Dict[str, Any]] = field(default_factory=list)
    outputs: List[Dict[str, Any]] = field(default_factory=list)
    args: Dict[str, Any] = field(default_factory=dict)
    nonfinite_args: bool = False        # a non-tensor argument is Inf/NaN (README, overflow)
    overload: Optional[str] = None      # the listing's overload (``out``, ``Tensor``…), None when unknown
    producers: Optional[List[Any]] = None   # per input: (full name, output slot) of the listed producer, or None

    @property
    def file_name(self) -> str:
        """The operator's name as its files carry it (:func:`opdump.format.names.sanitize`)."""
        return sanitize(self.full_name)

    @property
    def user_frame(self) -> Optional[SourceFrame]:
        """The innermost frame that is not framework code (torch, MindSpore, stdlib; library
        code such as ``transformers`` counts as the user's), else the innermost frame."""
        for fr in reversed(self.sources):
            if not is_library_file(fr.file):
                return fr
        return self.sources[-1] if self.sources else None

    @property
    def source(self) -> str:
        fr = self.user_frame
        return f"{fr.file}:{fr.line}" if fr else ""

    @property
    def code(self) -> str:
        fr = self.user_frame
        return fr.code if fr else ""
