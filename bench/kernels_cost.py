"""Cost of the kernel-level graph dump (``graph_dump: "kernels"``, README "Kernel-level graph dump").

Step time (forward, backward, SGD step) of a model under ``torch.compile`` (inductor), median
over the timed steps after warm-up, for:

* ``plain``: inductor, no opdump;
* ``kernels, not dumping``: opdump's backend in kernel mode, no iteration selected (the plain
  variant runs: should be ~1.0x);
* ``kernels, statistics (device)``: statistics of every kernel output, every step;
* ``operators, statistics (device)``: the operator dump, same statistics, for comparison;
* ``kernels + compare_compiled``: statistics of every kernel plus the reference runs (eager
  and float64) every step.

Usage: ``python bench/kernels_cost.py [--steps N] [--models mlp,encoder]``.  Prints a
Markdown table; ratios are to ``plain`` of the same model in the same run (this machine's
noise between runs is ±10–15 %, see BENCHMARKS.md).
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
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch                       # noqa: E402
import torch.nn as nn              # noqa: E402

import opdump                      # noqa: E402

FAR = "1000000000"


def models():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.LayerNorm(1024), nn.Linear(1024, 1024), nn.GELU(),
                        nn.Linear(1024, 10))
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True), 2)
    return {
        "mlp": (mlp, lambda: torch.randn(64, 512), lambda out: out.square().mean()),
        "encoder": (encoder, lambda: torch.randn(8, 32, 128), lambda out: out.square().mean()),
    }


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


def time_steps(model, make_input, loss_of, backend, steps: int, warmup: int = 3) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, backend=backend)
    x = make_input()
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        loss_of(compiled(x)).backward()
        opt.step()
        opt.zero_grad()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


MODES = [
    ("plain", None),
    ("kernels, not dumping", dict(graph_dump="kernels", iteration=FAR)),
    ("kernels, statistics (device)", dict(graph_dump="kernels")),
    ("operators, statistics (device)", dict(graph_dump="operators")),
    ("kernels + compare_compiled", dict(graph_dump="kernels", compare_compiled=True)),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--models", default="mlp,encoder")
    args = parser.parse_args(argv)
    available = models()
    rows = []
    for name in args.models.split(","):
        model, make_input, loss_of = available[name]
        base = None
        for label, settings in MODES:
            torch._dynamo.reset()
            with tempfile.TemporaryDirectory() as folder:
                if settings is None:
                    t = time_steps(copy.deepcopy(model), make_input, loss_of, "inductor", args.steps)
                else:
                    with opdump.Session(config(folder, **dict(settings))) as session:
                        t = time_steps(copy.deepcopy(model), make_input, loss_of, session.backend(), args.steps)
            base = base or t
            rows.append((name, label, t, t / base))
            print(f"{name:8s} {label:32s} {t * 1e3:9.2f} ms  {t / base:5.2f}x", file=sys.stderr, flush=True)
    print("| model | mode | step (median) | vs plain |\n|---|---|---|---|")
    for name, label, t, ratio in rows:
        print(f"| {name} | {label} | {t * 1e3:.2f} ms | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
