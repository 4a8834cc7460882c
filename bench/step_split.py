"""Where a graph statistics dump's step goes, by part (``bench/graph_taps_profile.py --split``).

Why: the taps' cost in a real step was ~1.5 ms more than their calls cost in isolation, and
the profile of the training thread alone could not say where; this wraps the parts that run
Python (measured with the CPU clock of the thread that runs them) and counts what a sampling
profile does not show: collections of the garbage collector, the training thread's voluntary
context switches (each one a wait, e.g. for the GIL a writer thread holds).

Parts (milliseconds of thread CPU per step):
* ``begin`` / ``end``: ``GraphRuntime.begin``/``end`` of every dumped call (folder, parameters'
  rows, the native taps' open/close, ``flush_statistics``);
* ``iter_end``: ``Session._end_iteration`` (hooks, flush, manifest, the wait for the writer);
* ``writer.*``: the writer thread's statistic.csv job (``Recorder._write_rows``), of which
  ``encode`` (``encode_batch``: the text), ``cells`` (the statistic cells' text, part of
  ``encode``) and ``append`` (the file's open, ``fstat`` and write);
* ``gc``: the collector's time by generation, ``gc_runs`` how many per step;
* ``switches``: the training thread's voluntary context switches per step.

:func:`close_taps` makes every dumped call run with its native taps closed (each tap returns at
once: the step of a dump whose taps cost nothing but their calls), for the open-minus-closed
difference: what the taps cost in the step.
"""
from __future__ import annotations

import collections
import gc
import importlib
import threading
import time
from typing import Callable, Dict


class Split:
    """Thread-CPU accumulators per part, installed by wrapping the parts' functions."""

    def __init__(self) -> None:
        self.ms: Dict[str, float] = collections.defaultdict(float)
        self.gc_runs: Dict[int, int] = collections.defaultdict(int)
        self._lock = threading.Lock()
        self._gc_start = 0.0
        self._switches0 = 0

    def wrap(self, owner, name: str, key: str) -> None:
        f: Callable = getattr(owner, name)
        acc, lock = self.ms, self._lock

        def timed(*a, **k):
            c0 = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                with lock:
                    acc[key] += (time.thread_time() - c0) * 1e3
        setattr(owner, name, timed)

    def install(self) -> "Split":
        runtime = importlib.import_module("opdump.capture.graph.runtime")
        session = importlib.import_module("opdump.session")
        core = importlib.import_module("opdump.recorder.core")
        engine = importlib.import_module("opdump.stats.engine")
        csv = importlib.import_module("opdump.write.statistic_csv")
        self.wrap(runtime.GraphRuntime, "begin", "begin")
        self.wrap(runtime.GraphRuntime, "end", "end")
        self.wrap(session.Session, "_end_iteration", "iter_end")
        self.wrap(core.Recorder, "_write_rows", "writer")
        self.wrap(core, "encode_batch", "writer.encode")
        for value in vars(engine).values():
            if isinstance(value, type) and value.__module__ == engine.__name__ and hasattr(value, "joined"):
                self.wrap(value, "joined", "writer.cells")
        self.wrap(csv.StatisticCsv, "append_encoded", "writer.append")
        gc.callbacks.append(self._on_gc)
        return self

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.thread_time()
            self.gc_runs[info["generation"]] += 1
        else:
            self.ms[f"gc{info['generation']}"] += (time.thread_time() - self._gc_start) * 1e3

    @staticmethod
    def _switches() -> int:
        with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    return int(line.split()[1])
        return 0

    def start(self) -> None:
        """From now on (call on the training thread, after the writer's backlog is flushed)."""
        self.ms.clear()
        self.gc_runs.clear()
        self._switches0 = self._switches()

    def per_step(self, steps: int) -> dict:
        """The parts per step since :meth:`start` (call on the training thread)."""
        out = {k: round(v / steps, 3) for k, v in sorted(self.ms.items())}
        out["gc_runs"] = {g: round(n / steps, 2) for g, n in sorted(self.gc_runs.items())}
        out["switches"] = round((self._switches() - self._switches0) / steps, 2)
        return out


def close_taps() -> None:
    """Every dumped call from now on runs with its native taps closed (never opened)."""
    runtime = importlib.import_module("opdump.capture.graph.runtime")
    begin = runtime.GraphRuntime.begin

    class _Closed:
        def open(self, *args) -> None:
            pass

    def closed_begin(self, placeholders) -> None:
        native = self.native
        if native is not None:
            self.native = _Closed()
        try:
            begin(self, placeholders)
        finally:
            self.native = native
    runtime.GraphRuntime.begin = closed_begin
