"""Magnitude bounds that prove an operator's outputs finite without reading them
(``op_debug_mode`` 3; README "Debug dumps").

Why: the CPU overflow watch reads every floating tensor an operator makes (one pass at
memory speed) and copies every tensor an in-place operator writes before it runs (the
values an origin's recorded inputs must have).  On a training step most of that is
matrix products and the optimizer's arithmetic on parameter-sized tensors (AdamW:
``lerp_``, ``addcmul_``, ``sqrt``, ``div``, ``add_``, ``addcdiv_``; SGD: ``add_``).  Each
reading gives, for free, the largest magnitude of the tensor and whether an element is
negative (:func:`opdump.stats.native.finite_bound`); from those facts about an operator's
inputs, :func:`output_bound` gives the same facts about its outputs.  When the bound is
finite with room to spare (at most half the largest finite value of the output's dtype),
the outputs are finite -- whatever the rounding -- so they are not read, and an in-place
operator needs no pre-write copy: it cannot be an overflow origin.

A tensor's facts are a pair ``(B, L)``: every element ``x`` has ``|x| <= B`` and
``x >= L`` (``L = -B`` when nothing better is known).

Guarantees: facts are given only when every floating tensor argument has known finite
facts and every number argument is a finite real no larger than the room of the tensors'
dtypes (a kernel may cast it first); each rule bounds every partial result whatever the
kernel's order of operations; the factor 2 of room covers float rounding (at most a
relative ``k * 2**-7`` for a ``k``-term sum even in bfloat16: matrix products get that
factor too).  Anything not listed here (or an argument not understood) gives None: the
outputs are read, as before.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from .overflow_rules import ALWAYS_FINITE, FINITE_PRESERVING

#: half the largest finite value of each floating dtype: the room a bound must leave
ROOM = {torch.float32: torch.finfo(torch.float32).max / 2, torch.float64: torch.finfo(torch.float64).max / 2,
        torch.float16: torch.finfo(torch.float16).max / 2, torch.bfloat16: torch.finfo(torch.bfloat16).max / 2}
_INF = math.inf
Facts = Tuple[float, float]        # (B, L): |x| <= B and x >= L for every element
_ULP = 2.0 ** -6                   # a relative rounding larger than bfloat16's (2**-8), twice over
_DOWN = 1.0 - _ULP                 # a lower bound's room for the rounding of a product or sum
_SLACK = 2.0 ** -5                 # every rule's facts widened by this (see _rounded)


def _real(x) -> Optional[float]:
    """A finite real number argument as a float (bool: 0/1), else None."""
    if isinstance(x, (int, float)):
        v = float(x)
        return v if -_INF < v < _INF else None
    return None


def _arg(args: Sequence, kwargs: dict, pos: int, name: str, default):
    if len(args) > pos:
        return args[pos]
    return kwargs.get(name, default) if kwargs else default


def _top_numbers(args: Sequence, kwargs: Optional[dict]) -> Optional[float]:
    """The largest |number| among the top-level arguments (0.0: none); None: one is not finite."""
    m = 0.0
    for a in (list(args) + list(kwargs.values())) if kwargs else args:
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            v = abs(float(a))
            if not v < _INF:
                return None
            m = max(m, v)
    return m


def float_tensors(args: Sequence, kwargs: Optional[dict]) -> list:
    """The floating tensors among the top-level arguments (lists too)."""
    out = []
    for a in (list(args) + list(kwargs.values())) if kwargs else args:
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                out.append(t)
    return out


def _facts(facts, x) -> Optional[Facts]:
    """Facts of a floating tensor (known, else None) or of a finite number (exact)."""
    if isinstance(x, torch.Tensor):
        return facts(x) if x.is_floating_point() else None
    v = _real(x)
    return None if v is None else (abs(v), v)


#: finite-preserving operators whose outputs may hold one of their number arguments
VALUE_ARGS = frozenset(("clamp", "clamp_", "hardtanh", "hardtanh_", "threshold", "threshold_", "fill_",
                         "masked_fill", "masked_fill_", "where"))


def _preserving(op_type, facts, args, kwargs) -> Optional[Facts]:
    """Rearranging, selecting, clamping or squashing operators (:data:`FINITE_PRESERVING`):
    each output element is an input element, 0, within [-1, 1] (``sigmoid``, ``sign``…) or,
    for :data:`VALUE_ARGS`, a number argument (the others' numbers are sizes and dims).
    One loop over the arguments: this runs for every view, ``t``, ``detach``, ``relu``…"""
    b = 1.0
    values = op_type in VALUE_ARGS
    for a in (list(args) + list(kwargs.values())) if kwargs else args:
        if isinstance(a, torch.Tensor):
            if a.is_floating_point():
                f = facts(a)
                if f is None:
                    return None
                if f[0] > b:
                    b = f[0]
        elif isinstance(a, float):
            if not -_INF < a < _INF:
                return None
            if values and abs(a) > b:
                b = abs(a)
        elif isinstance(a, (list, tuple)):
            for t in a:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    f = facts(t)
                    if f is None:
                        return None
                    if f[0] > b:
                        b = f[0]
        elif values and isinstance(a, int) and not isinstance(a, bool) and abs(a) > b:
            b = float(abs(a))
    return b, -b


def _mul(facts, args, kwargs):
    if len(args) != 2:
        return None
    a, b = _facts(facts, args[0]), _facts(facts, args[1])
    if a is None or b is None:
        return None
    B = a[0] * b[0]
    return B, (a[1] * b[1] * _DOWN if a[1] >= 0 and b[1] >= 0 else -B)


def _div(facts, args, kwargs):
    if len(args) != 2 or kwargs or isinstance(args[1], torch.Tensor):    # a tensor divisor: see addcdiv
        return None
    a, s = _facts(facts, args[0]), _real(args[1])
    if a is None or not s:
        return None
    # max(B, 1): a kernel may multiply by the reciprocal 1/s (0 * inf would be NaN)
    B = max(a[0], 1.0) / abs(s)
    return B, (a[1] / s * 0.5 if a[1] >= 0 and s > 0 else -B)


def _add(facts, args, kwargs, sign=1.0):
    if len(args) < 2:
        return None
    a, b = _facts(facts, args[0]), _facts(facts, args[1])
    alpha = _real(_arg(args, kwargs, 2, "alpha", 1))
    if a is None or b is None or alpha is None:
        return None
    alpha *= sign
    B = a[0] + abs(alpha) * b[0]
    term = alpha * b[1] if alpha >= 0 else alpha * b[0]      # alpha * b >= term
    if a[1] >= 0 and term >= 0:         # both non-negative: the rounding is relative to the sum
        return B, (a[1] + term) * _DOWN
    return B, max(-B, a[1] + term - B * _ULP)       # else relative to the operands


def _sub(facts, args, kwargs):
    return _add(facts, args, kwargs, -1.0)


def _lerp(facts, args, kwargs):
    # CPU lerp: w < 0.5: a + w * (b - a); else b - (b - a) * (1 - w); both below (2 + 2|w|)(|a| + |b|)
    if len(args) != 3:
        return None
    a, b, w = _facts(facts, args[0]), _facts(facts, args[1]), _facts(facts, args[2])
    if a is None or b is None or w is None:
        return None
    B = (2.0 + 2.0 * w[0]) * (a[0] + b[0])
    return B, -B


def _addcmul(facts, args, kwargs):
    if len(args) < 3:
        return None
    a, x, y = _facts(facts, args[0]), _facts(facts, args[1]), _facts(facts, args[2])
    v = _real(_arg(args, kwargs, 3, "value", 1))
    if a is None or x is None or y is None or v is None:
        return None
    # every partial product, whatever the kernel's order (value * x first, or x * y)
    p = max(abs(v), 1.0) * max(x[0], 1.0) * max(y[0], 1.0)
    B = a[0] + p
    square = args[1] is args[2] or (x[1] >= 0 and y[1] >= 0)      # x * y >= 0
    return B, (a[1] * _DOWN if square and v >= 0 and a[1] >= 0 else -B)


def _addcdiv(facts, args, kwargs):
    # a + v * x / y: needs y bounded away from 0 (y >= L > 0)
    if len(args) < 3:
        return None
    a, x, y = _facts(facts, args[0]), _facts(facts, args[1]), _facts(facts, args[2])
    v = _real(_arg(args, kwargs, 3, "value", 1))
    if a is None or x is None or y is None or v is None or not isinstance(args[2], torch.Tensor):
        return None
    low = y[1] * 0.5                                 # room for the rounding of y's own lower bound
    if not low >= 2.0 * torch.finfo(args[2].dtype).tiny:    # not a normal number: may be flushed to 0
        return None
    B = a[0] + max(abs(v), 1.0) * max(x[0], 1.0) / min(low, 1.0)
    return B, -B


def _sqrt(facts, args, kwargs):
    if len(args) != 1:
        return None
    a = _facts(facts, args[0])
    if a is None or a[1] < 0:                        # a negative element: NaN
        return None
    return math.sqrt(a[0]) * 1.5 + 1.0, 0.0


def _matmul(inner: Callable[[Sequence], Optional[int]], with_input: bool):
    def rule(facts, args, kwargs):
        n = 3 if with_input else 2
        if len(args) != n:
            return None
        k = inner(args)
        ts = [_facts(facts, t) if isinstance(t, torch.Tensor) else None for t in args]
        if k is None or any(f is None for f in ts):
            return None
        # k products of magnitude <= Ba * Bb, each partial sum too; k * 2**-7: the rounding
        p = k * ts[-2][0] * ts[-1][0] * (1.0 + k * 2.0 ** -7)
        if with_input:
            beta = _real(kwargs.get("beta", 1)) if kwargs else 1.0
            alpha = _real(kwargs.get("alpha", 1)) if kwargs else 1.0
            if beta is None or alpha is None:
                return None
            B = max(abs(beta), 1.0) * ts[0][0] + max(abs(alpha), 1.0) * p
        else:
            B = p
        return B, -B
    return rule


def _reduced(x: torch.Tensor, dims) -> Optional[int]:
    """How many elements each output of a reduction of ``x`` over ``dims`` sums."""
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return x.numel()
    if isinstance(dims, int):
        dims = (dims,)
    k = 1
    for d in dims:
        if not isinstance(d, int) or not -x.dim() <= d < max(x.dim(), 1):
            return None
        k *= int(x.shape[d]) if x.dim() else 1
    return k


def _sum(facts, args, kwargs):
    # sum / mean over dims: every partial sum of k terms is at most k * B (a mean too, before /k)
    if (not args or not isinstance(args[0], torch.Tensor) or (kwargs and kwargs.get("dtype") is not None)
            or (len(args) > 3 and args[3] is not None)):      # a dtype: the sum may be narrower
        return None
    x = _facts(facts, args[0])
    k = _reduced(args[0], args[1] if len(args) > 1 else None)
    if x is None or k is None:
        return None
    B = k * x[0] * (1.0 + k * 2.0 ** -7)
    return B, (-B if x[1] < 0 else 0.0)


def _softmax_backward(facts, args, kwargs):
    # y * (g - sum_j g_j y_j) over dim: |.| <= By * (Bg + k * Bg * By), every partial result too
    if len(args) < 3 or not isinstance(args[0], torch.Tensor) or not isinstance(args[1], torch.Tensor):
        return None
    g, y = _facts(facts, args[0]), _facts(facts, args[1])
    k = _reduced(args[1], args[2])
    if g is None or y is None or k is None:
        return None
    B = max(y[0], 1.0) * (g[0] + k * g[0] * max(y[0], 1.0)) * (1.0 + k * 2.0 ** -7)
    return B, -B


def _inner_last(args) -> Optional[int]:
    a = args[-2]
    return int(a.shape[-1]) if a.dim() >= 1 else None


def _ones(facts, args, kwargs):
    return 1.0, 0.0


#: operator type -> rule(facts, args, kwargs) giving the facts of its outputs or None
RULES: Dict[str, Callable] = {
    "mul": _mul, "mul_": _mul, "div": _div, "div_": _div, "add": _add, "add_": _add, "sub": _sub, "sub_": _sub,
    "lerp": _lerp, "lerp_": _lerp, "addcmul": _addcmul, "addcmul_": _addcmul, "addcdiv": _addcdiv,
    "addcdiv_": _addcdiv, "sqrt": _sqrt, "sqrt_": _sqrt,
    "mm": _matmul(_inner_last, False), "bmm": _matmul(_inner_last, False),
    "addmm": _matmul(_inner_last, True), "baddbmm": _matmul(_inner_last, True),
    "sum": _sum, "mean": _sum, "_softmax_backward_data": _softmax_backward,
    "bernoulli": _ones, "bernoulli_": _ones, "zeros": _ones, "zeros_like": _ones, "new_zeros": _ones,
    "ones": _ones, "ones_like": _ones, "new_ones": _ones,
    "_softmax": _ones, "_safe_softmax": _ones, "softmax": _ones,
}
_NUMBER_OVERLOADS = frozenset(("Tensor", "Scalar", "default", "float", "dim_IntList", "dim"))
_SOFTMAX = frozenset(("_softmax", "_safe_softmax", "softmax"))


def output_bound(op_type: str, overload: str, args: Sequence, kwargs: Optional[dict],
                 facts: Callable[[torch.Tensor], Optional[Facts]]) -> Optional[Facts]:
    """The facts ``(B, L)`` of the outputs of ``op_type`` called with ``args`` and ``kwargs``,
    ``facts(t)`` giving a floating tensor argument's (None: unknown or not finite); None
    when no rule applies.  The caller checks ``B`` against :data:`ROOM` (:func:`proven_finite`)."""
    if overload == "dtype" or overload == "out":
        return None
    rule = RULES.get(op_type)
    if rule is None:
        if op_type in FINITE_PRESERVING:       # no arithmetic: the elements themselves, no rounding
            return _preserving(op_type, facts, args, kwargs)
        return None
    m = _top_numbers(args, kwargs)
    if m is None:
        return None
    if rule is _ones:
        if op_type in _SOFTMAX:         # softmax of finite inputs is within [0, 1]; of -inf/NaN: read
            if any(facts(t) is None for t in float_tensors(args, kwargs)):
                return None
        elif op_type not in ALWAYS_FINITE:
            return None
        return 1.0 + _SLACK, 0.0
    if overload not in _NUMBER_OVERLOADS:
        return None
    try:
        got = rule(facts, args, kwargs or {})
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    if got is None:
        return None
    # a kernel may cast a number argument to a tensor's dtype first (1e5 in float16 is inf)
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            room = ROOM.get(a.dtype)
            if room is None or not m <= room:
                return None
    return _rounded(got)


def _rounded(got: Facts) -> Facts:
    """Facts of the computed outputs: the rule bounds the exact result of the computed
    inputs; the kernel's own roundings (a few, each below 2**-8 relative, bfloat16's) move
    it by less than :data:`_SLACK` relative, so the stored facts hold for the computed
    values and a chain of proved operators stays proved by induction."""
    b, low = got
    return b * (1.0 + _SLACK), (low * (1.0 - _SLACK) if low > 0 else low * (1.0 + _SLACK))


def proven_finite(got: Optional[Facts], outputs: Sequence) -> bool:
    """Is the bound of ``got`` at most half the largest finite value of every floating
    output's dtype?"""
    if got is None or not got[0] < _INF:
        return False
    b = got[0]
    for t in outputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            room = ROOM.get(t.dtype)
            if room is None or not b <= room:
                return False
    return True
