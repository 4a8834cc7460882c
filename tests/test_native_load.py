"""Loading opdump's native module can never hang a run, and never uses a module that does not
match this Python: real subprocesses, real lock files, real kills (opdump/stats/native.py).

A process killed inside ``torch.utils.cpp_extension.load`` leaves ``<extensions>/<name>/lock``
behind, and every later loader through torch waited for it forever.  opdump now imports its
library built ahead, without any lock; a build at run time holds an ``flock`` (released by the
kernel when its holder dies) within a timeout, then falls back to Python with one warning.
"""
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from opdump.stats import native
from conftest import write_config

pytestmark = pytest.mark.skipif(native.module() is None,
                                reason="the native module could not be built here (a warning says why)")

# A statistics-only dump of a few CPU tensors through the recorder (the native row sink's path),
# then what the process used: "native True|False rows N".
RUN = textwrap.dedent("""
    import csv, glob, os, sys, warnings
    warnings.simplefilter("always")
    import torch, opdump
    from opdump.capture.op_info import OpInfo
    from opdump.stats import native
    with opdump.Session(sys.argv[1]) as session:
        for k in range(3):
            session.recorder.record_all(session.iteration_dir(0), OpInfo(k, "op", "Default", "default", (), ()), "output",
                                        [torch.randn(5, 7), torch.arange(6)])
        session.recorder.flush_statistics()
    rows = 0
    for path in glob.glob(os.path.join(os.path.dirname(sys.argv[1]), "**", "statistic.csv"), recursive=True):
        with open(path) as f:
            rows += sum(1 for _ in csv.DictReader(f))
    print("native", native.is_loaded(), "rows", rows)
""")


def _config(tmp_path):
    return write_config(tmp_path, common={"iteration": "0", "saved_data": "statistic",
                                          "statistic_category": ["max", "min", "avg", "l2norm", "count"]},
                        e2e={"stat_calc_mode": "device"})


def _run(tmp_path, env, timeout=120):
    tmp_path.mkdir()
    cfg = _config(tmp_path)
    return subprocess.run([sys.executable, "-c", RUN, str(cfg)], env={**os.environ, **env}, timeout=timeout,
                          capture_output=True, text=True)


def _hold_lock(path):
    """A real process holding an flock on ``path`` until killed."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_stale_torch_extensions_lock_does_not_hang_a_run(tmp_path):
    """The lock a process killed inside cpp_extension.load leaves: the next run neither waits for it
    nor touches torch's extension folder at all."""
    extensions = tmp_path / "torch_extensions"
    for name in (native.module_name(), "opdump_cpu_stats_0123456789ab"):
        (extensions / name).mkdir(parents=True)
        (extensions / name / "lock").write_text("")
    before = sorted(p for p in extensions.rglob("*"))
    proc = _run(tmp_path / "run", {"TORCH_EXTENSIONS_DIR": str(extensions)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "native True rows 6" in proc.stdout
    assert "opdump: the native module" not in proc.stderr
    assert sorted(p for p in extensions.rglob("*")) == before


def test_a_lock_held_by_a_live_builder_times_out_to_python_with_one_warning(tmp_path):
    folder = tmp_path / "native"
    folder.mkdir()
    holder = _hold_lock(folder / (native.module_name() + ".lock"))
    try:
        start = time.monotonic()
        proc = _run(tmp_path / "run", {"OPDUMP_NATIVE_DIR": str(folder), "OPDUMP_NATIVE_BUILD_TIMEOUT": "1"})
        waited = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 0, proc.stderr
    assert "native False rows 6" in proc.stdout           # the same rows, by the Python path
    assert proc.stderr.count("opdump: the native module") == 1, proc.stderr
    assert "lock" in proc.stderr and "timeout" in proc.stderr
    assert waited < 100                                   # it did not wait for the holder (600 s)
    assert not list(folder.glob("*.so"))


def test_the_lock_of_a_killed_builder_is_released(tmp_path):
    """A builder killed with SIGKILL leaves its lock file and its work folder: the next build takes
    the lock at once, removes the work folder and finds the library there."""
    folder = tmp_path / "native"
    folder.mkdir()
    name = native.module_name()
    holder = _hold_lock(folder / (name + ".lock"))
    stale = folder / f".build-{name}-dead"
    stale.mkdir()
    (stale / "half.o").write_bytes(b"\0" * 10)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    shutil.copy(native.find_library(), native.library_path(str(folder)))
    script = textwrap.dedent(f"""
        import sys
        from opdump.stats import native
        print(native.build({str(folder)!r}, timeout=5))
        print(native.module() is not None)
    """)
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "OPDUMP_NATIVE_DIR": str(folder)},
                          timeout=60, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [native.library_path(str(folder)), "True"]
    assert (folder / (name + ".lock")).exists() and not stale.exists()
    where = subprocess.run([sys.executable, "-m", "opdump.stats.build_native", "where"], capture_output=True, text=True,
                           env={**os.environ, "OPDUMP_NATIVE_DIR": str(folder)}, timeout=60)
    assert where.returncode == 0 and where.stdout.strip() == native.library_path(str(folder))


def test_without_a_built_library_and_no_build_allowed_python_is_used(tmp_path):
    proc = _run(tmp_path / "run", {"OPDUMP_NATIVE_DIR": str(tmp_path / "empty"), "OPDUMP_NATIVE_BUILD_TIMEOUT": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "native False rows 6" in proc.stdout
    assert proc.stderr.count("opdump: the native module") == 1 and "not built" in proc.stderr
    assert not (tmp_path / "empty").exists()


def test_switched_off_it_is_neither_built_nor_announced(tmp_path):
    proc = _run(tmp_path / "run", {"OPDUMP_CPU_KERNEL": "0", "OPDUMP_NATIVE_DIR": str(tmp_path / "empty")})
    assert proc.returncode == 0, proc.stderr
    assert "native False rows 6" in proc.stdout and "opdump: the native module" not in proc.stderr


def test_a_failed_run_time_build_is_one_warning_and_leaves_nothing_behind(tmp_path):
    """A real run-time build (child process, flock, private work folder) with a compiler that fails."""
    folder = tmp_path / "native"
    proc = _run(tmp_path / "run", {"OPDUMP_NATIVE_DIR": str(folder), "CXX": "/bin/false",
                                   "OPDUMP_NATIVE_BUILD_TIMEOUT": "300"}, timeout=400)
    assert proc.returncode == 0, proc.stderr
    assert "native False rows 6" in proc.stdout
    assert proc.stderr.count("opdump: the native module") == 1 and "build failed" in proc.stderr, proc.stderr
    assert sorted(p.name for p in folder.iterdir()) == [native.module_name() + ".lock"]
