"""Opening A and B at the same time: B is read (folders scanned, records table built) in a
forked child process while this process reads A, and comes back pickled (streamed: this
process unpickles while the child is still pickling).

Why: reading is a third of a statistics-only compare (100,000 rows: ~0.65 s per side of
one core) and the two dumps are independent; on two cores the command's wall time drops
by about one side's reading.  Pickling the opened dump costs a tenth of reading it.

When: both arguments are paths, on Linux (fork), no other Python thread running, and
``OPDUMP_COMPARE_PARALLEL_OPEN`` ``1`` (always) or unset (when a CPU of this process is
idle: at least two CPUs, torch not imported, and not both a one-minute load average and
a count of other processes running now of at least the CPUs less one -- on a busy machine
the child only competes for the same cores and the pickle is extra work: measured at load
~6 on two cores, 5.7 -> 6.4 s wall; the count now keeps a user's own compares run one
after another, which lift the one-minute average on an otherwise idle machine, from
reading B serially); ``0`` never.

Guarantee: the same :class:`~opdump.analysis.reader.Dump` as ``open_dump(b)`` in this
process -- the child's object itself, records table included, through a pickle round trip
(values and dtypes exact); the warnings reading B gave in the child are shown here, once
each, at their place.  Anything going wrong in the child (B is not a dump, a reader
error, a child killed) only costs time: B is then opened here, so its error, if any, is
raised here as without this module.  The child never returns into the caller's code: it
leaves by ``os._exit``.
"""
from __future__ import annotations

import os
import pickle
import sys
import threading
import warnings
from typing import Any, Callable, Optional, Tuple

__all__ = ["open_pair", "enabled"]


#: how the last :func:`open_pair` opened B: "child" (forked) or "here"; the child's pid (0: none)
last_mode = ""
last_pid = 0


def enabled() -> bool:
    """Whether B is read by a child (module doc): ``OPDUMP_COMPARE_PARALLEL_OPEN`` ``1``
    forces it, ``0`` turns it off, unset leaves it to an idle CPU; never off Linux or with
    other Python threads running (forking them is unsafe).  The same rule decides whether a
    large CSV table's second half is made by a child (:mod:`.csv_halves`)."""
    switch = os.environ.get("OPDUMP_COMPARE_PARALLEL_OPEN", "")
    if switch == "0" or not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    if threading.active_count() != 1:
        return False
    if switch == "1":
        return True
    if "torch" in sys.modules:      # unset: a process with torch's thread pools (a training script,
        return False                # a notebook) is not forked; the `opdump compare` command has none
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    if cpus < 2:
        return False
    try:
        load = os.getloadavg()[0]
    except OSError:
        return False
    return load < cpus - 1 or _others_running() < cpus - 1


def _others_running() -> int:
    """Processes runnable now besides this one (``/proc/loadavg``'s running count); a large
    number when it cannot be read."""
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return 1 << 30
    return max(0, running - 1)


#: the pipe's buffers on either side (the pickle streams through them)
_BUFFER = 1 << 20


def _child(w: int, b: Any, open_dump: Callable[[Any], Any]) -> None:
    """In the forked child: open ``b``, build its records, pickle them into ``w``, exit."""
    code = 1
    try:
        with warnings.catch_warnings(record=True) as shown:
            d = open_dump(b)
            d.records()
        said = [(str(x.message), x.category, x.filename, x.lineno) for x in shown]
        _send(w, (d, said))
        code = 0
    except BaseException:  # noqa: BLE001 - the parent opens B itself
        pass
    finally:
        os._exit(code)


def _send(w: int, obj: Any) -> None:
    """Pickle ``obj`` into the pipe ``w`` as it is made (framed: the parent unpickles the
    frames while the later ones are being made), then close it."""
    with os.fdopen(w, "wb", buffering=_BUFFER) as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


def _collect(r: int, pid: int) -> Optional[Any]:
    """The child's dump (None when it failed): unpickled from its pipe as it arrives, the
    rest of the pipe drained, the child reaped; used only when the child exited with 0
    (a child that dies mid-way leaves a torn pickle: B is then opened here)."""
    got = None
    try:
        with os.fdopen(r, "rb", buffering=_BUFFER) as f:
            try:
                got = pickle.load(f)
            except Exception:  # noqa: BLE001 - a torn or empty pickle: open B here
                got = None
            while f.read(_BUFFER):                  # nothing should be left; never leave the child blocked
                got = None
    finally:
        _, status = os.waitpid(pid, 0)
    if got is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    d, said = got
    for message, category, filename, lineno in said:
        warnings.warn_explicit(message, category, filename, lineno)
    return d


def open_pair(a: Any, b: Any, open_dump: Callable[[Any], Any]) -> Tuple[Any, Any]:
    """``(open_dump(a), open_dump(b))``, B read (and its records built) by a forked child
    while A is read here when :func:`enabled` (module doc); A's error, if any, is raised
    after the child is reaped."""
    global last_mode, last_pid
    last_mode, last_pid = "here", 0
    if not enabled():
        return open_dump(a), open_dump(b)
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return open_dump(a), open_dump(b)
    if pid == 0:                                    # the child
        os.close(r)
        _child(w, b, open_dump)
    last_pid = pid
    os.close(w)
    try:
        da = open_dump(a)
        try:
            da.records()                            # A's share while B's is made: compare needs both
        except Exception:  # noqa: BLE001 - raised again where compare asks for the records
            pass
    except BaseException:
        _collect(r, pid)                            # no child left behind
        raise
    db = _collect(r, pid)
    if db is None:
        db = open_dump(b)
    else:
        last_mode = "child"
    return da, db
