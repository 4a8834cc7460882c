"""Cost of the kernel-level graph dump (``graph_dump: "kernels"``, README "Kernel-level graph dump").

Step time (``Workload.step``: forward, loss, backward, optimizer) of the bench's models
(:mod:`bench.models`: transformer, AlexNet, MLP) under ``torch.compile`` (inductor), against
the plain compiled step **in the same process, in alternating rounds**: each mode compiles
its own copy of the model inside its session, a plain copy is compiled with inductor alone,
and ``--rounds`` rounds of ``--steps`` plain steps then ``--steps`` steps of the mode are
timed (after warm-up; default 20 rounds of 1 step each).  The ratio is median(mode) /
median(plain) over all timed steps; the interquartile range of the per-round ratios is the
noise of that figure — the machine may be
shared, so a background load that comes and goes hits both sides alike.  The ratio of the
fastest plain and fastest mode step is printed too: on a loaded machine it is the estimate
least disturbed by other processes.  And the ratio of median process CPU time per step
(every thread of the process: intra-op workers and opdump's writer included, time spent
descheduled excluded), which a background load disturbs less than wall time.

Modes:

* ``kernels, statistics (device)``: statistics of every kernel output buffer (and of the
  parameters the graphs read), every step — the issue's ≤1.3× target;
* ``kernels, not dumping``: kernel mode, no iteration selected (the plain variant runs);
* ``operators, statistics (device)``: the operator dump, same statistics, for comparison;
* ``kernels + compare_compiled`` (``--compare``): the reference runs too (a debugging mode).

Usage: ``python bench/kernels_cost.py [--models transformer,alexnet,mlp] [--quick]
[--rounds 20] [--steps 1] [--compare] [--json out.json]``.  Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch                       # noqa: E402

import opdump                      # noqa: E402
from models import BUILDERS        # noqa: E402

FAR = "1000000000"


def config(folder: str, **settings) -> str:
    common = {"op_debug_mode": 0, "dump_mode": 0, "path": os.path.join(folder, "dump"), "net_name": "Net",
              "iteration": settings.pop("iteration", "all"), "saved_data": "statistic", "input_output": 2,
              "kernels": [], "support_device": [0]}
    doc = {"common_dump_settings": common,
           "e2e_dump_settings": {"enable": True, "trans_flag": True, "stat_calc_mode": "device"},
           "opdump_settings": settings}
    path = os.path.join(folder, "data_dump.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


MODES = [
    ("kernels, statistics (device)", dict(graph_dump="kernels")),
    ("kernels, not dumping", dict(graph_dump="kernels", iteration=FAR)),
    ("operators, statistics (device)", dict(graph_dump="operators")),
]
COMPARE = ("kernels + compare_compiled", dict(graph_dump="kernels", compare_compiled=True))


def _compiled(workload, backend):
    w = copy.deepcopy(workload)            # model and optimizer together (the optimizer holds the copy's parameters)
    w.run_model = torch.compile(w.model, backend=backend)
    return w


def _timed(w, steps: int, cpu: list = None) -> list:
    out = []
    for _ in range(steps):
        start, c0 = time.perf_counter(), time.process_time()
        w.step()
        out.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(time.process_time() - c0)
    return out


def measure(workload, settings: dict, rounds: int, steps: int, warmup: int = 3) -> dict:
    """Alternating rounds of plain and ``settings`` steps in this process (module doc)."""
    torch._dynamo.reset()
    plain = _compiled(workload, "inductor")
    _timed(plain, warmup)
    with tempfile.TemporaryDirectory() as folder:
        with opdump.Session(config(folder, **dict(settings))) as session:
            dumped = _compiled(workload, session.backend())
            _timed(dumped, warmup)
            tp, td, ratios, cp, cd = [], [], [], [], []
            for _ in range(rounds):
                p = _timed(plain, steps, cp)
                d = _timed(dumped, steps, cd)
                tp += p
                td += d
                ratios.append(statistics.median(d) / statistics.median(p))
    torch._dynamo.reset()
    mp, md = statistics.median(tp), statistics.median(td)
    lo = min(td) / min(tp)          # fastest step of each: the least disturbed by a background load
    ratios.sort()
    q = lambda f: ratios[min(len(ratios) - 1, int(f * len(ratios)))]     # noqa: E731
    return {"plain_ms": mp * 1e3, "mode_ms": md * 1e3, "ratio": md / mp, "min_ratio": lo,
            "cpu_ratio": statistics.median(cd) / statistics.median(cp), "plain_min_ms": min(tp) * 1e3, "mode_min_ms": min(td) * 1e3, "round_p25": q(0.25), "round_p75": q(0.75)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="transformer,alexnet,mlp")
    parser.add_argument("--quick", action="store_true", help="the models' small sizes (bench/models.py)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--compare", action="store_true", help="also time compare_compiled")
    parser.add_argument("--modes", default="", help="comma-separated mode numbers (0-based) to run")
    parser.add_argument("--json", default="", help="write the rows here too")
    args = parser.parse_args(argv)
    modes = MODES + ([COMPARE] if args.compare else [])
    if args.modes:
        modes = [modes[int(i)] for i in args.modes.split(",")]
    rows = []
    for name in args.models.split(","):
        workload = BUILDERS[name](quick=args.quick)
        for label, settings in modes:
            r = measure(workload, settings, args.rounds, args.steps)
            r.update(model=workload.name, describe=workload.describe, mode=label)
            rows.append(r)
            print(f"{workload.name:12s} {label:32s} plain {r['plain_ms']:8.2f} ms  mode {r['mode_ms']:8.2f} ms  "
                  f"{r['ratio']:5.2f}x, CPU time {r['cpu_ratio']:.2f}x, fastest steps {r['min_ratio']:.2f}x (rounds p25-p75 {r['round_p25']:.2f}-{r['round_p75']:.2f})", file=sys.stderr, flush=True)
    print("| model | mode | plain step (median) | step (median) | vs plain | per-round ratio p25–p75 | fastest steps: plain, mode, ratio | CPU time per step vs plain |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['mode']} | {r['plain_ms']:.1f} ms | {r['mode_ms']:.1f} ms | {r['ratio']:.2f}x | "
              f"{r['round_p25']:.2f}–{r['round_p75']:.2f} | "
              f"{r['plain_min_ms']:.1f} ms, {r['mode_min_ms']:.1f} ms, {r['min_ratio']:.2f}x | {r['cpu_ratio']:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
