"""The overflow-only dump (``op_debug_mode`` 3, eager mode; README, "Debug dumps").

Why: a user hunting the first NaN of a long run wants only the operator that made it,
from the real run, in one pass.  Each captured operator is handed to
:class:`OverflowWatch` instead of being recorded: it keeps references to the operator's
tensors (a clone only of the arguments the operator writes in place, taken before it
runs) and one flag per floating tensor (fp16/bf16/fp32/fp64), computed on the tensor's
own device without a sync: ``torch.aminmax(t)`` (one reduction pass, no temporary the size
of ``t``), whose two values are finite, Inf (Inf only) or NaN (some NaN).

Every :data:`BATCH` operators, before an in-place write to a tensor the batch still
holds, and at the iteration's end, the flags are stacked per device and read with one
``.cpu()``.  Each operator is then judged in execution order by :func:`.origin.judge`
(the rule ``opdump overflow`` uses): only :data:`~.origin.OPERATOR` verdicts (finite
inputs, finite non-tensor arguments, non-finite output) are overflows.  Overflowing
operators are recorded (inputs and outputs) up to ``overflow_number`` per session
(0: all); every dumped iteration gets an ``overflow.json`` listing its overflows.

Guarantees: nothing here raises into the training thread (a failure is reported as a
warning and the watch stops for the iteration); the training values are never changed
(flags are computed on detached tensors, clones are private).
"""
from __future__ import annotations

import json
import math
import warnings
import weakref
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..format.layout import OVERFLOW_JSON
from .origin import OPERATOR, ON_PURPOSE, judge

#: operators held before the flags are read (bounds the memory the references keep alive)
BATCH = 256
_FLOATS = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))


def _flag(t) -> Optional[tuple]:
    """(min, max) of ``t`` as 0-d tensors on its device (NaN if any NaN); None when not judged."""
    if isinstance(t, torch.Tensor) and t.dtype in _FLOATS and not t.is_meta and t.numel():
        return torch.aminmax(t.detach())
    return None


def _combine(lo: float, hi: float) -> float:
    """One value from a tensor's (min, max): NaN if it holds NaN, Inf if Inf, else 0."""
    if lo != lo or hi != hi:
        return math.nan
    return math.inf if math.isinf(lo) or math.isinf(hi) else 0.0


def _storage(t: torch.Tensor) -> Optional[int]:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:   # noqa: BLE001 - tensor subclasses without storage: no staleness check
        return None


class _Call:
    __slots__ = ("op", "inputs", "outputs", "in_flags", "out_flags", "flagged")

    def __init__(self, op, inputs, outputs, in_flags, out_flags, flagged):
        self.op, self.inputs, self.outputs = op, inputs, outputs
        self.in_flags, self.out_flags, self.flagged = in_flags, out_flags, flagged


