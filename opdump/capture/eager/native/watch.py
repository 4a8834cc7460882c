"""The native eager path's overflow watch (``op_debug_mode`` 3; README "Debug dumps"): what
``watch.cpp`` asks Python.

Why: the watch's verdict on an operator whose floating outputs are all finite is "none"
(:func:`opdump.debug.origin.judge`), so the observer reads each operator's outputs natively
and calls Python only for the rest -- a non-finite (or unread) output, uninitialized
outputs -- handing it to the same :class:`~opdump.debug.overflow.OverflowWatch` the Python
capture feeds, with its inputs as they were before it ran.  The rule, the records and the
summaries are the Python watch's; the observer holds no copy of them.  Before an in-place
operator runs, whether its written tensors need a pre-write copy is
:func:`~opdump.debug.overflow_rules.needs_prewrite_copy`'s answer (asked once per overload
and number arguments; the observer keeps it).
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from ...op_info import OpInfo
from ..schema import facts_of
from ..values import has_nonfinite_arg
from .callbacks import split_args

_FUNCS: Dict[Tuple[str, str], object] = {}


def _func(qualname: str, overload: str):
    key = (qualname, overload)
    func = _FUNCS.get(key)
    if func is None:
        ns, _, op = qualname.partition("::")
        func = _FUNCS[key] = getattr(getattr(getattr(torch.ops, ns), op), overload or "default")
    return func


_BOUNDS: tuple = ()


def _bounds() -> tuple:
    """(output_bound, proven_finite) of :mod:`opdump.debug.overflow_bounds`, imported at first use
    (once: the proofs ask hundreds of times a step, and an import statement costs each time)."""
    global _BOUNDS
    from ....debug.overflow_bounds import output_bound, proven_finite
    _BOUNDS = (output_bound, proven_finite)
    return _BOUNDS


class NativeWatch:
    """Mixed into :class:`.path.NativeEager`: the overflow watch's side of the native path."""

    #: (outputs read natively, operators handed to the watch, pre-write copies) of the served
    #: iterations so far (tests and the bench read it)
    native_watch_counts = (0, 0, 0)

    def _native_watch_ok(self) -> bool:
        """The watch is served natively when it is the only debug mode and it reads CPU operators
        as they return (``OverflowWatch.READ_CPU_NOW``: the path whose verdicts the observer's
        hand-over reproduces)."""
        watch = self._overflow
        return (self.config.op_debug_mode == 3 and watch is not None and watch.READ_CPU_NOW
                and self._watcher is None and self._exception is None)

    def _native_watch_kind(self, qualname: str, overload: str, values) -> int:
        """What the watch's rules (:mod:`opdump.debug.overflow_rules`) say of an operator call, as
        the bits of watch.h: ``1`` its written tensors need a pre-write copy (dispatch.py
        ``_run_watched``'s decision), ``2`` its outputs are finite when its inputs are
        (``FINITE_PRESERVING``, a scale by at most 1), ``4`` its outputs are always finite
        (``ALWAYS_FINITE``), ``8`` a magnitude rule may bound its outputs (:mod:`~opdump.debug.overflow_bounds`;
        :meth:`_native_watch_bound`).  Asked once per overload and number arguments."""
        from ....debug.overflow_bounds import RULES
        from ....debug.overflow_rules import ALWAYS_FINITE, FINITE_PRESERVING, needs_prewrite_copy, scales_down
        func = _func(qualname, overload)
        facts = facts_of(func)
        args, kwargs = split_args(func, values)
        op_type, ovl = facts.types
        flagged = has_nonfinite_arg(args, kwargs)
        kind = 0
        if facts.writes and (facts.writes_list or needs_prewrite_copy(op_type, ovl, flagged, args)):
            kind |= 1
        if not flagged and (op_type in FINITE_PRESERVING and ovl != "dtype" or scales_down(op_type, ovl, args)):
            kind |= 2
        if not flagged and op_type in ALWAYS_FINITE:
            kind |= 4
        if not flagged and op_type in RULES:
            kind |= 8
        return kind

    def _native_watch_bound(self, qualname: str, overload: str, values, outputs):
        """The facts ``(B, L)`` :func:`~opdump.debug.overflow_bounds.output_bound` gives an
        operator's ``outputs`` from its arguments' facts as the observer knows them (its
        readings), when they prove the outputs finite (then they are not read, and an in-place
        operator, asked before it runs, needs no pre-write copy); else None.  The same rules
        the Python watch applies (``CpuPath._prove_before``/``_out_bound``)."""
        if not self._overflow.BOUNDS:       # the rules switched off (as the Python watch honours it)
            return None
        bounds = _BOUNDS or _bounds()
        func = _func(qualname, overload)
        args, kwargs = split_args(func, values)
        if has_nonfinite_arg(args, kwargs):
            return None
        op_type, ovl = facts_of(func).types
        got = bounds[0](op_type, ovl, args, kwargs, self._native_obs.watch_facts)
        return got if bounds[1](got, outputs) else None

    def _native_watch_add(self, index, name, qualname, overload, values, saved, outputs, cloned) -> None:
        """An operator the observer could not clear (a non-finite or unread output): the Python
        watch judges it, as it judges the Python capture's operators."""
        func = _func(qualname, overload)
        args, kwargs = split_args(func, values)
        listed = self.listing.ops.get(name)
        if listed is not None:
            op = OpInfo(index, listed.op_type, listed.scope, listed.overload, listed.module_ids, listed.source)
        else:       # not listed (cannot happen: described before): named as the observer named it
            op_type, ovl = facts_of(func).types
            op = OpInfo(index, op_type, "", ovl)
            op.__dict__["full_name"] = name
        flagged = has_nonfinite_arg(args, kwargs)
        op.nonfinite_args = flagged
        self._overflow.add(op, list(saved), list(outputs), flagged, list(cloned), args=args, kwargs=kwargs)

    def _native_watch_counted(self) -> None:
        got = self._native_obs.watch_counts()
        self.native_watch_counts = tuple(a + b for a, b in zip(self.native_watch_counts, got))
