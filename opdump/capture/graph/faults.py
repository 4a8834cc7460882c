"""Fault injection for the graph backend's fallback (a test hook).

Why: the backend promises that a failure anywhere in its dump path costs one
warning and the graph's dump, never the user's compile or step (README, "Graph
mode").  The real failures that once broke a compile are fixed, so the tests
arm a fault at a named stage instead, through real compiles and real steps.

Stages: ``compile:forward`` / ``compile:backward`` / ``compile:inference``
(after the graph was instrumented, before it is handed back), ``dumped call``
(the dispatcher, as the dump path is entered), ``call`` (the graph's first
tap) and ``tap`` (in an operator's tap).  Every stage is outside the operator
guards, so an injected fault is always opdump's own failure, never taken for the
user's error (:mod:`.errors`).  Nothing is
armed outside :func:`inject`, and an unarmed check is one set lookup.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Set

_armed: Set[str] = set()


class InjectedFault(RuntimeError):
    """Raised at an armed stage."""


@contextlib.contextmanager
def inject(*stages: str) -> Iterator[None]:
    """Arm ``stages`` for the duration of the block."""
    _armed.update(stages)
    try:
        yield
    finally:
        _armed.difference_update(stages)


def check(stage: str) -> None:
    if stage in _armed:
        raise InjectedFault(f"fault injected at {stage}")
