"""Tensor files written straight from the tensor's memory: no copy on the training thread
(README, "How it works", Writing).

A recorded CPU tensor is normally copied out on the training thread (:func:`.copies.copy_out`)
and the writer writes the copy.  Inside a *hold window* the recorder instead keeps a
reference (:class:`HeldCopy`: a detached alias, counted in the writer's byte budget like a
copy) and the writer thread writes the ``.npy`` from the tensor's own memory.

Why a held tensor's memory cannot change before the writer has read it -- the rule, and
nothing else:

* A window is one call of an operator-dump graph (the graph runtime's begin to end taps)
  whose operators write nothing but their fresh outputs: no operator of the graph has a
  mutable schema (no in-place, ``out=`` or ``copy_`` into an input).  While it runs, the
  training thread runs only those operators and the taps, so nothing writes any tensor.
* When the window closes (the end tap; or the runtime is detached after a failure; or the
  same runtime begins again without having ended), every held tensor the writer has not
  finished is looked at once more.  If nothing but opdump's own alias uses its storage
  (the storage's use count) and the storage is one the allocator made (resizable, not
  shared memory, so neither numpy nor another process holds the same bytes), no code can
  reach that memory any more: it stays held until the writer writes it.  Otherwise it is
  copied now, on the training thread, after waiting for a write already reading it; from
  then on every file of it is written from the copy.
* The writer's gate (:mod:`opdump.write.writer`; :attr:`Holds.gate`, off by default): the
  first tensor held in a window closes it, so that no file is written between two
  operators of the call; the window's end opens it and waits until the window's held
  tensors are written (every writer thread at once, while the step waits), so that none
  is left to keep or copy.  A writer that fails or
  is closed meanwhile ends the wait; what is left unwritten then takes the rule above.
* A net, not the guarantee: the writer compares the tensor's version counter before it
  reads and after it has written the temporary file, before the rename; if the counter
  moved, the file is dropped (one warning for the session), never a wrong file kept.

Not held (the copy path, unchanged): eager capture, kernel-level dumps, graphs with a
mutating operator, host statistics and md5 (they read the copy), sample dumps, online
compare, bin files, non-contiguous/conjugate/negative-view tensors, empty tensors, tensor
subclasses, non-CPU tensors (CUDA keeps its asynchronous copy).
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import List, Optional

import numpy as np
import torch

from ..write import atomic
from ..write.buffers import HostBuffers, HostCopy

_use_count = torch._C._storage_Use_Count


class StaleTensor(Exception):
    """The held tensor was written while (or before) its file was: the file is dropped."""


class HeldCopy:
    """A recorded tensor the writer will read in place (the :class:`HostCopy` interface:
    ``acquire``/``release`` by the jobs using it); after :meth:`Holds.secure` its reads
    go to a copy made at that moment."""

    __slots__ = ("held", "version", "copy", "_refs", "_readers", "_holds", "__weakref__")

    def __init__(self, holds: "Holds", tensor: torch.Tensor):
        self._holds = holds
        self.held: Optional[torch.Tensor] = tensor.detach()     # opdump's own alias (its own TensorImpl)
        self.version = tensor._version
        self.copy: Optional[HostCopy] = None
        self._refs = 1
        self._readers = 0

    def acquire(self) -> bool:
        with self._holds._cond:
            if self._refs <= 0:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._holds._cond:
            self._refs -= 1
            if self._refs > 0:
                return
            self.held = None
            copy, self.copy = self.copy, None
            self._holds._cond.notify_all()        # a window's end may wait for this (Holds.close)
        if copy is not None:
            copy.release()

    def private(self) -> bool:
        """Nothing but this alias uses the held storage, and the storage is the allocator's."""
        storage = self.held.untyped_storage()
        return _use_count(storage._cdata) <= 2 and storage.resizable() and not storage.is_shared()


class Window:
    """The tensors held during one graph call; once closed it takes no more (a recording
    that still finds it gets the copy path)."""

    __slots__ = ("entries", "closed", "gated")

    def __init__(self):
        self.entries: List[HeldCopy] = []
        self.closed = False
        self.gated = False          # this window closed the writer's gate


