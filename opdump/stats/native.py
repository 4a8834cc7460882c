"""The one place opdump's Python meets its C++ module: built, found, loaded, checked, used.

The module (``native_module.cpp`` and the parts it exports: ``cpu_kernel.cpp``'s one-pass
CPU statistics ``fused_stats`` and ``host_stats``, ``cell_text.cpp``'s ``format_cells``, ``stats_memo.cpp``'s
``StatsMemo``, ``row_sink.cpp``'s ``RowSink``, ``GraphTaps`` and ``RowBatch`` (``row_batch.h``: queued
statistic.csv rows as C++ records), ``finite_bound.cpp``'s ``finite_bound``, the overflow
watch's reading) is optional: every use of it has an exact
Python/torch twin, taken when :func:`module` is None.

Why it is built ahead and loaded without a lock
    ``torch.utils.cpp_extension.load`` takes a lock file under ``~/.cache/torch_extensions``
    at every first load, even of a module already built; a process killed while holding it
    left a lock that made every later run wait forever, inside the training step.  Here
    the module is built at set-up time (``scripts/setup.sh`` runs
    ``python -m opdump.stats.build_native``) into a folder of the Python environment, under
    a file name carrying a digest of the sources, the torch version and the CPU's
    instruction-set flags (it is compiled with ``-march=native``); at run time that file
    is imported directly, with no lock at all.

Guarantees
    * Loading never waits on a lock: a built library is imported as it is.
    * When no library is built yet, it is built at first use, in a child process, under an
      ``flock`` on ``<folder>/<name>.lock`` (the kernel releases it when its holder dies,
      so a killed build never blocks another) and within ``OPDUMP_NATIVE_BUILD_TIMEOUT``
      seconds (default 600, waiting for another builder included); past it, or on any
      failure, opdump warns ONCE and uses its Python path.  The build's PATH (for the
      ``ninja`` installed with opdump) is set in the child's environment only: this
      process's ``os.environ`` is never changed.
    * Every layout and code the two languages share (:mod:`.contract`) is exported by the
      module and compared at load; a difference is a warning and the Python path.
    * Thread-safe: the first call resolves the module once for the process.

Settings (environment)
    ``OPDUMP_CPU_KERNEL=0``: do not build or use the module (no warning).
    ``OPDUMP_NATIVE_DIR``: the only folder searched and built into (default: ``lib/opdump-native``
    under ``sys.prefix``, then ``$XDG_CACHE_HOME/opdump/native``, ``~/.cache`` by default).
    ``OPDUMP_NATIVE_BUILD_TIMEOUT``: seconds a run-time build may take (0: never build at run time).
"""
from __future__ import annotations

import fcntl
import functools
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Callable, List, Optional

import torch

from . import contract

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(_HERE, n) for n in
                ("native_module.cpp", "cpu_kernel.cpp", "cell_text.cpp", "stats_memo.cpp", "row_sink.cpp",
                 "finite_bound.cpp")) + tuple(
    # the native eager capture's observer (opdump/capture/eager/native), exported as `eager_observer`
    os.path.join(os.path.dirname(_HERE), "capture", "eager", "native", n) for n in
    ("observer.cpp", "observer_names.cpp", "observer_args.cpp", "observer_rows.cpp", "observer_api.cpp",
     "watch.cpp")) + (os.path.join(os.path.dirname(_HERE), "debug", "graph_watch.cpp"),)   # graph-mode watch tap
HEADERS = tuple(os.path.join(_HERE, n) for n in ("contract.h", "stats_memo.h", "row_batch.h", "graph_values.h")) + tuple(
    os.path.join(os.path.dirname(_HERE), "capture", "eager", "native", n) for n in
    ("observer_state.h", "watch.h"))
# -ffp-contract=off: no fused multiply-add, so host_stats' sums are numpy's bit for bit
# -DPYBIND11_NO_ASSERT_GIL_HELD_INCREF_DECREF: pybind11 otherwise checks the GIL (PyGILState_Check,
# a thread-local look-up) at every reference count change of a handle when NDEBUG is not defined
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-DPYBIND11_NO_ASSERT_GIL_HELD_INCREF_DECREF"]
_LDFLAGS = ["-fopenmp"]

ENV_SWITCH = "OPDUMP_CPU_KERNEL"
ENV_DIR = "OPDUMP_NATIVE_DIR"
ENV_TIMEOUT = "OPDUMP_NATIVE_BUILD_TIMEOUT"
DEFAULT_BUILD_TIMEOUT = 600.0

_lock = threading.Lock()
_resolved = False
_module = None


class NativeUnavailable(Exception):
    """Why the module cannot be used (one line); ``details``: the compiler's output, if any."""

    def __init__(self, reason: str, details: str = ""):
        super().__init__(reason)
        self.details = details


