"""Eager mode (README, Eager mode): a ``TorchDispatchMode`` front-end sharing naming,
selection, statistics and writing with the graph front-end.

``with opdump.capture.eager.EagerCapture(session): train()`` — or ``opdump run``,
which starts one for the whole script.
"""
from .mode import EagerCapture

__all__ = ["EagerCapture"]
