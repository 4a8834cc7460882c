#!/usr/bin/env python
"""Graph statistics against their floor (issue 24 item 2), one process, interleaved.

    .venv/bin/python bench/graph_taps.py [--models alexnet,transformer] [--phases 2] [--rounds 6]
                                         [--threads N] [--root DIR]   # DIR: another checkout (before/after)

Per model and per ``stat_calc_mode`` (device, host), one session (one at a time, as a user
runs it): rounds of three blocks — plain eager, ``torch.compile(backend="aot_eager")`` (the
dump path's floor: AOT graphs op by op, no taps), and the model compiled with opdump's backend
dumping statistics of every operator every step — each block one untimed step then
``--per-round`` timed ones.  Ratios are median / median of plain eager in that same
interleaving (wall and process CPU time); *over floor* = dump ratio − aot_eager ratio, the
figure issue 24's target (≤ 0.15) is about; one JSON line per model and mode, plus the
neighbours' load (cores other processes used meanwhile), and ``writer_ms_per_step``: the CPU time
opdump's writer threads spent per dumped step (statistic.csv text and writes; part of the process
CPU above), from their thread CPU clocks.

The plain-eager and aot_eager sides run as programs without opdump would: the session's
optimizer hook (a global ``optimizer.step()`` post-hook that ends the session's iteration:
statistics flush, manifest, the wait for the writer's previous iteration) is suspended
while they step (``--floor-hooks`` keeps it, as the bench did before 2026-11-24 13:30:
every side then paid ~0.15-0.2 ms of opdump's iteration end per step, and its wait on the
dump side's writer backlog, which made the floor and the eager baseline look slower and
*over floor* ~0.03 smaller; the iteration counter also advanced three times per round).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings


def writer_cpu() -> float:
    """Seconds of CPU used so far by the live ``opdump-writer`` threads of this process."""
    import threading
    total = 0.0
    for t in threading.enumerate():
        if t.name.startswith("opdump-writer") and t.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, ValueError):
                pass
    return total


def without_optimizer_hooks(step):
    """``step`` run with torch's global optimizer post-hooks (the session's) suspended."""
    from torch.optim import optimizer as optim_module
    hooks = getattr(optim_module, "_global_optimizer_post_hooks", None)
    if hooks is None:
        return step

    def run():
        saved = dict(hooks)
        hooks.clear()
        try:
            step()
        finally:
            hooks.update(saved)
    return run


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="alexnet,transformer")
    ap.add_argument("--modes", default="device,host")
    ap.add_argument("--phases", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-round", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--root", default=None, help="import opdump from this checkout (default: this one)")
    ap.add_argument("--floor-hooks", action="store_true",
                    help="let the eager/aot_eager sides' optimizer steps run the session's hook (the old bench)")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [args.root or os.path.dirname(here), os.path.dirname(here)]
    import torch
    import opdump
    if args.threads:
        torch.set_num_threads(args.threads)
    from bench import dumps as D, harness as H, models as M

    tmp = tempfile.mkdtemp(prefix="opdump-graph-taps-")
    try:
        for name in args.models.split(","):
            per_round = args.per_round if name == "alexnet" else max(1, args.per_round // 3)
            for _ in range(args.phases):
                for mode in args.modes.split(","):
                    d = tempfile.mkdtemp(dir=tmp)
                    cfg = D.write_config(d, os.path.join(d, "dump"), saved_data="statistic", stat_calc_mode=mode)
                    eager, floor, dump = (M.BUILDERS[name]() for _ in range(3))
                    floor.run_model = torch.compile(floor.model, backend="aot_eager")
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        with opdump.Session(cfg) as s:
                            dump.run_model = torch.compile(dump.model, backend=s.backend())
                            bare = (lambda f: f) if args.floor_hooks else without_optimizer_hooks
                            sides = {"eager": bare(eager.step), "aot_eager": bare(floor.step), "dump": dump.step}
                            for step in sides.values():
                                step(), step()
                            s.writer.flush()
                            n0 = s.recorder.tensors_recorded
                            dump.step()
                            s.writer.flush()
                            tensors = s.recorder.tensors_recorded - n0
                            wall = {k: [] for k in sides}
                            cpu = {k: [] for k in sides}
                            gc.collect()
                            H.wait_quiet()
                            a = H.cpu_snapshot()
                            w0 = writer_cpu()
                            for _ in range(args.rounds):
                                for k, step in sides.items():
                                    step()
                                    for _ in range(per_round):
                                        t0, c0 = time.perf_counter(), time.process_time()
                                        step()
                                        wall[k].append(time.perf_counter() - t0)
                                        cpu[k].append(time.process_time() - c0)
                            neighbours = H.others_cores(a, H.cpu_snapshot())
                            s.writer.flush()
                            writer_ms = (writer_cpu() - w0) * 1e3 / (args.rounds * (per_round + 1))
                    torch._dynamo.reset()
                    shutil.rmtree(d, ignore_errors=True)
                    med = {k: statistics.median(v) for k, v in wall.items()}
                    cmed = {k: statistics.median(v) for k, v in cpu.items()}
                    r = {k: med[k] / med["eager"] for k in ("aot_eager", "dump")}
                    c = {k: cmed[k] / cmed["eager"] for k in ("aot_eager", "dump")}
                    print(json.dumps({
                        "model": name, "mode": mode, "root": args.root or "this checkout",
                        "threads": torch.get_num_threads(),
                        "ratio": {k: round(v, 3) for k, v in r.items()},
                        "over_floor": round(r["dump"] - r["aot_eager"], 3),
                        "cpu_ratio": {k: round(v, 3) for k, v in c.items()},
                        "cpu_over_floor": round(c["dump"] - c["aot_eager"], 3),
                        "median_ms": {k: round(v * 1e3, 2) for k, v in med.items()},
                        "spread": {k: round((max(v) - min(v)) / statistics.median(v), 2) for k, v in wall.items()},
                        "neighbours": round(neighbours, 2), "steps_per_side": len(wall["dump"]),
                        "tensors_per_step": tensors, "floor_hooks": args.floor_hooks,
                        "writer_ms_per_step": round(writer_ms, 3)}), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
