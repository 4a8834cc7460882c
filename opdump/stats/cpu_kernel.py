"""opdump's native module (``cpu_kernel.cpp``, ``cell_text.cpp``, ``stats_memo.cpp``), built on first use.

:func:`load` gives the one-pass CPU statistics kernel ``fused_stats(tensor)``, or
None when the module is not available; :func:`cell_formatter` its
``format_cells`` (statistic.csv cells as text, see ``cell_text.cpp`` and
:mod:`.formatting`); :func:`stats_memo` a ``StatsMemo`` (the kernel's statistics of
CPU tensors, reused for a tensor reading memory already read, see ``stats_memo.cpp``).
``fused_stats`` gives ``(max, min, sum, sum of squares)`` of a dense CPU
float32/bfloat16/float16 tensor in one read of its memory, or None for a tensor it
does not handle (see the guarantees at the top of ``cpu_kernel.cpp``).  On this project's
2-core CPU it is 2–4x faster than the torch reductions it replaces (aminmax +
float32 row norms + a float64 combine), see BENCHMARKS.md.

Building: ``torch.utils.cpp_extension.load`` compiles the file once per machine
with g++ and ninja (a dependency of opdump, used when none is on PATH; about 25 s;
cached under ``$TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``; concurrent processes wait for one build).  The
module name carries a digest of the source and of the CPU's instruction-set
flags, since it is built with ``-march=native`` (a home directory shared by
different machines gets one build per CPU kind).  Without a C++ compiler, or
with ``OPDUMP_CPU_KERNEL=0`` in the environment, opdump computes the same
statistics with torch reductions; the first case is announced once with a
warning naming the reason.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import threading
import warnings
from typing import Callable, Optional

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCES = [os.path.join(_HERE, name) for name in ("cpu_kernel.cpp", "cell_text.cpp", "stats_memo.cpp", "row_sink.cpp")]
_HEADERS = [os.path.join(_HERE, "stats_memo.h")]
_lock = threading.Lock()
_loaded = False
_module = None


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


def _module_name() -> str:
    h = hashlib.sha256()
    for source in _SOURCES + _HEADERS:     # a changed header is a new module too
        with open(source, "rb") as f:
            h.update(f.read())
    h.update(_cpu_flags().encode() + torch.__version__.encode())
    return f"opdump_cpu_stats_{h.hexdigest()[:12]}"


def _ninja_dir() -> Optional[str]:
    """The folder of the ``ninja`` that pip installs with opdump, when none is on PATH
    (torch's extension builder runs ``ninja`` from PATH; a virtual environment that is
    not activated has its own ``bin`` off PATH)."""
    if shutil.which("ninja"):
        return None
    try:
        import ninja
    except ImportError:
        return None
    return getattr(ninja, "BIN_DIR", None)


def enabled_by_environment() -> bool:
    return os.environ.get("OPDUMP_CPU_KERNEL", "1").strip().lower() not in ("0", "false", "no", "off")


def load() -> Optional[Callable]:
    """The kernel's ``fused_stats`` function, building the module if needed; None if unavailable."""
    module = load_module()
    return None if module is None else module.fused_stats


def stats_memo():
    """A new ``StatsMemo`` (building the module if needed), or None if unavailable."""
    module = load_module()
    return None if module is None else module.StatsMemo()


def row_sink(memo, entries, dtypes, launch):
    """A ``RowSink`` over ``memo`` (a ``StatsMemo``) and a batch's ``entries``/``dtypes`` lists,
    sending what the memo declines to ``launch``; None if the module is unavailable."""
    module = load_module()
    return None if module is None else module.RowSink(memo, entries, dtypes, launch, torch.nn.Parameter)


def cell_formatter() -> Optional[Callable]:
    """The module's ``format_cells``, building the module if needed; None if unavailable."""
    module = load_module()
    return None if module is None else module.format_cells


def loaded_cell_formatter() -> Optional[Callable]:
    """``format_cells`` if the module is already loaded, else None (never builds it: a
    run that never read a CPU tensor does not pay the build to format cells)."""
    return _module.format_cells if _loaded and _module is not None else None


def load_module():
    """The native module, building it if needed; None if unavailable (said once, by a warning)."""
    global _loaded, _module
    if _loaded:
        return _module
    with _lock:
        if _loaded:
            return _module
        if enabled_by_environment():
            path = os.environ.get("PATH")
            ninja_dir = _ninja_dir()
            try:
                from torch.utils.cpp_extension import load as load_extension
                if ninja_dir:           # for the build only; restored below
                    os.environ["PATH"] = ninja_dir + os.pathsep + (path or "")
                module = load_extension(
                    name=_module_name(), sources=_SOURCES,
                    extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                    verbose=False)
                _module = module
            except Exception as exc:  # noqa: BLE001 - any build failure: say it once, use torch
                first = str(exc).strip().splitlines()
                warnings.warn(
                    "opdump: the native module (CPU statistics kernel, statistic.csv cell text) could not "
                    f"be built ({type(exc).__name__}: {first[0] if first else ''}); statistics are computed "
                    "with torch reductions and written by Python instead (slower). "
                    "Set OPDUMP_CPU_KERNEL=0 to skip the build.",
                    RuntimeWarning, stacklevel=2)
                _module = None
            finally:
                if ninja_dir:
                    if path is None:
                        os.environ.pop("PATH", None)
                    else:
                        os.environ["PATH"] = path
        _loaded = True
        return _module
