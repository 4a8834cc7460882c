"""Which operators the overflow watch may spare work (``op_debug_mode`` 3; README "Debug
dumps"): those that cannot make Inf/NaN from finite inputs (no reduction of their outputs;
no pre-write copy when they write in place) and those whose outputs are uninitialized
memory (never judged).  Split from :mod:`.overflow` so the rules are read in one place."""
from __future__ import annotations

import math
from typing import Sequence

import torch

#: operators that cannot make Inf/NaN from finite inputs (their outputs are rearranged, selected
#: or bounded input elements, with no non-finite scalar argument): their outputs get no
#: reduction of their own (:meth:`OverflowWatch._derived`).  Not here: dtype conversions
#: (``_to_copy``, ``copy_``: fp32 -> fp16 overflows), scaling (dropout), sums.
FINITE_PRESERVING = frozenset((
    "view", "_unsafe_view", "reshape", "_reshape_alias", "transpose", "t", "permute", "expand", "slice",
    "select", "unsqueeze", "squeeze", "as_strided", "alias", "detach", "narrow", "split", "split_with_sizes",
    "chunk", "unbind", "diagonal", "view_as", "flatten", "unflatten", "movedim", "unfold", "clone",
    "contiguous", "cat", "stack", "index_select", "gather", "repeat", "lift_fresh_copy", "roll", "flip",
    "relu", "relu_", "threshold", "threshold_", "threshold_backward", "hardtanh", "hardtanh_", "clamp",
    "clamp_", "max_pool2d", "max_pool2d_with_indices", "amax", "amin", "max", "min", "sigmoid", "tanh",
    "sign", "abs", "neg", "where", "masked_fill", "masked_fill_", "zero_", "fill_",
    # backward scatters: the gradient placed into zeros (finite iff the gradient is)
    "select_backward", "slice_backward", "diagonal_backward", "select_scatter", "slice_scatter"))
#: operators whose outputs are finite whatever their inputs hold (zeros, ones, random 0/1 and
#: uniform fills: dropout's mask is ``empty_like`` + ``bernoulli_``): no reduction, no pre-write copy (they
#: cannot be an origin); a non-finite scalar argument (``flagged``) still makes them judged
ALWAYS_FINITE = frozenset(("bernoulli", "bernoulli_", "uniform_", "random_", "zeros", "zeros_like", "new_zeros",
                           "ones", "ones_like", "new_ones"))
#: operators whose outputs are uninitialized memory (judging them would report garbage NaNs)
UNINITIALIZED = frozenset(("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                           "empty_permuted", "resize_", "resize_as_"))


#: ``mul``/``div`` by a number: finite-preserving when the number's magnitude is at most 1
#: (``mul``) or at least 1 (``div``): ``|x * s| <= |x|``, ``|x / s| <= |x|``
#: (and not 0: ``inf * 0`` is NaN, an on-purpose Inf turned into NaN is an origin)
_SCALING = {"mul": False, "mul_": False, "div": True, "div_": True}
_NUMBER_OVERLOADS = frozenset(("Tensor", "Scalar"))


def scales_down(op_type: str, overload: str, args: Sequence) -> bool:
    """Is this ``x * s`` with ``0 < |s| <= 1`` or ``x / s`` with ``1 <= |s| < inf``, ``s`` a real
    number (``args``: the operator's positional arguments; a Python number reaches
    ``mul.Tensor`` as itself under a dispatch mode) or a 0-d CPU tensor (read on the host
    without a sync)?  AdamW's ``param.mul_(1 - lr * wd)``, ``exp_avg_sq.mul_(beta2)``.
    Anything else (a tensor, a complex or non-finite number): False."""
    divides = _SCALING.get(op_type)
    if divides is None or overload not in _NUMBER_OVERLOADS or len(args) != 2:
        return False
    s = args[1]
    if isinstance(s, torch.Tensor):
        if s.dim() != 0 or not s.is_cpu or s.is_complex() or s.requires_grad:
            return False
    elif not isinstance(s, (int, float)):
        return False
    try:
        v = abs(float(s))
    except Exception:   # noqa: BLE001 - a tensor subclass without a value: no shortcut
        return False
    return 1.0 <= v < math.inf if divides else 0.0 < v <= 1.0


def needs_prewrite_copy(op_type: str, overload: str, flagged: bool, args: Sequence = ()) -> bool:
    """Must the arguments an in-place operator writes be copied before it runs?

    No for a :data:`FINITE_PRESERVING` operator (``relu_``, ``zero_``, ``fill_``,
    ``clamp_``…), for a :func:`scales_down` one (``args``: its positional arguments) and for an
    :data:`ALWAYS_FINITE` one, called with no non-finite scalar argument and no dtype
    conversion.  Why
    that is safe: the copy exists only so that, if this operator turns out to be an
    overflow origin, its recorded inputs are the values before the write.  Such an
    operator cannot be an origin: its output holds Inf/NaN only where its input already
    did (finite inputs and finite scalars give finite values).  Judged without the copy,
    its input is the written tensor itself, so input and output carry the same values and
    :func:`.origin.judge` never gives it the :data:`~.origin.OPERATOR` verdict either: the
    verdict is unchanged, and its pre-write input, never recorded, is not needed.  Nor is
    it needed by a later operator: a later one reads the tensor after the write, and it is
    the post-write value the watch holds and records for it.  The batch is still judged
    before the write when it holds the tensor (:meth:`OverflowWatch.before_write`), so an
    earlier origin whose output this operator overwrites is recorded with its own values.
    """
    if flagged or overload == "dtype":
        return True
    return op_type not in FINITE_PRESERVING and op_type not in ALWAYS_FINITE and not scales_down(
        op_type, overload, args)
