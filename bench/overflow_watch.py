"""The cost of the every-step overflow watch (``op_debug_mode`` 3, ``iteration`` "all";
README "Debug dumps") against the undumped step, eager and graph, in one process.

Rows per model (the transformer and AlexNet of :mod:`bench.models`, a full training step):

* *eager overflow watch* vs plain eager (served by the native eager observer after the first
  dumped iteration, README "Native statistics path"; ``OPDUMP_NATIVE_EAGER=0`` measures the
  Python capture's watch);
* *graph overflow watch* (opdump's backend: every step runs AOTAutograd's graphs op by op
  under the watch) vs plain compiled (inductor), the undumped compiled step;
* the same graph watch vs ``aot_eager`` (the op-by-op path with no watch: what the watch
  itself adds) and vs plain eager.

Every ratio comes from :meth:`bench.measure.Bench.pair` (baseline and mode interleaved in
blocks, medians), so a neighbour's load hits both sides.  The figures go to BENCHMARKS.md
between ``<!-- overflow-watch: begin -->`` and ``<!-- overflow-watch: end -->`` (kept by
``bench/run.py``'s full rewrite); the rest of the file is left alone.

    .venv/bin/python bench/overflow_watch.py [--models transformer,alexnet] [--out BENCHMARKS.md]
    .venv/bin/python bench/overflow_watch.py --eager-cpu 15     # eager only, CPU time, 1 thread
    .venv/bin/python bench/overflow_watch.py --eager-cpu 15 --floor   # ... the watch idle per operator
    .venv/bin/python bench/overflow_watch.py --graph-cpu 15     # graph watch vs aot_eager, CPU time, 1 thread
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from bench import harness as H  # noqa: E402
from bench import models as M  # noqa: E402
from bench.measure import Bench  # noqa: E402
from bench.modes import log  # noqa: E402

BEGIN, END = "<!-- overflow-watch: begin -->", "<!-- overflow-watch: end -->"
TARGET = 1.15
WATCH = dict(op_debug_mode=3)


def _row(label: str, against: str, r: dict) -> dict:
    return {"mode": label, "baseline": against, **{k: r.get(k) for k in (
        "median", "base_median", "ratio", "paired_ratio", "cpu_ratio", "spread", "base_spread", "neighbours",
        "steps", "tensors_per_step")}}


def measure_eager(bench: Bench, name: str) -> dict:
    """The eager row of ``name``.  Run before anything is compiled in the process: the native
    eager path serves a process in which ``torch._dynamo`` has analysed no frame (README,
    native statistics path), as in a user's eager program; a compile first would measure the
    Python capture's watch instead."""
    build = lambda: M.BUILDERS[name](quick=bench.quick)  # noqa: E731
    base = build()
    H.warm(base.step, bench.warmup)
    est = bench.estimate(base.step)
    log(f"[{name}] eager overflow watch vs plain eager")
    row = _row("eager overflow watch", "plain eager",
               bench.dump_mode("eager overflow watch", build, WATCH, base.step, graph=False, step_s=est))
    return {"name": name, "describe": base.describe, "rows": [row]}


def measure_graph(bench: Bench, name: str, eager: dict) -> dict:
    """``eager`` (:func:`measure_eager`'s result) with the graph rows of ``name`` added."""
    build = lambda: M.BUILDERS[name](quick=bench.quick)  # noqa: E731
    torch._dynamo.reset()
    base = build()
    H.warm(base.step, bench.warmup)
    est = bench.estimate(base.step)
    comp = build()
    comp.run_model = torch.compile(comp.model)
    log(f"[{name}] inductor")
    H.warm(comp.step, bench.warmup)
    floor = build()
    floor.run_model = torch.compile(floor.model, backend="aot_eager")
    H.warm(floor.step, bench.warmup)
    rows = list(eager["rows"])
    for label, against, step in (("plain compiled", "plain compiled (inductor)", comp.step),
                                 ("aot_eager", "aot_eager (op by op, no watch)", floor.step),
                                 ("plain eager", "plain eager", base.step)):
        log(f"[{name}] graph overflow watch vs {label}")
        rows.append(_row("graph overflow watch", against,
                         bench.dump_mode("graph overflow watch", build, WATCH, step, graph=True, step_s=est)))
    del comp, floor, base
    torch._dynamo.reset()
    return {**eager, "rows": rows}


