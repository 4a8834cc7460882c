"""The finiteness value of a CPU tensor, read now (``op_debug_mode`` 3; README "Debug dumps").

Why: on a CPU tensor a reduction has already run when it returns (there is no device
queue to keep asynchronous), so the overflow watch reads a CPU tensor's verdict at once
and keeps nothing to judge later.  The cheapest exact reading per tensor:

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

import torch

from ..stats import native

#: float32 tensors up to this many elements are read by the native one-pass kernel
FUSED_MAX = 1 << 15
_HALF = frozenset((torch.float16, torch.bfloat16))
_F32 = torch.float32
_NAN, _INF = math.nan, math.inf


_FUSED = None            # the native kernel, resolved at the first reading (None: torch alone)
_RESOLVED = False


def _resolve() -> None:
    global _FUSED, _RESOLVED
    try:
        _FUSED = native.fused_stats()
    except Exception:   # noqa: BLE001 - no native module: torch alone
        _FUSED = None
    _RESOLVED = True


def exact_value(t: torch.Tensor) -> float:
    """NaN/Inf facts of ``t`` itself (two passes; only for a non-finite reading)."""
    if bool(t.isnan().any()):
        return _NAN
    return _INF if bool(t.isinf().any()) else 0.0


def value_now(t: torch.Tensor) -> float:
    """The finiteness value of a floating CPU tensor with elements (see the module docstring)."""
    if t.requires_grad:
        t = t.detach()
    dtype = t.dtype
    if dtype is _F32:
        if not _RESOLVED:
            _resolve()
        if _FUSED is not None and t.numel() <= FUSED_MAX:
            got = _FUSED(t)
            if got is not None:
                hi, lo = got[0], got[1]
                if hi != hi:
                    return _NAN
                return _INF if hi == _INF or lo == -_INF else 0.0
    elif dtype in _HALF:
        lo, hi = torch.aminmax(t)
        lo, hi = float(lo), float(hi)
        if hi != hi or lo != lo:
            return _NAN
        return _INF if hi == _INF or lo == -_INF else 0.0
    s = float(t.sum())
    return 0.0 if s - s == 0.0 else exact_value(t)
