"""Eager statistics dump: the Python capture vs the native observer vs plain eager.

``python bench/native_eager.py [--steps N] [--quick] [--only NAME,...] [--write]``: per workload
(AlexNet, the transformer encoder, the Llama-style decoder; bench/models.py), the median step
time and CPU time of plain eager, of a statistics dump of every operator of every step served by
the Python capture, and of the same dump with ``OPDUMP_NATIVE_EAGER=1`` (iteration 0 is the
Python capture's in both, with the observer's probe beside it in the native run: the first 3
dumped steps are not timed; "served" says whether the observer served the timed steps).  Ratios are medians over the same process, plain eager measured before and
after (their mean is the reference).  ``--write`` puts the table between
``<!-- native-eager: begin -->`` and ``<!-- native-eager: end -->`` in BENCHMARKS.md.

The load average and CPU time are reported because the machine may be shared: a ratio of
wall times is only as good as the quiet it was measured in.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import models  # noqa: E402

BEGIN, END = "<!-- native-eager: begin -->", "<!-- native-eager: end -->"
SKIP = 3


_THREAD = []     # the main thread's CPU times of the last _timed call
_WRITER = []     # per dumped run, the writer threads' CPU seconds per timed step (statistic.csv text)


def _timed(step, n):
    """(wall times, CPU times) of ``n`` steps; the main thread's own CPU times in ``_THREAD``
    (the process's CPU time also counts the writer thread's work, and torch's intra-op
    threads spinning while they wait for a core on a loaded machine)."""
    wall, cpu = [], []
    _THREAD.clear()
    for _ in range(n):
        w, c, t = time.perf_counter(), time.process_time(), time.thread_time()
        step()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
        _THREAD.append(time.thread_time() - t)
    return wall, cpu


def _plain(make, n):
    wl = make()
    for _ in range(SKIP):
        wl.step()
    result = _timed(wl.step, n)
    return result + (True,)


def _dumped(make, n, native_on):
    import opdump
    from opdump.capture.eager import EagerCapture
    from opdump.config import DumpConfig, IterationSpec
    os.environ["OPDUMP_NATIVE_EAGER"] = "1" if native_on else "0"
    root = tempfile.mkdtemp(prefix="opdump-native-bench-")
    try:
        wl = make()
        cfg = DumpConfig(path=root, iteration=IterationSpec(ranges=((0, 10 ** 6),)), saved_data="statistic",
                         stat_calc_mode="device")
        with opdump.Session(cfg) as session, EagerCapture(session) as cap:
            for _ in range(SKIP):
                wl.step()
            session.writer.flush()
            w0 = session.writer.thread_cpu()
            result = _timed(wl.step, n)
            live = cap._native_live
            session.writer.flush()
            _WRITER.append((session.writer.thread_cpu() - w0) / n)
        return result + (live,)
    finally:
        os.environ.pop("OPDUMP_NATIVE_EAGER", None)
        shutil.rmtree(root, ignore_errors=True)


def measure(quick: bool, steps: int, only=("alexnet", "transformer", "decoder"), rounds: int = 2, threads: int = 0):
    """Per workload, ``rounds`` rounds of plain / Python capture / native, each a fresh model of
    ``steps`` timed steps (after SKIP untimed ones), then plain once more: medians of all steps
    of each kind (interleaved, so a load change hits the three alike)."""
    torch.set_num_threads(max(1, threads or torch.get_num_threads()))
    out = []
    for name in only:
        make = (lambda name=name: getattr(models, name)(quick=quick))
        load0 = os.getloadavg()[0]
        runs = {"plain": ([], [], []), "python": ([], [], []), "native": ([], [], [])}
        writer = {"python": [], "native": []}
        served = True
        for _ in range(rounds):
            for kind, fn in (("plain", lambda: _plain(make, steps)), ("python", lambda: _dumped(make, steps, False)),
                             ("native", lambda: _dumped(make, steps, True))):
                wall, cpu, live = fn()
                if kind in writer:
                    writer[kind].append(_WRITER[-1])
                runs[kind][0].extend(wall)
                runs[kind][1].extend(cpu)
                runs[kind][2].extend(_THREAD)
                served = served and (live if kind == "native" else True)
        wall, cpu, _ = _plain(make, steps)
        runs["plain"][0].extend(wall)
        runs["plain"][1].extend(cpu)
        runs["plain"][2].extend(_THREAD)
        med = {k: (statistics.median(w), statistics.median(c), statistics.median(t)) for k, (w, c, t) in runs.items()}
        plain_thread = med["plain"][2]
        plain_wall, plain_cpu, _ = med["plain"]
        first, last = statistics.median(runs["plain"][0][:steps]), statistics.median(wall)
        out.append({
            "workload": name, "steps": steps, "rounds": rounds, "plain_ms": plain_wall * 1e3,
            "plain_cpu_ms": plain_cpu * 1e3, "python_ms": med["python"][0] * 1e3, "native_ms": med["native"][0] * 1e3,
            "native_served": served, "python_x": med["python"][0] / plain_wall, "native_x": med["native"][0] / plain_wall,
            "python_cpu_x": med["python"][1] / plain_cpu, "native_cpu_x": med["native"][1] / plain_cpu,
            "plain_thread_ms": plain_thread * 1e3, "python_thread_x": med["python"][2] / plain_thread,
            "native_thread_x": med["native"][2] / plain_thread,
            "python_writer_ms": statistics.median(writer["python"]) * 1e3,
            "native_writer_ms": statistics.median(writer["native"]) * 1e3,
            "plain_drift": last / first, "load": [load0, os.getloadavg()[0]], "threads": torch.get_num_threads(),
        })
    return out


def block(results) -> str:
    lines = [BEGIN, "",
             "Eager statistics dump (device statistics, every operator, every step), medians in one process; "
             "`python bench/native_eager.py --write`. Python capture = `OPDUMP_NATIVE_EAGER=0`; native = the "
             "default (same dump as the Python capture's, see README, Eager mode). Issue 24's targets: "
             "≤ 1.5× on AlexNet and the decoder, ≤ 1.3× on the transformer.", "",
             "| workload | plain eager (ms) | Python capture | native observer | CPU-time ratio Python / native "
             "| main-thread CPU ratio Python / native | plain drift | load avg (start, end) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['workload']} | {r['plain_ms']:.1f} | {r['python_x']:.2f}× | {r['native_x']:.2f}×"
                     f"{'' if r['native_served'] else ' (not served!)'} | {r['python_cpu_x']:.2f}× / "
                     f"{r['native_cpu_x']:.2f}× | {r['python_thread_x']:.2f}× / {r['native_thread_x']:.2f}× "
                     f"| {r['plain_drift']:.2f} | {r['load'][0]:.1f}, {r['load'][1]:.1f} |")
    lines += ["", END]
    return "\n".join(lines)


def write(text: str, path: str) -> None:
    with open(path) as f:
        old = f.read()
    if BEGIN in old and END in old:
        new = old[:old.index(BEGIN)] + text + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="alexnet,transformer,decoder", help="workloads, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads (default: torch's); 1 on a loaded machine, where waiting threads spin")
    ap.add_argument("--write", action="store_true", help="update BENCHMARKS.md's native-eager block")
    args = ap.parse_args(argv)
    results = measure(args.quick, args.steps, tuple(args.only.split(",")), args.rounds, args.threads)
    print(json.dumps(results, indent=1))
    text = block(results)
    print(text)
    if args.write:
        write(text, os.path.join(os.path.dirname(HERE), "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
