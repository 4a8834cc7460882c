"""The overflow-only dump (``op_debug_mode`` 3; README, "Debug dumps").

Why: a user hunting the first NaN of a long run wants only the operator that made it,
from the real run, in one pass.  Each operator the eager capture sees, and each operator
of a dumped graph call (run op by op, :mod:`.overflow_graph`), is handed to
:class:`OverflowWatch` instead of being recorded: it keeps references to the operator's
tensors (a clone only of the arguments the operator writes in place, taken before it
runs) and one flag per floating tensor (fp16/bf16/fp32/fp64), computed on the tensor's
own device without a sync: ``torch.aminmax(t)`` (one reduction pass, no temporary the size
of ``t``), whose two values are finite, Inf (Inf only) or NaN (some NaN).  A tensor flagged
earlier in the batch (an output that is the next operator's input, same version) reuses
its flag: each tensor is reduced once, not once per use.

Every :data:`BATCH` operators, before an in-place write to a tensor the batch still
holds, at the end of each graph call and at the iteration's end, the flags are stacked
per device and read with one ``.cpu()``.  Each operator is then judged in execution order
by :func:`.origin.judge` (the rule ``opdump overflow`` uses): only
:data:`~.origin.OPERATOR` verdicts (finite inputs, finite non-tensor arguments,
non-finite output) are overflows.  Overflowing operators are recorded (inputs and
outputs; ``saved_data`` decides files and/or statistic.csv rows) up to
``overflow_number`` per session (0: all); every folder a dumped iteration wrote into
gets an ``overflow.json`` and ``overflow.csv`` listing its overflows
(:mod:`.overflow_summary`).

Guarantees: nothing here raises into the training thread (a failure is reported as a
warning and the watch stops for the iteration); the training values are never changed
(flags are computed on detached tensors, clones are private).
"""
from __future__ import annotations

import math
import warnings
import weakref
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..format.layout import OVERFLOW_CSV, OVERFLOW_JSON
from .origin import OPERATOR, ON_PURPOSE, judge
from .overflow_summary import render_csv, render_json

#: operators held before the flags are read (bounds the memory the references keep alive)
BATCH = 256
_FLOATS = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_NONE: frozenset = frozenset()


def _storage(t: torch.Tensor) -> Optional[int]:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:   # noqa: BLE001 - tensor subclasses without storage: no staleness check
        return None


def _combine(lo: float, hi: float) -> float:
    """One value from a tensor's (min, max): NaN if it holds NaN, Inf if Inf, else 0."""
    if lo != lo or hi != hi:
        return math.nan
    return math.inf if math.isinf(lo) or math.isinf(hi) else 0.0


class _Call:
    __slots__ = ("op", "inputs", "outputs", "in_flags", "out_flags", "flagged", "private", "where")

    def __init__(self, op, inputs, outputs, in_flags, out_flags, flagged, private, where):
        self.op, self.inputs, self.outputs = op, inputs, outputs
        self.in_flags, self.out_flags, self.flagged = in_flags, out_flags, flagged
        self.private, self.where = private, where


