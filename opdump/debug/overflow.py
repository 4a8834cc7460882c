"""The overflow-only dump (``op_debug_mode`` 3; README, "Debug dumps").

Why: a user hunting the first NaN of a long run wants only the operator that made it,
from the real run, in one pass.  Each operator the eager capture sees, and each operator
of a dumped graph call (run op by op, :mod:`.overflow_graph`), is handed to
:class:`OverflowWatch` instead of being recorded (a clone only of the arguments the
operator writes in place, taken before it runs, unless it cannot be an origin:
:mod:`.overflow_rules`).  Every floating tensor (fp16/bf16/fp32/fp64) gets a value:
finite, Inf only, or some NaN.

Operators whose tensors are all on the CPU (:mod:`.overflow_now`) are read and judged as
they return -- a CPU reduction has finished when it returns, so this adds no sync: the
outputs' values are read at once (:mod:`.overflow_values`: the native integer pass
``finite_bound``, which also gives the largest magnitude and the sign), an operator whose
outputs are finite is forgotten at once (no reference held), and inputs are read only when
an output is not finite.  An operator whose outputs' magnitudes are bounded by its
inputs' well inside its dtype's range (:mod:`.overflow_bounds`: matrix products, the
optimizer's arithmetic…) is neither read nor, when it writes in place, copied: it cannot
be an origin.

Operators with a tensor on another device are held (references, not copies) with one
flag per floating tensor, computed on the tensor's own device without a sync, one
reduction pass and no temporary the size of ``t``: for fp16/bf16 ``torch.aminmax(t)``
(exact), for fp32/fp64 ``t.sum()`` (about half aminmax's cost on CPU: 0.26 vs 0.49 ms for
1.5 M fp32 elements on one thread), finite whenever ``t`` is; a non-finite sum (a finite
tensor whose sum overflowed, or +Inf with -Inf) is settled exactly from the held tensor
when the flags are read.  Every :data:`BATCH` operators, before an in-place write to a
tensor the batch still holds, at the end of each graph call and at the iteration's end,
the flags are stacked per device and read with one ``.cpu()``.

Both paths: a tensor read earlier in the iteration (same object, same version, not
written since) reuses its value: each tensor is read once, not once per use.  Outputs of
operators that cannot make Inf/NaN from finite inputs (:data:`FINITE_PRESERVING`: views,
``cat``, ``relu``…; ``mul`` by a number of magnitude at most 1) get no reduction: finite
when their inputs are, settled exactly otherwise.  Outputs of ``empty``-like operators
(:data:`UNINITIALIZED`) are never judged.  Not tracked: writes the watch is not told about
(eager code outside the captured scope using ``_foreach_*_`` or ``.data``, which move no
version counter).

Each operator is judged in execution order by :func:`.origin.judge` (the rule ``opdump
overflow`` uses): only :data:`~.origin.OPERATOR` verdicts (finite inputs, finite
non-tensor arguments, non-finite output) are overflows.  Overflowing operators are
recorded (inputs and outputs; ``saved_data`` decides files and/or statistic.csv rows) up
to ``overflow_number`` per session (0: all); every folder a dumped iteration wrote into
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
from .overflow_copies import CopyPool
from .overflow_batch import DevicePath
from .overflow_now import CpuPath
from .overflow_rules import FINITE_PRESERVING, UNINITIALIZED, needs_prewrite_copy, scales_down  # noqa: F401
from .overflow_summary import render_csv, render_json
from .overflow_values import version_of

#: operators held before the flags are read (bounds the memory the references keep alive)
BATCH = 256
_NONE: frozenset = frozenset()


def _storage(t: torch.Tensor) -> Optional[int]:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:   # noqa: BLE001 - tensor subclasses without storage: no staleness check
        return None


class _Call:
    __slots__ = ("op", "inputs", "outputs", "in_flags", "out_flags", "flagged", "private", "where")

    def __init__(self, op, inputs, outputs, in_flags, out_flags, flagged, private, where):
        self.op, self.inputs, self.outputs = op, inputs, outputs
        self.in_flags, self.out_flags, self.flagged = in_flags, out_flags, flagged
        self.private, self.where = private, where


def write_summaries(layout, targets, iteration: int, limit: int, complete: bool) -> None:
    """Render and write ``overflow.json``/``overflow.csv`` of each ``(folder, events)`` in
    ``targets``, each file whole (``Layout.write_small``: temp + rename, errors reported to the
    session, never raised).  Runs in a writer job when the watch has ``submit``: the summaries
    of an iteration are then on disk once the writer has run the jobs queued at its end (the
    session's lag wait, ``flush``, close), off the training thread."""
    for folder, evs in targets:
        layout.write_small(layout.place(folder, OVERFLOW_JSON), render_json(iteration, limit, complete, evs))
        layout.write_small(layout.place(folder, OVERFLOW_CSV), render_csv(evs))


class OverflowWatch(CpuPath, DevicePath):
    """Watches operators in execution order.  ``record(op, inputs, outputs)`` (or, for an
    operator added with ``where``, ``record(op, inputs, outputs, where)``) dumps an
    overflowing operator; ``folder()`` is the folder of the eager iteration (None: only the
    folders given by :meth:`touch` get a summary); ``layout()`` writes the summaries, in a job
    given to ``submit`` (the session writer's) when there is one (:func:`write_summaries`)."""

    #: CPU operators read and judged as they return (:mod:`.overflow_now`); False: held and
    #: judged by batch like device operators (the tests compare both paths on the CPU)
    READ_CPU_NOW = True
    #: CPU operators whose outputs' magnitudes are bounded by their inputs' are neither read
    #: nor copied before an in-place write (:mod:`.overflow_bounds`); False: read and copied
    BOUNDS = True
    #: ... for outputs (written tensors) of at least this many elements: below, a native
    #: reading (or a pooled copy) costs less than the rules' Python
    BOUND_MIN = 8192

    def __init__(self, limit: int, record: Callable, folder: Optional[Callable[[], str]], layout: Callable,
                 submit: Optional[Callable[[Callable[[], None]], object]] = None):
        self.limit = int(limit)
        self._submit = submit                  # the session writer's submit (None: summaries written here)
        self.dumped = 0                        # overflowing operators recorded this session
        self._record = record
        self._folder = folder
        self._layout = layout
        self._calls: List[_Call] = []
        self._flags: List[torch.Tensor] = []   # 0-d flag tensors on the tensors' devices
        self._owner: List[int] = []            # flag entry -> held tensor
        self._held: List[torch.Tensor] = []    # the flagged tensors (detached), this batch
        self._exact: List[bool] = []           # held tensor's flag is its (min, max), not a sum
        self._orig: List = []                  # the flagged tensors themselves (None: a preset slot)
        self._preset: Dict[int, float] = {}    # slot -> value already read (the tensor is known)
        self._known: Dict[int, tuple] = {}     # id(tensor) -> (weakref, version, value, bumps, facts), this iteration
        self._derive: Dict[int, List[int]] = {}  # slot -> input slots it is finite with (no reduction)
        self._memo: Dict[int, tuple] = {}      # id(tensor) -> (version, flag index), this batch
        self._storages: set = set()            # storages the batch holds (built when a write asks)
        self._indexed = 0                      # calls whose tensors are in _storages
        self._events: List[tuple] = []         # (where, event)
        self._touched: Dict[str, None] = {}    # folders written this iteration (graph calls), in order
        self._eager_ran = False                # an eager operator was handed over this iteration
        self._prewrite: Dict[int, Optional[float]] = {}  # id(written tensor) -> its value before the write
        self._prewrite_bound: Dict[int, Optional[float]] = {}  # id(written tensor) -> its bound before the write
        self._proven = None                     # (op, bound): the in-place operator proved finite before it ran
        self._places: Dict[tuple, int] = {}     # (data_ptr, dtype, shape, strides) -> id(tensor) with facts
        self._writing: frozenset = _NONE        # ids of the tensors the operator being run writes
        self._copies = CopyPool()               # the private pre-write copies (reused)
        self._on_purpose: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
        self._broken = False
        self._call = _Call

    # ------------------------------------------------------------------ per operator
    def _unjudged(self, t) -> int:
        """An output holding uninitialized memory (``empty``…): never judged, nor is it as an
        input until something writes it (its garbage may hold NaN bit patterns)."""
        if isinstance(t, torch.Tensor):
            self._memo[id(t)] = (version_of(t), -1)
            try:
                self._known[id(t)] = (weakref.ref(t), version_of(t), None, 0, None)
            except TypeError:
                pass
        return -1

    def note_eager(self) -> None:
        """Eager operators ran this iteration that were not handed over (the native eager
        observer cleared them: finite outputs): its folder gets a summary all the same."""
        self._eager_ran = True

    def touch(self, where: str) -> None:
        """A dumped graph call writes into ``where`` this iteration: it gets a summary."""
        self._touched[where] = None

    def before_write(self, written: Sequence[torch.Tensor]) -> None:
        """An operator is about to write ``written``: judge the batch first if it holds one of
        them (its recorded values must be the ones before the write)."""
        calls = self._calls
        if calls:
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
        known, prewrite, bounds = self._known, {}, {}
        self._proven = None
        try:
            for t in written:       # their values read so far are stale after the write...
                entry = known.pop(id(t), None)
                if entry is not None and entry[0]() is t and 0 <= version_of(t) - entry[1] <= entry[3]:
                    prewrite[id(t)] = entry[2]      # ...but still those of its pre-write copy
                    if entry[2] == 0.0:
                        bounds[id(t)] = entry[4]
            self._writing = frozenset(map(id, written))
        except Exception as exc:   # noqa: BLE001 - never into the training thread
            self._fail(exc)
        self._prewrite, self._prewrite_bound = prewrite, bounds

    def copy_written(self, inputs: Sequence, written: Sequence[torch.Tensor], op=None, args: Sequence = (),
                     kwargs: Optional[dict] = None) -> tuple:
        """``(saved, cloned)``: ``inputs`` with a private copy of each tensor in ``written``
        (taken now, before the operator writes it) and the list of those copies.  A copy
        whose tensor's value is already known this iteration (read by :meth:`before_write`'s
        judging, or an earlier batch) reuses that value: no reduction of its own.  No copy
        at all when the magnitudes of the arguments (``op`` called with ``args`` and
        ``kwargs``; None: not given) prove its outputs finite (:mod:`.overflow_bounds`):
        it cannot be an overflow origin."""
        if op is not None and self.BOUNDS and not self._broken:
            try:
                if self._prove_before(op, args, kwargs, written):
                    self._prewrite = {}
                    return list(inputs), []
            except Exception as exc:   # noqa: BLE001 - never into the training thread
                self._fail(exc)
        ids = {id(t) for t in written}
        prewrite, self._prewrite = self._prewrite, {}
        saved, cloned = [], []
        for t in inputs:
            if id(t) in ids:
                c = self._copies.copy(t)
                cloned.append(c)
                # a pooled buffer may be reused with its version unchanged (a copy made under
                # the dispatch mode moves no version counter): its old entry must go
                self._known.pop(id(c), None)
                on_purpose = self._on_purpose
                if on_purpose:
                    on_purpose.pop(id(c), None)
                    if on_purpose.get(id(t)) is t:      # the copy carries an on-purpose Inf too
                        on_purpose[id(c)] = c
                if id(t) in prewrite:
                    try:
                        self._known[id(c)] = (weakref.ref(c), version_of(c), prewrite[id(t)], 0, None)
                    except TypeError:            # no weak reference to this tensor type
                        pass
                t = c
            saved.append(t)
        return saved, cloned

    def add(self, op, inputs: Sequence, outputs: Sequence, flagged: bool, cloned: Sequence = (),
            where: Optional[str] = None, args: Sequence = (), kwargs: Optional[dict] = None) -> None:
        """One operator that ran: ``inputs`` as they were before it ran, ``outputs`` after;
        ``cloned``: the private copies among ``inputs``; ``where``: its iteration folder
        (graph calls; None: the eager ``folder()``); ``args``: its positional arguments
        (:func:`.overflow_rules.scales_down`; empty: not known); ``kwargs``: its keyword
        arguments (:mod:`.overflow_bounds`; None: not known, no bound rule)."""
        if where is None:
            self._eager_ran = True
        if self._broken:
            return
        try:
            writing, self._writing = self._writing, _NONE
            cpu = self.READ_CPU_NOW
            if cpu:
                for t in inputs:
                    if isinstance(t, torch.Tensor) and not t.is_cpu:
                        cpu = False
                        break
                else:
                    for t in outputs:
                        if isinstance(t, torch.Tensor) and not t.is_cpu:
                            cpu = False
                            break
            if cpu:
                return self._add_now(op, inputs, outputs, flagged, cloned, where, writing, args, kwargs)
            flag_in = self._flag_in
            inputs, outputs = list(inputs), list(outputs)
            in_flags = [flag_in(t) for t in inputs]
            kind = op.op_type
            if kind in UNINITIALIZED:
                out_flags = [self._unjudged(t) for t in outputs]
            elif not flagged and (kind in FINITE_PRESERVING and op.overload != "dtype"
                                  or scales_down(kind, op.overload, args)):
                out_flags = self._derived(inputs, in_flags, outputs)
            else:
                out_flags = [self._flag_out(t) for t in outputs]
            call = _Call(op, inputs, outputs, in_flags, out_flags,
                         flagged, frozenset(map(id, cloned)) if cloned else _NONE, where)
            self._calls.append(call)
            if len(self._calls) >= BATCH:
                self.flush()
        except Exception as exc:   # noqa: BLE001 - never into the training thread
            self._fail(exc)

    # ------------------------------------------------------------------ batches (device operators)
    def _reset_batch(self) -> None:
        self._calls, self._flags, self._memo, self._storages, self._indexed = [], [], {}, set(), 0
        self._held, self._owner, self._exact, self._orig, self._preset, self._derive = [], [], [], [], {}, {}
        self._copies.batch()

    def flush(self) -> None:
        """Judge the held operators in execution order; dump the overflowing ones."""
        copies = self._copies.batch()
        kept = self._judge_held()
        if kept is not None:
            self._copies.recycle(copies, kept)

    def _judge_held(self) -> Optional[set]:
        """Judge the held operators; the ids of the copies recorded (None: failed, keep all)."""
        calls = self._calls
        kept: set = set()
        if not calls:
            return kept
        try:
            values = self._read_flags()
        except Exception as exc:   # noqa: BLE001
            self._reset_batch()
            self._fail(exc)
            return None
        self._reset_batch()
        if not any(values):                     # every flag finite (NaN is truthy): no verdict
            return kept
        isfinite = math.isfinite
        try:
            for call in calls:
                self._judge(call, [(t, values[k]) for t, k in zip(call.inputs, call.in_flags)
                                   if k >= 0 and not isfinite(values[k])],
                            [(s, t, values[k]) for s, (t, k) in enumerate(zip(call.outputs, call.out_flags))
                             if k >= 0 and not isfinite(values[k])], kept)
        except Exception as exc:   # noqa: BLE001
            self._fail(exc)
            return None
        return kept

    def _judge(self, call: _Call, bad_in, bad_out, kept: set) -> None:
        """One operator's verdict from its non-finite inputs ``(tensor, value)`` and outputs
        ``(slot, tensor, value)``: an on-purpose Inf is remembered, an origin recorded."""
        if not bad_in and not bad_out:
            return
        on_purpose = self._on_purpose
        unexplained = any(v != v or on_purpose.get(id(t)) is not t for t, v in bad_in)
        verdict = judge(bool(bad_in), unexplained, bool(bad_out), any(v != v for _, _, v in bad_out), call.flagged)
        if verdict == ON_PURPOSE:
            for _, t, _ in bad_out:
                on_purpose[id(t)] = t
        elif verdict == OPERATOR:
            kept |= call.private
            self._overflow(call, bad_out)

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
        self._known = {}
        self._places = {}
        self._proven = None
        self._on_purpose = weakref.WeakValueDictionary()
        broken, self._broken = self._broken, False
        ran, self._eager_ran = self._eager_ran, False
        try:
            for where in {w: None for w, _ in events if w is not None}:
                if where not in touched:
                    touched.append(where)
            targets = [(w, [e for ew, e in events if ew == w]) for w in touched]
            # the eager folder: a summary for an iteration in which an operator ran (the one the
            # last optimizer step opens runs none) or that has an event of its own
            if self._folder is not None and ((not touched and (ran or broken)) or any(w is None for w, _ in events)):
                targets.append((self._folder(), [e for ew, e in events if ew is None]))
            if targets:
                layout = self._layout()
                job = lambda: write_summaries(layout, targets, iteration, self.limit, not broken)  # noqa: E731
                if self._submit is None:
                    job()
                else:       # rendered and written by the writer (queued before the iteration's lag mark)
                    self._submit(job)
        except Exception as exc:   # noqa: BLE001
            self._fail(exc)
            self._broken = False

    def _fail(self, exc: BaseException) -> None:
        self._broken = True
        self._reset_batch()
        warnings.warn(f"opdump: overflow watch stopped for this iteration: {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=2)
