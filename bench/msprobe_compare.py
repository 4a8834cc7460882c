"""MindStudio Probe's own compare on its own dumps of the compare benchmark's models, for
the compare benchmark (bench/compare_bench.py, BENCHMARKS.md "compare").

Why its own dumps: ``msprobe compare`` reads the ``dump.json`` + ``dump_tensor_data/``
layout its ``PrecisionDebugger`` writes; on this project's MindSpore-layout dumps its
``--rank`` (MindSpore graph) mode needs the ``mindspore`` package (``import mindspore``
at ``msprobe.mindspore``'s import), which is not installed here. So each shape of
``bench/compare_dumps.py`` is dumped again by ``PrecisionDebugger`` (task ``tensor``,
level L1, every step, same seeds, data and the same ``1 + 1e-6`` perturbation of the
first weight for B), and ``msprobe compare`` runs on those, timed like ``opdump compare``
(wall, CPU of the process and its children, warm and cold page cache).

Run with the Python of the venv bench/msprobe_setup.py makes (it sees this project's
torch through a ``.pth``)::

    /tmp/msvenv/bin/python bench/msprobe_compare.py --root /tmp/opdump-cmp --shapes alexnet --json out.json
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import compare_dumps as CD  # noqa: E402
from compare_bench import all_files, drop_cache  # noqa: E402


def dump_one(path: str, shape: str, variant: str) -> float:
    """``PrecisionDebugger`` (tensor, L1) over the iterations of ``shape`` -> seconds."""
    from msprobe.pytorch import PrecisionDebugger
    build, iterations, _saved = CD.SHAPES[shape]
    os.makedirs(path, exist_ok=True)
    cfg = {"task": "tensor", "dump_path": os.path.join(path, "dump"), "rank": [], "step": [], "level": "L1",
           "async_dump": False, "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    torch.manual_seed(0)
    model, x, y, first = build()
    if variant == "b":
        with torch.no_grad():
            first.mul_(1 + 1e-6)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        dbg = PrecisionDebugger(config_path=cfg_path)
        for _ in range(iterations):
            dbg.start(model)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            dbg.stop()
            dbg.step()
    return time.perf_counter() - t0


def ensure(root: str, shape: str, log=print) -> dict:
    """msprobe's dumps of ``shape`` (A = perturbed, B = reference) under root/msprobe/."""
    out = {}
    for v in ("a", "b"):
        p = os.path.join(root, "msprobe", shape, v)
        done = os.path.join(p, ".bench_done")
        if not os.path.exists(done):
            shutil.rmtree(p, ignore_errors=True)
            # PrecisionDebugger is a process-wide singleton: one dump per process
            r = subprocess.run([sys.executable, __file__, "--dump-one", p, shape, v], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"msprobe dump of {shape}/{v} failed: {r.stderr[-3000:]}")
            with open(done, "w") as f:
                f.write(r.stdout.strip().splitlines()[-1] + "\n")
            log(f"msprobe dumped {shape}/{v}: {r.stdout.strip().splitlines()[-1]} s")
        out[v] = os.path.join(p, "dump")
    return out


def data_bytes(dump: str) -> tuple:
    files = [f for f in all_files(dump) if f.endswith((".pt", ".npy"))]
    return sum(os.path.getsize(f) for f in files), len(files)


def steps(dump: str) -> list:
    return sorted((d for d in os.listdir(dump) if d.startswith("step") and d[4:].isdigit()), key=lambda d: int(d[4:]))


def run_compare(a: str, b: str, work: str) -> dict:
    """``msprobe compare -tp A/stepN -gp B/stepN -o OUT`` for every step both dumps hold
    (its directory mode compares one step's ``proc*`` folder), each in a fresh process:
    wall and CPU seconds summed over the steps."""
    exe = os.path.join(os.path.dirname(sys.executable), "msprobe")
    wall = cpu = 0.0
    rows = 0
    both = [s for s in steps(a) if s in set(steps(b))]
    if not both:
        raise RuntimeError(f"no step common to {a} and {b}")
    for step in both:
        out = os.path.join(work, "msprobe_out", step)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run([exe, "compare", "-tp", os.path.join(a, step), "-gp", os.path.join(b, step), "-o", out],
                           capture_output=True, text=True)
        wall += time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu += (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        results = glob.glob(os.path.join(out, "**", "*.csv"), recursive=True) + \
            glob.glob(os.path.join(out, "**", "*.xlsx"), recursive=True)
        if p.returncode != 0 or not results:
            raise RuntimeError(f"msprobe compare {step} failed ({p.returncode}): {(p.stdout + p.stderr)[-3000:]}")
        for f in results:
            if f.endswith(".csv"):
                with open(f, encoding="utf-8", errors="replace") as fh:
                    rows += max(0, sum(1 for _ in fh) - 1)
    return {"wall_s": wall, "cpu_s": cpu, "result_rows": rows, "steps": len(both)}


def measure(root: str, shapes, repeat: int, work: str, log=print, caches=("warm", "cold")) -> dict:
    from importlib.metadata import version
    res = {"version": version("mindstudio-probe"), "runs": []}
    for shape in shapes:
        d = ensure(root, shape, log)
        # compare the directories holding step*/rank*/dump.json
        mb, nfiles = data_bytes(d["a"])
        for cache in caches:
            walls, cpus, last = [], [], {}
            if cache == "warm":
                run_compare(d["a"], d["b"], work)
            for _ in range(repeat):
                if cache == "cold":
                    drop_cache([d["a"], d["b"]])
                last = run_compare(d["a"], d["b"], work)
                walls.append(last["wall_s"])
                cpus.append(last["cpu_s"])
            row = {"shape": shape, "pair": "msprobe compare, its own dumps (A perturbed vs B)", "cache": cache,
                   "mb_per_side": mb / 1e6, "files_per_side": nfiles, "wall_s": statistics.median(walls),
                   "walls": walls, "cpu_s": statistics.median(cpus), "load": os.getloadavg()[0],
                   "result_rows": last.get("result_rows"), "api_s": None}
            row["mb_s"] = row["mb_per_side"] / row["wall_s"] if mb else None
            res["runs"].append(row)
            log(f"msprobe {shape} {cache}: {row['wall_s']:.2f} s wall, {row['cpu_s']:.2f} s CPU, "
                f"{row['mb_per_side']:.0f} MB/side, {row['result_rows']} rows, load {row['load']:.1f}")
    return res


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--dump-one":
        print(f"{dump_one(argv[1], argv[2], argv[3]):.1f}")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="/tmp/opdump-cmp")
    ap.add_argument("--shapes", default="alexnet")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--caches", default="warm,cold")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    import tempfile
    with tempfile.TemporaryDirectory() as work:
        res = measure(a.root, a.shapes.split(","), a.repeat, work, log=lambda s: print(s, file=sys.stderr, flush=True),
                      caches=tuple(a.caches.split(",")))
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(a.json + ".tmp", a.json)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
