#!/usr/bin/env python
"""Where a graph statistics dump's step goes, per tap (issue 24 item 2): one model compiled with
opdump's backend, ``--steps`` dumped steps run under cProfile (``--cprofile FILE``) or bare (for
``perf record -g -p PID``; ``--pause`` seconds printed PID first), with one torch thread.

    .venv/bin/python bench/graph_taps_profile.py [--model decoder] [--steps 40] [--cprofile out.prof]
                                                  [--mode device|host] [--aot-eager] [--root DIR]

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
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [args.root or os.path.dirname(here), os.path.dirname(here)]
    import torch
    import opdump
    torch.set_num_threads(1)
    from bench import dumps as D, models as M
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
            for _ in range(args.steps):
                t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
                w.step()
                times.append(time.perf_counter() - t0)
                threads.append(time.thread_time() - c0)
                procs.append(time.process_time() - p0)
            if prof is not None:
                prof.disable()
                prof.dump_stats(args.cprofile)
            s.writer.flush()
            n = (s.recorder.tensors_recorded - n0) / args.steps
    med = lambda v: round(statistics.median(v) * 1e3, 2)
    print(f"median step {med(times)} ms wall, {med(threads)} ms main-thread CPU, {med(procs)} ms process CPU, "
          f"{n:.0f} tensors/step", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
