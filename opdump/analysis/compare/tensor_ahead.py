"""The metrics of a tensor-file compare started before its pairs are known: the workers
compare A's and B's files position by position while this process reads the headers,
pairs the records and builds the table's columns (:mod:`.tensor_fast`).

Why: in a dump of many small tensors (32,700 pairs of ~2 KB) the main process spends
~0.7 s reading 65,400 headers, pairing and building columns while the worker pool is not
yet started, then waits ~0.5 s for the pool while it does nothing: on two cores one of
them is idle for most of the compare.  :mod:`.tensor_fast` only answers when A's and B's
records are the same sequence of tensors within each iteration pair, so position-by-position
pairs are, in practice, the pairs it makes; their files' sizes are known from the folder
scan, so the work can be ordered (largest first) and batched before any header is read.

Guarantee: a pair's metrics are used only when the pair :mod:`.tensor_fast` made has the
same two paths *and* the same two layouts (header shape, dtype, data offset, order) as
the worker read -- and then they are the dict :func:`opdump.analysis.metrics_batch.batch_metrics`
gives for that task, the function :func:`.pool.run_pairs` runs on it (its result does not
depend on which other pairs share the batch: tests/test_compare_batch_metrics.py).  Every
other pair (a different pairing, a header that changed, a worker that failed) goes to
:func:`.pool.run_pairs` as before.  The pool is shut down before :meth:`Ahead.take`
returns or :meth:`Ahead.close` does (no worker outlives the compare; no thread stays
behind to make a later fork unsafe).  Memory: the task list (paths and sizes) and the
metrics dicts, as :func:`.pool.run_pairs` holds them; the workers read through the same
bounded batches.

When: the metric stage would run in worker processes anyway (the rule of
:func:`.pool.run_pairs`: at least two workers, ``parallel_min`` pairs or
:data:`.pool.PARALLEL_MIN_BYTES` of data), on Linux with ``fork`` (no start-up cost, no
re-import), and ``OPDUMP_COMPARE_AHEAD`` is not ``0``.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Ahead", "start"]

#: batches of pairs above this many bytes (both files) hold few pairs (pool.py's "one" batches)
_BIG = 1 << 20


def _work(items: Sequence[Tuple[str, int, str, int]]) -> List[Tuple[str, str, Any, Any, Dict[str, Any]]]:
    """In a worker: (path A, path B, layout A, layout B, metrics) of each item (path A, size A,
    path B, size B) whose two headers read (the others are left to the main process)."""
    from ..metrics_batch import batch_metrics
    from ..reader.npy import npy_layouts_sized
    paths, sizes = [], []
    for pa, sa, pb, sb in items:
        paths += (pa, pb)
        sizes += (sa, sb)
    lays = npy_layouts_sized(paths, sizes)
    tasks = []
    for k in range(len(items)):
        la, lb = lays[2 * k], lays[2 * k + 1]
        if isinstance(la, Exception) or isinstance(lb, Exception):
            continue
        tasks.append((k, paths[2 * k], paths[2 * k + 1], _nbytes(la) + _nbytes(lb), la, lb))
    by_k = {t[0]: t for t in tasks}
    return [(by_k[k][1], by_k[k][2], by_k[k][4], by_k[k][5], m) for k, m in batch_metrics(tasks)]


def _nbytes(layout) -> int:
    n = layout[1].itemsize
    for x in layout[0]:
        n *= x
    return n


def _batches(items: List[Tuple[str, int, str, int]], workers: int) -> List[list]:
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
    """The futures of the speculative batches; :meth:`take` hands over what matches."""

    def __init__(self, executor, futures):
        self.executor, self.futures = executor, futures

    def take(self, tasks: List[tuple]) -> Tuple[Dict[Any, Dict[str, Any]], List[tuple]]:
        """(metrics by index of the tasks answered ahead, the tasks left to :func:`.pool.run_pairs`);
        tasks are ``(index, path A, path B, bytes, layout A, layout B)``.  Waits for every batch
        and shuts the pool down."""
        done: Dict[Tuple[str, str], Tuple[Any, Any, Dict[str, Any]]] = {}
        try:
            for f in self.futures:
                try:
                    for pa, pb, la, lb, m in f.result():
                        done[(pa, pb)] = (la, lb, m)
                except Exception:  # noqa: BLE001 - a worker failed: those pairs are computed again
                    pass
        finally:
            self.close()
        got: Dict[Any, Dict[str, Any]] = {}
        rest: List[tuple] = []
        for t in tasks:
            hit = done.get((t[1], t[2])) if len(t) > 5 else None
            if hit is not None and _same_layout(hit[0], t[4]) and _same_layout(hit[1], t[5]):
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


def start(sides, positions, workers: Optional[int], parallel_min: int) -> Optional[Ahead]:
    """Start the workers on the position-by-position pairs, or None when the metric stage would
    not use workers (module doc).  ``sides``: (A records, B records) per rank pair;
    ``positions``: per rank pair, the (A rows, B rows) arrays of each iteration pair."""
    import sys
    from .pool import PARALLEL_MIN_BYTES, _mp_context, _worker_init
    if not enabled() or workers is None or workers < 2 or not sys.platform.startswith("linux"):
        return None
    items: List[Tuple[str, int, str, int]] = []
    for (sa, sb), blocks in zip(sides, positions):
        if "nbytes" not in sa.columns or "nbytes" not in sb.columns:
            return None
        pa_all, pb_all = sa["path"].to_numpy(dtype=object), sb["path"].to_numpy(dtype=object)
        na_all, nb_all = sa["nbytes"].to_numpy(dtype=object), sb["nbytes"].to_numpy(dtype=object)
        for ra, rb in blocks:
            if len(ra) != len(rb) or not len(ra):
                continue
            for pa, na, pb, nb in zip(pa_all[ra].tolist(), na_all[ra].tolist(), pb_all[rb].tolist(),
                                      nb_all[rb].tolist()):
                if type(na) is int and type(nb) is int:
                    items.append((pa, na, pb, nb))
    total = sum(t[1] + t[3] for t in items)
    if not (len(items) >= parallel_min or (len(items) >= 2 and total >= PARALLEL_MIN_BYTES)):
        return None
    ctx = _mp_context()
    if ctx.get_start_method() != "fork":
        return None
    from concurrent.futures import ProcessPoolExecutor
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init)
    try:
        futures = [ex.submit(_work, b) for b in _batches(items, workers)]
    except Exception:  # noqa: BLE001 - no pool: the metric stage runs as before
        ex.shutdown(wait=True, cancel_futures=True)
        return None
    return Ahead(ex, futures)


def positions_of(it_a, it_b, it_pairs, positions) -> List[Tuple[np.ndarray, np.ndarray]]:
    """(A rows, B rows) of each iteration pair (``positions``: :func:`.stat_fast._positions`)."""
    pos_a, pos_b = positions(it_a), positions(it_b)
    out = []
    for ia, ib in it_pairs:
        ra, rb = pos_a.get(ia), pos_b.get(ib)
        if ra is not None and rb is not None:
            out.append((ra, rb))
    return out
