"""The background writer: a small thread pool behind a byte budget.

The training thread hands over jobs (a callable plus the number of bytes it
holds) and goes on.  ``submit`` blocks only while the bytes held by queued and
running jobs exceed the budget, so memory stays bounded whatever the model size
(back-pressure, never dropping, never growing).  A job larger than the whole
budget runs alone.  Jobs run in submission order (FIFO), so a job may wait for
the futures of earlier jobs.

A failing job (disk full, permission denied, a link planted in the dump) does not
stop training: the first error is kept, reported once as a warning, and from then
on :attr:`failed` is true so the session stops dumping; jobs still queued, and jobs
submitted later, are dropped (never run, never raising).  Errors met outside a job
(a folder made on the training thread) are reported the same way through
:meth:`fail`.  ``close`` re-raises nothing but returns the errors, so the caller
decides.  Nothing here raises into the caller's thread: :meth:`submit` on a closed
or failed writer returns a finished future holding None.

:meth:`mark` and :meth:`wait` bound how far the writer may fall behind: the session
marks the jobs queued at the end of each iteration and waits for the previous
mark, so the rows of an iteration are on disk at most one iteration after it ends,
whatever the threads' priority.

With ``low_priority`` the writer threads run at the lowest CPU priority (nice +19,
Linux; niceness is per thread there): on a machine whose cores the training step
keeps busy (its own intra-op threads), the writer takes the idle moments instead
of pre-empting the step, and it still runs whenever the step waits (on the byte
budget above, at a flush).  The session asks for it when only statistics computed as
tensors are recorded are written (device mode, or host mode without md5: a little CPU work per step: on the 2-core bench machine AlexNet's
statistic dump went from 1.96x to 1.76x of the eager step); not for tensor files or
host statistics, whose work must overlap the step to keep up with it (at nice +19
the MLP's tensor dump fell from 74 % to 63 % of numpy.save's bytes per second, the
transformer's host statistics from 3.6x to 5.3x of the eager step).

The gate (:meth:`pause` / :meth:`resume`): while it is closed, queued jobs wait and no
thread starts one.  A graph call that holds tensors for the writer may close it for the
call (:mod:`opdump.recorder.held`, where ``Holds.gate`` turns it on: off by default until
measured on a quiet machine) and, at the call's end, open it and wait while every thread
writes.  Why: on a machine whose cores the step keeps busy (CPU training, intra-op
threads in lock-step parallel regions), a writer thread running between two operators
takes one core of a parallel region, and the region's other threads spin at its end until
the core comes back (profile of the AlexNet graph tensor dump on the 2-core bench
machine: 79 % of the process's CPU samples during the step in libgomp's spin-wait; the
writer's CPU per file within ~10 % of ``numpy.save``'s; the GIL held by any thread for
under 10 % of the step).  Nothing can wait for ever on a closed gate: :meth:`reserve`
opens it while it waits (and closes it again once half the budget is free, so that the
step and the writer take turns instead of interleaving file by file); :meth:`flush`,
:meth:`wait` and :meth:`close` open it for good.

Deferral (:meth:`defer` / :meth:`release_deferred`): the session defers the jobs queued
while an iteration ends (summaries, execution orders: a few small files) and hands them
over as **one** job once it has declared the iteration in ``manifest.json`` (the ``before``
callback).  Why: one wake-up of one writer thread per iteration instead of one per file
(an every-step overflow watch queued two jobs a step, each waking a thread that takes a core
and the GIL from the step), and no file of an iteration can reach the disk before the
manifest names it, so the manifest is written once per iteration instead of twice.  Only
jobs holding no bytes are deferred: a job with bytes, a :meth:`mark`, a :meth:`wait` on a
deferred job, ``result()`` of one, :meth:`flush` and :meth:`close` hand the deferred jobs
over first (``before`` called once), so the order of jobs is the order of submission and
nothing waits for a job that was never handed over.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import sys
import threading
import time
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


def _done_future() -> cf.Future:
    fut: cf.Future = cf.Future()
    fut.set_result(None)
    return fut


class _DeferredFuture(cf.Future):
    """A deferred job's future: asking for its result hands the deferred jobs over first
    (a wait on a job never handed over would never end)."""

    def __init__(self, writer: "BackgroundWriter"):
        super().__init__()
        self._writer = writer

    def result(self, timeout=None):
        self._writer.release_deferred()
        return super().result(timeout)

    def exception(self, timeout=None):
        self._writer.release_deferred()
        return super().exception(timeout)


class BackgroundWriter:
    def __init__(self, budget_bytes: int = 256 << 20, threads: int = 2, *, low_priority: bool = False):
        self.budget = max(1, int(budget_bytes))
        self._idents: List[int] = []           # the threads' identifiers (CPU clocks: thread_cpu)
        self._pool = cf.ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="opdump-writer",
                                           initializer=self._started, initargs=(low_priority,))
        self._held = 0
        self._cond = threading.Condition()
        self._pending: set = set()
        self.errors: List[BaseException] = []
        self.bytes_written = 0
        self.files_written = 0
        self._closed = False
        self._gate_closed = False
        self._gate_epoch = 0                   # pause/resume calls: a wait in reserve re-closes only its own opening
        self._deferring = False                # defer() .. release_deferred(): zero-byte jobs held here
        self._deferred: list = []              # [(fn, future)] in submission order
        self._before: Optional[Callable[[], None]] = None
        self._defer_thread: Optional[int] = None   # only this thread's jobs are deferred
        self._defer_lock = threading.Lock()
        self.batches = 0                       # deferred batches handed over (tests, the bench)

    def _started(self, low_priority: bool) -> None:
        self._idents.append(threading.get_ident())
        if low_priority:
            _lowest_priority()

    def thread_cpu(self) -> float:
        """CPU seconds the writer threads have used so far (where threads have CPU clocks;
        0.0 elsewhere): what the bench reports as the writer's CPU per step."""
        total = 0.0
        for ident in list(self._idents):
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(ident))
            except (AttributeError, OSError):      # no such clock here, or the thread has ended
                pass
        return total

    @property
    def held(self) -> int:
        """Bytes held by queued and running jobs."""
        return self._held

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    def reserve(self, nbytes: int) -> None:
        """Wait until ``nbytes`` fit in the budget (or nothing else is held), then hold them.
        Behind a closed gate (:meth:`pause`) the gate opens while this waits, and the wait
        goes on until ``nbytes`` fit in half the budget: the writer then works alone for a
        while instead of one file at a time between two operators."""
        with self._cond:
            if self._held > 0 and self._held + nbytes > self.budget:
                gated, self._gate_closed = self._gate_closed, False
                epoch = self._gate_epoch = self._gate_epoch + 1
                limit = self.budget // 2 if gated else self.budget
                self._cond.notify_all()
                while self._held > 0 and self._held + nbytes > limit:
                    self._cond.wait()
                if gated and epoch == self._gate_epoch and not self._closed:
                    self._gate_closed = True        # nobody paused or resumed meanwhile: closed again
            self._held += nbytes

    def pause(self) -> None:
        """Close the gate: queued jobs wait until :meth:`resume` (or any wait on the writer)."""
        with self._cond:
            if not self._closed:
                self._gate_closed = True
                self._gate_epoch += 1

    def resume(self) -> None:
        """Open the gate: every thread takes the jobs queued meanwhile."""
        with self._cond:
            self._gate_epoch += 1
            if self._gate_closed:
                self._gate_closed = False
                self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def paused(self) -> bool:
        return self._gate_closed

    def release(self, nbytes: int) -> None:
        with self._cond:
            self._held -= nbytes
            self._cond.notify_all()

    # ------------------------------------------------------------------ deferral
    @property
    def deferring(self) -> bool:
        """Jobs queued now are deferred (:meth:`defer`): none can run before ``before``."""
        return self._deferring

    def defers_here(self) -> bool:
        """A job queued now by this thread would be deferred."""
        return self._deferring and threading.get_ident() == self._defer_thread

    def defer(self, before: Optional[Callable[[], None]] = None) -> None:
        """From now on, jobs holding no bytes are kept until :meth:`release_deferred` (or
        anything that needs them: see the module), then handed over as one job; ``before``
        is called first, on the releasing thread (its errors are the caller's to report:
        it must not raise)."""
        with self._defer_lock:
            if self._closed or self._deferring:
                return
            self._deferring, self._before, self._defer_thread = True, before, threading.get_ident()

    def release_deferred(self) -> None:
        """Call ``before``, then hand the deferred jobs over as one job; deferral ends."""
        with self._defer_lock:
            if not self._deferring:
                return
            self._deferring = False
            before, self._before = self._before, None
            jobs, self._deferred = self._deferred, []
        if before is not None:
            try:
                before()
            except Exception as exc:  # noqa: BLE001 - reported, never into the caller
                self.fail(exc)
        if not jobs:
            return
        self.batches += 1
        queued = self.submit(lambda: self._run_batch(jobs))
        # a batch never run (the writer failed or closed meanwhile) still sets its futures
        queued.add_done_callback(lambda _: [fut.set_result(None) for _, fut in jobs if not fut.done()])

    def _run_batch(self, jobs: list) -> None:
        """The deferred jobs, in order, each as a job of its own would run (errors reported,
        dropped once the writer failed); every future set."""
        for fn, fut in jobs:
            result = None
            try:
                if not self.errors:
                    result = fn()
            except BaseException as exc:  # noqa: BLE001 - reported, never swallowed silently
                self.fail(exc)
            finally:
                fut.set_result(result)

    # ------------------------------------------------------------------ jobs
    def submit(self, fn: Callable[[], Any], nbytes: int = 0, *, reserved: bool = False) -> cf.Future:
        """Queue ``fn``; ``nbytes`` is what it holds (already reserved when ``reserved``).
        On a closed or failed writer nothing is queued: a finished future holding None.
        While deferring (:meth:`defer`), a job holding no bytes is kept (its future is set
        when it has run); a job holding bytes hands the deferred ones over first."""
        if self._closed or self.errors:
            if reserved and nbytes:
                self.release(nbytes)
            return _done_future()
        if self._deferring and threading.get_ident() == self._defer_thread:
            if not nbytes:
                with self._defer_lock:
                    if self._deferring:
                        fut = _DeferredFuture(self)
                        self._deferred.append((fn, fut))
                        return fut
            else:
                self.release_deferred()
        if not reserved and nbytes:
            self.reserve(nbytes)
        try:
            fut = self._pool.submit(self._run, fn, nbytes)
        except RuntimeError as exc:              # the pool is shut down (interpreter exit)
            if nbytes:
                self.release(nbytes)
            self.fail(exc)
            return _done_future()
        with self._cond:
            self._pending.add(fut)
        fut.add_done_callback(self._done)
        return fut

    def fail(self, exc: BaseException) -> None:
        """Record a write error; the first one is reported once, as a warning."""
        with self._cond:
            first = not self.errors
            self.errors.append(exc)
        if first:
            warnings.warn(f"opdump: writing the dump failed, dumping stops, training goes on: {exc}",
                          RuntimeWarning, stacklevel=2)

    def _run(self, fn: Callable[[], Any], nbytes: int) -> Any:
        try:
            if self._gate_closed:
                with self._cond:
                    while self._gate_closed:
                        self._cond.wait()
            if self.errors:
                return None                      # dumping stopped: queued work is dropped
            return fn()
        except BaseException as exc:  # noqa: BLE001 - reported, never swallowed silently
            self.fail(exc)
            return None
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
        self.wait(self.mark())

    def mark(self) -> List[cf.Future]:
        """The jobs queued so far (to :meth:`wait` for later); deferred ones handed over first."""
        self.release_deferred()
        with self._cond:
            return list(self._pending)

    def wait(self, jobs: List[cf.Future]) -> None:
        """Wait until every job of a :meth:`mark` has run (the gate opens: see the module)."""
        if jobs:
            if self._deferring and any(isinstance(j, _DeferredFuture) for j in jobs):
                self.release_deferred()
            self.resume()
            cf.wait(jobs)

    def abandon(self) -> None:
        """In a forked child: the threads did not survive the fork; never queue or wait again."""
        self._closed = True
        self._gate_closed = False
        self._pending = set()
        with self._defer_lock:
            self._deferring, self._deferred, self._before = False, [], None

    def close(self) -> List[BaseException]:
        self.release_deferred()
        self.resume()
        if not self._closed:
            self.flush()
            self._closed = True
            self._pool.shutdown(wait=True)
        return list(self.errors)
