"""What runs besides the training thread during an every-step eager overflow watch
(``op_debug_mode`` 3; README "Debug dumps"), per step, watch on vs off.

Why: the watch's wall-time ratio (bench/overflow_watch.py) is larger than its training-thread
CPU ratio; the difference is time the step waits, or loses a core, to other threads on a small
machine.  This probe splits it, from the kernel's own per-thread accounting, which a
neighbour's load changes little (``/proc/self/task/<tid>/schedstat``: nanoseconds on a CPU,
nanoseconds runnable but waiting for a core, time slices; ``status``: voluntary and
involuntary context switches):

* the **training thread** (CPU, run-queue wait, switches: a voluntary switch is a wait on
  the writer, the GIL or a lock),
* the **writer threads** (``opdump-writer*``: CPU, time slices = wake-ups),
* **other threads** (torch's intra-op pool, …),
* what the session hands the writer per step (jobs by the function that made them), the
  manifest rewrites (and on which thread), and the training thread's time in the lag wait.

Plain and watched steps run in blocks, alternating, in one process with one session (the
capture toggled around the watched blocks, as :class:`bench.modes.EagerToggle` does).

    .venv/bin/python bench/watch_threads.py [--models alexnet,transformer] [--steps 10] [--rounds 4]
    .venv/bin/python bench/watch_threads.py --ab defer|nice --threads 1   # in-process A/B, watched steps

Findings (2026-11-24, 1 torch thread, load average 10-12 from neighbours: counts and CPU, not
wall): a clean watched step's writer work is one folder and three small files (the iteration's
execution order, ``overflow.json``, ``overflow.csv``: README's contract), ~0.5-1 ms of the
writer's CPU, most of it the file system's creates and renames (AlexNet; the transformer's
52 KB execution order: ~1 ms of a ~500 ms step).  Before the iteration end's jobs were
deferred (``BackgroundWriter.defer``) they reached the writer threads as 2 jobs and the
manifest was written twice a step on the training thread (54 us each); now 1 job and 1
write (9 us): writer time slices 6.7-10.6 -> 1.5-3.5 a step, its voluntary switches 5-9 ->
1.5-2.7, the training thread's voluntary switches (GIL and lock waits) 0.5-3.2 -> 0.2-0.3.
The writer at nice +19 (``--ab nice``): no difference in wall time at this load, the
training thread then waits for the starved writer at the lag bound (1.7 voluntary switches a
step); not adopted.  The rest of the wall-vs-CPU gap is not other threads: the watch's added
work is serial on the training thread while the plain step's compute runs on both intra-op
threads, so it weighs (added ms) / (2-thread step ms) in the wall ratio, against (added ms) /
(1-thread step ms) in the single-thread CPU ratio.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import threading
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from bench import dumps as D  # noqa: E402
from bench import models as M  # noqa: E402

WATCH = dict(op_debug_mode=3)


def _threads() -> dict:
    """tid -> (name, cpu ns, run-queue wait ns, slices, voluntary, involuntary switches)."""
    out = {}
    base = "/proc/self/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                cpu, wait, slices = (int(x) for x in f.read().split()[:3])
            with open(f"{base}/{tid}/comm") as f:
                name = f.read().strip()
            vol = inv = 0
            with open(f"{base}/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vol = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        inv = int(line.split()[1])
        except OSError:
            continue
        out[int(tid)] = (name, cpu, wait, slices, vol, inv)
    return out


def _writer_tids() -> set:
    """The kernel ids of the writer threads (Python names them; the kernel's ``comm`` does not)."""
    return {t.native_id for t in threading.enumerate() if t.name.startswith("opdump-writer")}


def _group(tid: int, name: str, main: int) -> str:
    if tid == main:
        return "train"
    if tid in _writer_tids():
        return "writer"
    return "other"


def _delta(before: dict, after: dict, main: int) -> dict:
    """Per group: [cpu ns, wait ns, slices, voluntary, involuntary] from ``before`` to ``after``."""
    out = collections.defaultdict(lambda: [0, 0, 0, 0, 0])
    for tid, row in after.items():
        old = before.get(tid, (row[0], 0, 0, 0, 0, 0))
        acc = out[_group(tid, row[0], main)]
        for k in range(5):
            acc[k] += row[k + 1] - old[k + 1]
    return out


class _Tally:
    """Counts what the session hands the writer, the manifest rewrites and the lag waits."""

    def __init__(self, session):
        self.jobs = collections.Counter()
        self.manifest = collections.Counter()
        self.manifest_s = 0.0
        self.wait_s = 0.0
        self.waits = 0
        writer = session.writer
        submit, wait = writer.submit, writer.wait
        tally = self

        def counted_submit(fn, nbytes=0, **kw):
            code = getattr(fn, "__code__", None)
            where = (f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}:{code.co_name}"
                     if code is not None else type(fn).__name__)
            tally.jobs[where] += 1
            return submit(fn, nbytes, **kw)

        def timed_wait(jobs):
            t0 = time.perf_counter()
            try:
                return wait(jobs)
            finally:
                if threading.current_thread() is threading.main_thread():
                    tally.wait_s += time.perf_counter() - t0
                    tally.waits += 1
        writer.submit, writer.wait = counted_submit, timed_wait
        pool_submit = writer._pool.submit

        def counted_pool(*a, **kw):             # what reaches the threads: one wake-up each
            tally.jobs["(handed to the writer threads)"] += 1
            return pool_submit(*a, **kw)
        writer._pool.submit = counted_pool
        from opdump.write import manifest as MF
        self._cls, self._write = MF.Manifest, MF.Manifest.write

        def timed_write(this, doc):
            t0 = time.perf_counter()
            try:
                return tally._write(this, doc)
            finally:
                thread = "train" if threading.current_thread() is threading.main_thread() else "writer"
                tally.manifest[thread] += 1
                if thread == "train":
                    tally.manifest_s += time.perf_counter() - t0
        MF.Manifest.write = timed_write

    def restore(self):
        self._cls.write = self._write

    def snapshot(self):
        return (collections.Counter(self.jobs), collections.Counter(self.manifest), self.manifest_s,
                self.wait_s, self.waits)


