"""The finiteness value of a CPU tensor, read now (``op_debug_mode`` 3; README "Debug dumps").

Why: on a CPU tensor a reduction has already run when it returns (there is no device
queue to keep asynchronous), so the overflow watch reads a CPU tensor's verdict at once
and keeps nothing to judge later.  The cheapest exact reading per tensor:

* any dense float32/float64/float16/bfloat16 tensor: the native integer pass
  :func:`opdump.stats.native.finite_bound` (the largest magnitude's bit pattern: NaN, Inf or
  the finite max ``|x|``, which :mod:`.overflow_bounds` uses); where it is not built:
* small float32 tensors (up to :data:`FUSED_MAX` elements): the native one-pass kernel
  (:func:`opdump.stats.native.fused_stats`, used as it is): a direct call, no dispatcher, no
  0-d result tensor (0.5 vs 2.2 µs for 256 elements, one thread); its max/min are exact
  (NaN when any element is NaN, ±Inf when an element is);
* larger float32 and float64 tensors: ``t.sum()`` (memory speed; torch's sum beats the
  native kernel's four accumulators there); a finite sum means a finite tensor; a
  non-finite one (an overflowing sum of finite values, or +Inf with -Inf) is settled
  exactly by ``isnan().any()`` / ``isinf().any()``;
* float16/bfloat16: ``torch.aminmax`` (exact: a float16 sum of finite values overflows).

Values: ``0.0`` (finite), ``inf`` (Inf, no NaN), ``nan`` (some NaN) -- the flags
:class:`.overflow.OverflowWatch` compares.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ..stats import native
from ..stats.memory import tensor_version

#: float32 tensors up to this many elements are read by the native one-pass kernel
FUSED_MAX = 1 << 15
_HALF = frozenset((torch.float16, torch.bfloat16))
_F32 = torch.float32
_NAN, _INF = math.nan, math.inf


def version_of(t: torch.Tensor):
    """``t``'s version counter, or NaN for an inference tensor (``torch.inference_mode``), which
    has none: NaN equals nothing and no difference with it is in range, so the watch never takes
    an earlier reading of such a tensor as current -- it reads it again (seventh trial, B5: the
    RuntimeError stopped the watch for the rest of the iteration)."""
    v = tensor_version(t)       # -1: an inference tensor
    return v if v >= 0 else _NAN


_FUSED = None            # the native kernel, resolved at the first reading (None: torch alone)
_BOUND = None            # the native finite_bound reading (None: not built)
_RESOLVED = False


def _resolve() -> None:
    global _FUSED, _BOUND, _RESOLVED
    try:
        _FUSED = native.fused_stats()
        _BOUND = native.finite_bound()
    except Exception:   # noqa: BLE001 - no native module: torch alone
        _FUSED = _BOUND = None
    _RESOLVED = True


def exact_value(t: torch.Tensor) -> float:
    """NaN/Inf facts of ``t`` itself (two passes; only for a non-finite reading)."""
    if bool(t.isnan().any()):
        return _NAN
    return _INF if bool(t.isinf().any()) else 0.0


def read_now(t: torch.Tensor) -> Tuple[float, Optional[Tuple[float, float]]]:
    """``(value, facts)`` of a floating CPU tensor with elements: its finiteness value (see
    the module docstring) and, when it is finite and the reading gives them, ``(B, L)``:
    the largest magnitude of its elements and a lower bound of their values (0.0 when none
    is negative, else ``-B``; None: not known; :mod:`.overflow_bounds` uses them)."""
    if not _RESOLVED:
        _resolve()
    if _BOUND is not None:
        try:
            got = _BOUND(t)     # max |x| in one integer pass; None: a tensor it does not handle
        except Exception:   # noqa: BLE001 - a tensor without plain storage: torch reads it
            got = None
        if got is not None:
            got, signed = got
            if got != got:
                return _NAN, None
            return (_INF, None) if got == _INF else (0.0, (got, -got if signed else 0.0))
    if t.requires_grad:
        t = t.detach()
    dtype = t.dtype
    if dtype is _F32:
        if _FUSED is not None and t.numel() <= FUSED_MAX:
            got = _FUSED(t)
            if got is not None:
                hi, lo = got[0], got[1]
                if hi != hi:
                    return _NAN, None
                return (_INF, None) if hi == _INF or lo == -_INF else (0.0, (max(hi, -lo), min(lo, 0.0)))
    elif dtype in _HALF:
        lo, hi = torch.aminmax(t)
        lo, hi = float(lo), float(hi)
        if hi != hi or lo != lo:
            return _NAN, None
        return (_INF, None) if hi == _INF or lo == -_INF else (0.0, (max(hi, -lo), min(lo, 0.0)))
    s = float(t.sum())
    return (0.0, None) if s - s == 0.0 else (exact_value(t), None)


def value_now(t: torch.Tensor) -> float:
    """The finiteness value of a floating CPU tensor with elements (see the module docstring)."""
    return read_now(t)[0]
