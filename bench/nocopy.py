"""Tensor-dump throughput rows only (issue 24 item 4, the no-copy tensor dump): the
``graph tensor`` and ``eager tensor`` modes of chosen models, each against ``numpy.save``
in the same process, through :meth:`bench.measure.Bench.dump_mode` (the same machinery
and figures as ``bench/run.py``'s tensor rows).

    .venv/bin/python bench/nocopy.py [--models alexnet,transformer,mlp] [--modes graph,eager] [--json F]
                                     [--with-copy]

``--with-copy``: each graph row is measured twice in a row, first with every tensor copied
out as before the no-copy path (``opdump.recorder.core._holdable`` patched to refuse every
tensor, in this bench process only), then as shipped: an A/B under the same neighbours' load.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from bench import harness as H  # noqa: E402
from bench import models as M  # noqa: E402
from bench.measure import Bench  # noqa: E402
from opdump.recorder import core  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="alexnet,transformer,mlp")
    p.add_argument("--modes", default="graph,eager")
    p.add_argument("--json", default=None)
    p.add_argument("--tmp", default=None)
    p.add_argument("--with-copy", action="store_true")
    a = p.parse_args()
    bench = Bench(argparse.Namespace(quick=False, tmp=a.tmp))
    rows = []
    try:
        for name in a.models.split(","):
            build = lambda name=name: M.BUILDERS[name](quick=False)  # noqa: E731
            torch._dynamo.reset()
            base = build()
            H.warm(base.step, bench.warmup)
            est = bench.estimate(base.step)
            runs = []
            for mode in a.modes.split(","):
                if a.with_copy and mode == "graph":
                    runs.append((mode, True))
                runs.append((mode, False))
            for mode, copied in runs:
                label = f"{mode} tensor" + (" copy-out" if copied else "")
                holdable = core._holdable
                if copied:
                    core._holdable = lambda t: False
                try:
                    row = bench.dump_mode(label, build, dict(saved_data="tensor"), base.step,
                                          graph=mode == "graph", step_s=est, throughput=True)
                finally:
                    core._holdable = holdable
                row["model"] = name
                row["load1"] = os.getloadavg()[0]
                rows.append(row)
                print(f"{name:12s} {label:24s} raw {row.get('throughput_ratio_raw', float('nan')):.2f} "
                      f"eff {row.get('throughput_ratio_effective') or float('nan'):.2f} "
                      f"step x{row['ratio']:.2f} numpy {row['numpy_rate'] / 1e6:.0f} MB/s "
                      f"load {row['load1']:.1f} neighbours {row.get('neighbours', float('nan')):.2f}",
                      flush=True)
    finally:
        bench.cleanup()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