def measure(name: str, steps: int, rounds: int, quick: bool) -> dict:
    import opdump
    from bench.modes import EagerToggle, eager_capture_class
    cls, _ = eager_capture_class()
    folder = tempfile.mkdtemp(prefix="opdump-wt-")
    main = threading.get_native_id()
    sums = {False: collections.defaultdict(lambda: [0, 0, 0, 0, 0]), True: collections.defaultdict(lambda: [0, 0, 0, 0, 0])}
    wall = {False: 0.0, True: 0.0}
    counts = {False: None, True: None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = opdump.Session(D.write_config(folder, os.path.join(folder, "dump"), **WATCH))
        session.__enter__()
        tally = _Tally(session)
        try:
            w = M.BUILDERS[name](quick=quick)
            toggle = EagerToggle(cls, session)
            for _ in range(2):
                w.step()
                toggle.enter()
                w.step()
                toggle.exit()
            session.writer.flush()
            agg = {False: [collections.Counter(), collections.Counter(), 0.0, 0.0, 0],
                   True: [collections.Counter(), collections.Counter(), 0.0, 0.0, 0]}
            for r in range(rounds):
                for side in ((False, True) if r % 2 else (True, False)):
                    if side:
                        toggle.enter()
                    s0, t0, c0 = _threads(), time.perf_counter(), tally.snapshot()
                    for _ in range(steps):
                        w.step()
                    t1, s1, c1 = time.perf_counter(), _threads(), tally.snapshot()
                    if side:
                        toggle.exit()
                    session.writer.flush()          # the block's leftover writer work is its own
                    s2 = _threads()
                    wall[side] += t1 - t0
                    for grp, v in _delta(s0, s2, main).items():
                        acc = sums[side][grp]
                        for k in range(5):
                            acc[k] += v[k]
                    a = agg[side]
                    a[0] += c1[0] - c0[0]
                    a[1] += c1[1] - c0[1]
                    a[2] += c1[2] - c0[2]
                    a[3] += c1[3] - c0[3]
                    a[4] += c1[4] - c0[4]
            counts = agg
        finally:
            tally.restore()
            session.__exit__(None, None, None)
    n = steps * rounds
    out = {"name": name, "steps": n, "load": open("/proc/loadavg").read().split()[:3]}
    for side in (False, True):
        label = "watch" if side else "plain"
        out[label] = {"wall_ms": wall[side] / n * 1e3,
                      "threads": {g: [v[0] / n / 1e6, v[1] / n / 1e6, v[2] / n, v[3] / n, v[4] / n]
                                  for g, v in sums[side].items()},
                      "jobs": {k: v / n for k, v in counts[side][0].items()},
                      "manifest": {k: v / n for k, v in counts[side][1].items()},
                      "manifest_ms": counts[side][2] / n * 1e3, "lag_wait_ms": counts[side][3] / n * 1e3,
                      "lag_waits": counts[side][4] / n}
    return out


def report(res: dict) -> str:
    lines = [f"[{res['name']}] {res['steps']} steps per side, load {' '.join(res['load'])}"]
    for label in ("plain", "watch"):
        r = res[label]
        lines.append(f"  {label}: wall {r['wall_ms']:.2f} ms/step; manifest writes {dict(r['manifest'])} "
                     f"({r['manifest_ms']:.3f} ms on the training thread); lag wait {r['lag_wait_ms']:.3f} ms "
                     f"({r['lag_waits']:.2f}/step)")
        for g in ("train", "writer", "other"):
            v = r["threads"].get(g)
            if v:
                lines.append(f"    {g:6s} cpu {v[0]:7.2f} ms  runq wait {v[1]:6.2f} ms  slices {v[2]:6.1f}  "
                             f"vol {v[3]:6.1f}  invol {v[4]:5.1f}  (per step)")
        for k, v in sorted(r["jobs"].items()):
            lines.append(f"    {'' if k.startswith('(') else 'job queued by '}{k}: {v:.2f}/step")
    return "\n".join(lines)


def _set_writer_nice(value: int) -> None:
    for tid in _writer_tids():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, value)
        except OSError:             # raising a thread's priority back needs CAP_SYS_NICE
            pass


