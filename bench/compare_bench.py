"""The compare benchmark (issue 25): ``opdump compare`` on pairs of real dumps, warm and
cold page cache, against a plain numpy loop reading the same files.

Dumps (written once by ``bench/compare_dumps.py`` under ``--root``): ``alexnet`` (the
issue's AlexNet, batch 24, 4 iterations), ``small`` (tens of thousands of small tensors),
``large`` (few tensors of up to 64 MiB), each as A, B = A with the first weight scaled by
1 + 1e-6 (every pair differs: the full metric pass) and ``same`` = A run again
(byte-identical: compare's fast path), ``stats`` (a statistics-only pair of 136,250
rows: 250 iterations) and ``stats100k`` (its first 184 iterations: 100,280 rows, the
issue's 100,000-row case; folders copied from ``stats``), ``statsdiffer`` (two statistics dumps
whose operator sequences differ: a tiny MobileBERT, 40 iterations, bf16 autocast against
float32, ~172k and ~147k rows).

Each measurement is the command a user types, ``opdump compare A B --csv FILE -q``, in a
fresh process (imports included), timed by wall clock, with the CPU time of the process
and its workers next to it. MB/s is per side: the bytes of A's ``.npy`` files over the
wall time. *Cold*: ``os.sync()`` then ``posix_fadvise(DONTNEED)`` on every file of both
dumps before the run (only those pages leave the cache; the other users of the machine
keep theirs). *numpy loop*: one process loads each ``.npy`` file of A with ``np.load``
and makes one float64 pass over it in 65,536-element chunks -- the floor for reading the
same files from Python.

Usage::

    .venv/bin/python bench/compare_bench.py                 # all shapes, 3 repeats, markdown to stdout
    .venv/bin/python bench/compare_bench.py --shapes alexnet --repeat 1 --json /tmp/c.json
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import compare_dumps  # noqa: E402

CHUNK = 1 << 16


def npy_files(path: str) -> List[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".npy"))


def all_files(path: str) -> List[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


def drop_cache(paths: List[str]) -> None:
    """Write back, then ask the kernel to drop the cached pages of every file under ``paths``."""
    os.sync()
    for p in paths:
        for f in all_files(p):
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def cached_share(paths: List[str], limit: int = 400) -> float:
    """Share of the first ``limit`` files' pages in the page cache (mincore through mmap),
    to check that a cold run started cold; -1 when it cannot be measured."""
    import ctypes
    import mmap
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return -1.0
    page = mmap.PAGESIZE
    resident = total = 0
    for p in paths:
        for f in npy_files(p)[:limit]:
            size = os.path.getsize(f)
            if size == 0:
                continue
            with open(f, "rb") as fh:
                m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)   # writable view for ctypes; never written
                try:
                    n = (size + page - 1) // page
                    vec = (ctypes.c_ubyte * n)()
                    addr = ctypes.c_void_p.from_buffer(m)  # type: ignore[arg-type]
                    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
                    if libc.mincore(ctypes.addressof(addr), ctypes.c_size_t(size), vec) != 0:
                        return -1.0
                    resident += sum(1 for v in vec if v & 1)
                    total += n
                    del addr
                finally:
                    try:
                        m.close()
                    except BufferError:
                        pass
    return resident / total if total else -1.0


def stat_rows(path: str) -> int:
    """Rows of the ``statistic.csv`` files under ``path`` (headers not counted)."""
    n = 0
    for d, _, fs in os.walk(path):
        if "statistic.csv" in fs:
            with open(os.path.join(d, "statistic.csv"), "rb") as f:
                n += max(sum(1 for _ in f) - 1, 0)
    return n


def data_bytes(path: str) -> int:
    return sum(os.path.getsize(f) for f in npy_files(path))


def run_cli(a: str, b: str, workdir: str) -> Dict[str, float]:
    """``opdump compare A B`` in a fresh process: wall and CPU seconds (process + workers)."""
    exe = os.path.join(ROOT, ".venv", "bin", "opdump")
    cmd = ([exe] if os.path.exists(exe) else [sys.executable, "-m", "opdump"]) + \
        ["compare", a, b, "--csv", os.path.join(workdir, "cmp.csv"), "-q"]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"opdump compare failed ({p.returncode}): {p.stderr[-2000:]}")
    return {"wall_s": wall, "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)}


_API = """
import json, sys, time
t0 = time.perf_counter()
from opdump.analysis.compare import compare
import pandas
t1 = time.perf_counter()
r = compare(sys.argv[1], sys.argv[2], progress=False)
r.to_csv(sys.argv[3])
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "compare_s": t2 - t1}))
"""


def run_api(a: str, b: str, workdir: str) -> Dict[str, float]:
    """``compare(A, B)`` + ``to_csv`` timed inside a fresh process, after its imports (the CLI
    also imports torch through ``opdump/__init__``: that start-up is not compare's)."""
    p = subprocess.run([sys.executable, "-c", _API, a, b, os.path.join(workdir, "api.csv")], cwd=ROOT,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"compare() failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def numpy_loop(path: str) -> Dict[str, float]:
    """Load every ``.npy`` file of ``path`` and make one float64 pass (same process)."""
    import numpy as np
    buf = np.empty(CHUNK, np.float64)
    t0, c0 = time.perf_counter(), time.process_time()
    total = 0.0
    for f in npy_files(path):
        a = np.load(f, allow_pickle=False)
        flat = a.reshape(-1)
        if flat.dtype.kind not in "biuf":
            continue
        for s in range(0, flat.size, CHUNK):
            c = flat[s:s + CHUNK]
            x = buf[:c.size]
            x[...] = c
            total += float(x.sum())
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


STATS100K_ITERATIONS = 184          # x 545 rows per iteration of the small MLP = 100,280 rows


def stats100k(root: str, log=print) -> Dict[str, str]:
    """The ``stats100k`` pair: the first 184 iteration folders of the ``stats`` pair (and its
    rank-level files, the global order cut to those iterations), copied once."""
    import shutil
    src = compare_dumps.ensure(root, "stats", log=log)
    out = {}
    for v in ("a", "b"):
        dst = os.path.join(root, "stats100k", v)
        out[v] = dst
        if os.path.exists(os.path.join(dst, ".bench_done")):
            continue
        if os.path.isdir(dst):
            shutil.rmtree(dst)
        rank = os.path.join(src[v], "rank_0")
        for sub in ("execution_order", "graphs"):
            if os.path.isdir(os.path.join(rank, sub)):
                shutil.copytree(os.path.join(rank, sub), os.path.join(dst, "rank_0", sub))
        for it in range(STATS100K_ITERATIONS):
            shutil.copytree(os.path.join(rank, "Net", "0", str(it)), os.path.join(dst, "rank_0", "Net", "0", str(it)))
        glob_order = os.path.join(dst, "rank_0", "execution_order", "ms_global_execution_order_graph_0.csv")
        if os.path.exists(glob_order):
            with open(glob_order) as f:
                lines = f.readlines()[:STATS100K_ITERATIONS]
            with open(glob_order, "w") as f:
                f.writelines(lines)
        with open(os.path.join(dst, ".bench_done"), "w") as f:
            f.write(f"{STATS100K_ITERATIONS}\n")
        log(f"stats100k/{v}: {STATS100K_ITERATIONS} iterations copied from stats/{v}")
    return out


def measure(root: str, shapes: List[str], repeat: int, workdir: str, log=print) -> Dict:
    out: Dict = {"machine": machine(), "runs": []}
    for shape in shapes:
        dumps = stats100k(root, log) if shape == "stats100k" else compare_dumps.ensure(root, shape, log=log)
        a = dumps["a"]
        mb = data_bytes(a) / 1e6
        nfiles = len(npy_files(a))
        rows = {v: stat_rows(p) for v, p in dumps.items()} if shape.startswith("stats") else {}
        variants = ["b"] if shape.startswith("stats") else ["b", "same"]
        for v in variants:
            b = dumps[v]
            for cache in ("warm", "cold"):
                walls, cpus, resid, api = [], [], [], []
                if cache == "warm":
                    run_cli(a, b, workdir)            # brings both dumps into the page cache
                for _ in range(repeat):
                    if cache == "cold":
                        drop_cache([a, b])
                        resid.append(cached_share([a, b]))
                    r = run_cli(a, b, workdir)
                    walls.append(r["wall_s"])
                    cpus.append(r["cpu_s"])
                    if cache == "warm":
                        api.append(run_api(a, b, workdir)["compare_s"])
                pair = "A vs B (perturbed)" if v == "b" else "A vs A again (identical)"
                if shape in compare_dumps.AUTOCAST:
                    pair = "bf16 autocast vs float32"
                row = {"shape": shape, "pair": pair,
                       "cache": cache, "mb_per_side": mb, "files_per_side": nfiles,
                       "rows_per_side": [rows[x] for x in ("a", v)] if rows else None,
                       "wall_s": statistics.median(walls), "walls": walls, "cpu_s": statistics.median(cpus),
                       "cached_before": resid, "load": os.getloadavg()[0],
                       "api_s": statistics.median(api) if api else None}
                row["mb_s"] = mb / row["wall_s"] if mb else None
                out["runs"].append(row)
                if row["api_s"] and mb:
                    row["api_mb_s"] = mb / row["api_s"]
                log(f"{shape:8s} {v:5s} {cache}: {row['wall_s']:.2f} s wall, {row['cpu_s']:.2f} s CPU"
                    + (f", {row['mb_s']:.0f} MB/s per side" if mb else "")
                    + (" (rows per side " + " / ".join(f"{n:,}" for n in row["rows_per_side"]) + ")" if rows else "")
                    + f", load {row['load']:.1f}")
        if not shape.startswith("stats"):
            for cache in ("warm", "cold"):
                walls, cpus = [], []
                if cache == "warm":
                    numpy_loop(a)
                for _ in range(repeat):
                    if cache == "cold":
                        drop_cache([a])
                    r = numpy_loop(a)
                    walls.append(r["wall_s"])
                    cpus.append(r["cpu_s"])
                row = {"shape": shape, "pair": "numpy loop over A", "cache": cache, "mb_per_side": mb,
                       "files_per_side": nfiles, "wall_s": statistics.median(walls), "walls": walls,
                       "cpu_s": statistics.median(cpus), "load": os.getloadavg()[0]}
                row["mb_s"] = mb / row["wall_s"]
                out["runs"].append(row)
                log(f"{shape:8s} numpy {cache}: {row['wall_s']:.2f} s, {row['mb_s']:.0f} MB/s")
    return out


def machine() -> Dict[str, str]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return {"cpu": cpu, "cores": str(os.cpu_count()), "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "opdump commit": rev, "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def markdown(res: Dict) -> str:
    lines = ["| dump | pair | cache | MB per side (files; rows A / B) | command wall s | CPU s | MB/s per side "
             "| `compare()` s (MB/s) | load |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        mbs = f"{r['mb_s']:.0f}" if r.get("mb_s") else "–"
        api = "–"
        if r.get("api_s"):
            api = f"{r['api_s']:.2f}" + (f" ({r['api_mb_s']:.0f})" if r.get("api_mb_s") else "")
        size = f"{r['mb_per_side']:.0f} ({r['files_per_side']})"
        if r.get("rows_per_side"):
            size = "{:,} / {:,} rows".format(*r["rows_per_side"])
        lines.append(f"| {r['shape']} | {r['pair']} | {r['cache']} | {size} | "
                     f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | {mbs} | {api} | {r['load']:.1f} |")
    m = res["machine"]
    return "\n".join(lines) + "\n\n" + "; ".join(f"{k}: {v}" for k, v in m.items()) + "\n"


BEGIN, END = "<!-- compare_bench: begin -->", "<!-- compare_bench: end -->"


def update_section(path: str, res: Dict, note: str = "") -> None:
    """Replace (or append) this benchmark's marked section of ``path``; the file is written whole."""
    body = (f"{BEGIN}\n## compare (issue 25)\n\nWritten by `bench/compare_bench.py --update` (see bench/README.md, "
            "\"compare benchmark\"); MB/s is per side (bytes of A's `.npy` files over the wall time).\n\n"
            + markdown(res) + ("\n" + note.strip() + "\n" if note.strip() else "") + END + "\n")
    text = open(path).read() if os.path.exists(path) else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1].lstrip("\n")
        text = head + body + ("\n" + after if after else "")       # one blank line before the next block
    else:
        text = text.rstrip("\n") + "\n\n" + body
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="opdump compare benchmark (warm/cold, numpy reference)")
    ap.add_argument("--root", default="/tmp/opdump-cmp", help="where the benchmark's dumps live")
    ap.add_argument("--shapes", default="alexnet,small,large,stats,stats100k,statsdiffer")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--from-json", nargs="+", help="results of earlier runs (merged in order): nothing measured")
    ap.add_argument("--update", metavar="FILE", help="rewrite this benchmark's section of FILE (BENCHMARKS.md)")
    ap.add_argument("--note", metavar="FILE", help="markdown appended to that section")
    a = ap.parse_args(argv)
    if a.from_json:
        res = {"machine": {}, "runs": []}
        for p in a.from_json:
            with open(p) as f:
                r = json.load(f)
            res["machine"] = res["machine"] or r.get("machine", {})
            res["runs"] += r["runs"]        # bench/msprobe_compare.py's results merge the same way
    else:
        import tempfile
        with tempfile.TemporaryDirectory() as work:
            res = measure(a.root, a.shapes.split(","), a.repeat, work,
                          log=lambda s: print(s, file=sys.stderr, flush=True))
    if a.update:
        note = open(a.note).read() if a.note else ""
        update_section(a.update, res, note)
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f, indent=1)
        os.replace(tmp, a.json)
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
