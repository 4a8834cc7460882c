"""The background writer: a small thread pool behind a byte budget.

The training thread hands over jobs (a callable plus the number of bytes it
holds) and goes on.  ``submit`` blocks only while the bytes held by queued and
running jobs exceed the budget, so memory stays bounded whatever the model size
(back-pressure, never dropping, never growing).  A job larger than the whole
budget runs alone.  Jobs run in submission order (FIFO), so a job may wait for
the futures of earlier jobs.

A failing job (disk full, permission denied) does not stop training: the first
error is kept, reported once as a warning, and from then on :attr:`failed` is
true so the session stops dumping; ``close`` re-raises nothing but returns the
errors, so the caller decides.

With ``low_priority`` the writer threads run at the lowest CPU priority (nice +19,
Linux; niceness is per thread there): on a machine whose cores the training step
keeps busy (its own intra-op threads), the writer takes the idle moments instead
of pre-empting the step, and it still runs whenever the step waits (on the byte
budget above, at a flush).  The session asks for it when only device statistics
are written (a little CPU work per step: on the 2-core bench machine AlexNet's
statistic dump went from 1.96x to 1.76x of the eager step); not for tensor files or
host statistics, whose work must overlap the step to keep up with it (at nice +19
the MLP's tensor dump fell from 74 % to 63 % of numpy.save's bytes per second, the
transformer's host statistics from 3.6x to 5.3x of the eager step).
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import sys
import threading
import warnings
from typing import Any, Callable, List, Optional


def _lowest_priority() -> None:
    """Nice +19 for the calling thread (Linux, where ``setpriority`` of a thread id is
    that thread's own); a scheduling hint, so elsewhere, or if refused, nothing changes."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass


class BackgroundWriter:
    def __init__(self, budget_bytes: int = 256 << 20, threads: int = 2, *, low_priority: bool = False):
        self.budget = max(1, int(budget_bytes))
        self._pool = cf.ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="opdump-writer",
                                           initializer=_lowest_priority if low_priority else None)
        self._held = 0
        self._cond = threading.Condition()
        self._pending: set = set()
        self.errors: List[BaseException] = []
        self.bytes_written = 0
        self.files_written = 0
        self._closed = False

    @property
    def held(self) -> int:
        """Bytes held by queued and running jobs."""
        return self._held

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    def reserve(self, nbytes: int) -> None:
        """Wait until ``nbytes`` fit in the budget (or nothing else is held), then hold them."""
        with self._cond:
            while self._held > 0 and self._held + nbytes > self.budget:
                self._cond.wait()
            self._held += nbytes

    def release(self, nbytes: int) -> None:
        with self._cond:
            self._held -= nbytes
            self._cond.notify_all()

    def submit(self, fn: Callable[[], Any], nbytes: int = 0, *, reserved: bool = False) -> cf.Future:
        """Queue ``fn``; ``nbytes`` is what it holds (already reserved when ``reserved``)."""
        if self._closed:
            raise RuntimeError("opdump writer is closed")
        if not reserved and nbytes:
            self.reserve(nbytes)
        fut = self._pool.submit(self._run, fn, nbytes)
        with self._cond:
            self._pending.add(fut)
        fut.add_done_callback(self._done)
        return fut

    def _run(self, fn: Callable[[], Any], nbytes: int) -> Any:
        try:
            return fn()
        except BaseException as exc:  # noqa: BLE001 - reported, never swallowed silently
            with self._cond:
                first = not self.errors
                self.errors.append(exc)
            if first:
                warnings.warn(f"opdump: writing the dump failed, dumping stops, training goes on: {exc!r}",
                              RuntimeWarning, stacklevel=1)
            raise
        finally:
            if nbytes:
                self.release(nbytes)

    def _done(self, fut: cf.Future) -> None:
        with self._cond:
            self._pending.discard(fut)

    def count(self, nbytes: int, files: int = 1) -> None:
        with self._cond:
            self.bytes_written += nbytes
            self.files_written += files

    def flush(self) -> None:
        """Wait for every job queued so far."""
        with self._cond:
            pending = list(self._pending)
        cf.wait(pending)

    def close(self) -> List[BaseException]:
        if not self._closed:
            self.flush()
            self._closed = True
            self._pool.shutdown(wait=True)
        return list(self.errors)