def ab(name: str, what: str, steps: int, rounds: int, quick: bool) -> dict:
    """Watched steps only, in alternating blocks: side A vs side B of ``what`` (``defer``: the
    iteration end's jobs deferred and handed over as one, one manifest write -- against one job
    per file and a manifest write at the folder's creation, as before; ``nice``: writer threads
    at nice +19 against 0).  Median wall ms per step of the blocks of each side, and the
    writer's and training thread's per-step figures."""
    import statistics
    import opdump
    from opdump.capture.eager import EagerCapture
    folder = tempfile.mkdtemp(prefix="opdump-wt-")
    main_tid = threading.get_native_id()
    walls = {False: [], True: []}
    sched = {False: collections.defaultdict(lambda: [0, 0, 0, 0, 0]), True: collections.defaultdict(lambda: [0, 0, 0, 0, 0])}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = opdump.Session(D.write_config(folder, os.path.join(folder, "dump"), **WATCH))
        w = M.BUILDERS[name](quick=quick)
        writer = session.writer
        defer = writer.defer
        with session, EagerCapture(session):
            for _ in range(3):
                w.step()
            for r in range(rounds):
                for side in ((False, True) if r % 2 else (True, False)):
                    if what == "defer":
                        writer.defer = defer if side else (lambda before=None: None)
                    else:
                        _set_writer_nice(19 if side else 0)
                    w.step()                    # the switch settles
                    writer.flush()
                    s0, t0 = _threads(), time.perf_counter()
                    for _ in range(steps):
                        w.step()
                    t1 = time.perf_counter()
                    writer.flush()
                    walls[side].append((t1 - t0) / steps * 1e3)
                    for grp, v in _delta(s0, _threads(), main_tid).items():
                        acc = sched[side][grp]
                        for k in range(5):
                            acc[k] += v[k]
            writer.defer = defer
    n = steps * rounds
    out = {"name": name, "what": what, "load": open("/proc/loadavg").read().split()[:3]}
    for side in (False, True):
        out[side] = {"median_ms": statistics.median(walls[side]),
                     "threads": {g: [v[0] / n / 1e6, v[1] / n / 1e6, v[2] / n, v[3] / n, v[4] / n]
                                 for g, v in sched[side].items()}}
    out["ratio"] = out[True]["median_ms"] / out[False]["median_ms"]
    pairs = [b / a for a, b in zip(walls[False], walls[True])]
    out["paired"] = statistics.median(pairs)
    return out


def report_ab(res: dict) -> str:
    names = {"defer": ("one job per file (before)", "deferred, one job"), "nice": ("writer nice 0", "writer nice +19")}
    lines = [f"[{res['name']}] A/B {res['what']}: load {' '.join(res['load'])}; B/A median {res['ratio']:.3f}, "
             f"paired {res['paired']:.3f}"]
    for side in (False, True):
        r = res[side]
        lines.append(f"  {names[res['what']][side]}: {r['median_ms']:.2f} ms/step")
        for g in ("train", "writer", "other"):
            v = r["threads"].get(g)
            if v:
                lines.append(f"    {g:6s} cpu {v[0]:7.2f} ms  runq wait {v[1]:6.2f} ms  slices {v[2]:6.1f}  "
                             f"vol {v[3]:6.1f}  invol {v[4]:5.1f}  (per step)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="alexnet,transformer")
    ap.add_argument("--steps", type=int, default=10, help="steps per block")
    ap.add_argument("--rounds", type=int, default=4, help="blocks per side")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ab", choices=("defer", "nice"), default=None,
                    help="watched steps only, alternating blocks: the deferred end jobs vs one job per file, "
                         "or the writer at nice +19 vs 0")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.ab:
        for name in filter(None, args.models.split(",")):
            print(report_ab(ab(name, args.ab, args.steps, args.rounds, args.quick)), flush=True)
        return 0
    for name in filter(None, args.models.split(",")):
        print(report(measure(name, args.steps, args.rounds, args.quick)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
