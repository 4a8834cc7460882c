#!/usr/bin/env python
"""Where a graph statistics dump's step goes, per tap (issue 24 item 2): one model compiled with
opdump's backend, ``--steps`` dumped steps run under cProfile (``--cprofile FILE``) or bare (for
``perf record -g -p PID``; ``--pause`` seconds printed PID first), with one torch thread.

    .venv/bin/python bench/graph_taps_profile.py [--model decoder] [--steps 40] [--cprofile out.prof]
                                                  [--mode device|host] [--aot-eager] [--root DIR]
                                                  [--split] [--closed] [--threads N]

``--split`` prints the step's parts (bench/step_split.py: begin/end of the dumped calls, the
iteration end, the writer's statistic.csv job and its pieces, the collector, the training
thread's voluntary context switches); ``--closed`` runs every dumped call with its native taps
closed (open minus closed: what the taps cost in the step).

Reading of 2026-11-24 (decoder, device statistics, 1 torch thread, load 1.7-2, per step, main
thread CPU; ``perf record -g -t PID``): plain aot_eager floor 8.1 ms, opdump's graph without taps
7.1-7.3 ms (its guards and iteration end included), with the native taps 11.3-11.6 ms before
51d1091 and 10.4 ms after it (taps: ~4.3 -> ~3.3 ms for 1,253 tensors, 516 tap calls, 350 reads);
the writer thread ~1.4-2.3 ms more (statistic.csv text).  Per tap call in isolation (one 64-element
tensor already read): 3.8 -> 1.15 us; pybind11's dispatch alone was 0.17-0.5 us, the rest the
per-call C API work (locks, clock, rows), the GC (rows were tracked) and pybind11's GIL checks.

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
            if split is not None:
                split.start()
            for _ in range(args.steps):
                t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
                w.step()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
