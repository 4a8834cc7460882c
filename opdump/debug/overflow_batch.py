"""The overflow watch's flags for operators with a tensor off the CPU (``op_debug_mode`` 3;
README "Debug dumps"); split from :mod:`.overflow`, whose :class:`~.overflow.OverflowWatch`
it is a part of (:mod:`.overflow_now` is the CPU operators' part).

Why: on a device a reduction's result is known only after a sync, so these operators are
held (references) with one 0-d flag per floating tensor, computed on the tensor's own
device without a sync -- ``torch.aminmax`` for fp16/bf16 (exact), ``t.sum()`` for
fp32/fp64 (finite whenever ``t`` is; a non-finite sum is settled exactly from the held
tensor at the read) -- and read per device with one ``.cpu()`` when the batch is judged.

Guarantees: one reduction per tensor per batch (a tensor flagged earlier in the batch,
same object and version, reuses its flag; one read earlier in the iteration, its value);
outputs of finite-preserving operators get no reduction (finite when their inputs are,
settled exactly otherwise).
"""
from __future__ import annotations

import math
import weakref
from typing import Dict, List

import torch

from .overflow_values import version_of

_FLOATS = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_HALF = frozenset((torch.float16, torch.bfloat16))
_INFS = (math.inf, -math.inf)


class DevicePath:
    """The held operators' flag methods of :class:`~.overflow.OverflowWatch` (which sets the
    attributes they use: ``_flags``, ``_owner``, ``_held``, ``_exact``, ``_orig``,
    ``_preset``, ``_known``, ``_derive``, ``_memo`` and ``_unjudged``)."""

    def _flag_in(self, t) -> int:
        """The flag slot of an input: the one it got earlier in the batch, or a slot holding
        the value read in an earlier batch of this iteration, when it is the same tensor at
        the same version not written since; else a new flag (-1: not judged)."""
        if type(t) is not torch.Tensor and not isinstance(t, torch.Tensor):
            return -1
        key = id(t)
        hit = self._memo.get(key)
        version = version_of(t)
        if hit is not None and hit[0] == version:
            return hit[1]
        known = self._known.get(key)
        if known is not None and 0 <= version - known[1] <= known[3] and known[0]() is t:
            if known[2] is None:         # uninitialized memory nobody wrote yet: not judged
                return -1
            j = len(self._held)
            self._held.append(None)
            self._exact.append(True)
            self._orig.append(None)
            self._preset[j] = known[2]
            self._memo[key] = (version, j)
            return j
        return self._flag_out(t)

    def _flag_out(self, t) -> int:
        if not isinstance(t, torch.Tensor):
            return -1
        dtype = t.dtype
        if dtype not in _FLOATS or t.is_meta or not t.numel():
            return -1
        d = t.detach() if t.requires_grad else t     # (no autograd graph for the flag)
        j = len(self._held)
        self._held.append(d)
        self._orig.append(t)
        if dtype in _HALF:           # exact: Inf/NaN are the min/max themselves
            self._flags.extend(torch.aminmax(d))
            self._owner += (j, j)
            self._exact.append(True)
        else:                        # half aminmax's cost; non-finite sums are checked at the read
            self._flags.append(d.sum())
            self._owner.append(j)
            self._exact.append(False)
        self._memo[id(t)] = (version_of(t), j)
        return j

    def _derived(self, inputs, in_flags, outputs) -> List[int]:
        """Output slots of an operator that cannot turn finite inputs into Inf/NaN: no
        reduction of their own; finite when every floating input is, else settled exactly
        from the held output at the read.  An input not judged (uninitialized memory) makes
        the outputs not judged either; with no floating input they are flagged as usual."""
        deps = []
        for t, k in zip(inputs, in_flags):
            if k >= 0:
                deps.append(k)
            elif isinstance(t, torch.Tensor) and t.dtype in _FLOATS and t.numel():
                return [self._unjudged(o) for o in outputs]
        if not deps:
            return [self._flag_out(o) for o in outputs]
        slots = []
        for t in outputs:
            if not isinstance(t, torch.Tensor) or t.dtype not in _FLOATS or t.is_meta or not t.numel():
                slots.append(-1)
                continue
            j = len(self._held)
            self._held.append(t.detach() if t.requires_grad else t)
            self._orig.append(t)
            self._exact.append(False)
            self._derive[j] = deps
            self._memo[id(t)] = (version_of(t), j)
            slots.append(j)
        return slots

    def _read_flags(self) -> List[float]:
        """Per held tensor: 0.0 (finite), ``inf`` (Inf, no NaN) or ``nan`` (some NaN).  One
        host read per device/dtype; a non-finite sum (which may be a finite tensor whose sum
        overflowed, or +Inf with -Inf) is settled exactly by a second, batched read."""
        flags, owner, held = self._flags, self._owner, self._held
        out = [0.0] * len(held)
        for j, v in self._preset.items():
            out[j] = v
        groups: Dict[tuple, List[int]] = {}
        for i, f in enumerate(flags):
            groups.setdefault((f.device, f.dtype), []).append(i)
        for idx in groups.values():
            host = torch.stack([flags[i] for i in idx]).tolist()     # one sync per device/dtype
            if math.isfinite(sum(host)):        # the usual case: all finite, nothing to note
                continue
            for i, v in zip(idx, host):
                if v != v:
                    out[owner[i]] = math.nan
                elif v in _INFS and out[owner[i]] == 0.0:
                    out[owner[i]] = math.inf
        exact, derive = self._exact, self._derive
        if not any(out):                        # all finite: derived slots are too (0.0)
            derive = {}
        self._settle(out, [j for j, v in enumerate(out) if v != 0.0 and not exact[j] and j not in derive])
        for j, deps in derive.items():          # in slot order: their inputs are settled first
            vals = [out[k] for k in deps]
            out[j] = math.nan if any(v != v for v in vals) else (math.inf if any(vals) else 0.0)
        self._settle(out, [j for j in derive if out[j] != 0.0])
        known = self._known
        for j, t in enumerate(self._orig):      # later batches of the iteration reuse these
            if t is not None:
                try:
                    known[id(t)] = (weakref.ref(t), version_of(t), out[j], 0, None)
                except TypeError:                # no weak reference to this tensor type
                    pass
        return out

    def _settle(self, out: List[float], slots: List[int]) -> None:
        """Exact values for ``slots`` from their held tensors (one host read per device)."""
        held = self._held
        by_device: Dict[torch.device, List[int]] = {}
        for j in slots:
            by_device.setdefault(held[j].device, []).append(j)
        for js in by_device.values():
            facts = torch.stack([torch.stack((held[j].isnan().any(), held[j].isinf().any())) for j in js]).tolist()
            for j, (nan, inf) in zip(js, facts):
                out[j] = math.nan if nan else (math.inf if inf else 0.0)
