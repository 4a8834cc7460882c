"""Device statistics: torch reductions on the tensor's own device (``stat_calc_mode: "device"``).

:class:`DeviceStatsBatch` launches a few reduction kernels per tensor on the
current stream of the tensor's device, keeps the 0-dim results on the device,
and :meth:`DeviceStatsBatch.collect` gathers everything of a device with one
stack and ONE device-to-host copy — the only synchronisation.  Nothing is
copied to the host per tensor, and the tensor itself never leaves its device.

Device-capable categories: every category except ``md5`` (which needs the
bytes on the host).  Kernels per tensor: ``max``+``min`` share one
``torch.aminmax``; ``avg`` one ``mean``; ``l2norm`` one
``torch.linalg.vector_norm``; each count a compare + a sum; ``finite max`` /
``finite min`` a ``nan_to_num`` + ``amax``/``amin``; ``count`` none (it is the
numel).  Integer results (counts, integer max/min) are kept as int64 and are
exact; float results are carried as float64 (bit-cast into the same int64
transfer buffer), so element values and float32 results are exact.

``device_stat_precision_mode``:

* ``"high"``: ``avg`` and ``l2norm`` accumulate in float32 on CUDA (float64 for
  float64 tensors); on CPU, large float tensors in float32 rows combined in
  float64 (see :func:`.reductions._blocks`), small ones in float64; integer tensors in
  float64; bool tensors as an exact integer count.  torch reads float16/bfloat16
  and upcasts on the fly on CUDA (no copy); on CPU they are upcast to float32
  once.  Even in float32, a float32 tensor whose l2norm exceeds ~1.8e19 (sum of
  squares > float32 max) gives ``inf``.
* ``"low"``: ``avg`` and ``l2norm`` are computed in the tensor's own dtype (torch
  may still accumulate internally in float32, but the result is rounded to that
  dtype): less memory, but overflow: a float16 tensor whose l2norm (or avg)
  exceeds 65504 gives ``inf``, and bfloat16 results keep 8 bits of mantissa.
  Integer tensors use float32.

On CPU, ``"high"`` precision, float32/bfloat16/float16, integer and bool tensors
whose elements fill one block of memory (contiguous, transposed, permuted,
channels-last; and those with gaps up to ``_COPY_LIMIT``, after one copy) get ``max``,
``min``, ``avg``, ``l2norm`` and ``count`` from one read by a C++ loop, looked up and read
in one native call (:mod:`.native`; same accumulation rules as above: float64
below 16384 elements, float32 blocks combined in float64 above; integers and bools
in float64, their max/min exact); their values are known at once, with nothing to
gather.  Other categories, dtypes, layouts and devices use
the torch reductions below.

Every statistic is invariant under a reordering of the elements, so tensors are
reduced in memory order (:func:`.memory.memory_order`), and a tensor reading exactly the
memory of one already added to the batch reuses its values (:meth:`DeviceStatsBatch.add`).

Stages: :mod:`.memory` (which memory a tensor reads, reuse keys), :mod:`.reductions`
(the torch kernels per category), this module (the batch: launch, reuse, one gather
per device), :mod:`.native` (the CPU kernel, memo and row sink, when built).

In both modes ``max``/``min`` and the counts are exact (computed in the
tensor's dtype), NaN/Inf propagate as in host mode (see :mod:`opdump.stats.host`).
float8 tensors are upcast to float32 first (a temporary copy: torch has no
float8 reductions); bool tensors are read as uint8; uint16/uint32 are copied
to int64 and uint64 to float64 (torch lacks their reductions; uint64 values
above 2**53 are rounded).  Empty tensors launch no
kernels (counts 0, other values None); complex and other unsupported dtypes
launch nothing (all None).  Device and host results agree exactly for
max/min/counts and within float32 rounding for avg/l2norm (relative 1e-5 for
well-conditioned data in high mode).
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from . import native
from .categories import lookup
from .contract import F_MAX, F_MIN, F_NUMEL, F_SUM, F_SUMSQ
from .host import supported_dtype
from .memory import gathered as _gathered, memory_key as _memory_key
from .memory import tensor_version  # noqa: F401  (the recorder imports it from here)
from .reductions import PRECISIONS, Ctx


# What the one-pass CPU kernel (:mod:`.native`) gives, from a fused entry (contract.FUSED_FIELDS).
_FUSED = {
    "max": lambda f, n: f[F_MAX],
    "min": lambda f, n: f[F_MIN],
    "avg": lambda f, n: f[F_SUM] / n,
    "l2norm": lambda f, n: math.sqrt(f[F_SUMSQ]),
    "count": lambda f, n: n,
}
_FUSED_DTYPES = frozenset((torch.float32, torch.bfloat16, torch.float16, torch.bool, torch.uint8, torch.int8,
                           torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32))
_UNRESOLVED = object()


class _Entry:
    """A tensor whose statistics were launched on its device (an entry known at once is the
    list of its values, or the CPU kernel's tuple, instead: see :meth:`DeviceStatsBatch._known`)."""
    __slots__ = ("device", "plan", "nfloat", "nint", "stream")

    def __init__(self, device, plan, nfloat, nint, stream):
        self.device = device
        self.plan = plan            # per category: ("f", i) | ("i", i) | ("v", value)
        self.nfloat = nfloat
        self.nint = nint
        self.stream = stream


class DeviceStatsBatch:
    """Statistics launched on the tensors' devices, gathered with one copy per device.

    ``categories``: the device-capable categories to compute, in the order
    :meth:`collect` returns them.  ``cpu_kernel``: let the one-pass CPU kernel
    (:mod:`.native`) give max/min/avg/l2norm/count of CPU float, integer and
    bool tensors (False: torch reductions only, as on other devices).
    """

    def __init__(self, categories: Sequence[str], precision: str = "high", *, cpu_kernel: bool = True):
        if precision not in PRECISIONS:
            raise ValueError(f"device_stat_precision_mode must be one of {PRECISIONS}, got {precision!r}")
        cats = [lookup(c) for c in categories]
        bad = [c.name for c in cats if c.device is None]
        if bad:
            raise ValueError(f"statistic categories {bad} cannot be computed on the device")
        self.categories = tuple(c.name for c in cats)
        self._cats = cats
        self.precision = precision
        self._entries: List[Any] = []          # _Entry, or what _known kept of a tensor known at once
        self._dtypes: List[torch.dtype] = []
        self._floats: Dict[torch.device, List[torch.Tensor]] = {}
        self._ints: Dict[torch.device, List[torch.Tensor]] = {}
        # memory block -> (weakref to the tensor added, its version, its index)
        self._by_memory: Dict[tuple, tuple] = {}
        # categories the one-pass CPU kernel gives (high precision only: "low" promises the dtype's own)
        self._fused_getters = [_FUSED.get(c.name) for c in cats]
        self._use_kernel = cpu_kernel and precision == "high" and any(self._fused_getters)
        self._all_fused = bool(cats) and all(self._fused_getters)     # no torch kernel at all
        self._kernel = _UNRESOLVED
        self._memo = None          # the native StatsMemo, with the kernel (see _resolve_kernel)
        self._sink = None          # the RowRecorder over the native memo (see row_sink)

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, tensor: torch.Tensor) -> int:
        """Launch the statistics of ``tensor`` (no sync); returns its index for :meth:`collect`.

        A tensor that reads exactly the memory of one added earlier in this batch
        (a ``view``, ``t()``, ``permute``… of it: the same elements in another order)
        gets that tensor's index: its statistics are the same, and nothing is launched.
        Reuse needs the earlier tensor alive (so its memory cannot have been reused)
        and the shared version counter unchanged (no in-place write since).  CPU tensors
        the kernel reads are looked up and read in one native call (:func:`.native.new_stats_memo`,
        same rules); the others here.
        """
        index = len(self._entries)
        t = tensor
        dtype = t.dtype
        kernel = self._kernel
        if kernel is _UNRESOLVED:
            kernel = self._resolve_kernel()
        memo = self._memo
        if memo is not None and dtype in _FUSED_DTYPES and t.is_cpu:
            fused = memo.stats(t, index)    # a fused entry (contract.FUSED_FIELDS), or an earlier index
            if type(fused) is int:
                return fused
            if fused is not None:       # kept as the kernel gave it; values are derived when read
                self._entries.append(fused)                 # (_known, inlined: the most common case)
                self._dtypes.append(dtype)
                return index
        n = t.numel()
        if not supported_dtype(dtype) or not self._cats:
            return self._known([None] * len(self._cats), dtype)
        if n == 0:
            return self._known([0 if c.kind == "count" else None for c in self._cats], dtype)
        ordered, key = _memory_key(t)
        dev = t.device
        earlier = self._by_memory.get(key)
        version = tensor_version(tensor)
        if earlier is not None:
            ref, v, i = earlier
            if v == version >= 0 and ref() is not None:
                return i
        self._by_memory[key] = (weakref.ref(tensor), version, index)
        if ordered is None:
            ordered = _gathered(t)      # a new tensor with gaps: copied once, here
        fused = None
        if kernel is not None and dev.type == "cpu" and dtype in _FUSED_DTYPES:
            fused = kernel(ordered)
            if fused is not None and self._all_fused:
                return self._known(fused + (n,), dtype)     # + numel: a fused entry
        if t.requires_grad:
            t, ordered = t.detach(), ordered.detach()       # detach costs ~5 us; needed only then
        floats = self._floats.setdefault(dev, [])
        ints = self._ints.setdefault(dev, [])
        f0, i0 = len(floats), len(ints)
        plan = []
        ctx = Ctx(ordered, self.precision)     # detached: no autograd graph is recorded
        for c, get in zip(self._cats, self._fused_getters):
            r = get(fused, n) if fused is not None and get is not None else c.device(ctx)
            if not isinstance(r, torch.Tensor):
                plan.append(("v", r))
            elif r.dtype.is_floating_point:
                plan.append(("f", len(floats) - f0))
                floats.append(r)
            else:
                plan.append(("i", len(ints) - i0))
                ints.append(r)
        stream = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
        self._entries.append(_Entry(dev, plan, len(floats) - f0, len(ints) - i0, stream))
        self._dtypes.append(dtype)
        return index

    def _known(self, values, dtype: torch.dtype) -> int:
        """An entry whose values are known without any kernel to wait for: the list of its
        values, or the CPU kernel's ``(max, min, sum, sum of squares, numel)`` tuple."""
        self._entries.append(values)
        self._dtypes.append(dtype)
        return len(self._entries) - 1

    def _resolve_kernel(self):
        """The CPU kernel if some category comes from it, else None, and the native memo when
        every category does; resolved at the first tensor (building the kernel is not paid by
        CUDA-only runs).  Once: a second call keeps the memo (a row sink already handed out
        reads and forgets through it)."""
        if self._kernel is not _UNRESOLVED:
            return self._kernel
        self._kernel = native.fused_stats() if self._use_kernel else None
        self._memo = native.new_stats_memo() if self._kernel is not None and self._all_fused else None
        if self._memo is not None:
            self._sink = RowRecorder(self, native.new_row_sink(self._memo))
        return self._kernel

    def row_sink(self) -> Optional["RowRecorder"]:
        """The :class:`RowRecorder` that builds a recorder's statistic.csv rows and adds their CPU
        tensors to this batch in one native call (``row_sink.cpp``), or None (no native memo:
        some category needs torch, precision "low", or the module is unavailable)."""
        if self._kernel is _UNRESOLVED:
            self._resolve_kernel()
        return self._sink

    def _extend(self, entries: list, dtypes: list) -> None:
        """Entries read by the native row sink, numbered from ``len(self)`` as it was told."""
        self._entries += entries
        self._dtypes += dtypes

    def collect(self) -> List[List[Any]]:
        """Per added tensor, its values in category order (float, int or None).

        ``finite max``/``finite min`` without any finite element are None.  The batch
        keeps its entries until :meth:`clear`.
        """
        return self.gather().values()

    def gather(self) -> "Gathered":
        """Bring every value to the host: one stack and ONE ``.cpu()`` per device — the sync.

        The per-tensor unpacking is left to :meth:`Gathered.values`, which needs no
        device and can run in another thread.  The batch can be cleared right after.
        """
        host: Dict[torch.device, tuple] = {}
        for dev in self._floats:
            floats, ints = self._floats[dev], self._ints[dev]
            if not floats and not ints:
                continue
            if dev.type == "cuda":
                current = torch.cuda.current_stream(dev)
                streams = {e.stream for e in self._entries if type(e) is _Entry and e.device == dev}
                for s in streams - {current, None}:
                    current.wait_stream(s)
            parts = []
            if floats:
                parts.append(torch.stack(floats).to(torch.float64).view(torch.int64))
            if ints:
                parts.append(torch.stack(ints).to(torch.int64))
            buf = (parts[0] if len(parts) == 1 else torch.cat(parts)).cpu().numpy()
            nf = len(floats)
            host[dev] = (buf[:nf].view(np.float64), buf[nf:])
        return Gathered(host, list(self._entries), list(self._dtypes), self._cats, self._fused_getters)

    def forget(self, tensor: torch.Tensor) -> None:
        """``tensor`` is being written in place (inside the operator's dispatch its version
        counter does not show it yet): no later tensor reuses what was computed from it.
        (Once the operator returned, autograd's version bump guards every view of it;
        ``_foreach_*`` ops bump nothing under a dispatch mode, so for them the eager
        front-end forgets every argument.)"""
        if self._memo is not None:
            self._memo.forget(tensor)
        if self._by_memory and tensor.numel():     # (empty when the memo took every tensor)
            dev, ptr, dtype, neg = tensor.device, tensor.data_ptr(), tensor.dtype, tensor.is_neg()
            self._by_memory.pop((dev, ptr, tensor.numel(), dtype, neg), None)
            self._by_memory.pop((dev, ptr, dtype, neg, tensor.shape, tensor.stride()), None)

    def settle(self, tensor: torch.Tensor) -> None:
        """``tensor`` was written by the operator whose output it was just added as, and that
        operator has returned: autograd's in-place bookkeeping has now bumped its version
        counter (once), or has not (``_foreach_*`` ops under a dispatch mode).  Either way
        the tensor still holds what was read, so its entry takes the current version and
        the next operator reading it reuses the statistics.  Called before any other
        operator runs; a version that moved further is left alone (no reuse)."""
        if self._memo is not None:
            self._memo.settle(tensor)
        if not self._by_memory or not tensor.numel():
            return
        _, key = _memory_key(tensor)
        earlier = self._by_memory.get(key)
        if earlier is None:
            return
        ref, v, i = earlier
        now = tensor_version(tensor)
        if v >= 0 and v <= now <= v + 1 and ref() is not None:
            self._by_memory[key] = (ref, now, i)

    def clear(self) -> None:
        if self._memo is not None:
            self._memo.clear()
        self._by_memory.clear()
        self._entries.clear()
        self._dtypes.clear()
        self._floats.clear()
        self._ints.clear()


