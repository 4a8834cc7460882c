"""Recycled host buffers for tensor copies.

Copying a tensor out is a memcpy, but into freshly allocated memory it is several
times slower: every page of a new large buffer faults on first touch.  Copies are
therefore made into a small pool of same-sized raw byte buffers.  A
:class:`HostCopy` is reference-counted by the jobs that use it (writing the file,
computing host statistics) and its buffer goes back to the pool when the last one
releases it — explicitly, not by garbage collection, because numpy views of the
copy do not keep the tensor object alive.  The pool keeps at most ``cap_bytes`` of
free buffers, where ``cap_bytes`` is a number or a function giving the room left
(the recorder passes "the writer's budget minus the bytes it holds", so copies in
flight and free buffers together stay within the one budget).
:attr:`HostBuffers.copies` / :attr:`HostBuffers.copied_bytes` count the copies made (what
the no-copy tensor dump of :mod:`opdump.recorder.held` saves is visible there).
"""
from __future__ import annotations

import mmap
import threading
from collections import OrderedDict
from typing import Callable, List, Optional, Union

import torch

_SMALL = 1 << 16        # below this the allocator's own cache is as good


def _mapped_bytes(nbytes: int) -> torch.Tensor:
    """``nbytes`` of fresh anonymous memory, given back to the OS when the tensor dies.

    Not from malloc: glibc raises its mmap threshold (up to 32 MiB) each time a large
    block is freed, after which copies come from the heap and, freed by the writer
    threads, stay in it — measured +120 MiB of resident memory beyond the writer's
    budget on the MLP bench.  An anonymous mapping per buffer keeps resident memory
    at what the budget says.
    """
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8)


class HostCopy:
    """A host copy of one tensor, shared by the jobs that hold a reference."""

    __slots__ = ("tensor", "_raw", "_refs", "_pool", "_lock", "__weakref__")

    def __init__(self, tensor: torch.Tensor, raw: Optional[torch.Tensor], pool: Optional["HostBuffers"]):
        self.tensor: Optional[torch.Tensor] = tensor
        self._raw = raw
        self._refs = 1
        self._pool = pool
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        """One more user; False when the copy was already recycled."""
        with self._lock:
            if self.tensor is None:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            if self._refs > 0:
                return
            self.tensor = None
            raw, self._raw = self._raw, None
        if raw is not None and self._pool is not None:
            self._pool.give(raw)


class HostBuffers:
    def __init__(self, cap_bytes: Union[int, Callable[[], int]]):
        self._cap = cap_bytes if callable(cap_bytes) else (lambda: int(cap_bytes))
        self._free: "OrderedDict[int, List[torch.Tensor]]" = OrderedDict()
        self._free_bytes = 0
        self._lock = threading.Lock()
        self.copies = 0            # copies made by copy_of (training thread)
        self.copied_bytes = 0

    def copy_of(self, t: torch.Tensor) -> HostCopy:
        """An exact contiguous copy of CPU tensor ``t`` (one reference held by the caller)."""
        nbytes = t.numel() * t.element_size()
        self.copies += 1
        self.copied_bytes += nbytes
        if nbytes < _SMALL:
            return HostCopy(t.clone(memory_format=torch.contiguous_format), None, None)
        raw = None
        with self._lock:
            bucket = self._free.get(nbytes)
            if bucket:
                raw = bucket.pop()
                self._free_bytes -= nbytes
                if not bucket:
                    del self._free[nbytes]
        if raw is None:
            with self._lock:
                self._trim(self.cap)          # make room: a new buffer comes out of the same budget
            raw = _mapped_bytes(nbytes)
        buf = raw.view(t.dtype).view(t.shape)
        buf.copy_(t)
        return HostCopy(buf, raw, self)

    @property
    def cap(self) -> int:
        return max(0, self._cap())

    def _trim(self, limit: int) -> None:
        """Drop free buffers, oldest size first, until at most ``limit`` bytes are kept (lock held)."""
        while self._free and self._free_bytes > limit:
            size, bucket = next(iter(self._free.items()))
            bucket.pop()
            self._free_bytes -= size
            if not bucket:
                del self._free[size]

    def give(self, raw: torch.Tensor) -> None:
        nbytes = raw.numel()
        cap = self.cap
        if nbytes > cap:
            return
        with self._lock:
            self._trim(cap - nbytes)
            self._free.setdefault(nbytes, []).append(raw)
            self._free.move_to_end(nbytes)
            self._free_bytes += nbytes

    def close(self) -> None:
        """Give every free buffer back, and keep none from now on (the session is over)."""
        with self._lock:
            self._cap = lambda: 0
            self._trim(0)

    @property
    def free_bytes(self) -> int:
        return self._free_bytes
