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


def thread_time(name: str, steps: int, tmp) -> dict:
    """Copy-out vs no-copy steps of one compiled graph tensor dump, alternating (see above)."""
    import shutil
    import statistics
    import tempfile
    import time
    import warnings

    import opdump
    from bench import dumps as D

    folder = tempfile.mkdtemp(prefix="opdump-nocopy-", dir=tmp)
    dump = os.path.join(folder, "dump")
    sides = {True: [], False: []}
    holdable = core._holdable
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch._dynamo.reset()
            with opdump.Session(D.write_config(folder, dump)) as session:
                w = M.BUILDERS[name](quick=False)
                w.run_model = torch.compile(w.model, backend=session.backend())
                H.warm(w.step, 2)
                session.writer.flush()
                buffers = session.recorder.buffers
                for k in range(2 * steps):
                    copied = k % 2 == 0
                    core._holdable = (lambda t: False) if copied else holdable
                    c0, b0, f0 = buffers.copies, buffers.copied_bytes, session.writer.files_written
                    t0, w0 = time.thread_time(), time.perf_counter()
                    w.step()
                    cpu, wall = time.thread_time() - t0, time.perf_counter() - w0
                    core._holdable = holdable
                    session.writer.flush()
                    sides[copied].append((cpu, wall, buffers.copies - c0, buffers.copied_bytes - b0,
                                          session.writer.files_written - f0))
                    D.prune_iterations(dump, keep_last=False)
    finally:
        core._holdable = holdable
        shutil.rmtree(folder, ignore_errors=True)
    out = {"model": name, "load1": os.getloadavg()[0]}
    for copied, label in ((True, "copy_out"), (False, "no_copy")):
        rows = sides[copied]
        out[label] = {"thread_ms": 1e3 * statistics.median(r[0] for r in rows),
                      "wall_ms": 1e3 * statistics.median(r[1] for r in rows),
                      "copies": statistics.median(r[2] for r in rows),
                      "copied_mb": statistics.median(r[3] for r in rows) / 1e6,
                      "files": statistics.median(r[4] for r in rows)}
    c, n = out["copy_out"], out["no_copy"]
    print(f"{name:12s} thread CPU ms/step copy-out {c['thread_ms']:.1f} no-copy {n['thread_ms']:.1f} "
          f"(x{n['thread_ms'] / c['thread_ms']:.2f}); wall {c['wall_ms']:.1f} / {n['wall_ms']:.1f}; "
          f"copies {c['copies']:.0f} ({c['copied_mb']:.1f} MB) / {n['copies']:.0f} ({n['copied_mb']:.1f} MB) "
          f"of {c['files']:.0f} files; load {out['load1']:.1f}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="alexnet,transformer,mlp")
    p.add_argument("--modes", default="graph,eager")
    p.add_argument("--json", default=None)
    p.add_argument("--tmp", default=None)
    p.add_argument("--with-copy", action="store_true")
    p.add_argument("--thread-time", action="store_true")
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args()
    if a.thread_time:
        rows = [thread_time(name, a.steps, a.tmp) for name in a.models.split(",")]
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
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
