"""Running the tensor metrics of many pairs: in this process for a few small ones, else in
a pool of worker processes sized to the CPUs this process may use.

* **largest pairs first**: tasks are sorted by bytes, so a multi-GB pair does not start
  last and leave the other workers idle at the end; small pairs follow in batches (one
  round trip for up to 64 pairs or 32 MB); pairs of at most one metric chunk go in batches
  of up to 2,048 pairs / 512 KB, compared together by :mod:`opdump.analysis.metrics_batch`
  (one read per file into a shared buffer, element-wise work once per batch);
* the workers start once (fork where safe), stream their files themselves and send back
  only the metrics dict: no array is pickled, no process starts per pair;
* each worker's numpy BLAS runs on one thread (:func:`opdump.analysis.blas.single_thread_blas`):
  the parallelism is the pool's, and the digits do not depend on the core count;
* a bounded number of batches is in flight, and workers read through fixed-size buffers,
  so memory stays bounded whatever the dump's size.
"""
from __future__ import annotations

import itertools
import os
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..common import progress_bar
from ..blas import set_blas_threads
from ..metrics import _task
from ..metrics_batch import batch_metrics, batchable

__all__ = ["run_pairs", "default_workers"]

#: (index, path A, path B, bytes of both, layout A, layout B); the layouts may be None
Task = Tuple[Any, ...]

#: below this many bytes in all, pairs are compared in this process (a pool costs ~0.1 s to start)
PARALLEL_MIN_BYTES = 64 << 20


def default_workers() -> int:
    """The CPUs this process may run on (its affinity mask), at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def _mp_context():
    import multiprocessing as mp
    methods = mp.get_all_start_methods()
    if sys.platform.startswith("linux") and sys.version_info < (3, 12) and "fork" in methods:
        return mp.get_context("fork")
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        try:
            ctx.set_forkserver_preload(["opdump.analysis.metrics"])
        except Exception:  # pragma: no cover
            pass
        return ctx
    return mp.get_context("spawn")


def _worker_init() -> None:
    set_blas_threads(1)


#: batches of small pairs (at most one metric chunk each, :func:`.metrics_batch.batchable`)
SMALL_BATCH_BYTES = 512 << 10         # float64 work arrays of a batch stay near the L2 cache
SMALL_BATCH_COUNT = 2048


def _split(tasks: List[Task]) -> Tuple[List[Task], List[Task]]:
    """(pairs compared one by one, pairs compared in batches), order kept."""
    one, many = [], []
    for t in tasks:
        (many if len(t) > 5 and batchable(t[4], t[5]) else one).append(t)
    return one, many


def _batches(tasks: List[Task], max_bytes: int = 32 << 20, max_count: int = 64) -> Iterator[List[Task]]:
    cur: List[Task] = []
    size = 0
    for t in tasks:
        cur.append(t)
        size += t[3]
        if size >= max_bytes or len(cur) >= max_count:
            yield cur
            cur, size = [], 0
    if cur:
        yield cur


def run_pairs(tasks: List[Task], workers: int, parallel_min: int, progress: bool,
              max_inflight: Optional[int] = None) -> Dict[int, Dict[str, Any]]:
    """Metrics of every task, by index; in worker processes when there are ``parallel_min``
    or more pairs, or more than :data:`PARALLEL_MIN_BYTES` in at least two pairs. A pair
    whose file cannot be read gets an ``error`` entry, never an exception."""
    results: Dict[int, Dict[str, Any]] = {}
    bar = progress_bar(progress, len(tasks), "compare", "pair")
    tasks = sorted(tasks, key=lambda t: -t[3])
    total = sum(t[3] for t in tasks)
    parallel = workers > 1 and (len(tasks) >= parallel_min or (len(tasks) >= 2 and total >= PARALLEL_MIN_BYTES))
    one, many = _split(tasks)
    if not parallel:
        for t in one:
            idx, m = _task(t)
            results[idx] = m
            if bar is not None:
                bar.update(1)
        for b in _batches(many, SMALL_BATCH_BYTES, SMALL_BATCH_COUNT):
            for idx, m in batch_metrics(b):
                results[idx] = m
            if bar is not None:
                bar.update(len(b))
    else:
        inflight_cap = max_inflight or workers * 2
        per_batch = max(1, min(64, len(one) // (workers * 4) or 1))
        small = max(1, min(SMALL_BATCH_COUNT, len(many) // (workers * 4) or 1))
        with ProcessPoolExecutor(max_workers=workers, mp_context=_mp_context(), initializer=_worker_init) as ex:
            pending = set()
            it = itertools.chain(_batches(one, max_count=per_batch),
                                 _batches(many, SMALL_BATCH_BYTES, small))
            exhausted = False
            while True:
                while not exhausted and len(pending) < inflight_cap:
                    try:
                        b = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    f = ex.submit(batch_metrics, b)
                    f.tasks = b  # type: ignore[attr-defined]
                    pending.add(f)
                if not pending:
                    break
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    try:
                        out = f.result()
                    except Exception as e:  # noqa: BLE001 - a worker died (e.g. killed for memory)
                        out = [(t[0], {"error": f"cannot compare {t[1]} / {t[2]}: worker failed: {e}",
                                       "unreadable": t[1], "n": 0}) for t in f.tasks]
                    for idx, m in out:
                        results[idx] = m
                    if bar is not None:
                        bar.update(len(out))
    if bar is not None:
        bar.close()
    return results
