"""``opdump demo``: train the built-in AlexNet for a few steps under dump, then analyse the dump.

Shows the whole loop on a fresh machine with no download: a config is written,
the model is compiled with opdump's backend (inductor for iterations that do not
dump), trained with SGD, and the dump is summarised per iteration.
"""
from __future__ import annotations

import json
import os
import time
from collections import defaultdict


def register(sub) -> None:
    p = sub.add_parser("demo", help="train a small built-in model with dump on, then analyse the dump")
    p.add_argument("--out", default=os.path.abspath("demo_dump"), help="dump folder (default ./demo_dump)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--iteration", default="0|2", help='iterations to dump (default "0|2")')
    p.add_argument("--saved-data", default="full", choices=["tensor", "statistic", "full"])
    p.add_argument("--backend", default="inductor", help="the real backend for iterations that do not dump")
    p.set_defaults(func=run_demo)


def run_demo(args) -> int:
    import shutil

    import torch

    import opdump
    from ..demo.models import AlexNet

    out = os.path.abspath(args.out)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    config_path = os.path.join(out, "data_dump.json")
    config = {
        "common_dump_settings": {
            "op_debug_mode": 0, "dump_mode": 0, "path": os.path.join(out, "dump"), "net_name": "AlexNet",
            "iteration": args.iteration, "saved_data": args.saved_data, "input_output": 0, "kernels": [],
            "support_device": [0, 1, 2, 3, 4, 5, 6, 7], "statistic_category": ["max", "min", "avg", "nan count", "l2norm"],
        },
        "e2e_dump_settings": {"enable": True, "trans_flag": True},
    }
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)
    print(f"config: {config_path}")

    torch.manual_seed(0)
    model = AlexNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    with opdump.Session(config_path) as session:
        compiled = torch.compile(model, backend=session.backend(args.backend))
        for step in range(args.steps):
            x = torch.randn(4, 3, 227, 227)
            y = torch.randint(0, 10, (4,))
            t0 = time.perf_counter()
            loss = loss_fn(compiled(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            dumped = "dumped" if step in session.config.iteration else "not dumped"
            print(f"step {step}: loss {loss.item():.4f}  {time.perf_counter() - t0:6.2f}s  ({dumped})")
    root = os.path.join(out, "dump")
    print(f"\ndump written to {root}")
    summarise(root)
    _analyse(root)
    return 0


def summarise(root: str) -> None:
    """Per (rank, graph, iteration): operators, files and bytes, from the files themselves."""
    rows = defaultdict(lambda: [set(), 0, 0])
    for dirpath, _, files in os.walk(root):
        parts = os.path.relpath(dirpath, root).split(os.sep)
        if len(parts) != 4 or not parts[3].isdigit():
            continue
        key = (parts[0], parts[2], int(parts[3]))
        for name in files:
            row = rows[key]
            if name.endswith(".npy") and not name.startswith("Parameter."):
                row[0].add(name.split(".")[1])
            row[1] += 1
            row[2] += os.path.getsize(os.path.join(dirpath, name))
    print(f"{'rank':8} {'graph':>5} {'iter':>5} {'ops':>6} {'files':>6} {'bytes':>12}")
    for (rank, graph, it), (ops, files, size) in sorted(rows.items()):
        print(f"{rank:8} {graph:>5} {it:>5} {len(ops):>6} {files:>6} {size:>12,}")


def _analyse(root: str) -> None:
    try:
        from ..analysis import overflow as _overflow  # noqa: F401
    except ImportError:
        return
    from ..demo import models
    from .main import main as cli
    line = next(i for i, text in enumerate(open(models.__file__).read().splitlines(), 1)
                if "x = self.conv3(x)" in text)
    where = f"{models.__file__}:{line}"
    print(f"\n$ opdump locate {root} {where}      # the operators of `x = self.conv3(x)`")
    cli(["locate", root, where])
    print(f"\n$ opdump overflow {root}")
    cli(["overflow", root])
