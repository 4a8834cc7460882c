"""The overflow watch's path for operators whose tensors are all on the CPU
(``op_debug_mode`` 3; README "Debug dumps"); split from :mod:`.overflow`, whose
:class:`~.overflow.OverflowWatch` it is a part of.

Why: a CPU reduction has run when it returns -- there is no device queue to keep
asynchronous -- so a CPU operator's outputs are read at once
(:func:`.overflow_values.value_now`) and the operator is judged at once.  That removes
what the batched (device) path needs: no references held (an operator with finite
outputs is forgotten as it returns), no flag tensors, no batch closed before an in-place
write, no input read unless a verdict needs it (:func:`.origin.judge` gives one that
matters only when an output is non-finite).

Bounds (:mod:`.overflow_bounds`): each reading also gives the tensor's facts (largest
magnitude, sign); an operator whose outputs the rules bound well inside their dtype's
range from its arguments' facts is not read (its outputs remember the bound), and an
in-place one is proved before it runs (:meth:`CpuPath._prove_before`), so it gets no
pre-write copy either; arguments not read yet are read for that when they are the smaller
side.

Guarantees (the batched path's): the same verdicts, in execution order (held device
operators are judged before a CPU operator's verdict); a written input is judged by its
value before the write (its pre-write copy, or the value known before the write); each
value is read once per iteration (same tensor, same version, not written since: a
reading stays valid across the one version bump autograd makes once an in-place
operator has returned under the eager capture's dispatch mode).
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from .overflow_bounds import VALUE_ARGS, RULES, float_tensors, output_bound, proven_finite
from .overflow_rules import ALWAYS_FINITE, FINITE_PRESERVING, UNINITIALIZED, scales_down
from .overflow_values import read_now, version_of

_FLOATS = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_NONE: frozenset = frozenset()
_UNINIT = -1.0       # _value_of: a floating tensor holding uninitialized memory (never judged)
_UNKNOWN = -2.0      # _value_of(read=False): a floating tensor not read this iteration
_BOUND_RULES = frozenset(RULES)


class CpuPath:
    """The CPU operators' methods of :class:`~.overflow.OverflowWatch` (which sets the
    attributes they use: ``_known``, ``_prewrite``, ``_calls``, ``_copies``, ``_unjudged``,
    ``_judge_held``, ``_judge`` and ``_call``, its operator record type)."""

    def _add_now(self, op, inputs, outputs, flagged: bool, cloned, where, writing, args, kwargs=None) -> None:
        """An operator whose tensors are all on the CPU: its outputs are read now
        (:func:`.overflow_values.value_now`: a CPU reduction has run when it returns, so no
        sync is added).  Finite outputs: nothing is held, no input is read (a verdict needs
        a non-finite output; :func:`.origin.judge` gives none that matters otherwise).  A
        non-finite output: the held operators are judged first (execution order), then its
        inputs are read (intact: a written one is its pre-write copy) and it is judged."""
        kind = op.op_type
        if kind in UNINITIALIZED:
            for t in outputs:
                self._unjudged(t)
            return
        # eager: autograd bumps a written tensor's version once the mode returns (graph: already)
        bump = 1 if where is None and writing else 0
        in_vals = None
        proven, self._proven = self._proven, None
        if proven is not None and proven[0] is op:      # copy_written proved its outputs finite
            self._remember_finite(outputs, writing, bump, proven[1])
            return
        # the bound rules need the call's keyword arguments (None: not given, no rule)
        bounds = kwargs is not None and not flagged and self.BOUNDS
        if kind in ALWAYS_FINITE and not flagged:
            self._remember_finite(outputs, writing, bump, self._out_bound(op, args, kwargs, writing)
                                  if bounds else None)
            self._recycle(cloned)
            return
        if not flagged and (kind in FINITE_PRESERVING and op.overload != "dtype"
                            or scales_down(kind, op.overload, args)):
            plain = bounds and not writing and kind not in VALUE_ARGS and kind in FINITE_PRESERVING
            if plain:           # values and facts in one look-up each (views, t, detach, relu…)
                known = [self._value_facts(t) for t in inputs]
                in_vals = [v for v, _ in known]
            else:
                in_vals = ([self._value_of(t, False) for t in inputs] if not writing
                           else self._values_before(inputs, writing))
            judged = [v for v in in_vals if v is not None]
            if _UNINIT in judged:       # an input nobody wrote yet: nor are the outputs judged
                for t in outputs:
                    self._unjudged(t)
                return
            if judged and not any(v and v != _UNKNOWN for v in judged):
                if _UNKNOWN not in judged:      # finite inputs: finite outputs, no reduction
                    if plain:   # .overflow_bounds._preserving: the largest input bound (and 1)
                        b = 1.0
                        for v, f in known:
                            if v is not None:
                                if f is None:
                                    b = None
                                    break
                                b = max(b, f[0])
                        facts = None if b is None else (b, -b)
                    else:
                        facts = self._out_bound(op, args, kwargs, writing) if bounds else None
                    self._remember_finite(outputs, writing, bump, facts)
                # else an input not read yet: nor are the outputs (read if a verdict needs them;
                # the input was never judged, so it is no on-purpose Inf the outputs could carry)
                self._recycle(cloned)
                return
        if (bounds and kind in RULES    # outputs bounded from the inputs' magnitudes: finite, no reading
                and sum(t.numel() for t in outputs if isinstance(t, torch.Tensor)) >= self.BOUND_MIN):
            b = self._out_bound(op, args, kwargs, writing, outputs)
            if b is not None and proven_finite(b, outputs):
                self._remember_finite(outputs, writing, bump, b)
                self._recycle(cloned)
                return
        out_vals = [self._value_new(t, bump if id(t) in writing else 0) for t in outputs]
        if not any(out_vals):                   # None/0.0: nothing non-finite, no verdict
            self._recycle(cloned)
            return
        copies = self._copies.batch()           # the held operators' copies and this one's
        kept = self._judge_held()
        if kept is None:
            return
        if in_vals is None:
            in_vals = [self._value_of(t) for t in inputs]
        elif _UNKNOWN in in_vals:
            in_vals = [self._value_of(t) if v == _UNKNOWN else v for t, v in zip(inputs, in_vals)]
        call = self._call(op, inputs, outputs, None, None, flagged, frozenset(map(id, cloned)) if cloned else _NONE,
                     where)
        self._judge(call, [(t, v) for t, v in zip(inputs, in_vals) if v and v != _UNINIT],
                    [(s, t, v) for s, (t, v) in enumerate(zip(outputs, out_vals)) if v], kept)
        self._copies.recycle(copies, kept)

    def _values_before(self, inputs, writing) -> list:
        """Input values of an in-place operator run without a pre-write copy: a written
        input's value before the write when it was known (its output is bounded by it)."""
        prewrite, self._prewrite = self._prewrite, {}
        vals = []
        for t in inputs:
            if id(t) in writing and id(t) in prewrite:
                v = prewrite[id(t)]
                vals.append(_UNINIT if v is None else v)
            else:
                vals.append(self._value_of(t, False))
        return vals

    def _recycle(self, cloned) -> None:
        """This operator's copies are free again, unless held operators' copies are pooled too."""
        if cloned and not self._calls:
            self._copies.recycle(self._copies.batch(), _NONE)

    def _remember_finite(self, outputs, writing, bump: int, bound: Optional[float] = None) -> None:
        """Outputs known finite without a reading (the written ones take autograd's bump);
        ``bound``: a bound of their magnitudes, when known."""
        for t in outputs:
            if isinstance(t, torch.Tensor) and t.dtype in _FLOATS:
                self._remember(t, 0.0, bump if id(t) in writing else 0, bound)

    def _remember(self, t: torch.Tensor, value: Optional[float], bumps: int, bound: Optional[float] = None) -> None:
        try:
            self._known[id(t)] = (weakref.ref(t), version_of(t), value, bumps, bound)
        except TypeError:       # no weak reference to this tensor type: read again when needed
            return
        if bound is not None and t.numel() >= self.BOUND_MIN:   # found again by its memory (saved tensors)
            try:
                self._places[(t.data_ptr(), t.dtype, t.shape, t.stride())] = id(t)
                base = t._base
                # a view of all of its base's elements (a weight's .t()): the base has its facts,
                # at the version they share (a parameter's views are temporary, the parameter is not)
                if (base is not None and id(base) not in self._known and base.numel() == t.numel()
                        and base.dtype is t.dtype and value == 0.0 and t.storage_offset() == base.storage_offset()
                        and base.is_contiguous() and (t.is_contiguous() or t.dim() == 2 and t.t().is_contiguous())):
                    self._remember(base, value, bumps, bound)
            except Exception:   # noqa: BLE001 - a tensor without plain storage: by id only
                pass

    # ------------------------------------------------------------------ magnitude bounds
    def _bound(self, t):
        """The known facts ``(B, L)`` of a finite tensor this iteration (:mod:`.overflow_bounds`;
        None: unknown)."""
        entry = self._known.get(id(t))
        if (entry is not None and entry[2] == 0.0 and entry[0]() is t
                and 0 <= version_of(t) - entry[1] <= entry[3]):
            return entry[4]
        return self._bound_by_place(t)

    def _bound_by_place(self, t):
        """The facts of a live tensor with the same memory, dtype, shape and strides as ``t``
        whose version counter ``t`` shares at the same version: a saved tensor autograd hands
        to a backward operator is a new object over the forward tensor's memory.  The live
        owner keeps the memory from being reused; the shared counter moves with any write."""
        try:
            key = (t.data_ptr(), t.dtype, t.shape, t.stride())
        except Exception:   # noqa: BLE001 - a tensor without plain storage
            return None
        i = self._places.get(key)
        entry = self._known.get(i) if i is not None else None
        if entry is None or entry[2] != 0.0 or entry[4] is None:
            return None
        o = entry[0]()
        if (o is None or not 0 <= version_of(o) - entry[1] <= entry[3] or version_of(o) != version_of(t)
                or o.data_ptr() != key[0] or o.dtype is not t.dtype or o.shape != t.shape or o.stride() != key[3]):
            return None
        return entry[4]

    def _out_bound(self, op, args, kwargs, writing, outputs=None):
        """:func:`.overflow_bounds.output_bound` of an operator that ran (a written argument
        counts with its facts before the write).  ``outputs`` given: arguments not read yet
        (and not written) are read now when they hold fewer elements than the outputs (the
        reading they spare), so that the rule applies."""
        bound = self._bounds_before(writing)
        got = output_bound(op.op_type, op.overload, args, kwargs, bound)
        if got is None and outputs is not None:
            missing = [t for t in float_tensors(args, kwargs) if bound(t) is None]
            if (not missing or any(id(t) in writing or not t.is_cpu or not t.numel() for t in missing)
                    or sum(t.numel() for t in missing) >= sum(t.numel() for t in outputs
                                                              if isinstance(t, torch.Tensor))):
                return None
            for t in missing:
                if not self._read_facts(t):
                    return None
            got = output_bound(op.op_type, op.overload, args, kwargs, bound)
        return got

    def _bounds_before(self, writing):
        """The facts of an operator's arguments as they were before it ran: a written one's
        from before the write (``_prewrite_bound``), the others' as known now."""
        if not writing:
            return self._bound
        pre, known = self._prewrite_bound, self._bound
        return lambda t: pre.get(id(t)) if id(t) in writing else known(t)

    def _read_facts(self, t) -> bool:
        """Read an argument (not written by the operator) for its facts: is it finite?  One
        known not finite or uninitialized is not read again (its verdict stays as it was)."""
        v = self._value_of(t, False)
        if v == _UNKNOWN or v == 0.0:
            return self._value_new(t, 0) == 0.0
        return False

    def _prove_before(self, op, args, kwargs, written) -> bool:
        """Before an in-place operator runs: are its outputs finite by their bounds
        (:mod:`.overflow_bounds`)?  Then it cannot be an overflow origin and needs no
        pre-write copy, nor its outputs a reading.  Arguments not read yet this iteration
        are read now (one pass each) when that costs less than the copy and the reading
        it saves (their elements at most twice the written ones)."""
        if kwargs is None or op.nonfinite_args or sum(t.numel() for t in written) < self.BOUND_MIN:
            return False
        writing = frozenset(map(id, written))
        bound = self._bounds_before(writing)
        pre = self._prewrite_bound
        missing = [t for t in float_tensors(args, kwargs) if bound(t) is None]
        if missing:
            if op.op_type not in _BOUND_RULES:
                return False
            if sum(t.numel() for t in missing) > 2 * sum(t.numel() for t in written):
                return False
            prewrite = self._prewrite
            for t in missing:
                if not t.is_cpu:
                    return False
                if id(t) in writing:
                    if prewrite.get(id(t), 0.0) != 0.0 or not t.numel():   # known not finite, or empty
                        return False
                    value, b = read_now(t)
                    prewrite[id(t)] = value
                    pre[id(t)] = b
                elif not self._read_facts(t):
                    return False
        b = output_bound(op.op_type, op.overload, args, kwargs, bound)
        if b is None or not proven_finite(b, written) or not all(t.is_cpu for t in written):
            return False
        self._proven = (op, b)
        return True

    def _value_new(self, t, bumps: int) -> Optional[float]:
        """An output's value, read now (None: not a floating tensor with elements)."""
        if not isinstance(t, torch.Tensor) or t.dtype not in _FLOATS or not t.numel():
            return None
        value, bound = read_now(t)
        self._remember(t, value, bumps, bound)
        return value

    def _value_facts(self, t) -> tuple:
        """``(value, facts)`` of an input known this iteration, without reading it: the value
        as :meth:`_value_of` with ``read`` False gives it, the facts when known (else None)."""
        if not isinstance(t, torch.Tensor) or t.dtype not in _FLOATS or not t.numel():
            return None, None
        entry = self._known.get(id(t))
        if entry is not None and entry[0]() is t and 0 <= version_of(t) - entry[1] <= entry[3]:
            if entry[2] is None:
                return _UNINIT, None
            return entry[2], (entry[4] if entry[2] == 0.0 else None)
        return _UNKNOWN, None

    def _value_of(self, t, read: bool = True) -> Optional[float]:
        """An input's value: the one known this iteration (same tensor, same version, not
        written since), else read now (``read`` False: :data:`_UNKNOWN`); :data:`_UNINIT`
        for uninitialized memory."""
        if not isinstance(t, torch.Tensor) or t.dtype not in _FLOATS or not t.numel():
            return None
        entry = self._known.get(id(t))
        if entry is not None and entry[0]() is t and 0 <= version_of(t) - entry[1] <= entry[3]:
            return _UNINIT if entry[2] is None else entry[2]
        if not read:
            return _UNKNOWN
        value, bound = read_now(t)
        self._remember(t, value, 0, bound)
        return value

