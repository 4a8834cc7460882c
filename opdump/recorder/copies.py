"""Copies of tensors and what the recorder remembers about them.

Guarantees: :func:`copy_out` returns an exact, contiguous host copy (channels_last
kept in memory order only with ``trans_flag`` false, conjugate/negative views
resolved); :class:`Clock` never gives the same timestamp twice, so file names are
unique; :class:`Seen` holds weak references only, so remembering a tensor never
keeps it alive.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Tuple

import torch

from ..debug.sample import take
from ..write.buffers import HostBuffers, HostCopy


class Clock:
    """Microsecond timestamps, strictly increasing so that every file name is unique."""

    def __init__(self):
        self._last = 0
        self._lock = threading.Lock()

    def __call__(self, count: int = 1) -> int:
        """The first of ``count`` consecutive timestamps, all later than any given before."""
        now = time.time_ns() // 1000
        with self._lock:
            if now <= self._last:
                now = self._last + 1
            self._last = now + count - 1
        return now


def copy_out(t: torch.Tensor, trans_flag: bool, buffers: HostBuffers, sample: int = 0) -> Tuple[HostCopy, Any, str]:
    """An exact, contiguous host copy of ``t`` (plus a CUDA event to wait on, and the format);
    ``sample`` > 0: of its first ``sample`` elements only, flattened (:mod:`opdump.debug.sample`)."""
    fmt = "DefaultFormat"
    t = t.detach()
    if (not trans_flag and t.dim() == 4 and not t.is_contiguous()
            and t.is_contiguous(memory_format=torch.channels_last)):
        t = t.permute(0, 2, 3, 1)
        fmt = "NHWC"
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if sample:
        t = take(t, sample)
    if t.device.type == "cpu":
        return buffers.copy_of(t), None, fmt
    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=torch.cuda.is_available())
    buf.copy_(t, non_blocking=True)
    event = None
    if t.device.type == "cuda":
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(t.device))
    return HostCopy(buf, None, None), event, fmt


def stream_id_of(t: torch.Tensor) -> int:
    if t.is_cuda:
        return int(torch.cuda.current_stream(t.device).stream_id)
    return 0


class Seen:
    """A tensor already recorded since the last flush: its copy, its statistics."""

    __slots__ = ("tensor", "version", "copy", "event", "fmt", "host_future", "device_handle")

    def __init__(self, tensor_ref, version: int):
        self.tensor = tensor_ref
        self.version = version
        self.copy = None           # weakref to its HostCopy (usable while a job still holds it)
        self.event = None
        self.fmt = "DefaultFormat"
        self.host_future = None    # the job computing its host statistics
        self.device_handle = None  # its device statistics in the current batch
