"""Memory and machine facts: a memory cgroup for the beyond-RAM runs, peak RSS, swap, and
the machine/software summary at the top of BENCHMARKS.md."""
from __future__ import annotations

import datetime
import os
import platform
import resource
from typing import Dict, Optional

import numpy as np


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
