#!/usr/bin/env python
"""Where a graph statistics dump's step goes, per tap (issue 24 item 2): one model compiled with
opdump's backend, ``--steps`` dumped steps run under cProfile (``--cprofile FILE``) or bare (for
``perf record -g -p PID``; ``--pause`` seconds printed PID first), with one torch thread.

    .venv/bin/python bench/graph_taps_profile.py [--model decoder] [--steps 40] [--cprofile out.prof]
                                                  [--mode device|host] [--aot-eager] [--root DIR]
                                                  [--split] [--closed] [--blocked] [--threads N]

``--split`` prints the step's parts (bench/step_split.py: begin/end of the dumped calls, the
iteration end, the writer's statistic.csv job and its pieces, the collector, the training
thread's voluntary context switches); ``--closed`` runs every dumped call with its native taps
closed (open minus closed: what the taps cost in the step); ``--blocked`` prints the main thread's
time asleep a step and its part in ``Writer.wait`` (class Blocked).

Reading of 2026-11-24 (decoder, device statistics, 1 torch thread, load 1.7-2, per step, main
thread CPU; ``perf record -g -t PID``): plain aot_eager floor 8.1 ms, opdump's graph without taps
7.1-7.3 ms (its guards and iteration end included), with the native taps 11.3-11.6 ms before
51d1091 and 10.4 ms after it (taps: ~4.3 -> ~3.3 ms for 1,253 tensors, 516 tap calls, 350 reads);
the writer thread ~1.4-2.3 ms more (statistic.csv text).  Per tap call in isolation (one 64-element
tensor already read): 3.8 -> 1.15 us; pybind11's dispatch alone was 0.17-0.5 us, the rest the
per-call C API work (locks, clock, rows), the GC (rows were tracked) and pybind11's GIL checks.

The split of 2026-11-24 17:5x-18:3x (decoder, device statistics, 1 torch thread, LOADED: load
3-8 on 2 cores, so milliseconds of thread CPU, not wall; ``--split``, ``--closed``, ``perf record``
of taps open vs closed, bench/graph_taps_micro.py): aot_eager floor 8.1-9.2 ms main-thread CPU;
taps closed 8.7-10.1; taps open 10.4-13.6 (open minus closed in the same minutes: 1.5-2.9 ms).
The taps' part, by perf (main thread, ms a step): the statistics reads ~0.65 (reduce_range,
one_pass, copies of tensors with gaps), the taps' own C++ ~0.3 (side, tap, memo lookups, carry),
Python objects of the rows ~0.45 (tuple_alloc, PyObject_Malloc, tupledealloc, ints), libc malloc
churn ~0.25, torch's own kernels slower beside the reads ~0.25 (cache: mul's kernel, serial_for_each),
Python of begin/end/flush beyond the closed taps ~0.15-0.3.  Not the cause: the garbage collector
(0.03-0.05 ms a step: 0.1-0.35 young collections), the caching allocator (CPU tensors: malloc; no
lifetime the taps extend), GIL waits (2-3 voluntary switches of the training thread a step).  The
"1.5 ms beyond the calls in isolation" is mostly the isolation's tensor size: 516 taps (1,032
rows, 350 reads) cost 0.56 ms with 16-float tensors and 1.57 ms with 16,384-float ones (the
decoder's rows name 60 MB a step, median 32 KB; reads at ~23 GB/s).  The writer thread, ms a
step: statistic.csv job 1.3-1.9, of which the text 0.82-0.93 (the cells 0.32-0.35) and the two
new files' open+fstat+write 0.44-0.9; about 0.3 of that is there with the taps closed (parameters).

Prints the median step time (ms: wall, main-thread CPU, process CPU) and the tensors recorded per step; ``--aot-eager`` runs the
floor (``torch.compile(backend="aot_eager")``, no opdump) instead, for a same-process reference.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings


class Blocked:
    """The main thread's time asleep per step: wall minus its CPU time (``time.thread_time``) minus its
    time waiting for a CPU (/proc/self/task/TID/schedstat's second field, Linux; its first, the time
    run, lags the slice in progress), so a loaded machine's pre-emption is not counted; and
    the part of it spent in ``Writer.wait`` (the iteration end waiting for the previous iteration's
    writer jobs).  Plain and ``--aot-eager`` steps sleep ~0 ms."""

    def __init__(self, writer):
        import threading
        self.path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        self.rows, self.waited = [], 0.0
        wait = writer.wait

        def timed_wait(jobs):
            t = time.perf_counter()
            try:
                wait(jobs)
            finally:
                self.waited += time.perf_counter() - t
        writer.wait = timed_wait

    def _sched(self):
        with open(self.path) as f:
            queued = f.read().split()[1]
        return time.thread_time(), int(queued) / 1e9

    def begin(self):
        self.waited = 0.0
        self.t0, self.s0 = time.perf_counter(), self._sched()

    def end(self):
        wall = time.perf_counter() - self.t0
        run, queued = self._sched()
        self.rows.append((wall - (run - self.s0[0]) - (queued - self.s0[1]), self.waited))

    def summary(self):
        asleep, waited = zip(*self.rows)
        ms = lambda v: (round(statistics.median(v) * 1e3, 3), round(statistics.mean(v) * 1e3, 3))
        return {"asleep": ms(asleep), "in Writer.wait": ms(waited)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="decoder")
    ap.add_argument("--mode", default="device")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--cprofile", default=None)
    ap.add_argument("--pause", type=float, default=0.0)
    ap.add_argument("--aot-eager", action="store_true")
    ap.add_argument("--root", default=None)
    ap.add_argument("--split", action="store_true", help="print the step's parts (bench/step_split.py)")
    ap.add_argument("--closed", action="store_true", help="the native taps closed: each returns at once")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--blocked", action="store_true",
                    help="print the main thread's time asleep a step and the part of it in Writer.wait")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [args.root or os.path.dirname(here), os.path.dirname(here)]
    import torch
    import opdump
    torch.set_num_threads(args.threads)
    from bench import dumps as D, models as M
    sys.path.insert(0, here)          # this checkout's bench/step_split.py, whatever --root is
    import step_split
    split = step_split.Split().install() if args.split else None
    if args.closed:
        step_split.close_taps()
    d = tempfile.mkdtemp(prefix="opdump-gtp-")
    cfg = D.write_config(d, os.path.join(d, "dump"), saved_data="statistic", stat_calc_mode=args.mode)
    w = M.BUILDERS[args.model]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with opdump.Session(cfg) as s:
            if args.aot_eager:
                w.run_model = torch.compile(w.model, backend="aot_eager")
            else:
                w.run_model = torch.compile(w.model, backend=s.backend())
            for _ in range(3):
                w.step()
            s.writer.flush()
            n0 = s.recorder.tensors_recorded
            if args.pause:
                print("PID", os.getpid(), flush=True)
                time.sleep(args.pause)
            prof = None
            if args.cprofile:
                import cProfile
                prof = cProfile.Profile()
                prof.enable()
            times, threads, procs = [], [], []
            blocked = Blocked(s.writer) if args.blocked else None
            if split is not None:
                split.start()
            for _ in range(args.steps):
                if blocked is not None:
                    blocked.begin()
                t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
                w.step()
                if blocked is not None:
                    blocked.end()
                times.append(time.perf_counter() - t0)
                threads.append(time.thread_time() - c0)
                procs.append(time.process_time() - p0)
            parts = split.per_step(args.steps) if split is not None else None
            if prof is not None:
                prof.disable()
                prof.dump_stats(args.cprofile)
            s.writer.flush()
            n = (s.recorder.tensors_recorded - n0) / args.steps
    med = lambda v: round(statistics.median(v) * 1e3, 2)
    print(f"median step {med(times)} ms wall, {med(threads)} ms main-thread CPU, {med(procs)} ms process CPU, "
          f"{n:.0f} tensors/step", flush=True)
    if parts is not None:
        print("parts (ms of thread CPU per step):", parts, flush=True)
    if blocked is not None:
        print("main thread asleep a step (ms; median, mean):", blocked.summary(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
