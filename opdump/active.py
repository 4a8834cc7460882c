"""The current dump session: a registry with no dependencies.

Why: the capture front-ends (the ``torch.compile`` backend, eager capture) need
"the session that is open now", and :mod:`opdump.session` needs the capture
front-ends (``Session.backend``).  Holding the registry here, in a module that
imports nothing from opdump, keeps both directions free of import cycles.

Guarantees:
* at most one session is current; :func:`activate` refuses a second one;
* :func:`current` with ``create`` asks the factory registered by
  :mod:`opdump.session` (which opens a session from ``$OPDUMP_CONFIG``) when
  none is current; without a factory, or when it opens nothing, it is None;
* the registry holds the current session only: :func:`deactivate` (called by
  ``Session.close``) drops the reference, so a closed session is not kept alive
  from here.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

_lock = threading.RLock()
_current: Any = None
_factory: Optional[Callable[[], None]] = None


def current(create: bool = True):
    """The current session, or None; with ``create``, the factory may open one first."""
    with _lock:
        if _current is None and create and _factory is not None:
            _factory()
        return _current


def activate(session) -> None:
    """Make ``session`` current; RuntimeError if another one is."""
    global _current
    with _lock:
        if _current is not None and _current is not session:
            raise RuntimeError("another opdump session is already active")
        _current = session


def deactivate(session) -> None:
    """``session`` is no longer current (a no-op if another one is)."""
    global _current
    with _lock:
        if _current is session:
            _current = None


def set_factory(factory: Optional[Callable[[], None]]) -> None:
    """Register what :func:`current` calls to open a session on demand (it must call
    :func:`activate` itself, or do nothing)."""
    global _factory
    _factory = factory
