"""``opdump demo``: train the built-in AlexNet for a few steps under dump, then analyse the dump.

Shows the whole loop on a fresh machine with no download: a config is written,
the model is compiled with opdump's backend (inductor for iterations that do not
dump), trained with SGD, and the dump is read back with :mod:`opdump.analysis`
(summary per iteration, ``locate`` of one line, ``overflow``), the same API the
analysis commands use; the demo never walks the dump folders itself.
"""
from __future__ import annotations

import json
import os
import sys
import time

from ..analysis.reader import open_dump
from .analysis_commands import count

#: what the demo writes in --out (and replaces on the next run); anything else there is not the demo's
DEMO_FILES = frozenset({"data_dump.json", "dump"})


def register(sub) -> None:
    p = sub.add_parser("demo", help="train a small built-in model with dump on, then analyse the dump")
    p.add_argument("--out", default=os.path.abspath("demo_dump"),
                   help="the demo's folder: data_dump.json and dump/ (default ./demo_dump; a folder holding "
                        "anything else is refused)")
    p.add_argument("--steps", type=count(1), default=4, help="training steps (default 4)")
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
    try:
        held = set(os.listdir(out)) if os.path.isdir(out) else set()
    except OSError as exc:
        held, denied = set(), exc
    else:
        denied = None
    if denied is not None or (os.path.exists(out) and not os.path.isdir(out)) or held - DEMO_FILES:
        # the demo replaces only what it wrote: `--out .` or `--out ~/project` removed everything there
        other = sorted(held - DEMO_FILES)[:3]
        why = (f"cannot read it ({denied})" if denied is not None else "it is a file" if not os.path.isdir(out)
               else f"it holds files the demo did not write ({', '.join(other)}{', …' if len(held - DEMO_FILES) > 3 else ''})")
        print(f"opdump demo: error: --out {out}: {why}; give a new or empty folder", file=sys.stderr)
        return 2
    for name in held:                   # the previous demo's config and dump
        path = os.path.join(out, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
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

    from ..config import ConfigError
    try:
        from torch._dynamo.backends.registry import lookup_backend
        lookup_backend(args.backend)
    except Exception as exc:  # noqa: BLE001 - torch's InvalidBackend: a one-line error, before any training
        print(f"opdump demo: error: --backend {args.backend}: {exc}", file=sys.stderr)
        return 2
    try:
        session = opdump.Session(config_path)
    except ConfigError as exc:                   # e.g. --iteration x: one line, as opdump run says it
        print(f"opdump demo: invalid config: {exc}", file=sys.stderr)
        return 2

    torch.manual_seed(0)
    model = AlexNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    with session:
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
    """Per (rank, graph, iteration): operators, tensor files, statistic rows and bytes, as the
    reader sees the dump (:meth:`opdump.analysis.Dump.summary`)."""
    try:
        dump = open_dump(root)
        table = dump.summary()
    except ModuleNotFoundError as exc:           # pandas: the analysis extra
        print(f"(no summary: {exc.name} is not installed; pip install 'opdump[analysis]')")
        return
    print(f"{'rank':>4} {'graph':>5} {'iter':>9} {'ops':>6} {'params':>6} {'tensors':>7} {'stat rows':>9} {'bytes':>12}")
    for r in table.itertuples(index=False):
        print(f"{r.rank:>4} {r.graph:>5} {str(r.iteration):>9} {r.ops:>6} {r.parameters:>6} {r.tensors:>7} "
              f"{r.stat_rows:>9} {r.bytes:>12,}")


def _analyse(root: str) -> None:
    """``opdump locate`` of the line ``x = self.conv3(x)`` and ``opdump overflow``, through the
    analysis API (what those commands print, in short)."""
    from ..demo import models
    try:
        from ..analysis import find_overflow, locate
        dump = open_dump(root)
    except ModuleNotFoundError:
        return
    with open(models.__file__, encoding="utf-8") as f:
        line = next(i for i, text in enumerate(f.read().splitlines(), 1) if "x = self.conv3(x)" in text)
    where = f"{models.__file__}:{line}"
    print(f"\n$ opdump locate {root} {where}      # the operators of `x = self.conv3(x)`")
    hits = locate(dump, where)
    if not hits:
        print(f"no operator found for {where!r}")
    for h in hits:
        n_files = sum(len(paths) for paths in h.files.values())
        print(f"{h.op.full_name}\n    type {h.op.op_type}, {h.op.kind}, graph {h.op.graph}, {n_files} files")
    print(f"\n$ opdump overflow {root}")
    report = find_overflow(dump, progress=False)
    if not report.found:
        print(f"no NaN/Inf found ({report.scanned_tensors} floating tensors scanned)")
    else:
        o = report.origin
        print(f"first NaN/Inf: {o.op} (iteration {o.iteration}, {o.source} {o.code})")