class RowRecorder:
    """The device-statistics fast path of CPU tensors: statistic.csv row tuples
    (:data:`.contract.ROW_FIELDS`) and their statistics, made by the native row sink in one call.

    :meth:`record` appends to the caller's ``rows`` exactly what ``Recorder.record_all``'s
    Python loop would, and the tensors read to the batch; the native side only returns
    new lists (it edits no object of Python's).
    """

    __slots__ = ("_batch", "_record", "_into")

    def __init__(self, batch: DeviceStatsBatch, sink):
        self._batch = batch
        self._record = sink.record
        self._into = sink.record_into

    def record(self, rows, op_type: str, name, io: str, ts: int, tensors) -> int:
        """Rows of ``tensors`` (slot k at timestamp ``ts + k``, None slots skipped) appended to
        ``rows``; how many, or -1 having changed nothing when some element needs the Python path.
        ``rows`` a RowBatch (``row_batch.h``): appended as records, and ``name`` may then be one
        name per tensor (parameters: each row at slot 0)."""
        batch = self._batch
        if type(rows) is not list:
            made = self._into(rows, len(batch), op_type, name, io, ts, tensors)
            if made is None:
                return -1
            count, entries, dtypes = made
        else:
            made = self._record(len(batch), op_type, name, io, ts, tensors)
            if made is None:
                return -1
            new_rows, entries, dtypes = made
            rows += new_rows
            count = len(new_rows)
        if entries:
            batch._extend(entries, dtypes)
        return count