class Holds:
    """The held tensors of the open windows, the securing at their end, and the counters
    (``held``: tensors held at record time; ``secured``: copied when their window closed;
    ``kept``: still held past their window, private; ``dropped``: files dropped by the net)."""

    #: close the writer's gate during a window (see the module docstring).  Off by default:
    #: on the loaded 2-core machine it was measured at 0.97x-2.75x of the ungated step (AlexNet,
    #: alternating steps, load 7-9, where a process with fewer runnable threads gets less of the
    #: CPU); ``bench/nocopy.py --thread-time --ab gate`` measures it on a quiet machine.
    gate = False

    def __init__(self, buffers: HostBuffers, writer=None):
        self.buffers = buffers
        self.writer = writer
        self._cond = threading.Condition()
        self.held = self.secured = self.kept = self.dropped = 0
        self._warned = False

    # ------------------------------------------------------------------ training thread
    def open(self) -> Window:
        """A new window, to pass to :meth:`hold` and :meth:`close`."""
        return Window()

    def hold(self, window: Window, tensor: torch.Tensor) -> Optional[HeldCopy]:
        """``tensor`` held in ``window``; None when the window is already closed (copy it)."""
        with self._cond:
            if window.closed:
                return None
            entry = HeldCopy(self, tensor)
            window.entries.append(entry)
        self.held += 1
        if not window.gated and self.gate and self.writer is not None:
            window.gated = True
            self.writer.pause()
        return entry

    def close(self, window: Optional[Window]) -> None:
        """The window ends: each held tensor not yet written is kept if private, else copied
        (after any write reading it has finished)."""
        if window is None:
            return
        with self._cond:
            window.closed = True
            entries, window.entries = window.entries, []
        if window.gated:
            self.writer.resume()
            self._wait_written(entries)
        for entry in entries:
            self.secure(entry, keep_private=True)

    def _wait_written(self, entries: List[HeldCopy]) -> None:
        """Wait until the jobs of ``entries`` are done, or the writer stopped (failed, closed:
        its queued jobs never run; checked every 50 ms)."""
        writer = self.writer
        with self._cond:
            for entry in entries:
                while entry._refs > 0 and not writer.failed and not writer.closed:
                    self._cond.wait(0.05)

    def secure(self, entry: HeldCopy, keep_private: bool = False) -> None:
        with self._cond:
            while entry._readers:                   # a write reading the memory: let it finish
                self._cond.wait()
            if entry._refs <= 0 or entry.copy is not None or entry.held is None:
                return
            if keep_private and entry.private():
                self.kept += 1
                return
            # copied under the lock: a job starting meanwhile waits, then reads the copy
            try:
                entry.copy = self.buffers.copy_of(entry.held)
                self.secured += 1
            finally:
                entry.held = None          # no copy (out of memory): its files are dropped, never wrong

    # ------------------------------------------------------------------ writer thread
    def write(self, layout, path: str, entry: HeldCopy, to_numpy) -> int:
        """Write ``entry``'s file at ``path`` (temporary + rename); returns the bytes written,
        0 when the file was dropped because the tensor changed (the net)."""
        with self._cond:
            copy = entry.copy
            tensor = entry.held if copy is None else copy.tensor
            if copy is None:
                entry._readers += 1
        try:
            if tensor is None or (copy is None and tensor._version != entry.version):
                raise StaleTensor()
            array = to_numpy(tensor)
            check = None if copy is not None else (lambda: tensor._version == entry.version)
            _save_checked(layout, path, array, check)
            return array.nbytes
        except StaleTensor:
            self._drop(path)
            return 0
        finally:
            if copy is None:
                with self._cond:
                    entry._readers -= 1
                    self._cond.notify_all()

    def _drop(self, path: str) -> None:
        with self._cond:
            self.dropped += 1
            first, self._warned = not self._warned, True
        if first:
            warnings.warn(f"opdump: a tensor was written in place before its file was written; "
                          f"the file is left out rather than written with later values: {path}",
                          RuntimeWarning, stacklevel=2)


def _save_checked(layout, path: str, array: np.ndarray, check) -> None:
    """``numpy.save`` bytes of a C-contiguous ``array`` written whole at ``path`` (as
    :func:`opdump.write.atomic.atomic_save_npy`), ``check()`` called after the data is in the
    temporary file and before the rename: False removes the temporary (:class:`StaleTensor`)."""
    header = atomic._npy_header(array.dtype, array.shape)

    def fill(fd: int) -> None:
        if header is None:
            with os.fdopen(fd, "wb", closefd=False) as f:
                np.lib.format.write_array(f, array, allow_pickle=False)
        else:
            atomic._write_all(fd, header, array.reshape(-1).view(np.uint8))
        if check is not None and not check():
            raise StaleTensor()

    atomic._write_whole(path, fill, layout.tree, fresh=header is not None)