def _alternating_cpu(rounds: int, plain, watched, before=None, after=None, clock=time.process_time):
    """Median ``clock()`` time of ``plain()`` and of ``watched()`` (``before``/``after``
    around each watched step, untimed), one of each per round, the order swapped every round.
    ``clock``: ``time.process_time`` (every thread: the writer's work counts) or
    ``time.thread_time`` (the training thread alone)."""
    import statistics
    times = {False: [], True: []}
    for r in range(rounds):
        for side in ((False, True) if r % 2 else (True, False)):
            if side and before is not None:
                before()
            t0 = clock()
            (watched if side else plain)()
            times[side].append(clock() - t0)
            if side and after is not None:
                after()
    return statistics.median(times[False]), statistics.median(times[True])


class _IdleWatch:
    """``--floor``: the native eager path with the watch doing nothing per operator, to measure
    what the observer, the hooks and the iteration ends cost without it (bench only, restored
    on exit).  Python's rules answer "always finite" for every operator (watch.h ``kAlways``:
    no reading, no copy, no proof, nothing handed over) and no operator type is handed to
    Python as uninitialized; the capture's counters then read (0, 0, 0)."""

    def __enter__(self):
        from opdump.capture.eager.native import watch as W
        from opdump.debug import overflow_rules as R
        self._saved = (W.NativeWatch._native_watch_kind, R.UNINITIALIZED)
        W.NativeWatch._native_watch_kind = lambda self, qualname, overload, values: 4
        R.UNINITIALIZED = frozenset()
        return self

    def __exit__(self, *exc):
        from opdump.capture.eager.native import watch as W
        from opdump.debug import overflow_rules as R
        W.NativeWatch._native_watch_kind, R.UNINITIALIZED = self._saved


def eager_cpu_ab(names, rounds: int, floor: bool = False) -> list:
    """The eager rows' focused reading: one torch thread, ``time.process_time`` per step (then
    ``time.thread_time``: the training thread alone, the writer's jobs left out), plain and
    watched steps alternating in one process (the capture toggled around each
    watched step, as :class:`bench.modes.EagerToggle` does), medians.  CPU time is what a
    neighbour's load disturbs least on a shared machine; returns one dict per model.
    ``floor``: the watch does nothing per operator (:class:`_IdleWatch`)."""
    import contextlib
    import tempfile
    import warnings
    import opdump
    from bench import dumps as D
    from bench.modes import EagerToggle, eager_capture_class
    torch.set_num_threads(1)
    idle = _IdleWatch() if floor else contextlib.nullcontext()
    cls, _ = eager_capture_class()
    out = []
    for name in names:
        folder = tempfile.mkdtemp(prefix="opdump-ovw-")
        with warnings.catch_warnings(), idle:
            warnings.simplefilter("ignore")
            session = opdump.Session(D.write_config(folder, os.path.join(folder, "dump"), **WATCH))
            session.__enter__()
            try:
                w = M.BUILDERS[name]()
                toggle = EagerToggle(cls, session)
                for _ in range(2):                      # warm-up, both sides
                    w.step()
                    toggle.enter()
                    w.step()
                    toggle.exit()
                base, watch = _alternating_cpu(rounds, lambda: w.step(), lambda: w.step(),
                                               before=toggle.enter, after=toggle.exit)
                session.writer.flush()
                t_base, t_watch = _alternating_cpu(rounds, lambda: w.step(), lambda: w.step(),
                                                   before=toggle.enter, after=toggle.exit, clock=time.thread_time)
            finally:
                session.__exit__(None, None, None)
        counts = getattr(toggle.cap, "native_watch_counts", None)
        out.append({"name": name, "plain_ms": base * 1e3, "watch_ms": watch * 1e3, "ratio": watch / base,
                    "thread_ratio": t_watch / t_base, "load": os.getloadavg()[0], "native_counts": counts})
        log(f"[{name}] eager CPU time: plain {base * 1e3:.1f} ms, watch{' (floor)' if floor else ''} "
            f"{watch * 1e3:.1f} ms, {watch / base:.2f}x; training thread alone: plain {t_base * 1e3:.1f} ms, "
            f"watch {t_watch * 1e3:.1f} ms, {t_watch / t_base:.2f}x (load {os.getloadavg()[0]:.2f}; "
            f"native read/handed/copied {counts})")
    return out


