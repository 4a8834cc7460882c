"""MindStudio Probe (``mindstudio-probe``) on the benchmark models, for comparison.

Run by ``bench/run.py`` with the Python of a throwaway venv that has
``mindstudio-probe`` and this project's torch.  For each model it interleaves
plain eager steps with steps under ``PrecisionDebugger`` (level L1, every
step; ``start(model)`` / ``stop()`` / ``step()`` around each step, as its docs
show), task ``statistics`` then ``tensor``, and prints one ``RESULT {json}`` line.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import harness as H  # noqa: E402
from bench import dumps as D  # noqa: E402
from bench import models as M  # noqa: E402


def _config(folder: str, task: str) -> str:
    cfg = {"task": task, "dump_path": os.path.join(folder, "dump"), "rank": [], "step": [], "level": "L1",
           "async_dump": False, task: {"scope": [], "list": [], "data_mode": ["all"]}}
    if task == "statistics":
        cfg[task]["summary_mode"] = "statistics"
    path = os.path.join(folder, f"{task}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def _count_tensors(o) -> int:
    if isinstance(o, dict):
        return (1 if "Max" in o or "data_name" in o else 0) + sum(_count_tensors(v) for v in o.values())
    if isinstance(o, list):
        return sum(_count_tensors(v) for v in o)
    return 0


def _counts(dump: str) -> dict:
    """APIs and tensors in the newest step's dump.json."""
    import glob
    files = glob.glob(os.path.join(dump, "step*", "*", "dump.json"))
    if not files:
        return {}
    newest = max(files, key=lambda p: int(p.split(os.sep + "step")[-1].split(os.sep)[0] or 0))
    with open(newest) as f:
        data = json.load(f).get("data", {})
    return {"apis_per_step": len(data), "tensors_per_step": _count_tensors(data)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tmp", default=tempfile.gettempdir())
    ap.add_argument("--models", default="alexnet,transformer", help="comma list of bench/models.py's BUILDERS")
    ap.add_argument("--tasks", default="statistics",
                    help="PrecisionDebugger is a process-wide singleton that patches torch: one task per process")
    args = ap.parse_args()
    import msprobe
    from msprobe.pytorch import PrecisionDebugger
    try:
        from importlib.metadata import version as _dist_version
        version = _dist_version("mindstudio-probe")
    except Exception:  # noqa: BLE001
        version = getattr(msprobe, "__version__", "?")
    out = {"version": version, "models": {}}
    for name in args.models.split(","):
        res = {}
        base = M.BUILDERS[name]()
        H.warm(base.step, 3)           # a fresh process's first steps are slow (lazy init): not the estimate
        est = sorted(H.warm(base.step, 1) for _ in range(5))[2]
        for task in args.tasks.split(","):
            folder = tempfile.mkdtemp(prefix=f"msprobe-{name}-{task}-", dir=args.tmp)
            sink = io.StringIO()
            with contextlib.redirect_stdout(sink):
                dbg = PrecisionDebugger(config_path=_config(folder, task))
                w = M.BUILDERS[name]()

                def step(w=w, dbg=dbg):
                    dbg.start(w.model)
                    w.step()
                    dbg.stop()
                    dbg.step()

                H.warm(step, 2)
                dump = os.path.join(folder, "dump")

                def prune(dump=dump):
                    steps = sorted((d for d in os.listdir(dump) if d.startswith("step")),
                                   key=lambda s: int(s[4:]) if s[4:].isdigit() else -1) if os.path.isdir(dump) else []
                    for d in steps[:-1]:
                        shutil.rmtree(os.path.join(dump, d), ignore_errors=True)

                mode = H.Side(step, enter=D.sync_disk if task == "tensor" else None, after_block=prune)
                b = H.Side(base.step)
                # the same schedule as bench/run.py: step by step for statistics, blocks of 3 for tensors
                if task == "tensor":
                    sched = (H.rounds_for(est, 3, target_s=4.0, lo=3, hi=6), 3)
                else:
                    sched = (H.rounds_for(est, 1, target_s=4.0, lo=7, hi=40), 1)
                H.interleave(b, mode, *sched)
            res[task] = {**_counts(dump), "median": mode.median, "base_median": b.median, "ratio": mode.median / b.median,
                         "paired_ratio": H.paired_ratio(b, mode), "cpu_ratio": mode.cpu_median / b.cpu_median,
                         "steps": len(mode.times)}
            shutil.rmtree(folder, ignore_errors=True)
            gc.collect()
        out["models"][name] = res
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
