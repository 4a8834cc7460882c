"""Timing, configs, dump-folder housekeeping and machine facts for ``bench/run.py``.

Measuring on a shared 2-core machine: every ratio is taken between two step
functions run *interleaved* in the same process (rounds of baseline steps, then
rounds of the measured mode's steps), so that a neighbour's load hits both sides
alike; medians, never means.
"""
from __future__ import annotations

import datetime
import gc
import glob
import json
import os
import platform
import resource
import shutil
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np


# --------------------------------------------------------------------------- timing
@dataclass
class Side:
    """One side of an interleaved measurement."""

    step: Callable[[], None]
    enter: Optional[Callable[[], None]] = None      # before each block (untimed)
    exit: Optional[Callable[[], None]] = None       # after each block (untimed)
    drain: Optional[Callable[[], None]] = None      # after each block, timed apart (writer flush)
    after_block: Optional[Callable[[], None]] = None  # after drain, untimed (delete old files)
    warm_steps: int = 0                             # untimed steps at the start of each block
    times: List[float] = field(default_factory=list)
    cpu: List[float] = field(default_factory=list)      # process CPU seconds per step (all threads)
    blocks: List[List[float]] = field(default_factory=list)
    drains: List[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def amortized(self) -> float:
        """Per step, including the time to drain the writer after each block."""
        return (sum(self.times) + sum(self.drains)) / len(self.times)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    @property
    def spread(self) -> float:
        """(max - min) / median of the timed steps: how noisy this side was."""
        return (max(self.times) - min(self.times)) / self.median if self.times else float("nan")


def run_block(side: Side, n: int) -> None:
    if side.enter:
        side.enter()
    block: List[float] = []
    try:
        for _ in range(side.warm_steps):
            side.step()
        for _ in range(n):
            c0 = time.process_time()
            t0 = time.perf_counter()
            side.step()
            t1 = time.perf_counter()
            side.cpu.append(time.process_time() - c0)
            side.times.append(t1 - t0)
            block.append(t1 - t0)
    finally:
        side.blocks.append(block)
        if side.exit:
            side.exit()
    if side.drain:
        t0 = time.perf_counter()
        side.drain()
        side.drains.append(time.perf_counter() - t0)
    if side.after_block:
        side.after_block()


def interleave(base: Side, mode: Side, rounds: int, per_round: int) -> float:
    """``rounds`` × (``per_round`` baseline steps, ``per_round`` mode steps).

    Waits first (≤ 20 s) for the neighbours to quieten; returns the CPU cores other
    processes used meanwhile (a noise indicator for the report).
    """
    # A clean start, and then the garbage collector runs as it does in a user's process (no
    # gc.freeze(): with it, a dump that leaves many tracked objects alive would never pay for
    # the full collections they trigger — 2.6 ms per eager AlexNet step, before the rows
    # were made untracked).
    gc.collect()
    wait_quiet()
    a = cpu_snapshot()
    for r in range(rounds):
        run_block(base, per_round)
        run_block(mode, per_round)
    return others_cores(a, cpu_snapshot())


def paired_ratio(base: Side, mode: Side) -> float:
    """Median over rounds of (mode block median / the baseline block run just before it)."""
    ratios = [statistics.median(m) / statistics.median(b) for b, m in zip(base.blocks, mode.blocks) if b and m]
    return statistics.median(ratios)


def rounds_for(step_s: float, per_round: int, *, target_s: float, lo: int, hi: int) -> int:
    """Rounds so that each side runs about ``target_s`` seconds, within [lo, hi]."""
    import math
    if step_s <= 0:
        return hi
    return max(lo, min(hi, math.ceil(target_s / (step_s * per_round))))


def warm(step: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return time.perf_counter() - t0


def under_null_dispatch_mode(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` run under a ``TorchDispatchMode`` that only forwards each operator: the cost
    of routing every ATen operator through Python, which any Python dispatch-mode capture
    (opdump's eager capture included) pays before doing anything."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class NullMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    mode = NullMode()

    def wrapped() -> None:
        with mode:
            step()
    return wrapped


# --------------------------------------------------------------------------- configs
def write_config(folder: str, dump_path: str, *, iteration: str = "all", saved_data: str = "tensor",
                 stat_calc_mode: Optional[str] = None, queue_mb: Optional[int] = None,
                 extra_e2e: Optional[Dict] = None) -> str:
    """A MindSpore data_dump.json (the seed's CPU/GPU example) in ``folder`` → its path."""
    cfg = {
        "common_dump_settings": {
            "op_debug_mode": 0, "dump_mode": 0, "path": dump_path, "net_name": "Net",
            "iteration": iteration, "saved_data": saved_data, "input_output": 0, "kernels": [],
            "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
        },
        "e2e_dump_settings": {"enable": True, "trans_flag": True},
    }
    if stat_calc_mode:
        cfg["e2e_dump_settings"]["stat_calc_mode"] = stat_calc_mode
    if extra_e2e:
        cfg["e2e_dump_settings"].update(extra_e2e)
    if queue_mb:
        cfg["opdump_settings"] = {"writer_queue_mb": queue_mb}
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "data_dump.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


# --------------------------------------------------------------------------- dump folders
def iteration_dirs(dump_path: str) -> Dict[int, List[str]]:
    """iteration → its folders (one per graph id) under ``dump_path``."""
    out: Dict[int, List[str]] = {}
    for d in glob.glob(os.path.join(dump_path, "rank_*", "*", "*", "*")):
        name = os.path.basename(d)
        if name.isdigit() and os.path.isdir(d):
            out.setdefault(int(name), []).append(d)
    return out


def prune_iterations(dump_path: str, keep_last: bool = True) -> None:
    """Delete finished iteration folders (all but the newest when ``keep_last``)."""
    its = iteration_dirs(dump_path)
    if not its:
        return
    newest = max(its)
    for it, dirs in its.items():
        if keep_last and it == newest:
            continue
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def load_iteration_arrays(dump_path: str) -> List[np.ndarray]:
    """Every ``.npy`` of the newest dumped iteration, read into memory."""
    its = iteration_dirs(dump_path)
    if not its:
        return []
    arrays = []
    for d in its[max(its)]:
        for p in sorted(glob.glob(os.path.join(d, "*.npy"))):
            arrays.append(np.load(p, allow_pickle=False))
    return arrays


def sync_disk() -> None:
    """Write dirty pages back, so that timed write phases start from the same page-cache state."""
    try:
        os.sync()
    except AttributeError:  # pragma: no cover - not on Linux
        pass


class NumpySaveBaseline:
    """A plain ``numpy.save`` loop writing ``arrays``, one round after each block of the dump
    it is compared with (so both see the same disk and page-cache state); a round writes
    the arrays ``times`` times, up to an ``os.sync()`` inside its timing."""

    def __init__(self, arrays: List[np.ndarray], folder: str):
        self.arrays = arrays
        self.folder = folder
        self.bytes = 0
        self.seconds = 0.0
        self.files = 0

    def round(self, times: int) -> None:
        sync_disk()
        target = os.path.join(self.folder, f"npsave-{self.files}")
        os.makedirs(target, exist_ok=True)
        t0 = time.perf_counter()
        for k in range(times):
            for i, a in enumerate(self.arrays):
                np.save(os.path.join(target, f"a{k}-{i}.npy"), a, allow_pickle=False)
                self.files += 1
        sync_disk()             # timed: the bytes reach the disk, as the dump's drain makes them
        self.seconds += time.perf_counter() - t0
        self.bytes += sum(a.nbytes for a in self.arrays) * times
        shutil.rmtree(target, ignore_errors=True)

    @property
    def rate(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else float("nan")


# --------------------------------------------------------------------------- memory cgroup
class MemoryCgroup:
    """A fresh memory cgroup (v1 or v2) under this process's own, limited to ``limit_bytes``:
    resident memory *and* page cache of the processes in it, i.e. the RAM they are given.

    ``preexec`` moves a child into it (``subprocess.run(..., preexec_fn=cg.preexec)``);
    ``usage()`` reads its peak and its OOM kills after the child ran.  Needs a writable
    cgroup tree (root here); :meth:`create` raises OSError naming what failed otherwise.
    """

    def __init__(self, path: str, version: int):
        self.path, self.version = path, version

    @classmethod
    def create(cls, name: str, limit_bytes: int) -> "MemoryCgroup":
        with open("/proc/self/cgroup") as f:
            lines = [ln.strip().split(":", 2) for ln in f if ln.strip()]
        v1 = next((p for _, ctrl, p in lines if "memory" in ctrl.split(",")), None)
        if v1 is not None and os.path.isdir("/sys/fs/cgroup/memory"):
            path, version = os.path.join("/sys/fs/cgroup/memory", v1.lstrip("/"), name), 1
        else:
            v2 = next((p for h, ctrl, p in lines if h == "0" and ctrl == ""), None)
            if v2 is None:
                raise OSError("no memory cgroup in /proc/self/cgroup")
            path, version = os.path.join("/sys/fs/cgroup", v2.lstrip("/"), name), 2
        if os.path.isdir(path):
            os.rmdir(path)
        os.mkdir(path)
        cg = cls(path, version)
        try:
            cg._write("memory.limit_in_bytes" if version == 1 else "memory.max", str(limit_bytes))
            if version == 2:
                cg._write("memory.swap.max", "0")
        except OSError:
            cg.remove()
            raise
        return cg

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def _read(self, name: str) -> str:
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def preexec(self) -> None:
        self._write("cgroup.procs", str(os.getpid()))

    def usage(self) -> Dict[str, int]:
        """{"peak_bytes": …, "oom_kills": …} (what this kernel's files say; absent keys: not given)."""
        out: Dict[str, int] = {}
        try:
            out["peak_bytes"] = int(self._read("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"))
        except (OSError, ValueError):
            pass
        try:
            text = self._read("memory.oom_control" if self.version == 1 else "memory.events")
            for line in text.splitlines():
                key, _, val = line.partition(" ")
                if key == "oom_kill":
                    out["oom_kills"] = int(val)
        except (OSError, ValueError):
            pass
        return out

    def remove(self) -> None:
        try:
            os.rmdir(self.path)
        except OSError:
            pass


# --------------------------------------------------------------------------- machine
def _proc_kib(path: str, key: str) -> Optional[int]:
    """The ``key: N kB`` value of a /proc file (``/proc/meminfo``, ``/proc/self/status``), or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss_mib() -> float:
    """Peak resident memory of this process image (VmHWM).

    Not ``ru_maxrss``: Linux carries that across fork + exec, so a child started by a
    big parent would report the parent's peak.
    """
    kib = _proc_kib("/proc/self/status", "VmHWM")
    if kib is not None:
        return kib / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def swap_total_mib() -> Optional[float]:
    """SwapTotal of /proc/meminfo in MiB (None where there is no such file)."""
    kib = _proc_kib("/proc/meminfo", "SwapTotal")
    return None if kib is None else kib / 1024.0


def machine_info(tmp_dir: str) -> Dict[str, str]:
    import torch
    info: Dict[str, str] = {}
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    kib = _proc_kib("/proc/meminfo", "MemTotal")
    mem = "unknown" if kib is None else f"{kib / 1024 / 1024:.1f} GiB"
    info["cpu"] = cpu
    info["cores"] = str(os.cpu_count())
    info["torch threads"] = str(torch.get_num_threads())
    info["ram"] = mem
    info["os"] = f"{platform.system()} {platform.release()}"
    info["python"] = platform.python_version()
    info["torch"] = torch.__version__
    info["numpy"] = np.__version__
    try:
        from opdump.version import __version__
        info["opdump"] = __version__
    except Exception:  # noqa: BLE001
        pass
    try:
        import subprocess
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        if rev:
            info["opdump commit"] = rev
    except Exception:  # noqa: BLE001
        pass
    st = os.statvfs(tmp_dir)
    info["dump folder"] = f"{tmp_dir} (device {os.stat(tmp_dir).st_dev}, {st.f_bavail * st.f_frsize / 2**30:.0f} GiB free)"
    info["date"] = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    try:
        info["load average at start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        pass
    return info


# --------------------------------------------------------------------------- formatting
def ms(seconds: Optional[float]) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.1f}"


def ratio(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.2f}×"


def mbps(rate: Optional[float]) -> str:
    return "–" if rate is None else f"{rate / 1e6:.0f} MB/s"


def statistic_volume(dump_path: str) -> Dict[str, float]:
    """Rows and tensor MiB in the statistic.csv files of the newest dumped iteration."""
    import csv
    its = iteration_dirs(dump_path)
    if not its:
        return {}
    rows = 0
    nbytes = 0
    for d in its[max(its)]:
        path = os.path.join(d, "statistic.csv")
        if not os.path.exists(path):
            continue
        with open(path, newline="") as f:
            for rec in csv.DictReader(f):
                rows += 1
                try:
                    nbytes += int(rec.get("Data Size") or 0)
                except ValueError:
                    pass
    return {"stat_rows_per_step": rows, "stat_mib_per_step": nbytes / 2**20}


# --------------------------------------------------------------------------- neighbours
_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_snapshot():
    """(machine busy CPU-seconds, this process's CPU-seconds, monotonic time)."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:9]]
        busy = (sum(vals) - vals[3] - vals[4]) / _TCK
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    t = os.times()
    return busy, t.user + t.system, time.monotonic()


def others_cores(a, b) -> float:
    """CPU cores used by other processes between two snapshots (machine busy − ours)."""
    dt = b[2] - a[2]
    if dt <= 0:
        return float("nan")
    return max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / dt)


def wait_quiet(threshold: float = 0.25, max_wait: float = 20.0, window: float = 0.5) -> float:
    """Wait (at most ``max_wait`` s) until other processes use < ``threshold`` cores; returns the last load."""
    deadline = time.monotonic() + max_wait
    load = float("nan")
    while True:
        a = cpu_snapshot()
        time.sleep(window)
        load = others_cores(a, cpu_snapshot())
        if not load >= threshold or time.monotonic() >= deadline:
            return load
