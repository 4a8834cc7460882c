"""The one rule that says whether an operator is where an overflow started (README,
"Debug dumps" and "Analysis: overflow").

Pure and torch-free, so that the live overflow dump (:mod:`.overflow`, ``op_debug_mode``
3) and the offline ``opdump overflow`` analysis decide the same way from the same facts.
"""
from __future__ import annotations

from typing import Optional

#: verdicts of :func:`judge`
ON_PURPOSE = "on_purpose"   # Inf made or passed along deliberately (a mask): not an overflow
OPERATOR = "operator"       # finite inputs and arguments, non-finite output: the operator overflowed
ARGUMENT = "argument"       # the non-finite output comes from a NaN/Inf non-tensor argument
INPUT = "input"             # a non-finite input nobody explains: the trouble started earlier


def judge(bad_in: bool, unexplained_in: bool, bad_out: bool, nan_out: bool, flagged: bool) -> Optional[str]:
    """The verdict on one operator call, or None when all its floating tensors are finite.

    ``bad_in``: some floating input holds NaN/Inf; ``unexplained_in``: some of those is not
    an on-purpose Inf (a mask: Inf-only and made by an :data:`ON_PURPOSE` operator);
    ``bad_out``: some floating output holds NaN/Inf; ``nan_out``: some output holds NaN;
    ``flagged``: a non-tensor argument is Inf/NaN or a float type's extreme.
    """
    if not bad_in and not bad_out:
        return None
    if not unexplained_in and (flagged or bad_in) and not nan_out:
        return ON_PURPOSE
    if bad_out and not unexplained_in:
        return ARGUMENT if flagged else OPERATOR
    return INPUT