class OverflowWatch:
    """Watches one eager capture's operators.  ``record(op, inputs, outputs)`` dumps an
    overflowing operator; ``folder()`` is the current iteration folder; ``layout`` writes
    ``overflow.json``."""

    def __init__(self, limit: int, record: Callable, folder: Callable[[], str], layout: Callable):
        self.limit = int(limit)
        self.dumped = 0                        # overflowing operators recorded this session
        self._record = record
        self._folder = folder
        self._layout = layout
        self._calls: List[_Call] = []
        self._flags: List[torch.Tensor] = []
        self._storages: set = set()
        self._events: List[dict] = []
        self._on_purpose: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
        self._broken = False

    # ------------------------------------------------------------------ per operator
    def _flags_of(self, tensors: Sequence) -> List[int]:
        out = []
        for t in tensors:
            f = _flag(t)
            if f is None:
                out.append(-1)
            else:
                out.append(len(self._flags))
                self._flags.extend(f)
        return out

    def before_write(self, written: Sequence[torch.Tensor]) -> None:
        """An operator is about to write ``written``: judge the batch first if it holds one of
        them (its recorded values must be the ones before the write)."""
        if self._calls and any(_storage(t) in self._storages for t in written if isinstance(t, torch.Tensor)):
            self.flush()

    def add(self, op, inputs: Sequence, outputs: Sequence, flagged: bool, cloned: Sequence = ()) -> None:
        """One operator that ran: ``inputs`` as they were before it ran, ``outputs`` after."""
        if self._broken:
            return
        try:
            call = _Call(op, list(inputs), list(outputs), self._flags_of(inputs), self._flags_of(outputs), flagged)
            self._calls.append(call)
            keep = {id(c) for c in cloned}
            for t in call.inputs + call.outputs:
                if isinstance(t, torch.Tensor) and id(t) not in keep:
                    self._storages.add(_storage(t))
            if len(self._calls) >= BATCH:
                self.flush()
        except Exception as exc:   # noqa: BLE001 - never into the training thread
            self._fail(exc)

    # ------------------------------------------------------------------ batches
    def _read_flags(self) -> List[float]:
        flags = self._flags
        values = [0.0] * len(flags)
        groups: Dict[tuple, List[int]] = {}
        for i, f in enumerate(flags):
            groups.setdefault((f.device, f.dtype), []).append(i)
        for idx in groups.values():
            host = torch.stack([flags[i] for i in idx]).double().cpu().tolist()   # one sync per device/dtype
            for i, v in zip(idx, host):
                values[i] = v
        return [_combine(values[k], values[k + 1]) if k + 1 < len(values) else 0.0 for k in range(len(values))]

    def flush(self) -> None:
        """Judge the held operators in execution order; dump the overflowing ones."""
        calls, self._calls = self._calls, []
        if not calls:
            return
        try:
            values = self._read_flags()
        except Exception as exc:   # noqa: BLE001
            self._flags, self._storages = [], set()
            self._fail(exc)
            return
        self._flags, self._storages = [], set()
        on_purpose = self._on_purpose
        try:
            for call in calls:
                bad_in = [(t, values[k]) for t, k in zip(call.inputs, call.in_flags) if k >= 0 and not math.isfinite(values[k])]
                bad_out = [(s, t, values[k]) for s, (t, k) in enumerate(zip(call.outputs, call.out_flags))
                           if k >= 0 and not math.isfinite(values[k])]
                unexplained = any(math.isnan(v) or on_purpose.get(id(t)) is not t for t, v in bad_in)
                verdict = judge(bool(bad_in), unexplained, bool(bad_out), any(math.isnan(v) for _, _, v in bad_out),
                                call.flagged)
                if verdict == ON_PURPOSE:
                    for _, t, _ in bad_out:
                        on_purpose[id(t)] = t
                elif verdict == OPERATOR:
                    self._overflow(call, bad_out)
        except Exception as exc:   # noqa: BLE001
            self._fail(exc)

    def _overflow(self, call: _Call, bad_out) -> None:
        op = call.op
        dump = self.limit == 0 or self.dumped < self.limit
        if dump:
            self.dumped += 1
            self._record(op, call.inputs, call.outputs)
        outputs = []
        for slot, t, _ in bad_out:
            d = t.detach()
            outputs.append({"slot": slot, "dtype": str(d.dtype).replace("torch.", ""), "shape": list(d.shape),
                            "nan": int(torch.isnan(d).sum()), "pos_inf": int((d == math.inf).sum()),
                            "neg_inf": int((d == -math.inf).sum())})
        src = op.source[-1] if op.source else None       # the innermost visible frame
        self._events.append({"op": op.full_name, "op_type": op.op_type, "order": op.index,
                             "source": f"{src.file}:{src.line}" if src is not None else "",
                             "code": src.code if src is not None else "",
                             "outputs": outputs, "dumped": dump})

    def finish(self, iteration: int) -> None:
        """The iteration ended: judge what is held, write its ``overflow.json``, reset."""
        self.flush()
        events, self._events = self._events, []
        self._on_purpose = weakref.WeakValueDictionary()
        broken, self._broken = self._broken, False
        try:
            body = {"iteration": iteration, "overflow_number": self.limit, "complete": not broken,
                    "overflows": events}
            layout = self._layout()
            path = layout.place(self._folder(), OVERFLOW_JSON)
            layout.write_small(path, (json.dumps(body, indent=1) + "\n").encode())
        except Exception as exc:   # noqa: BLE001
            self._fail(exc)
            self._broken = False

    def _fail(self, exc: BaseException) -> None:
        self._broken = True
        self._calls, self._flags, self._storages = [], [], set()
        warnings.warn(f"opdump: overflow watch stopped for this iteration: {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=2)
