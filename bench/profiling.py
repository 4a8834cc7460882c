"""The profile of a dumped step, summarised: cProfile's top functions and time buckets,
torch.profiler's top operators, and the per-stage probes run in a child process."""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402



def _short_path(path: str) -> str:
    for marker in ("site-packages/", "/work/main/", ROOT + "/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _top_python(prof: cProfile.Profile, steps: int, n: int = 14) -> List[Dict[str, Any]]:
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, func), (cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"func": f"{_short_path(file)}:{line}({func})", "calls": nc / steps,
                     "tottime": tt / steps, "cumtime": ct / steps})
    rows.sort(key=lambda r: r["tottime"], reverse=True)
    return rows[:n]


_BUCKETS = (
    ("statistic kernels (aminmax, vector_norm, mean, counts, stack/cat/copy of results)",
     ("linalg_vector_norm", "torch.aminmax", "method 'mean'", "torch.stack", "torch.cat", "method 'sum'",
      "torch.isnan", "torch.lt", "torch.gt", "torch.eq", "nan_to_num", "method 'amax'", "method 'amin'",
      "method 'numpy'", "method 'cpu'", "method 'to' of")),
    ("tensor copies (clone = the copy-out)", ("method 'clone'",)),
    ("waiting on locks (the writer's queue, the final flush)", ("method 'acquire'",)),
    ("file system calls in the main thread (mkdir, open)", ("posix.mkdir", "io.open", "posix.stat", "posix.replace")),
)


def _buckets(prof: cProfile.Profile, steps: int, wall: float) -> List[Dict[str, Any]]:
    """Own time of the main thread by kind: opdump's Python, statistic kernels, copies, waits, rest."""
    stats = pstats.Stats(prof, stream=io.StringIO())
    sums = {name: 0.0 for name, _ in _BUCKETS}
    opdump_py = 0.0
    total = 0.0
    for (file, line, func), (cc, nc, tt, ct, _c) in stats.stats.items():  # type: ignore[attr-defined]
        total += tt
        key = f"{file}:{func}"
        for name, pats in _BUCKETS:
            if any(p in key for p in pats):
                sums[name] += tt
                break
        else:
            if "/opdump/" in file:
                opdump_py += tt
    rows = [{"what": "opdump's own Python code (recorder, stats engine, taps, writer submit)", "ms": opdump_py}]
    rows += [{"what": k, "ms": v} for k, v in sums.items()]
    rows = [{"what": r["what"], "ms": r["ms"] / steps * 1e3} for r in rows]
    rows.append({"what": "everything else (the model's own forward/backward/optimizer, torch, Python)",
                 "ms": max(0.0, wall * 1e3 - sum(r["ms"] for r in rows))})
    return rows


def _probes(quick: bool) -> List[Dict[str, Any]]:
    """Micro-measurements of the primitives the profile points at (torch only, no opdump).

    Run in a fresh child process: allocation costs depend on the heap's history.
    """
    n = 1024 if quick else 4096
    x = torch.randn(n, n)
    small = torch.randn(8, 8, 55, 55)
    warm_buf = torch.empty_like(x)

    def t(f, reps=10):
        f()
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        return (time.perf_counter() - t0) / reps * 1e3

    ref = torch.linalg.vector_norm(x, dtype=torch.float64).item()
    two_level = lambda: torch.linalg.vector_norm(  # noqa: E731
        torch.linalg.vector_norm(x.reshape(-1, 4096 if n >= 4096 else n), dim=1).double())
    rows = [
        {"what": f"vector_norm(float32 {n}×{n}, dtype=float64) — opdump's CPU 'high' l2norm",
         "ms": t(lambda: torch.linalg.vector_norm(x, dtype=torch.float64)), "rel_err": 0.0},
        {"what": f"vector_norm(float32 {n}×{n}) in float32", "ms": t(lambda: torch.linalg.vector_norm(x)),
         "rel_err": abs(torch.linalg.vector_norm(x).item() - ref) / ref},
        {"what": "two-level: float32 norms of 4096-element rows, combined in float64",
         "ms": t(two_level), "rel_err": abs(two_level().item() - ref) / ref},
        {"what": "x.mean(dtype=float64) — opdump's CPU 'high' avg", "ms": t(lambda: x.mean(dtype=torch.float64))},
        {"what": f"torch.aminmax({n}×{n})", "ms": t(lambda: torch.aminmax(x))},
        {"what": f"x.clone() ({n * n * 4 / 2**20:.0f} MiB) — the copy-out: a fresh allocation, page faults",
         "ms": t(lambda: x.clone(memory_format=torch.contiguous_format))},
        {"what": "copy_ of the same into a reused buffer", "ms": t(lambda: warm_buf.copy_(x))},
        {"what": "vector_norm(dtype=float64) of an 8×8×55×55 activation (AlexNet conv1 size), per call",
         "ms": t(lambda: torch.linalg.vector_norm(small, dtype=torch.float64), 200)},
        {"what": "vector_norm (float32) of the same, per call",
         "ms": t(lambda: torch.linalg.vector_norm(small), 200)},
        {"what": "torch.aminmax of the same, per call", "ms": t(lambda: torch.aminmax(small), 200)},
    ]
    return rows


def _top_ops(tp, steps: int, n: int = 12) -> List[Dict[str, Any]]:
    rows = []
    for e in tp.key_averages():
        rows.append({"op": e.key, "calls": e.count / steps, "self_ms": e.self_cpu_time_total / 1e3 / steps,
                     "total_ms": e.cpu_time_total / 1e3 / steps})
    rows.sort(key=lambda r: r["self_ms"], reverse=True)
    return rows[:n]
