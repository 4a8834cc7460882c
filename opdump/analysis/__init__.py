"""Analysis of dumps (opdump's and MindSpore's): read, locate, overflow, compare, watch, report.

Only the HTML report is imported lazily; pandas is imported by the table views that need it.
"""
from __future__ import annotations

from .reader import Dump, DumpError, load_statistics, open_dump
# Imported here, not lazily: a function named like its module (``compare``, ``locate``, ``watch``) must be
# bound after the module is, or ``from opdump.analysis import locate`` hands out the module
# once anything has imported ``opdump.analysis.locate``.  These need no pandas.
from .compare import compare
from .locate import locate
from .overflow import find_overflow
from .watch import Condition, watch

load = open_dump

__all__ = ["Dump", "DumpError", "open_dump", "load", "load_statistics",
           "locate", "find_overflow", "compare", "watch", "Condition", "write_html_report"]


def __getattr__(name):  # lazy access to the job modules
    if name == "write_html_report":
        from .report import write_html_report
        return write_html_report
    raise AttributeError(name)