class Gathered:
    """The values of one batch, on the host; :meth:`values` unpacks them per tensor."""

    def __init__(self, host: Dict[torch.device, tuple], entries: List[Any], dtypes: List[torch.dtype], cats,
                 fused_getters):
        self._host = host
        self._entries = entries
        self._cats = cats
        self._fused_getters = fused_getters
        self.dtypes = dtypes

    def entries(self) -> List[Any]:
        """Per tensor, the list of its values in category order, or a fused entry
        (:data:`.contract.FUSED_FIELDS`, see :meth:`values`)."""
        host = self._host
        if not host and _Entry not in map(type, self._entries):
            return self._entries        # every value known at once (the CPU kernel's entries): as they are
        out: List[Any] = []
        offsets = {dev: [0, 0] for dev in host}
        for e in self._entries:
            if type(e) is not _Entry:
                out.append(e)
                continue
            fvals, ivals = host[e.device]
            off = offsets[e.device]
            row = []
            for cat, (kind, v) in zip(self._cats, e.plan):
                if kind == "f":
                    v = float(fvals[off[0] + v])
                    if cat.name in ("finite max", "finite min") and not np.isfinite(v):
                        v = None
                elif kind == "i":
                    v = int(ivals[off[1] + v])
                row.append(v)
            off[0] += e.nfloat
            off[1] += e.nint
            out.append(row)
        return out

    def values(self) -> List[List[Any]]:
        """Per tensor, its values in category order."""
        getters = self._fused_getters
        return [[get(e, e[F_NUMEL]) for get in getters] if type(e) is tuple else e for e in self.entries()]
