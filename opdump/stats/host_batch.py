"""Host-mode statistics of a batch (``stat_calc_mode: "host"``), computed when recorded.

Why: the tensor of a CPU run already lives in host memory, so the host mode's former
copy to the host and numpy reductions in writer threads were pure cost (AlexNet: 4.8x
graph / 9.5x eager against 1.4x / 1.7x in device mode).  :class:`HostStatsBatch` is the
device batch's interface (:class:`~opdump.stats.device.DeviceStatsBatch`: its memo,
native row sink, reuse of tensors reading the same memory, gather) with the host mode's
semantics (:mod:`opdump.stats.host`: float64 sums in the one order that module defines):

* CPU float32/bfloat16/float16, integer and bool tensors: ``max``, ``min``, ``avg``,
  ``l2norm``, ``count`` from ``cpu_kernel.cpp``'s ``host_stats`` (one read, no copy; a
  tensor with gaps up to 32 MiB is copied first, as in device mode);
* every other category, dtype or layout, and every tensor when the native module is not
  available: the numpy reducers of :mod:`opdump.stats.host` on the tensor itself (a view,
  no copy, for a tensor whose elements fill one block), on the training thread;
* a tensor on another device (untested: no CUDA machine here): copied to the host first,
  synchronously, then as above;
* ``md5`` is not here: it is hashed in a writer thread from a copy (see the engine).

The two implementations give the same bits for every category (tests/test_host_stats_native.py).
"""
from __future__ import annotations

import weakref
from typing import Sequence

import torch

from . import native
from .device import _FUSED_DTYPES, _UNRESOLVED, DeviceStatsBatch, RowRecorder
from .host import reduce_tensor, supported_dtype
from .memory import gathered, memory_key, tensor_version


class HostStatsBatch(DeviceStatsBatch):
    """Host statistics (every category but ``md5``), known at once; see the module docstring."""

    def __init__(self, categories: Sequence[str]):
        super().__init__(categories, "high")
        self.precision = "host"
        self._use_kernel = any(self._fused_getters)
        self._numpy = [c for c, get in zip(self._cats, self._fused_getters) if get is None]

    def _resolve_kernel(self):
        if self._kernel is not _UNRESOLVED:         # once (see DeviceStatsBatch._resolve_kernel)
            return self._kernel
        self._kernel = native.host_stats() if self._use_kernel else None
        self._memo = native.new_stats_memo(host=True) if self._kernel is not None and self._all_fused else None
        if self._memo is not None:
            self._sink = RowRecorder(self, native.new_row_sink(self._memo))
        return self._kernel

    def add(self, tensor: torch.Tensor) -> int:
        """The statistics of ``tensor``, computed now; its index (an earlier one when ``tensor``
        reads the memory of a tensor added before and unchanged since)."""
        index = len(self._entries)
        t = tensor
        dtype = t.dtype
        kernel = self._kernel
        if kernel is _UNRESOLVED:
            kernel = self._resolve_kernel()
        memo = self._memo
        if memo is not None and dtype in _FUSED_DTYPES and t.is_cpu:
            fused = memo.stats(t, index)
            if type(fused) is int:
                return fused
            if fused is not None:
                self._entries.append(fused)
                self._dtypes.append(dtype)
                return index
        n = t.numel()
        if not supported_dtype(dtype) or not self._cats:
            return self._known([None] * len(self._cats), dtype)
        if n == 0:
            return self._known([0 if c.kind == "count" else None for c in self._cats], dtype)
        ordered, key = memory_key(t)
        earlier = self._by_memory.get(key)
        version = tensor_version(tensor)
        if earlier is not None:
            ref, v, i = earlier
            if v == version >= 0 and ref() is not None:
                return i
        self._by_memory[key] = (weakref.ref(tensor), version, index)
        if ordered is None:
            ordered = gathered(t)
        ordered = ordered.detach()
        if ordered.device.type != "cpu":
            ordered = ordered.cpu()
        fused = kernel(ordered) if kernel is not None and dtype in _FUSED_DTYPES else None
        if fused is not None:
            fused = fused + (n,)
            if self._all_fused:
                return self._known(fused, dtype)
        todo = [c for c, get in zip(self._cats, self._fused_getters) if fused is None or get is None]
        computed = dict(zip((c.name for c in todo), reduce_tensor(ordered, [c.host for c in todo])))
        values = [_plain(computed[c.name]) if c.name in computed else get(fused, n)
                  for c, get in zip(self._cats, self._fused_getters)]
        return self._known(values, dtype)


def _plain(value):
    """A numpy scalar as the Python number it holds (exact), for the cell formatters."""
    return value.item() if hasattr(value, "item") else value
