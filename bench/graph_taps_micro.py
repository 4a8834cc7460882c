#!/usr/bin/env python
"""The native graph taps in isolation, at a small decoder's scale (issue 24 item 2): one dumped
call of ``--ops`` operators (1 to 3 output tensors each, ~2 per tap as on the decoder), over
``--tensors`` distinct CPU tensors of ``--numel`` floats, through ``GraphTaps``' builtins; the
thread CPU time of the call (open, taps, close), median over ``--reps``.

    .venv/bin/python bench/graph_taps_micro.py [--numel 16384] [--ops 516] [--tensors 350] [--root DIR]

Why: the tap cost quoted before (1.15 us a call) was measured with one 64-element tensor already
read, and the taps cost ~1.5 ms more in a real decoder step than such calls add up to.  Most
of that gap is the size of what the taps read: the decoder's rows name 60 MB a step (median
32 KB a tensor), and reading ~350 tensors of that size is bandwidth, not call overhead.

Reading of 2026-11-24 18:3x (loaded machine, load 7): 516 taps, 1,032 rows, 350 reads:
16 floats a tensor 0.58 ms a call; 8,192 floats 1.38 ms; 16,384 floats 1.62 ms (~23 GB/s of
statistics reads on top of the calls' ~0.58 ms).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import weakref


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--numel", type=int, default=16384)
    ap.add_argument("--ops", type=int, default=516)
    ap.add_argument("--tensors", type=int, default=350)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--root", default=None, help="import opdump from this checkout (default: this one)")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [args.root or os.path.dirname(here)]
    import torch
    from opdump.recorder.copies import Clock
    from opdump.stats import native
    mod = native.module()
    if mod is None or getattr(mod, "GraphTaps", None) is None:
        print("the native module is not built here")
        return 1

    class Recorder:                       # what GraphTaps.open reads of a recorder
        def __init__(self):
            self._lock = threading.Lock()
            self.clock = Clock()
            self._pending = {}

    class Runtime:                        # a call the native taps hand to Python: the bench is wrong
        def tap_inputs(self, *args):
            raise SystemExit("a tap went to the Python taps")
        tap_outputs = tap_inputs

        def _failed(self, exc, where):
            raise SystemExit(f"the taps failed at {where}: {exc}")

    memo, entries, dtypes, runtime = mod.StatsMemo(), [], [], Runtime()
    taps = mod.GraphTaps(memo, entries, dtypes, torch.nn.Parameter,
                         [("Op", f"Default/Op-op{i}") for i in range(args.ops)], set(), weakref.ref(runtime))
    g = torch.Generator().manual_seed(0)
    pool = [torch.randn(args.numel + i % 7, generator=g) for i in range(args.tensors)]
    calls = [(i, tuple(pool[(i * 3 + k) % len(pool)] for k in range(1 + i % 3))) for i in range(args.ops)]
    outputs = taps.fast()[1]
    times, rows = [], 0
    for rep in range(args.reps):
        rec = Recorder()
        c0 = time.thread_time()
        taps.open(rec, "folder", True, rep)
        for index, value in calls:
            outputs(index, value)
        taps.close()
        times.append(time.thread_time() - c0)
        rows = len(rec._pending["folder"])
        memo.clear()                       # a new batch: every tensor read again
        del entries[:], dtypes[:]
    print(f"{rows} rows, {args.ops} taps, {len(pool)} tensors of {args.numel} floats: "
          f"median {statistics.median(times[args.reps // 6:]) * 1e3:.3f} ms a call (thread CPU)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
