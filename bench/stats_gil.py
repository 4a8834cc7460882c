"""The native statistics kernel on many small tensors while another Python thread wants the GIL.

``python bench/stats_gil.py [--tensors 1650] [--numel 64] [--rounds 30] [--so PATH]``: the main
thread reads the statistics of ``--tensors`` small CPU tensors with ``fused_stats`` (about what
an eager statistics dump of the bench's decoder reads a step) while a second thread runs Python
(as the dump's writer threads do); prints the median wall and thread-CPU milliseconds of one
pass.  ``--so`` loads a given build of the native module (to compare two builds in the same
conditions); default: opdump's own (:func:`opdump.stats.native.module`).

Why: a kernel call that releases the GIL hands it to a waiting thread, and the caller then waits
for it to come back; for a tensor of a few hundred bytes that hand-over costs far more than the
reading (cpu_kernel.cpp, kReleaseBytes).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402


def _module(path):
    if path is None:
        from opdump.stats import native
        return native.module()
    name = os.path.basename(path).split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(mod, tensors: int, numel: int, rounds: int):
    """(median wall ms, median thread-CPU ms) of one pass over the tensors, a Python thread busy."""
    ts = [torch.randn(numel) for _ in range(tensors)]
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            for i in range(2000):
                x += i
            time.sleep(0)

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    wall, cpu = [], []
    try:
        for _ in range(rounds):
            w, c = time.perf_counter(), time.thread_time()
            for t in ts:
                mod.fused_stats(t)
            wall.append(time.perf_counter() - w)
            cpu.append(time.thread_time() - c)
    finally:
        stop.set()
        thread.join()
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=1650)
    ap.add_argument("--numel", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--so", default=None, help="a built native module to load instead of opdump's")
    args = ap.parse_args(argv)
    mod = _module(args.so)
    if mod is None:
        print("the native module is not built")
        return 1
    wall, cpu = measure(mod, args.tensors, args.numel, args.rounds)
    print(f"{args.tensors} tensors of {args.numel} float32: wall {wall:.2f} ms, thread CPU {cpu:.2f} ms "
          f"(load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
