"""The metrics of a tensor-file compare started before its pairs are known, and the header
index made by the same reads: the workers read A's and B's files position by position,
each small file whole in one ``pread`` (header and data), and compare them, while the
records are still being paired; their headers then serve the header index of
:mod:`.tensor_fast` and their metrics the pairs it makes.

Why: in a dump of many small tensors (32,700 pairs of 2-4 KB) each file used to be opened
twice -- its header read by the main process (0.33 s of one core for 65,400 files: system
calls), its data by a worker -- with one core idle during the header index.  Now each
small file costs one ``open``/``pread``/``close``, in a worker: main process 2.1 -> 1.8 s
of CPU, workers +0.1 s.  :mod:`.tensor_fast` only answers when A's and B's records are
the same sequence of tensors within each iteration pair, so position-by-position pairs
are, in practice, the pairs it makes; the files' sizes are known from the folder scan, so
the work is ordered (largest first) and batched before any header is read.

Guarantee: the header index answers with the layout the worker read, which is what
:func:`.reader.npy.npy_layouts_sized` gives for that file and scan size (the same parse and
size check; anything else -- a file of another size now, an unreadable header, a bin
tensor -- goes through that function itself, and a header a worker could not read is read
again here, so its error text is the usual one).  A pair's metrics are used only when the
pair :mod:`.tensor_fast` made has the same two paths *and* the same two layouts as the
worker's -- and then they are the dict :func:`opdump.analysis.metrics_batch.batch_metrics`
gives for that task, the function :func:`.pool.run_pairs` runs (its result does not depend
on which other pairs share the batch: tests/test_compare_batch_metrics.py; the data region
is served from the bytes the worker read, the bytes a read gives).  Every other pair (a
different pairing, a worker that failed) goes to :func:`.pool.run_pairs` as before.  The
value tie-break's fingerprint of an output file a worker read whole (``Ahead.tails``) is
``hash`` of those bytes, what ``hash(match._tail(path))`` gives (a file of at most 64 KiB
is its own tail; a forked worker hashes with this process's secret).  Files
that change while the compare runs may be seen before or after the change, as on the
per-pair path.  The pool is shut down once the results are collected, and by
:meth:`Ahead.close` (no worker outlives the compare; no thread stays behind to make a
later fork unsafe).  Memory: the task list (paths and sizes), the headers and the metrics
dicts, as :func:`.pool.run_pairs` holds them; a worker holds one batch's small files
(batches of :data:`.pool.SMALL_BATCH_BYTES`), larger files are streamed as before.

When: the metric stage would run in worker processes anyway (the rule of
:func:`.pool.run_pairs`: at least two workers, ``parallel_min`` pairs or
:data:`.pool.PARALLEL_MIN_BYTES` of data), on Linux with ``fork`` (no start-up cost, no
re-import), and ``OPDUMP_COMPARE_AHEAD`` is not ``0``.
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..metrics_batch import batch_metrics
from ..reader import bincache
from ..reader.npy import _fast_header, npy_layouts_sized, read_regions
from .match import _FINGERPRINT_BYTES as _TAIL_BYTES        # a file this small is its own fingerprint tail

__all__ = ["Ahead", "start"]

#: batches of pairs above this many bytes (both files) hold few pairs (pool.py's "one" batches)
_BIG = 1 << 20
#: files up to this size are read whole by the worker (header and data: one ``pread``)
WHOLE_MAX = 64 << 10


_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
#: files opened and announced to the kernel at once (cold cache: their reads are queued together)
WINDOW = 256


def _whole(path: str, size: int) -> bool:
    """Whether the file is read whole (small, a plain ``.npy`` of known size)."""
    return 0 < size <= WHOLE_MAX and bincache.entry(path) is None


def _read_whole(path: str, size: int, fd: int = -1):
    """(layout, the file's bytes or None) of one file as :func:`.reader.npy.npy_layouts_sized`
    reads it given the scan's ``size`` -- the same layout or exception -- with the whole file
    read in one ``pread`` when it is small and its length is still ``size`` (else the bytes
    are None and the data is read later by :func:`.reader.npy.read_regions`).  ``fd``: the
    file already open (the caller closes it)."""
    if _whole(path, size):
        try:
            if fd >= 0:
                data = os.pread(fd, size, 0)
            else:
                fd = os.open(path, os.O_RDONLY)
                try:
                    data = os.pread(fd, size, 0)
                finally:
                    os.close(fd)
        except OSError:
            data = b""
        fast = _fast_header(data) if len(data) == size else None
        if fast is not None:
            shape, fortran, dtype, offset = fast
            if offset + math.prod(shape) * dtype.itemsize <= size:
                return (shape, dtype, offset, fortran), data
    return npy_layouts_sized([path], [size])[0], None


def _read_all(files: List[Tuple[str, int]]) -> List[Tuple[Any, Optional[bytes]]]:
    """:func:`_read_whole` of each (path, size), :data:`WINDOW` files at a time opened and
    announced (``posix_fadvise(WILLNEED)``) before the first is read: on a cold cache their
    reads are in flight together instead of one after the other."""
    out: List[Tuple[Any, Optional[bytes]]] = []
    for w in range(0, len(files), WINDOW):
        part = files[w:w + WINDOW]
        fds: List[int] = []
        try:
            for path, size in part:
                fd = -1
                if _whole(path, size):
                    try:
                        fd = os.open(path, os.O_RDONLY)
                        if _WILLNEED is not None:
                            os.posix_fadvise(fd, 0, size, _WILLNEED)
                    except OSError:
                        pass
                fds.append(fd)
            for (path, size), fd in zip(part, fds):
                out.append(_read_whole(path, size, fd))
        finally:
            for fd in fds:
                if fd >= 0:
                    os.close(fd)
    return out


def _work(items: Sequence[Tuple[str, int, str, int, bool]]):
    """In a worker: ``(layouts, results, tails)`` -- ``layouts`` the layout (or None: unreadable,
    left to the main process) of every file of ``items`` (path A, size A, path B, size B,
    whether they are output tensors; A's then B's, item by item), ``results`` (position in
    ``items``, metrics) of each item whose two headers read, and ``tails`` (position among
    the files, ``hash`` of the bytes) of the output files read whole: the value tie-break's
    fingerprint, ``hash(match._tail(path))`` -- a whole small file is its last 64 KiB, and a
    forked worker hashes bytes with this process's hash secret.  Small files are read once,
    whole; their data regions are served from those bytes."""
    held: Dict[str, bytes] = {}
    lays: List[Any] = []
    tails: List[Tuple[int, int]] = []
    files = [f for pa, sa, pb, sb, _ in items for f in ((pa, sa), (pb, sb))]
    for i, ((p, _), (lay, data)) in enumerate(zip(files, _read_all(files))):
        if isinstance(lay, Exception):
            lay = None
        elif data is not None:
            held[p] = data
            if items[i >> 1][4] and len(data) <= _TAIL_BYTES:
                tails.append((i, hash(data)))
        lays.append(lay)

    def read(jobs):
        """read_regions' contract, from the bytes held (the same bytes a read gives now)."""
        errs: List[Optional[Exception]] = [None] * len(jobs)
        other = []
        for i, (path, layout, view) in enumerate(jobs):
            data = held.get(path)
            if data is not None and layout[2] + view.nbytes <= len(data):
                view[:] = memoryview(data)[layout[2]:layout[2] + view.nbytes]
            else:
                other.append(i)
        if other:
            for i, e in zip(other, read_regions([jobs[i] for i in other])):
                errs[i] = e
        return errs

    tasks = []
    for k, (pa, _, pb, _, _) in enumerate(items):
        la, lb = lays[2 * k], lays[2 * k + 1]
        if la is not None and lb is not None:
            tasks.append((k, pa, pb, _nbytes(la) + _nbytes(lb), la, lb))
    return lays, batch_metrics(tasks, read), tails   # by position in the batch: no path travels back


def _nbytes(layout) -> int:
    n = layout[1].itemsize
    for x in layout[0]:
        n *= x
    return n


def _batches(items: List[Tuple[str, int, str, int, bool]], workers: int) -> List[list]:
    """``items`` largest first, in batches as :func:`.pool.run_pairs` cuts them: big pairs a few
    per batch, small ones by bytes and count (one round trip for many)."""
    from .pool import SMALL_BATCH_BYTES, SMALL_BATCH_COUNT, _batches as cut
    items = sorted(items, key=lambda t: -(t[1] + t[3]))
    big = [t for t in items if t[1] + t[3] > _BIG]
    small = [t for t in items if t[1] + t[3] <= _BIG]
    per_big = max(1, min(64, len(big) // (workers * 4) or 1))
    per_small = max(1, min(SMALL_BATCH_COUNT, len(small) // (workers * 4) or 1))
    as_task = lambda t: (t, None, None, t[1] + t[3])             # noqa: E731 - cut() reads [3]
    out = [[x[0] for x in b] for b in cut([as_task(t) for t in big], max_count=per_big)]
    out += [[x[0] for x in b] for b in cut([as_task(t) for t in small], SMALL_BATCH_BYTES, per_small)]
    return out


class Ahead:
    """The futures of the speculative batches: :meth:`layouts` waits for them and hands the
    headers the workers read to the header index, :meth:`take` the metrics that match."""

    def __init__(self, executor, futures, batches, progress: bool = False):
        self.executor, self.futures, self.batches, self.progress = executor, futures, batches, progress
        self.known: Optional[Dict[str, Any]] = None
        self.done: Dict[Tuple[str, str], Tuple[Any, Any, Dict[str, Any]]] = {}
        #: path -> ``hash(match._tail(path))`` of the output files the workers read whole
        self.tails: Dict[str, int] = {}

    def _collect(self) -> None:
        if self.known is not None:
            return
        self.known = {}
        from ..common import progress_bar
        bar = progress_bar(self.progress, sum(map(len, self.batches)), "compare", "pair")
        try:
            for f, items in zip(self.futures, self.batches):
                try:
                    lays, results, tails = f.result()
                except Exception:  # noqa: BLE001 - a worker failed: those files are read again here
                    continue
                finally:
                    if bar is not None:
                        bar.update(len(items))
                for (pa, _, pb, _, _), la, lb in zip(items, lays[0::2], lays[1::2]):
                    if la is not None:
                        self.known[pa] = la
                    if lb is not None:
                        self.known[pb] = lb
                for i, h in tails:
                    self.tails[items[i >> 1][2 * (i & 1)]] = h
                for k, m in results:
                    self.done[(items[k][0], items[k][2])] = (lays[2 * k], lays[2 * k + 1], m)
        finally:
            if bar is not None:
                bar.close()
            self.close()

    def layouts(self, read):
        """``read`` (compare's header index: paths, sizes -> layouts or exceptions) answering
        from the headers the workers read, reading only the others."""
        self._collect()
        known = self.known

        def index(paths: List[str], sizes: Optional[List[int]] = None) -> List[Any]:
            out: List[Any] = [known.get(p) for p in paths]
            miss = [i for i, x in enumerate(out) if x is None]
            if miss:
                got = read([paths[i] for i in miss], [sizes[i] for i in miss] if sizes is not None else None)
                for i, x in zip(miss, got):
                    out[i] = x
            return out
        return index

    def take(self, tasks: List[tuple]) -> Tuple[Dict[Any, Dict[str, Any]], List[tuple]]:
        """(metrics by index of the tasks answered ahead, the tasks left to :func:`.pool.run_pairs`);
        tasks are ``(index, path A, path B, bytes, layout A, layout B)``."""
        self._collect()
        got: Dict[Any, Dict[str, Any]] = {}
        rest: List[tuple] = []
        for t in tasks:
            hit = self.done.get((t[1], t[2])) if len(t) > 5 else None
            if hit is not None and (hit[0] is t[4] or _same_layout(hit[0], t[4])) and (
                    hit[1] is t[5] or _same_layout(hit[1], t[5])):  # the same objects: the headers handed over
                got[t[0]] = hit[2]
            else:
                rest.append(t)
        return got, rest

    def close(self) -> None:
        """Cancel what has not started, wait for the workers to leave."""
        if self.executor is not None:
            ex, self.executor = self.executor, None
            ex.shutdown(wait=True, cancel_futures=True)


def _same_layout(x, y) -> bool:
    return (x is not None and y is not None and tuple(x[0]) == tuple(y[0]) and x[1] == y[1]
            and x[2] == y[2] and bool(x[3]) == bool(y[3]))


def enabled() -> bool:
    return os.environ.get("OPDUMP_COMPARE_AHEAD", "1") != "0"


def start(sides, positions, workers: Optional[int], parallel_min: int, progress: bool = False) -> Optional[Ahead]:
    """Start the workers on the position-by-position pairs, or None when the metric stage would
    not use workers (module doc).  ``sides``: (A records, B records) per rank pair;
    ``positions``: per rank pair, the (A rows, B rows) arrays of each iteration pair."""
    import sys
    from .pool import PARALLEL_MIN_BYTES, _mp_context, _worker_init
    if not enabled() or workers is None or workers < 2 or not sys.platform.startswith("linux"):
        return None
    items: List[Tuple[str, int, str, int, bool]] = []
    for (sa, sb), blocks in zip(sides, positions):
        if blocks is None or "nbytes" not in sa.columns or "nbytes" not in sb.columns or not _alike(sa, sb, blocks):
            return None
        pa_all, pb_all = sa["path"].to_numpy(dtype=object), sb["path"].to_numpy(dtype=object)
        na_all, nb_all = sa["nbytes"].to_numpy(dtype=object), sb["nbytes"].to_numpy(dtype=object)
        out_all = sa["io"].to_numpy(dtype=object) == "output"       # B's io is A's (_alike)
        for ra, rb in blocks:
            if len(ra) != len(rb) or not len(ra):
                continue
            for pa, na, pb, nb, out in zip(pa_all[ra].tolist(), na_all[ra].tolist(), pb_all[rb].tolist(),
                                           nb_all[rb].tolist(), out_all[ra].tolist()):
                if type(na) is int and type(nb) is int:
                    items.append((pa, na, pb, nb, out))
    total = sum(t[1] + t[3] for t in items)
    if not (len(items) >= parallel_min or (len(items) >= 2 and total >= PARALLEL_MIN_BYTES)):
        return None
    ctx = _mp_context()
    if ctx.get_start_method() != "fork":
        return None
    from concurrent.futures import ProcessPoolExecutor
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init)
    try:
        batches = _batches(items, workers)
        futures = [ex.submit(_work, b) for b in batches]
    except Exception:  # noqa: BLE001 - no pool: the metric stage runs as before
        ex.shutdown(wait=True, cancel_futures=True)
        return None
    return Ahead(ex, futures, batches, progress)


def positions_of(it_a, it_b, it_pairs, positions) -> Optional[List[Tuple[np.ndarray, np.ndarray]]]:
    """(A rows, B rows) of each iteration pair (``positions``: :func:`.stat_fast._positions`), or
    None when an iteration pair holds a different number of rows on each side (the column-wise
    compare then steps aside: nothing to start)."""
    pos_a, pos_b = positions(it_a), positions(it_b)
    out = []
    for ia, ib in it_pairs:
        ra, rb = pos_a.get(ia), pos_b.get(ib)
        if (0 if ra is None else len(ra)) != (0 if rb is None else len(rb)):
            return None
        if ra is not None and rb is not None:
            out.append((ra, rb))
    return out


#: columns the column-wise pairing requires equal position by position (.stat_fast._SAME)
_SAME = ("kind", "op", "op_file", "op_type", "io", "slot", "call", "graph")


def _alike(sa, sb, blocks) -> bool:
    """Whether A's and B's rows agree position by position in the columns the column-wise
    pairing requires equal before it reads any header: when they do not, that path steps
    aside and the per-pair stages pair the records -- work started ahead would be wasted."""
    if not blocks:
        return True
    ai = np.concatenate([ra for ra, _ in blocks])
    bi = np.concatenate([rb for _, rb in blocks])
    for c in _SAME:
        if c not in sa.columns or c not in sb.columns:
            return False
        if not bool(np.all(sa[c].to_numpy(dtype=object)[ai] == sb[c].to_numpy(dtype=object)[bi])):
            return False
    return True
