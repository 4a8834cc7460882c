"""Tensor-dump throughput rows only (issue 24 item 4, the no-copy tensor dump): the
``graph tensor`` and ``eager tensor`` modes of chosen models, each against ``numpy.save``
in the same process, through :meth:`bench.measure.Bench.dump_mode` (the same machinery
and figures as ``bench/run.py``'s tensor rows).

    .venv/bin/python bench/nocopy.py [--models alexnet,transformer,mlp] [--modes graph,eager] [--json F]
                                     [--with-copy]

``--thread-time [--ab copy|gate]``: alternating steps of two ways in one process (copy-out
vs no-copy, or the writer's gate of held windows off vs on): CPU of the training thread
and of the writer threads per step, wall of the step and of step + flush.

``--gate off|on|both``: graph rows with the writer's gate of held windows (opdump/write/writer.py)
off (the default, as shipped), on, or both in a row (an A/B under the same load).

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
from opdump.recorder.held import Holds  # noqa: E402


def _sides(ab: str):
    """The two sides of a ``--thread-time`` A/B: (label, how to set it, how to undo it)."""
    holdable, gate = core._holdable, Holds.gate
    if ab == "gate":
        def set_gate(on):
            return lambda: setattr(Holds, "gate", on)
        return (("gate_off", set_gate(False)), ("gate_on", set_gate(True))), lambda: setattr(Holds, "gate", gate)

    def set_copy(copied):
        return lambda: setattr(core, "_holdable", (lambda t: False) if copied else holdable)
    return (("copy_out", set_copy(True)), ("no_copy", set_copy(False))), lambda: setattr(core, "_holdable", holdable)


def thread_time(name: str, steps: int, tmp, ab: str = "copy") -> dict:
    """Two ways of one compiled graph tensor dump, alternating step by step in one process
    (``ab`` "copy": copy-out vs no-copy; "gate": the writer's gate of held windows off vs on,
    see opdump/write/writer.py): per step the training thread's CPU, the writer threads'
    CPU, the wall time of the step and of the step plus the flush of its files."""
    import shutil
    import statistics
    import tempfile
    import time
    import warnings

    import opdump
    from bench import dumps as D

    folder = tempfile.mkdtemp(prefix="opdump-nocopy-", dir=tmp)
    dump = os.path.join(folder, "dump")
    (a_side, b_side), undo = _sides(ab)
    sides = {a_side[0]: [], b_side[0]: []}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch._dynamo.reset()
            with opdump.Session(D.write_config(folder, dump)) as session:
                w = M.BUILDERS[name](quick=False)
                w.run_model = torch.compile(w.model, backend=session.backend())
                H.warm(w.step, 2)
                session.writer.flush()
                buffers, writer = session.recorder.buffers, session.writer
                for k in range(2 * steps):
                    label, setup = (a_side, b_side)[k % 2]
                    setup()
                    c0, b0, f0 = buffers.copies, buffers.copied_bytes, writer.files_written
                    t0, w0, x0 = time.thread_time(), time.perf_counter(), writer.thread_cpu()
                    w.step()
                    cpu, wall = time.thread_time() - t0, time.perf_counter() - w0
                    undo()
                    writer.flush()
                    drained = time.perf_counter() - w0
                    sides[label].append((cpu, wall, buffers.copies - c0, buffers.copied_bytes - b0,
                                         writer.files_written - f0, writer.thread_cpu() - x0, drained))
                    D.prune_iterations(dump, keep_last=False)
    finally:
        undo()
        shutil.rmtree(folder, ignore_errors=True)
    out = {"model": name, "ab": ab, "load1": os.getloadavg()[0]}
    for label, rows in sides.items():
        out[label] = {"thread_ms": 1e3 * statistics.median(r[0] for r in rows),
                      "wall_ms": 1e3 * statistics.median(r[1] for r in rows),
                      "copies": statistics.median(r[2] for r in rows),
                      "copied_mb": statistics.median(r[3] for r in rows) / 1e6,
                      "files": statistics.median(r[4] for r in rows),
                      "writer_cpu_ms": 1e3 * statistics.median(r[5] for r in rows),
                      "drained_ms": 1e3 * statistics.median(r[6] for r in rows)}
    a, b = out[a_side[0]], out[b_side[0]]
    print(f"{name:12s} {a_side[0]} / {b_side[0]}: training thread CPU ms/step {a['thread_ms']:.1f} / "
          f"{b['thread_ms']:.1f}; writer CPU {a['writer_cpu_ms']:.1f} / {b['writer_cpu_ms']:.1f}; "
          f"wall step {a['wall_ms']:.1f} / {b['wall_ms']:.1f}, step+flush {a['drained_ms']:.1f} / "
          f"{b['drained_ms']:.1f} (x{b['drained_ms'] / a['drained_ms']:.2f}); copies {a['copies']:.0f} "
          f"({a['copied_mb']:.1f} MB) / {b['copies']:.0f} ({b['copied_mb']:.1f} MB) of {a['files']:.0f} files; "
          f"load {out['load1']:.1f}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="alexnet,transformer,mlp")
    p.add_argument("--modes", default="graph,eager")
    p.add_argument("--json", default=None)
    p.add_argument("--tmp", default=None)
    p.add_argument("--with-copy", action="store_true")
    p.add_argument("--thread-time", action="store_true")
    p.add_argument("--ab", choices=("copy", "gate"), default="copy")
    p.add_argument("--gate", choices=("off", "on", "both"), default="off",
                   help="graph rows with the writer's gate of held windows off, on, or both in a row")
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args()
    if a.thread_time:
        rows = [thread_time(name, a.steps, a.tmp, a.ab) for name in a.models.split(",")]
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
            gates = {"off": (False,), "on": (True,), "both": (False, True)}[a.gate]
            for mode in a.modes.split(","):
                if a.with_copy and mode == "graph":
                    runs.append((mode, True, False))
                for gate in (gates if mode == "graph" else (False,)):
                    runs.append((mode, False, gate))
            for mode, copied, gate in runs:
                label = f"{mode} tensor" + (" copy-out" if copied else "") + (" gate" if gate else "")
                holdable, gate_was = core._holdable, Holds.gate
                if copied:
                    core._holdable = lambda t: False
                Holds.gate = gate
                try:
                    row = bench.dump_mode(label, build, dict(saved_data="tensor"), base.step,
                                          graph=mode == "graph", step_s=est, throughput=True)
                finally:
                    core._holdable, Holds.gate = holdable, gate_was
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
