"""Interleaved timing for the bench, and how busy the neighbours were meanwhile.

Measuring on a shared 2-core machine: every ratio is taken between two step
functions run *interleaved* in the same process (rounds of baseline steps, then
rounds of the measured mode's steps), so that a neighbour's load hits both sides
alike; medians, never means.  Dump configs and folders: :mod:`bench.dumps`; memory
and machine facts: :mod:`bench.machine`; number formatting: :mod:`bench.units`.
"""
from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional



# --------------------------------------------------------------------------- timing
@dataclass
class Side:
    """One side of an interleaved measurement."""

    step: Callable[[], None]
    enter: Optional[Callable[[], None]] = None      # before each block (untimed)
    exit: Optional[Callable[[], None]] = None       # after each block (untimed)
    drain: Optional[Callable[[], None]] = None      # after each block, timed apart (writer flush)
    after_block: Optional[Callable[[], None]] = None  # after drain, untimed (delete old files)
    warm_steps: int = 0                             # untimed steps at the start of each block
    times: List[float] = field(default_factory=list)
    cpu: List[float] = field(default_factory=list)      # process CPU seconds per step (all threads)
    blocks: List[List[float]] = field(default_factory=list)
    drains: List[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def amortized(self) -> float:
        """Per step, including the time to drain the writer after each block."""
        return (sum(self.times) + sum(self.drains)) / len(self.times)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    @property
    def spread(self) -> float:
        """(max - min) / median of the timed steps: how noisy this side was."""
        return (max(self.times) - min(self.times)) / self.median if self.times else float("nan")


def run_block(side: Side, n: int) -> None:
    if side.enter:
        side.enter()
    block: List[float] = []
    try:
        for _ in range(side.warm_steps):
            side.step()
        for _ in range(n):
            c0 = time.process_time()
            t0 = time.perf_counter()
            side.step()
            t1 = time.perf_counter()
            side.cpu.append(time.process_time() - c0)
            side.times.append(t1 - t0)
            block.append(t1 - t0)
    finally:
        side.blocks.append(block)
        if side.exit:
            side.exit()
    if side.drain:
        t0 = time.perf_counter()
        side.drain()
        side.drains.append(time.perf_counter() - t0)
    if side.after_block:
        side.after_block()


def interleave(base: Side, mode: Side, rounds: int, per_round: int) -> float:
    """``rounds`` × (``per_round`` baseline steps, ``per_round`` mode steps).

    Waits first (≤ 20 s) for the neighbours to quieten; returns the CPU cores other
    processes used meanwhile (a noise indicator for the report).
    """
    # A clean start, and then the garbage collector runs as it does in a user's process (no
    # gc.freeze(): with it, a dump that leaves many tracked objects alive would never pay for
    # the full collections they trigger — 2.6 ms per eager AlexNet step, before the rows
    # were made untracked).
    gc.collect()
    wait_quiet()
    a = cpu_snapshot()
    for r in range(rounds):
        run_block(base, per_round)
        run_block(mode, per_round)
    return others_cores(a, cpu_snapshot())


def paired_ratio(base: Side, mode: Side) -> float:
    """Median over rounds of (mode block median / the baseline block run just before it)."""
    ratios = [statistics.median(m) / statistics.median(b) for b, m in zip(base.blocks, mode.blocks) if b and m]
    return statistics.median(ratios)


def rounds_for(step_s: float, per_round: int, *, target_s: float, lo: int, hi: int) -> int:
    """Rounds so that each side runs about ``target_s`` seconds, within [lo, hi]."""
    import math
    if step_s <= 0:
        return hi
    return max(lo, min(hi, math.ceil(target_s / (step_s * per_round))))


def warm(step: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return time.perf_counter() - t0


def under_null_dispatch_mode(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` run under a ``TorchDispatchMode`` that only forwards each operator: the cost
    of routing every ATen operator through Python, which any Python dispatch-mode capture
    (opdump's eager capture included) pays before doing anything."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class NullMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    mode = NullMode()

    def wrapped() -> None:
        with mode:
            step()
    return wrapped


# --------------------------------------------------------------------------- neighbours
_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_snapshot():
    """(machine busy CPU-seconds, this process's CPU-seconds, monotonic time)."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:9]]
        busy = (sum(vals) - vals[3] - vals[4]) / _TCK
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    t = os.times()
    return busy, t.user + t.system, time.monotonic()


def others_cores(a, b) -> float:
    """CPU cores used by other processes between two snapshots (machine busy − ours)."""
    dt = b[2] - a[2]
    if dt <= 0:
        return float("nan")
    return max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / dt)


def wait_quiet(threshold: float = 0.25, max_wait: float = 20.0, window: float = 0.5) -> float:
    """Wait (at most ``max_wait`` s) until other processes use < ``threshold`` cores; returns the last load."""
    deadline = time.monotonic() + max_wait
    load = float("nan")
    while True:
        a = cpu_snapshot()
        time.sleep(window)
        load = others_cores(a, cpu_snapshot())
        if not load >= threshold or time.monotonic() >= deadline:
            return load
