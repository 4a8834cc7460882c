"""Analysis of dumps (opdump's and MindSpore's): read, locate, overflow, compare, watch, report.

Lazy imports keep ``import opdump.analysis`` cheap; pandas is only needed here.
"""
from __future__ import annotations

from .reader import Dump, DumpError, load_statistics, open_dump

load = open_dump

__all__ = ["Dump", "DumpError", "open_dump", "load", "load_statistics",
           "locate", "find_overflow", "compare", "watch", "Condition", "write_html_report"]


def __getattr__(name):  # lazy access to the job modules
    if name == "locate":
        from .locate import locate
        return locate
    if name == "find_overflow":
        from .overflow import find_overflow
        return find_overflow
    if name == "compare":
        from .compare import compare
        return compare
    if name in ("watch", "Condition"):
        from . import watch as _w
        return getattr(_w, name)
    if name == "write_html_report":
        from .report import write_html_report
        return write_html_report
    raise AttributeError(name)
