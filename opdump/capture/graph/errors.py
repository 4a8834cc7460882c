"""Whose error is it: the one rule the graph dispatcher applies when a dumped call raises.

Why: a dumped iteration runs each Dynamo graph on the *dump path* (AOTAutograd's ATen
graphs, operator by operator, with taps).  An exception leaving it is either the user's
program failing (an index out of range, a shape mismatch, ``torch._assert``, a custom
op's own error) or the dump failing (a tap, the dump path's machinery, a limit of the
operator-by-operator path).  The user's error must reach the user unchanged and only
once; the dump's failure must cost one warning and the real path (README, "Graph mode").

The rule (:func:`users_error`): the exception is the user's exactly when an operator
node of the dump path raised it — every operator node (``OpOverload`` or higher-order
operator) runs inside :func:`opdump.debug.exception.guard`, which marks the very
exception object it sees (:func:`~opdump.debug.exception.raised_by_operator`) — and it
is not one of the limits of the operator-by-operator path:

* out of memory (:func:`out_of_memory`): the dump path keeps every intermediate of an
  eager run alive where the real backend fuses them away, so it may need more memory;
* a kernel the eager path lacks (:func:`missing_kernel`: ATen's "not implemented for
  'Half'" and "Could not run 'aten::…' with arguments from the '…' backend"): the real
  backend may generate its own code for the same operator.

Why it is reliable: the mark is set on the exception object by the frame that called the
operator, so nothing else — a tap (taps catch their own exceptions), AOTAutograd's
wrappers, the dispatcher, an injected fault — can carry it; and an operator's exception
is the operator's whatever its type or message.  A user error raised while the graph runs
on its real path (iterations that do not dump) never passes through here.
"""
from __future__ import annotations

import torch

from ...debug.exception import raised_by_operator

# the CPU allocator reports a failed allocation as a plain RuntimeError
_CPU_OOM = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")
# ATen's own words for "no kernel for these inputs" (AT_DISPATCH, the dispatcher)
_NO_KERNEL = (" not implemented for '", "Could not run '")


def out_of_memory(exc: BaseException) -> bool:
    """An allocation failed: ``torch.OutOfMemoryError`` (CUDA and the other devices),
    Python's ``MemoryError``, or the CPU allocator's RuntimeError."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _CPU_OOM)


def missing_kernel(exc: BaseException) -> bool:
    """ATen has no eager kernel for these inputs (dtype or backend)."""
    return isinstance(exc, (NotImplementedError, RuntimeError)) and any(m in str(exc) for m in _NO_KERNEL)


def users_error(exc: BaseException) -> bool:
    """Must ``exc``, raised by a dumped call, propagate unchanged (no warning, no re-run)?"""
    try:
        return raised_by_operator(exc) and not out_of_memory(exc) and not missing_kernel(exc)
    except Exception:  # noqa: BLE001 - an exception whose str() fails: the dump's route, the safe one
        return False
