#!/usr/bin/env python
"""Host vs device statistics on CPU (issue 24 item 3), one process, interleaved.

    .venv/bin/python bench/host_vs_device.py [--rounds N] [--per-round K]

For AlexNet (bench.models), graph (opdump's backend) and eager capture: sessions with
``stat_calc_mode: "host"`` and ``"device"`` (every operator, every step) in turn, phase
after phase (one session is active at a time), each timed in blocks alternating with a
plain-eager baseline; ratio = median dumped step / median baseline step per session;
host/device = median host ratio / median device ratio; one JSON line per front-end.  The figures
go to BENCHMARKS.md's ``host-vs-device`` block by hand (a quick check, not bench/run.py).
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import opdump  # noqa: E402
from bench import dumps as D, harness as H, models as M  # noqa: E402
from bench.modes import EagerToggle, eager_capture_class  # noqa: E402


def measure(front: str, mode: str, tmp: str, eager_cls, rounds: int, per_round: int):
    """One session of ``mode``: rounds of (plain eager block, dumped block); step times in s."""
    d = tempfile.mkdtemp(prefix=f"{front}-{mode}-", dir=tmp)
    cfg = D.write_config(d, os.path.join(d, "dump"), saved_data="statistic", stat_calc_mode=mode)
    base = M.alexnet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = opdump.Session(cfg)
        s.__enter__()
    try:
        w = M.alexnet()
        enter = exit_ = None
        if front == "graph":
            w.run_model = torch.compile(w.model, backend=s.backend())
        else:
            tog = EagerToggle(eager_cls, s)
            enter, exit_ = tog.enter, tog.exit
        sides = {"base": (base.step, None, None), "mode": (w.step, enter, exit_)}
        times = {"base": [], "mode": []}
        cpu = {"base": [], "mode": []}
        for k, (step, en, ex) in sides.items():          # warm-up (compilation)
            if en:
                en()
            for _ in range(2):
                step()
            if ex:
                ex()
        gc.collect()
        H.wait_quiet()
        a = H.cpu_snapshot()
        for _ in range(rounds):
            for k, (step, en, ex) in sides.items():
                if en:
                    en()
                step()                                   # untimed first step of the block
                for _ in range(per_round):
                    t0, c0 = time.perf_counter(), time.process_time()
                    step()
                    times[k].append(time.perf_counter() - t0)
                    cpu[k].append(time.process_time() - c0)
                if ex:
                    ex()
        neighbours = H.others_cores(a, H.cpu_snapshot())
        s.writer.flush()
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s.__exit__(None, None, None)
        shutil.rmtree(d, ignore_errors=True)
    return times, cpu, neighbours


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", type=int, default=2, help="host then device, this many times")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-round", type=int, default=3)
    ap.add_argument("--front", choices=["graph", "eager", "both"], default="both")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="opdump-hvd-")
    fronts = ["graph", "eager"] if args.front == "both" else [args.front]
    eager_cls, _ = eager_capture_class()
    for front in fronts:
        ratios = {"host": [], "device": []}
        cpu_ratios = {"host": [], "device": []}
        steps = {"host": [], "device": [], "base": []}
        noise = []
        for _ in range(args.phases):
            for mode in ("host", "device"):
                times, cpu, neighbours = measure(front, mode, tmp, eager_cls, args.rounds, args.per_round)
                ratios[mode].append(statistics.median(times["mode"]) / statistics.median(times["base"]))
                cpu_ratios[mode].append(statistics.median(cpu["mode"]) / statistics.median(cpu["base"]))
                steps[mode] += times["mode"]
                steps["base"] += times["base"]
                noise.append(round(neighbours, 2))
        med = {k: statistics.median(v) for k, v in ratios.items()}
        cmed = {k: statistics.median(v) for k, v in cpu_ratios.items()}
        print(json.dumps({"front": front, "ratio_vs_plain_eager": med, "per_phase": ratios,
                          "host/device": med["host"] / med["device"],
                          "cpu_time_ratio_vs_plain_eager": cmed, "cpu_per_phase": cpu_ratios,
                          "cpu host/device": cmed["host"] / cmed["device"],
                          "median_ms": {k: statistics.median(v) * 1e3 for k, v in steps.items()},
                          "spread": {k: (max(v) - min(v)) / statistics.median(v) for k, v in steps.items()},
                          "neighbours": noise, "steps_per_side": len(steps["host"])}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