def graph_cpu_ab(names, rounds: int) -> list:
    """The graph rows' focused reading, as :func:`eager_cpu_ab`: one torch thread,
    ``time.process_time`` per step, the graph watch (opdump's backend, every step op by op)
    and ``aot_eager`` (the same op-by-op path with no watch) alternating in one process,
    medians; returns one dict per model."""
    import tempfile
    import warnings
    import opdump
    from bench import dumps as D
    torch.set_num_threads(1)
    out = []
    for name in names:
        folder = tempfile.mkdtemp(prefix="opdump-ovg-")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            session = opdump.Session(D.write_config(folder, os.path.join(folder, "dump"), **WATCH))
            session.__enter__()
            try:
                torch._dynamo.reset()
                floor, watched = M.BUILDERS[name](), M.BUILDERS[name]()
                floor.run_model = torch.compile(floor.model, backend="aot_eager")
                watched.run_model = torch.compile(watched.model, backend=session.backend())
                for _ in range(2):                      # compile and warm-up, both sides
                    floor.step()
                    watched.step()
                base, watch = _alternating_cpu(rounds, floor.step, watched.step)
            finally:
                session.__exit__(None, None, None)
                torch._dynamo.reset()
        out.append({"name": name, "floor_ms": base * 1e3, "watch_ms": watch * 1e3, "ratio": watch / base,
                    "load": os.getloadavg()[0]})
        log(f"[{name}] graph CPU time: aot_eager {base * 1e3:.1f} ms, watch {watch * 1e3:.1f} ms, "
            f"{watch / base:.2f}x (load {os.getloadavg()[0]:.2f})")
    return out


def _x(v) -> str:
    return "–" if v is None else f"{v:.2f}×"


def render(results: list, info: dict) -> str:
    lines = [BEGIN, "## Overflow watch (op_debug_mode 3, every step)", "",
             f"Measured by `.venv/bin/python bench/overflow_watch.py` on {info['date']} "
             f"(torch {torch.__version__}, {torch.get_num_threads()} threads, opdump commit {info['commit']}; "
             f"load average {info['load_start']} at start, {info['load_end']} at end; the machine is shared "
             "with other jobs: read *paired* and *CPU-time* next to the ratio, and *neighbours*). "
             f"Target: within {TARGET:.2f}× of the undumped step (eager: plain eager; graph: plain compiled). "
             "No operator overflows in these runs: the figure is the watch itself (flags, references, one "
             "host read per graph call / 256 operators), no file written.", ""]
    for res in results:
        lines += [f"### {res['name']}: {res['describe']}", "",
                  "| mode | baseline | median ms | baseline ms | **ratio** | paired | CPU-time | steps | "
                  "spread mode / base | neighbours |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            lines.append(f"| {r['mode']} | {r['baseline']} | {r['median'] * 1e3:.1f} | {r['base_median'] * 1e3:.1f} | "
                         f"**{_x(r['ratio'])}** | {_x(r['paired_ratio'])} | {_x(r['cpu_ratio'])} | {r['steps']} | "
                         f"{r['spread'] * 100:.0f}% / {r['base_spread'] * 100:.0f}% | {r['neighbours']:.2f} |")
        lines.append("")
    lines += info.get("notes", [])
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_block(path: str, block: str) -> None:
    """Replace the marked block in ``path`` (or append it), written whole (temp + rename)."""
    old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.S)
    new = pattern.sub(lambda _: block, old, count=1) if pattern.search(old) else old.rstrip("\n") + "\n\n" + block
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="transformer,alexnet")
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    ap.add_argument("--quick", action="store_true", help="small models, 2 timed steps (a smoke check)")
    ap.add_argument("--notes", default=None, help="a file whose lines are appended to the block (findings)")
    ap.add_argument("--eager-cpu", type=int, default=0, metavar="ROUNDS",
                    help="only the eager watch's single-thread CPU-time A/B (ROUNDS pairs); BENCHMARKS.md untouched")
    ap.add_argument("--floor", action="store_true",
                    help="with --eager-cpu: the watch does nothing per operator (the observer's, hooks' and "
                         "iteration ends' own cost)")
    ap.add_argument("--graph-cpu", type=int, default=0, metavar="ROUNDS",
                    help="only the graph watch's single-thread CPU-time A/B against aot_eager; BENCHMARKS.md untouched")
    args = ap.parse_args(argv)
    if args.graph_cpu:
        graph_cpu_ab(list(filter(None, args.models.split(","))), args.graph_cpu)
        return 0
    if args.eager_cpu:
        eager_cpu_ab(list(filter(None, args.models.split(","))), args.eager_cpu, floor=args.floor)
        return 0
    import subprocess
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
            "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    bench = Bench(types.SimpleNamespace(quick=args.quick, tmp=None))
    try:
        names = list(filter(None, args.models.split(",")))
        eager = [measure_eager(bench, name) for name in names]         # every eager row before any compile
        results = [measure_graph(bench, name, e) for name, e in zip(names, eager)]
    finally:
        bench.cleanup()
    info["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.notes:
        info["notes"] = open(args.notes, encoding="utf-8").read().rstrip("\n").split("\n") + [""]
    block = render(results, info)
    print(block)
    write_block(args.out, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