# ------------------------------------------------------------------ where
def switched_on(name: str) -> bool:
    """An ``OPDUMP_*`` switch of a native path (this module, the graph taps, the eager observer,
    the graph watch): on unless the environment sets it to 0, false, no or off."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def enabled_by_environment() -> bool:
    return switched_on(ENV_SWITCH)


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.machine()


@functools.lru_cache(maxsize=None)
def module_name() -> str:
    """``opdump_native_<digest>``: sources, headers, flags, torch version and CPU kind."""
    h = hashlib.sha256()
    for source in SOURCES + HEADERS:
        with open(source, "rb") as f:
            h.update(os.path.basename(source).encode() + b"\0" + f.read())
    h.update(json.dumps([_CFLAGS, _LDFLAGS, torch.__version__, _cpu_flags()]).encode())
    return f"opdump_native_{h.hexdigest()[:16]}"


def library_dirs() -> List[str]:
    """The folders searched for the built library, in order (the first writable one is built into)."""
    only = os.environ.get(ENV_DIR)
    if only:
        return [only]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(sys.prefix, "lib", "opdump-native"), os.path.join(cache, "opdump", "native")]


def library_path(directory: str) -> str:
    return os.path.join(directory, module_name() + ".so")


def find_library() -> Optional[str]:
    """The built library for these sources and this machine, or None."""
    for d in library_dirs():
        path = library_path(d)
        if os.path.isfile(path):
            return path
    return None


def _writable_dir() -> str:
    problems = []
    for d in library_dirs():
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as exc:
            problems.append(f"{d}: {exc.strerror}")
            continue
        if os.access(d, os.W_OK | os.X_OK):
            return d
        problems.append(f"{d}: not writable")
    raise NativeUnavailable("no folder to build it into (" + "; ".join(problems) + ")")


# ------------------------------------------------------------------ build
_CHILD = """
import json, sys
from torch.utils.cpp_extension import load
work, name, sources, cflags, ldflags = json.loads(sys.argv[1])
load(name=name, sources=sources, build_directory=work, extra_cflags=cflags, extra_ldflags=ldflags, verbose=False)
"""


def _child_env() -> dict:
    env = dict(os.environ)
    if not shutil.which("ninja"):
        try:
            import ninja
            ninja_dir = getattr(ninja, "BIN_DIR", None)
        except ImportError:
            ninja_dir = None
        if ninja_dir:
            env["PATH"] = ninja_dir + os.pathsep + env.get("PATH", "")
    return env


def _compile(work: str, deadline: float) -> None:
    """Compile into ``work`` (a private folder: the builder's own lock there is never shared)
    in a child process group, killed whole past ``deadline``."""
    arg = json.dumps([work, module_name(), list(SOURCES), _CFLAGS, _LDFLAGS])
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, arg], env=_child_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise NativeUnavailable("the build took longer than the timeout (set "
                                f"{ENV_TIMEOUT}, or run `python -m opdump.stats.build_native`)") from None
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        text = out.decode(errors="replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        # the compiler's first error, else the child's last line (its exception)
        errors = [ln for ln in lines if ": error:" in ln][:1] or lines[-1:] or [f"exit status {proc.returncode}"]
        raise NativeUnavailable(f"the build failed: {errors[0]}", details=text[-20000:])


def _kill_group(proc: subprocess.Popen) -> None:
    """The build child and everything it started (ninja, the compilers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def build(directory: Optional[str] = None, timeout: Optional[float] = None) -> str:
    """Build the library into ``directory`` (default: the first writable of :func:`library_dirs`)
    unless it is there; its path.  Holds an ``flock`` on ``<directory>/<name>.lock`` while
    building (another process building the same module is waited for, within ``timeout``
    seconds); raises :class:`NativeUnavailable`."""
    timeout = _timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    directory = directory or _writable_dir()
    os.makedirs(directory, exist_ok=True)
    name = module_name()
    target = library_path(directory)
    lock_path = os.path.join(directory, name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise NativeUnavailable(f"another process held {lock_path} (building it) for longer than "
                                            f"the timeout ({timeout:g} s)") from None
                time.sleep(0.1)
        for stale in glob.glob(os.path.join(directory, f".build-{name}-*")):   # left by a killed builder
            shutil.rmtree(stale, ignore_errors=True)
        if os.path.isfile(target):          # built by the process we waited for
            return target
        work = tempfile.mkdtemp(prefix=f".build-{name}-", dir=directory)
        try:
            _compile(work, deadline)
            os.replace(os.path.join(work, name + ".so"), target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return target
    finally:
        os.close(fd)                        # releases the flock; the lock file itself stays (harmless)


def _timeout() -> float:
    try:
        return max(0.0, float(os.environ.get(ENV_TIMEOUT, DEFAULT_BUILD_TIMEOUT)))
    except ValueError:
        return DEFAULT_BUILD_TIMEOUT


# ------------------------------------------------------------------ load
def contract_problem(mod) -> Optional[str]:
    """None if ``mod`` exports every value of :data:`.contract.EXPORTED` as this Python has it, else
    what differs."""
    for attr, want in contract.EXPORTED.items():
        got = getattr(mod, attr, None)
        if isinstance(got, list):
            got = tuple(got)
        if got != want:
            return f"its {attr} is {got!r}, opdump/stats/contract.py says {want!r}"
    return None


def _import(path: str):
    spec = importlib.util.spec_from_file_location(module_name(), path)
    if spec is None or spec.loader is None:
        raise NativeUnavailable(f"{path} is not an importable module")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _resolve():
    if not enabled_by_environment():
        return None
    try:
        path = find_library()
        if path is None:
            if _timeout() <= 0:
                raise NativeUnavailable("it is not built (run `python -m opdump.stats.build_native`)")
            path = build()
        mod = _import(path)
        problem = contract_problem(mod)
        if problem is not None:
            raise NativeUnavailable(f"{path} does not match this opdump: {problem}")
        return mod
    except Exception as exc:  # noqa: BLE001 - any failure: said once, the Python path is used
        reason = str(exc).strip().splitlines()
        warnings.warn(
            "opdump: the native module (CPU statistics kernel, statistic.csv cell text) is not used "
            f"({type(exc).__name__}: {reason[0] if reason else ''}); statistics are computed with torch "
            f"reductions and written by Python instead (slower). Set {ENV_SWITCH}=0 to skip it.",
            RuntimeWarning, stacklevel=3)
        return None


def module():
    """The checked native module, loaded (or built) on first call; None when unavailable."""
    global _resolved, _module
    if _resolved:
        return _module
    with _lock:
        if not _resolved:
            _module = _resolve()
            _resolved = True
    return _module


def is_loaded() -> bool:
    """The module was resolved (and found usable) in this process."""
    return _resolved and _module is not None


# ------------------------------------------------------------------ what Python uses of it
def fused_stats() -> Optional[Callable]:
    """``fused_stats(tensor)``: ``(max, min, sum, sum of squares)`` (:data:`.contract.FUSED_FIELDS`)
    of a dense CPU float/integer/bool tensor in one read, or None for one it does not handle
    (see ``cpu_kernel.cpp``); None when the module is unavailable."""
    mod = module()
    return None if mod is None else mod.fused_stats


def finite_bound() -> Optional[Callable]:
    """``finite_bound(tensor)``: max ``|x|`` of a dense CPU float32/float64/float16/bfloat16 tensor
    (NaN when an element is NaN, inf when one is ±Inf), or None for one it does not handle
    (``finite_bound.cpp``, the overflow watch's reading); None when the module is unavailable
    or was built without it."""
    mod = module()
    return None if mod is None else getattr(mod, "finite_bound", None)


def host_stats() -> Optional[Callable]:
    """``host_stats(tensor)``: :func:`fused_stats`'s fields with the host mode's float64 accumulation
    (its order: :data:`.contract.HOST_LANES`, :data:`.contract.HOST_CHUNK`; the numpy twin is
    :mod:`.host`), or None for a tensor it does not handle; None when the module is unavailable."""
    mod = module()
    return None if mod is None else mod.host_stats


def new_stats_memo(host: bool = False):
    """A new ``StatsMemo`` (``stats_memo.cpp``; ``host``: it reads with :func:`host_stats`), or None
    when the module is unavailable."""
    mod = module()
    return None if mod is None else mod.StatsMemo(host)


def new_row_sink(memo):
    """A ``RowSink`` over ``memo`` (``row_sink.cpp``): ``record(base, op_type, name, io, ts, tensors)``
    gives new ``(rows, entries, dtypes)`` lists or None; None when the module is unavailable."""
    mod = module()
    return None if mod is None else mod.RowSink(memo, torch.nn.Parameter)


def new_row_batch():
    """A new empty ``RowBatch`` (``row_batch.h``: queued statistic.csv rows as C++ records, read as
    row tuples), or None when the module is unavailable (never loads or builds it)."""
    return _module.RowBatch() if _resolved and _module is not None else None


def cell_formatter() -> Optional[Callable]:
    """``format_cells(entries, precisions, kinds, fused)`` (``cell_text.cpp``), loading the module if
    needed; None when unavailable."""
    mod = module()
    return None if mod is None else mod.format_cells


def loaded_cell_formatter() -> Optional[Callable]:
    """``format_cells`` if the module is already loaded, else None (never loads or builds it: a run
    that never read a CPU tensor does not pay for it to format cells)."""
    return _module.format_cells if _resolved and _module is not None else None


# ------------------------------------------------------------------ command line (set-up time)
def main(argv: Optional[List[str]] = None) -> int:
    """``python -m opdump.stats.build_native build [DIR]``: build now (scripts/setup.sh);
    ``where``: the built library's path.  Exit 0 when the library is there."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else "where"
    if command == "build":
        try:
            path = build(argv[1] if len(argv) > 1 else None)
        except NativeUnavailable as exc:
            if exc.details:
                print(exc.details, file=sys.stderr)
            print(f"opdump: the native module was not built: {exc}; torch reductions and Python will be used",
                  file=sys.stderr)
            return 1
        problem = contract_problem(_import(path))
        if problem is not None:
            print(f"opdump: the native module built at {path} does not match: {problem}", file=sys.stderr)
            return 1
        print(path)
        return 0
    if command == "where":
        path = find_library()
        print(path or f"not built (searched {', '.join(library_dirs())})")
        return 0 if path else 1
    print("usage: python -m opdump.stats.build_native [build [DIR] | where]", file=sys.stderr)
    return 2