class OverflowWatch:
    """Watches operators in execution order.  ``record(op, inputs, outputs)`` (or, for an
    operator added with ``where``, ``record(op, inputs, outputs, where)``) dumps an
    overflowing operator; ``folder()`` is the folder of the eager iteration (None: only the
    folders given by :meth:`touch` get a summary); ``layout()`` writes the summaries."""

    def __init__(self, limit: int, record: Callable, folder: Optional[Callable[[], str]], layout: Callable):
        self.limit = int(limit)
        self.dumped = 0                        # overflowing operators recorded this session
        self._record = record
        self._folder = folder
        self._layout = layout
        self._calls: List[_Call] = []
        self._flags: List[torch.Tensor] = []
        self._memo: Dict[int, tuple] = {}      # id(tensor) -> (version, flag index), this batch
        self._storages: set = set()            # storages the batch holds (built when a write asks)
        self._indexed = 0                      # calls whose tensors are in _storages
        self._events: List[tuple] = []         # (where, event)
        self._touched: Dict[str, None] = {}    # folders written this iteration (graph calls), in order
        self._on_purpose: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
        self._broken = False

    # ------------------------------------------------------------------ per operator
    def _flag_in(self, t) -> int:
        """The flag index of an input: the one it got earlier in the batch when it is the
        same tensor at the same version, else a new one (-1: not judged)."""
        if type(t) is not torch.Tensor and not isinstance(t, torch.Tensor):
            return -1
        hit = self._memo.get(id(t))
        if hit is not None and hit[0] == t._version:
            return hit[1]
        return self._flag_out(t)

    def _flag_out(self, t) -> int:
        if not isinstance(t, torch.Tensor) or t.dtype not in _FLOATS or t.is_meta or not t.numel():
            return -1
        k = len(self._flags)
        self._flags.extend(torch.aminmax(t.detach()))
        self._memo[id(t)] = (t._version, k)
        return k

    def touch(self, where: str) -> None:
        """A dumped graph call writes into ``where`` this iteration: it gets a summary."""
        self._touched[where] = None

    def before_write(self, written: Sequence[torch.Tensor]) -> None:
        """An operator is about to write ``written``: judge the batch first if it holds one of
        them (its recorded values must be the ones before the write)."""
        calls = self._calls
        if not calls:
            return
        try:
            storages = self._storages
            for call in calls[self._indexed:]:
                private = call.private
                for t in call.inputs + call.outputs:
                    if isinstance(t, torch.Tensor) and id(t) not in private:
                        storages.add(_storage(t))
            self._indexed = len(calls)
            if any(_storage(t) in storages for t in written if isinstance(t, torch.Tensor)):
                self.flush()
        except Exception as exc:   # noqa: BLE001 - never into the training thread
            self._fail(exc)

    def add(self, op, inputs: Sequence, outputs: Sequence, flagged: bool, cloned: Sequence = (),
            where: Optional[str] = None) -> None:
        """One operator that ran: ``inputs`` as they were before it ran, ``outputs`` after;
        ``cloned``: the private copies among ``inputs``; ``where``: its iteration folder
        (graph calls; None: the eager ``folder()``)."""
        if self._broken:
            return
        try:
            flag_in, flag_out = self._flag_in, self._flag_out
            inputs, outputs = list(inputs), list(outputs)
            call = _Call(op, inputs, outputs, [flag_in(t) for t in inputs], [flag_out(t) for t in outputs],
                         flagged, frozenset(map(id, cloned)) if cloned else _NONE, where)
            self._calls.append(call)
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

    def _reset_batch(self) -> None:
        self._calls, self._flags, self._memo, self._storages, self._indexed = [], [], {}, set(), 0

    def flush(self) -> None:
        """Judge the held operators in execution order; dump the overflowing ones."""
        calls = self._calls
        if not calls:
            return
        try:
            values = self._read_flags()
        except Exception as exc:   # noqa: BLE001
            self._reset_batch()
            self._fail(exc)
            return
        self._reset_batch()
        on_purpose = self._on_purpose
        isfinite = math.isfinite
        try:
            for call in calls:
                bad_in = [(t, values[k]) for t, k in zip(call.inputs, call.in_flags) if k >= 0 and not isfinite(values[k])]
                bad_out = [(s, t, values[k]) for s, (t, k) in enumerate(zip(call.outputs, call.out_flags))
                           if k >= 0 and not isfinite(values[k])]
                if not bad_in and not bad_out:
                    continue
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
            if call.where is None:
                self._record(op, call.inputs, call.outputs)
            else:
                self._record(op, call.inputs, call.outputs, call.where)
        outputs = []
        for slot, t, _ in bad_out:
            d = t.detach()
            outputs.append({"slot": slot, "dtype": str(d.dtype).replace("torch.", ""), "shape": list(d.shape),
                            "nan": int(torch.isnan(d).sum()), "pos_inf": int((d == math.inf).sum()),
                            "neg_inf": int((d == -math.inf).sum())})
        src = op.source[-1] if op.source else None       # the innermost visible frame
        self._events.append((call.where, {"op": op.full_name, "op_type": op.op_type, "order": op.index,
                                          "source": f"{src.file}:{src.line}" if src is not None else "",
                                          "code": src.code if src is not None else "",
                                          "outputs": outputs, "dumped": dump}))

    def finish(self, iteration: int) -> None:
        """The iteration ended: judge what is held, write its summaries, reset."""
        self.flush()
        events, self._events = self._events, []
        touched, self._touched = list(self._touched), {}
        self._on_purpose = weakref.WeakValueDictionary()
        broken, self._broken = self._broken, False
        try:
            for where in {w: None for w, _ in events if w is not None}:
                if where not in touched:
                    touched.append(where)
            targets = [(w, [e for ew, e in events if ew == w]) for w in touched]
            if self._folder is not None and (not touched or any(w is None for w, _ in events)):
                targets.append((self._folder(), [e for ew, e in events if ew is None]))
            layout = self._layout() if targets else None
            for folder, evs in targets:
                layout.write_small(layout.place(folder, OVERFLOW_JSON), render_json(iteration, self.limit,
                                                                                    not broken, evs))
                layout.write_small(layout.place(folder, OVERFLOW_CSV), render_csv(evs))
        except Exception as exc:   # noqa: BLE001
            self._fail(exc)
            self._broken = False

    def _fail(self, exc: BaseException) -> None:
        self._broken = True
        self._reset_batch()
        warnings.warn(f"opdump: overflow watch stopped for this iteration: {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=2)
