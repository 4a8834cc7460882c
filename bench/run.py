#!/usr/bin/env python
"""opdump's benchmarks (issue 5): one command, writes BENCHMARKS.md.

    .venv/bin/python bench/run.py [--quick] [--out BENCHMARKS.md]

For each model (AlexNet, a 4-layer transformer encoder, a wide MLP) it times a
training step in: plain eager; plain compiled (inductor); opdump's backend with
the timed iterations not selected; graph-mode dumps (statistic host / device,
tensor, full); eager capture (not selected, statistic host / device, tensor).
Each ratio is against the baseline measured interleaved with it in this same
process (graph not-selected vs plain compiled, every dump vs plain eager).
Tensor dumps are also measured in bytes/s against a plain ``numpy.save`` loop of
the same arrays into the same folder.  Then: peak RSS with and without dump
(child processes), overhead vs number of layers / tensor size, a profile of a
dumped AlexNet step, and MindStudio Probe on the same models when it installs.

``--quick``: smaller models, 2 timed steps, no MindStudio Probe — a smoke check.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import glob
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import opdump  # noqa: E402
from bench import harness as H  # noqa: E402
from bench import models as M  # noqa: E402

FAR = "1000000000"          # an iteration the run never reaches: nothing selected
MEMORY_QUEUE_MB = 64
BEYOND_RAM_LIMIT_MB = 1024        # the RAM (memory cgroup) given to the 'beyond RAM' runs
MSPROBE_VENV = os.environ.get("OPDUMP_BENCH_MSPROBE_VENV", os.path.join(tempfile.gettempdir(),
                                                                          "opdump-msprobe-venv"))

FLOOR_MODE = "graph floor: aot_eager, op by op, no dump"
EAGER_FLOOR_MODE = "eager floor: a do-nothing dispatch mode, no dump"

GRAPH_MODES = [
    # label, config keywords, baseline ("eager" | "compiled")
    ("graph not-selected", dict(iteration=FAR), "compiled"),
    ("graph statistic host", dict(saved_data="statistic", stat_calc_mode="host"), "eager"),
    ("graph statistic device", dict(saved_data="statistic", stat_calc_mode="device"), "eager"),
    ("graph tensor", dict(saved_data="tensor"), "eager"),
    ("graph full", dict(saved_data="full"), "eager"),
]
EAGER_MODES = [
    ("eager not-selected", dict(iteration=FAR)),
    ("eager statistic host", dict(saved_data="statistic", stat_calc_mode="host")),
    ("eager statistic device", dict(saved_data="statistic", stat_calc_mode="device")),
    ("eager tensor", dict(saved_data="tensor")),
]


_T0 = time.perf_counter()


# --quick: every mode on AlexNet, a few on the others (a smoke check of every code path)
QUICK_MODES = {
    "alexnet": None,
    "transformer": {"graph statistic device", "eager statistic device"},
    "mlp": {"graph not-selected", "graph tensor"},
}


def log(*a) -> None:
    print(f"{time.perf_counter() - _T0:6.1f}s", *a, file=sys.stderr, flush=True)


def eager_capture_class():
    """``opdump.capture.eager.EagerCapture``, or the reason it is not available."""
    try:
        from opdump.capture.eager import EagerCapture  # type: ignore
        return EagerCapture, None
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}"


class EagerToggle:
    """Eager capture on around each timed block of the mode, off around the baseline's.

    One ``EagerCapture`` per mode, stopped and started again between blocks, so its
    one-time work (graph id, the listing written on its first dumped iteration) is
    done in the warm-up like a real run's.  ``EagerCapture.start()`` refuses a
    second start; the bench clears its ``_started`` flag to restart it (a bench-only
    workaround: stop() already uninstalled everything).  If that ever fails, a new
    capture is made per block.
    """

    def __init__(self, cls, session):
        self.cls = cls
        self.session = session
        self.cap = None
        self.restarts = 0
        self.fresh = 0

    def enter(self):
        if self.cap is None:
            self.cap = self.cls(self.session)
            self.cap.start()
            self.fresh += 1
            return
        try:
            if getattr(self.cap, "_started", False):
                self.cap._started = False
            self.cap.start()
            self.restarts += 1
        except Exception:  # noqa: BLE001
            self.cap = self.cls(self.session)
            self.cap.start()
            self.fresh += 1

    def exit(self):
        if self.cap is not None:
            self.cap.stop()


# =========================================================================== one mode
class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.warmup = 2
        self.est: Dict[str, float] = {}     # plain eager step estimate per model, for the schedule
        self.tmp = tempfile.mkdtemp(prefix="opdump-bench-", dir=args.tmp)
        self.eager_cls, self.eager_missing = eager_capture_class()
        torch._dynamo.config.cache_size_limit = 64
        if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
            torch._dynamo.config.accumulated_cache_size_limit = 1024

    def folder(self, label: str) -> str:
        d = os.path.join(self.tmp, label.replace(" ", "-"))
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return d

    def schedule(self, step_s: float, writes: bool, tight: bool = False):
        """(rounds, steps per round): ≥ 9 timed steps per side (≥ 6 for tensor dumps), about 3 s a side.

        Modes that write files run 2 steps per block (so the writer's queue builds up as
        in a long run) and drain the writer after each block.  The others run blocks of 3
        timed steps after one untimed step (see :meth:`pair`).  ``tight``: a target within
        a few percent (not-selected iterations, 3 %): about 8 s a side, at least 15 steps,
        so that the neighbours' noise (±4 % on one 3 s run here) does not decide it.
        ``--quick``: 2 timed steps.
        """
        if self.quick:
            return (1, 2) if writes else (2, 1)
        if writes:
            return H.rounds_for(step_s, 2, target_s=1.0, lo=3, hi=6), 2
        if tight:
            return H.rounds_for(step_s, 3, target_s=8.0, lo=5, hi=27), 3
        return H.rounds_for(step_s, 3, target_s=3.0, lo=3, hi=14), 3

    def pair(self, base_step, mode: H.Side, step_s: float, writes: bool = False, tight: bool = False) -> H.Side:
        """Interleave ``mode`` with a baseline.  Blocks that write no files start with one
        untimed step on both sides: the first step after the other model ran pays for that
        model's caches and allocator state (the ResNet-ish model's statistic dump measured
        1.42x alternating single steps, 1.14x in blocks, its aot_eager floor 1.09x / 0.98x),
        which a training run, dumping step after step, does not.  Blocks that write keep
        their first step: the writer's queue and the page cache start empty there anyway."""
        base = H.Side(base_step)
        if not writes:
            base.warm_steps = mode.warm_steps = 1
        self.last_schedule = self.schedule(step_s, writes, tight)
        base.neighbours = H.interleave(base, mode, *self.last_schedule)
        return base

    def dump_mode(self, label: str, build: Callable[[], M.Workload], cfgkw: Dict, base_step,
                  *, graph: bool, step_s: float, throughput: bool = False) -> Dict[str, Any]:
        """Time ``label`` (a dump config) against ``base_step``, interleaved; dump deleted after."""
        d = self.folder(label)
        dump = os.path.join(d, "dump")
        cfg = H.write_config(d, dump, **cfgkw)
        out: Dict[str, Any] = {"mode": label}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            session = opdump.Session(cfg)
            session.__enter__()
            try:
                w = build()
                toggle = None
                if graph:
                    w.run_model = torch.compile(w.model, backend=session.backend())
                else:
                    toggle = EagerToggle(self.eager_cls, session)
                if toggle:
                    toggle.enter()
                try:
                    out["warmup_s"] = H.warm(w.step, self.warmup)
                finally:
                    if toggle:
                        toggle.exit()
                session.writer.flush()
                writes = cfgkw.get("saved_data", "tensor") in ("tensor", "full") and "iteration" not in cfgkw
                # the numpy.save baseline writes the arrays of the last warm-up iteration, one round
                # after each block of the dump, so that both meet the same disk and page-cache state
                npsave = None
                if writes and throughput:
                    npsave = H.NumpySaveBaseline(H.load_iteration_arrays(dump), os.path.join(dump, "numpy-save"))
                H.prune_iterations(dump, keep_last=False)
                b0, f0 = session.writer.bytes_written, session.writer.files_written
                r0 = session.recorder.tensors_recorded

                def enter():
                    if writes:
                        H.sync_disk()
                    if toggle:
                        toggle.enter()

                def after_block():
                    H.prune_iterations(dump, keep_last=True)
                    if npsave is not None:
                        npsave.round(len(mode.blocks[-1]))      # as many times as the block's steps

                mode = H.Side(w.step, enter=enter, exit=toggle.exit if toggle else None,
                              drain=(lambda: (session.writer.flush(), H.sync_disk())) if writes
                              else session.writer.flush, after_block=after_block)
                base = self.pair(base_step, mode, step_s, writes, tight="iteration" in cfgkw)
                n = len(mode.times)
                ran = n + mode.warm_steps * len(mode.blocks)        # the untimed steps dump too
                if toggle:
                    out["eager_captures"] = toggle.fresh
                out.update(self._summary(base, mode))
                out["bytes_per_step"] = (session.writer.bytes_written - b0) / ran
                out["files_per_step"] = (session.writer.files_written - f0) / ran
                out["tensors_per_step"] = (session.recorder.tensors_recorded - r0) / ran
                if npsave is not None:
                    total = sum(mode.times) + sum(mode.drains)
                    nbytes = session.writer.bytes_written - b0
                    out["dump_bytes"] = nbytes
                    out["dump_rate_raw"] = nbytes / total
                    added = total - n * base.median
                    out["dump_rate_effective"] = nbytes / added if added > 0 else None
                    out["numpy_rate"] = npsave.rate
                    out["numpy_files"] = npsave.files
                    out["throughput_ratio_raw"] = out["dump_rate_raw"] / npsave.rate
                    if out.get("dump_rate_effective"):
                        out["throughput_ratio_effective"] = out["dump_rate_effective"] / npsave.rate
                    npsave = None
                errors = list(session.writer.errors)
                if errors:
                    out["errors"] = [repr(e) for e in errors[:3]]
            finally:
                t0 = time.perf_counter()
                session.__exit__(None, None, None)
                out["close_s"] = time.perf_counter() - t0
        if cfgkw.get("saved_data") in ("statistic", "full") and "iteration" not in cfgkw:
            out.update(H.statistic_volume(dump))
        shutil.rmtree(d, ignore_errors=True)
        gc.collect()
        return out

    @staticmethod
    def estimate(step, n: int = 3) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    @staticmethod
    def _summary(base: H.Side, mode: H.Side) -> Dict[str, Any]:
        return {
            "median": mode.median, "base_median": base.median, "ratio": mode.median / base.median,
            "paired_ratio": H.paired_ratio(base, mode), "cpu_ratio": mode.cpu_median / base.cpu_median,
            "amortized": mode.amortized, "amortized_ratio": mode.amortized / base.median,
            "steps": len(mode.times), "spread": mode.spread, "base_spread": base.spread,
            "neighbours": getattr(base, "neighbours", float("nan")),
        }

    # ======================================================================= one model
    def model(self, name: str) -> Dict[str, Any]:
        build = lambda: M.BUILDERS[name](quick=self.quick)  # noqa: E731
        torch._dynamo.reset()
        res: Dict[str, Any] = {"name": name, "rows": []}
        base = build()
        res["describe"] = base.describe
        H.warm(base.step, self.warmup)
        est = self.estimate(base.step)
        comp = build()
        comp.run_model = torch.compile(comp.model)
        log(f"[{name}] compiling with inductor")
        compile_s = H.warm(comp.step, self.warmup)
        cmode = H.Side(comp.step)
        b = self.pair(base.step, cmode, est)
        res["rows"].append({"mode": "plain eager", "median": b.median, "ratio": 1.0, "baseline": "–",
                            "steps": len(b.times), "spread": b.spread})
        res["rows"].append({"mode": "plain compiled (inductor)", "baseline": "plain eager",
                            "warmup_s": compile_s, **self._summary(b, cmode)})
        if not self.quick:
            # What a dumped graph iteration cannot go below: the AOTAutograd graphs run operator
            # by operator (FX code, Python per operator, AOT's runtime wrappers), no dump.
            floor = build()
            floor.run_model = torch.compile(floor.model, backend="aot_eager")
            log(f"[{name}] {FLOOR_MODE}")
            H.warm(floor.step, self.warmup)
            fmode = H.Side(floor.step)
            fb = self.pair(base.step, fmode, est)
            res["rows"].append({"mode": FLOOR_MODE, "baseline": "plain eager", **self._summary(fb, fmode)})
            del floor
            # What eager capture cannot go below: a Python dispatch mode that only forwards each
            # operator (the arguments cross C++ -> Python -> C++ twice per operator).
            efloor = build()
            log(f"[{name}] {EAGER_FLOOR_MODE}")
            estep = H.under_null_dispatch_mode(efloor.step)
            H.warm(estep, self.warmup)
            emode = H.Side(estep)
            eb = self.pair(base.step, emode, est)
            res["rows"].append({"mode": EAGER_FLOOR_MODE, "baseline": "plain eager", **self._summary(eb, emode)})
            del efloor
        wanted = QUICK_MODES.get(name) if self.quick else None
        for label, cfgkw, against in GRAPH_MODES:
            if wanted is not None and label not in wanted:
                continue
            log(f"[{name}] {label}")
            base_step = comp.step if against == "compiled" else base.step
            try:
                row = self.dump_mode(label, build, cfgkw, base_step, graph=True, step_s=est, throughput=True)
            except Exception as exc:  # noqa: BLE001 - one failing mode does not lose the report
                traceback.print_exc()
                row = {"mode": label, "error": f"{type(exc).__name__}: {exc}"}
            row["baseline"] = "plain compiled" if against == "compiled" else "plain eager"
            res["rows"].append(row)
        for label, cfgkw in EAGER_MODES:
            if wanted is not None and label not in wanted:
                continue
            if self.eager_cls is None:
                res["rows"].append({"mode": label, "baseline": "plain eager",
                                    "error": f"not available ({self.eager_missing})"})
                continue
            log(f"[{name}] {label}")
            try:
                row = self.dump_mode(label, build, cfgkw, base.step, graph=False, step_s=est, throughput=True)
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                row = {"mode": label, "error": f"{type(exc).__name__}: {exc}"}
            row["baseline"] = "plain eager"
            res["rows"].append(row)
        del comp, base
        torch._dynamo.reset()
        gc.collect()
        return res

    # ======================================================================= scaling
    def _scale_point(self, what: str, tag: str, row: Dict[str, Any], build: Callable[[], M.Workload],
                     cfgkw: Dict, with_eager: bool) -> Dict[str, Any]:
        """One size of a scaling series: graph (and optionally eager) statistic dump vs plain eager."""
        log(f"[scaling] {what}")
        torch._dynamo.reset()
        base = build()
        H.warm(base.step, self.warmup)
        est = self.estimate(base.step)
        try:
            row["graph"] = self.dump_mode(f"scale-graph-{tag}", build, cfgkw, base.step, graph=True, step_s=est)
            if with_eager:
                row["eager"] = self.dump_mode(f"scale-eager-{tag}", build, cfgkw, base.step, graph=False,
                                              step_s=est)
        except Exception as exc:  # noqa: BLE001 - one failing size does not lose the report
            traceback.print_exc()
            row["error"] = f"{type(exc).__name__}: {exc}"
        return row

    def scaling(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"layers": [], "width": []}
        layers = (1, 2) if self.quick else (2, 4, 8)
        widths = () if self.quick else (1024, 2048, 4096)
        cfgkw = dict(saved_data="statistic", stat_calc_mode="device")
        for nl in layers:
            out["layers"].append(self._scale_point(
                f"transformer {nl} layers", f"{nl}L", {"layers": nl},
                lambda nl=nl: M.transformer(self.quick, layers=nl), cfgkw,
                with_eager=self.eager_cls is not None and not self.quick))
        for width in widths:
            out["width"].append(self._scale_point(
                f"mlp width {width}", f"w{width}", {"width": width},
                lambda width=width: M.mlp(self.quick, width=width), cfgkw, with_eager=False))
        torch._dynamo.reset()
        return out

    # ======================================================================= memory
    def memory(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"queue_mb": MEMORY_QUEUE_MB, "runs": {}}
        modes = ["plain-eager", "plain-aot-eager", "graph-tensor", "graph-statistic-device"]
        if self.quick:
            modes = ["plain-eager", "plain-aot-eager", "graph-tensor"]
        elif self.eager_cls is not None:
            modes.append("eager-tensor")
        for mode in modes:
            log(f"[memory] {mode}")
            out["runs"][mode] = self._child_memory(mode)
        if not self.quick:
            out["beyond_ram"] = self.beyond_ram([m for m in modes if m.endswith("tensor")])
        return out

    def _child_memory(self, mode: str, preexec_fn=None) -> Dict[str, Any]:
        """Run ``--child-memory mode`` in a fresh process: its RESULT, or {"error": its last line}."""
        cmd = [sys.executable, os.path.abspath(__file__), "--child-memory", mode, "--tmp", self.tmp]
        if self.quick:
            cmd.append("--quick")
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, preexec_fn=preexec_fn)
        line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            last = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit {proc.returncode}"]
            return {"error": last[-1], "returncode": proc.returncode}
        return {**json.loads(line[len("RESULT "):]), "returncode": proc.returncode}

    def beyond_ram(self, modes: List[str]) -> Dict[str, Any]:
        """Target 4's second half: the tensor dumps above, each in a child given less RAM (a
        memory cgroup: resident memory and page cache) than the bytes it dumps per step."""
        out: Dict[str, Any] = {"limit_mib": BEYOND_RAM_LIMIT_MB, "runs": {}, "swap_mib": H.swap_total_mib()}
        for mode in modes:
            log(f"[memory] {mode} in a {BEYOND_RAM_LIMIT_MB} MiB memory cgroup")
            try:
                cg = H.MemoryCgroup.create(f"opdump-bench-{os.getpid()}-{mode}", BEYOND_RAM_LIMIT_MB << 20)
            except OSError as exc:
                out["not_measured"] = f"no memory cgroup could be made here ({exc})"
                return out
            try:
                run = self._child_memory(mode, preexec_fn=cg.preexec)
                run.update(cg.usage())
            finally:
                cg.remove()
            out["runs"][mode] = run
        return out

    # ======================================================================= profile
    def profile(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for label, cfgkw in (("statistic device", dict(saved_data="statistic", stat_calc_mode="device")),
                             ("tensor", dict(saved_data="tensor"))):
            log(f"[profile] alexnet graph {label}")
            torch._dynamo.reset()
            d = self.folder("profile-" + label)
            dump = os.path.join(d, "dump")
            cfg = H.write_config(d, dump, **cfgkw)
            steps = 1 if self.quick else 3
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with opdump.Session(cfg) as session:
                    w = M.alexnet(self.quick)
                    w.run_model = torch.compile(w.model, backend=session.backend())
                    H.warm(w.step, self.warmup)
                    session.writer.flush()
                    prof = cProfile.Profile()
                    t0 = time.perf_counter()
                    prof.enable()
                    for _ in range(steps):
                        w.step()
                    session.writer.flush()
                    prof.disable()
                    wall = (time.perf_counter() - t0) / steps
                    from torch.profiler import ProfilerActivity, profile as tprofile
                    with tprofile(activities=[ProfilerActivity.CPU]) as tp:
                        for _ in range(steps):
                            w.step()
                        session.writer.flush()
            out[label] = {"step_s": wall, "python": _top_python(prof, steps),
                          "buckets": _buckets(prof, steps, wall), "ops": _top_ops(tp, steps), "steps": steps}
            shutil.rmtree(d, ignore_errors=True)
        log("[profile] primitives (child process)")
        cmd = [sys.executable, os.path.abspath(__file__), "--child-probes"] + (["--quick"] if self.quick else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT ")), None)
        if line is not None:
            out["_probes"] = json.loads(line[len("RESULT "):])
        return out

    # ======================================================================= msprobe
    def msprobe(self) -> Dict[str, Any]:
        if self.quick:
            return {"status": "skipped in --quick"}
        py = os.path.join(MSPROBE_VENV, "bin", "python")
        setup = {}
        if not _has_msprobe(py):
            if self.args.no_msprobe_setup:
                return {"status": f"not run: no MindStudio Probe environment at {MSPROBE_VENV} "
                                  f"(run without --no-msprobe-setup to create it)"}
            setup = setup_msprobe_venv(MSPROBE_VENV)
            if not setup.get("ok"):
                return {"status": "could not be installed", **setup}
        log("[msprobe] running in its own environment")
        result: Dict[str, Any] = {"status": "ok", "models": {}, **setup}
        for task in ("statistics", "tensor"):
            cmd = [py, os.path.join(HERE, "msprobe_child.py"), "--tmp", self.tmp, "--tasks", task]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
                return {"status": f"installed but failed to run ({task})", "message": tail, **setup}
            data = json.loads(line[len("RESULT "):])
            result["version"] = data.get("version")
            for name, r in data["models"].items():
                result["models"].setdefault(name, {}).update(r)
        return result

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


# =========================================================================== helpers
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
        {"what": f"x.mean(dtype=float64) — opdump's CPU 'high' avg", "ms": t(lambda: x.mean(dtype=torch.float64))},
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


def _has_msprobe(py: str) -> bool:
    if not os.path.exists(py):
        return False
    r = subprocess.run([py, "-c", "import msprobe.pytorch, torch; print(torch.__version__)"],
                       capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == torch.__version__


def setup_msprobe_venv(venv: str) -> Dict[str, Any]:
    """A throwaway venv that sees this project's torch (a .pth) and gets ``mindstudio-probe``.

    ``pip install --dry-run`` first: if pip would install any torch, nothing is installed.
    """
    base_python = getattr(sys, "_base_executable", None) or sys.executable
    log(f"[msprobe] creating {venv}")
    r = subprocess.run([base_python, "-m", "venv", venv], capture_output=True, text=True)
    if r.returncode != 0:
        return {"ok": False, "message": (r.stderr or r.stdout).strip()[-800:]}
    pyver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_dir = os.path.join(venv, "lib", pyver, "site-packages")
    project_site = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "torch")))
    with open(os.path.join(site_dir, "opdump_project.pth"), "w") as f:
        f.write(project_site + "\n")
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip"]
    dry = subprocess.run(pip + ["install", "--dry-run", "mindstudio-probe"], capture_output=True, text=True)
    would = next((ln for ln in dry.stdout.splitlines() if ln.startswith("Would install")), "")
    if dry.returncode != 0:
        return {"ok": False, "message": (dry.stderr or dry.stdout).strip()[-800:]}
    if any(tok.lower().startswith(("torch-", "torch_")) for tok in would.split()[2:]):
        return {"ok": False, "message": f"refused: pip would change torch: {would}"}
    inst = subprocess.run(pip + ["install", "mindstudio-probe"], capture_output=True, text=True)
    if inst.returncode != 0:
        return {"ok": False, "message": (inst.stderr or inst.stdout).strip()[-800:]}
    return {"ok": True, "install": would}


# =========================================================================== memory child
def child_memory(mode: str, quick: bool, tmp: str) -> None:
    """One process, one mode: peak RSS of a few MLP training steps."""
    w = M.mlp(quick)
    steps = 3
    before = H.peak_rss_mib()
    d = tempfile.mkdtemp(prefix=f"mem-{mode}-", dir=tmp)
    dump = os.path.join(d, "dump")
    result: Dict[str, Any] = {"mode": mode, "model": w.describe}
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode in ("plain-eager", "plain-aot-eager"):
            if mode == "plain-aot-eager":
                w.run_model = torch.compile(w.model, backend="aot_eager")
            for _ in range(steps + 1):
                w.step()
        else:
            saved = {"graph-tensor": "tensor", "eager-tensor": "tensor",
                     "graph-statistic-device": "statistic"}[mode]
            cfg = H.write_config(d, dump, saved_data=saved, stat_calc_mode="device", queue_mb=MEMORY_QUEUE_MB)
            with opdump.Session(cfg) as session:
                if mode.startswith("graph"):
                    w.run_model = torch.compile(w.model, backend=session.backend())
                    for _ in range(steps + 1):
                        w.step()
                else:
                    from opdump.capture.eager import EagerCapture  # type: ignore
                    cap = EagerCapture(session)
                    cap.start()
                    try:
                        for _ in range(steps + 1):
                            w.step()
                    finally:
                        cap.stop()
            result["bytes_written"] = session.writer.bytes_written
            result["writer_errors"] = [repr(e) for e in session.writer.errors[:3]]
            result["steps"] = steps + 1
            files = glob.glob(os.path.join(dump, "**", "*.npy"), recursive=True)
            result["npy_files"] = len(files)
            result["npy_bytes_on_disk"] = sum(os.path.getsize(f) for f in files)
    result["seconds"] = time.perf_counter() - t0
    result["rss_before_mib"] = before
    result["peak_rss_mib"] = H.peak_rss_mib()
    shutil.rmtree(d, ignore_errors=True)
    print("RESULT " + json.dumps(result), flush=True)


# =========================================================================== report
TABLE_HEAD = ("| mode | median ms | baseline, median ms | **ratio** | paired | CPU-time | amortized ms (ratio) | "
              "per step | throughput | steps | spread mode / base | neighbours |")
TABLE_RULE = "|---|---|---|---|---|---|---|---|---|---|---|---|"


def fmt_row(r: Dict[str, Any]) -> str:
    if "error" in r:
        return f"| {r['mode']} | – | {r.get('baseline', '–')} | – | | | | | {r['error']} | | | |"
    tput = ""
    if r.get("throughput_ratio_raw") is not None:
        eff = r.get("throughput_ratio_effective")
        tput = (f"{H.mbps(r['dump_rate_raw'])} raw = {r['throughput_ratio_raw']:.0%} of numpy.save's"
                f" {H.mbps(r['numpy_rate'])}"
                + (f"; {H.mbps(r['dump_rate_effective'])} effective = {eff:.0%}" if eff else ""))
    per_step = ""
    if r.get("tensors_per_step"):
        per_step = f"{r['tensors_per_step']:.0f} tensors"
        if r.get("bytes_per_step"):
            per_step += f", {r['bytes_per_step'] / 2**20:.1f} MiB in {r['files_per_step']:.0f} files"
    base = r.get("base_median")
    amort = "" if r.get("amortized") is None else f"{H.ms(r['amortized'])} ({r['amortized_ratio']:.2f}×)"
    if base is None:
        return (f"| {r['mode']} | {H.ms(r['median'])} | – | 1.00× | | | | | | {r.get('steps', '')} | "
                f"{r.get('spread', float('nan')):.0%} | |")
    return (f"| {r['mode']} | {H.ms(r['median'])} | {r.get('baseline', '–')} {H.ms(base)} | "
            f"**{H.ratio(r.get('ratio'))}** | {H.ratio(r.get('paired_ratio'))} | {H.ratio(r.get('cpu_ratio'))} | "
            f"{amort} | {per_step} | {tput} | {r.get('steps', '')} | "
            f"{r.get('spread', float('nan')):.0%} / {r.get('base_spread', float('nan')):.0%} | "
            f"{r.get('neighbours', float('nan')):.2f} |")


def _get(models, name, mode):
    for m in models:
        if m["name"] == name:
            for r in m["rows"]:
                if r["mode"] == mode:
                    return r
    return None


def targets(models, memory, scaling, eager_missing) -> List[str]:
    lines = ["| # | target | measured | verdict |", "|---|---|---|---|"]

    def verdict(vals, limit, higher_is_better=False):
        vals = [v for v in vals if v is not None]
        if not vals:
            return "not measured"
        ok = all((v >= limit) if higher_is_better else (v <= limit) for v in vals)
        return "**met**" if ok else "**not met**"

    def collect(mode, key="ratio"):
        out = []
        for m in models:
            r = _get(models, m["name"], mode)
            out.append((m["name"], None if r is None or "error" in r else r.get(key)))
        return out

    def show(pairs, pct=False):
        return ", ".join(f"{n} {('–' if v is None else (f'{v:.0%}' if pct else f'{v:.2f}×'))}" for n, v in pairs)

    p = collect("graph not-selected")
    lines.append(f"| 1 | graph not-selected ≤ 1.03× plain compiled | {show(p)} | {verdict([v for _, v in p], 1.03)} |")
    p = collect("eager not-selected")
    lines.append(f"| 1 | eager not-selected ≤ 1.10× plain eager | {show(p)} | "
                 f"{verdict([v for _, v in p], 1.10) if eager_missing is None else 'not available'} |")
    p = collect("graph statistic device")
    lines.append(f"| 2 | graph statistic (device) ≤ 1.3× plain eager | {show(p)} | {verdict([v for _, v in p], 1.3)} |")
    p = collect(FLOOR_MODE)
    if any(v is not None for _, v in p):
        lines.append(f"| 2 | (for scale) the graph dump path's floor without dump: aot_eager vs plain eager "
                     f"| {show(p)} | (no target) |")
    p = collect(EAGER_FLOOR_MODE)
    if any(v is not None for _, v in p):
        lines.append(f"| 2 | (for scale) the eager capture's floor without dump: a do-nothing Python dispatch mode "
                     f"vs plain eager | {show(p)} | (no target) |")
    p = collect("eager statistic device")
    lines.append(f"| 2 | eager statistic (device) ≤ 1.3× plain eager | {show(p)} | "
                 f"{verdict([v for _, v in p], 1.3) if eager_missing is None else 'not available'} |")
    p = collect("graph statistic host")
    lines.append(f"| 2 | graph statistic (host), reported | {show(p)} | (no target) |")
    p = collect("graph tensor", "throughput_ratio_raw")
    pe = collect("graph tensor", "throughput_ratio_effective")
    lines.append(f"| 3 | graph tensor dump ≥ 70 % of numpy.save bytes/s | raw: {show(p, True)}; "
                 f"effective: {show(pe, True)} | raw {verdict([v for _, v in p], 0.70, True)}, "
                 f"effective {verdict([v for _, v in pe], 0.70, True)} |")
    if eager_missing is None:
        p = collect("eager tensor", "throughput_ratio_raw")
        pe = collect("eager tensor", "throughput_ratio_effective")
        lines.append(f"| 3 | eager tensor dump ≥ 70 % of numpy.save bytes/s | raw: {show(p, True)}; "
                     f"effective: {show(pe, True)} | raw {verdict([v for _, v in p], 0.70, True)}, "
                     f"effective {verdict([v for _, v in pe], 0.70, True)} |")
    runs = memory.get("runs", {})
    mem_parts, mem_ok = [], []
    for k in ("graph-tensor", "eager-tensor", "graph-statistic-device"):
        v = runs.get(k, {}).get("peak_rss_mib")
        base_name = memory_baseline(k)
        base = runs.get(base_name, {}).get("peak_rss_mib")
        if base and v:
            mem_parts.append(f"{k} {v - base:+.0f} MiB vs {base_name}")
            mem_ok.append(v - base <= memory["queue_mb"] + MEMORY_CONSTANT_MB)
    lines.append(f"| 4 | peak RSS with dump ≤ without + queue bound ({memory['queue_mb']} MiB) + constant "
                 f"(README: largest tensor + 32 MiB = {MEMORY_CONSTANT_MB} MiB here) | {', '.join(mem_parts) or '–'} | "
                 f"{('**met**' if all(mem_ok) else '**not met**') if mem_ok else 'not measured'} |")
    br = memory.get("beyond_ram") or {}
    br_parts, br_ok = [], []
    for k, r in br.get("runs", {}).items():
        if "error" in r:
            br_parts.append(f"{k}: killed or failed ({r['error']})")
            br_ok.append(False)
            continue
        per_step = r["bytes_written"] / r["steps"]
        br_parts.append(f"{k}: {per_step / 2**30:.2f} GiB per step in {br['limit_mib']} MiB, completed")
        br_ok.append(per_step > br["limit_mib"] << 20 and not r.get("writer_errors"))
    verdict_br = ('**met**' if all(br_ok) else '**not met**') if br_ok else 'not measured'
    lines.append(f"| 4 | a dump of more tensor bytes per step than the RAM (memory cgroup) completes | "
                 f"{'; '.join(br_parts) or br.get('not_measured', '–')} | {verdict_br} |")
    lin = scaling_linearity(scaling)
    lines.append(f"| 5 | overhead grows linearly with operators and tensor size | {lin['text']} | {lin['verdict']} |")
    return lines


# README (writer_queue_mb): dump memory stays within the queue, plus one tensor larger than
# the whole queue (the MLP's 64 MiB weight) and one temporary copy of at most 32 MiB that
# device statistics make of a sliced/expanded tensor.
MEMORY_CONSTANT_MB = 64 + 32


def memory_baseline(mode: str) -> str:
    """Graph-mode dumps run the AOT graph op by op: their undumped twin is torch.compile(backend="aot_eager")
    (same execution, same compile-time memory); eager capture's is plain eager."""
    return "plain-aot-eager" if mode.startswith("graph") else "plain-eager"


def scaling_linearity(scaling) -> Dict[str, str]:
    """Overhead per dumped tensor across layer counts, and per MiB across widths: flat = linear."""
    texts, oks = [], []

    def flat(rows, key, unit_key, label, fmt):
        """Overhead per unit along ``rows``; ok when no point exceeds the first by 1.5×."""
        points = [(row[key], (g["median"] - g["base_median"]) / g[unit_key])
                  for row in rows for g in [row.get("graph")]
                  if g and "error" not in g and g.get(unit_key)]
        if len(points) >= 2:
            texts.append(label + ", ".join(fmt(k, v) for k, v in points))
            first = points[0][1]
            oks.append(all(v <= max(first, 1e-6) * 1.5 for _, v in points[1:]))

    flat(scaling.get("layers", []), "layers", "tensors_per_step", "graph statistic overhead per tensor: ",
         lambda nl, v: f"{nl}L {v * 1e6:.0f} µs")
    flat(scaling.get("width", []), "width", "stat_mib_per_step", "per MiB of statted tensors: ",
         lambda w, v: f"width {w} {v * 1e3:.2f} ms")
    if oks:
        return {"text": "; ".join(texts), "verdict": "**met** (cost per tensor / per MiB flat within 1.5×)" if all(oks)
                else "**not met** (cost per tensor or per MiB grows)"}
    return {"text": "–", "verdict": "not measured"}


def report(info, models, scaling, memory, profile, msprobe, eager_missing, args, elapsed) -> str:
    L: List[str] = []
    L.append("# opdump benchmarks")
    L.append("")
    L.append("Generated by `.venv/bin/python bench/run.py" + (" --quick" if args.quick else "") +
             f"` in {elapsed / 60:.1f} min — do not edit by hand; rerun the command.")
    if args.quick:
        L.append("")
        L.append("**This is a `--quick` smoke run: small models, 2 timed steps. The numbers are not the benchmark.**")
    L.append("")
    L.append("## Machine")
    L.append("")
    L.append("| | |")
    L.append("|---|---|")
    for k, v in info.items():
        L.append(f"| {k} | {v} |")
    L.append("")
    L.append("## Method")
    L.append("")
    L.append("- One process runs everything (the memory figures come from child processes, one per mode). "
             "A step is `zero_grad`, forward, cross-entropy, backward, `optimizer.step()`.")
    L.append(f"- Warm-up: {2} steps per mode, not timed (compilation happens there). Then rounds of a "
             "baseline block followed by a block of the mode, interleaved, so a neighbour's load on this "
             "shared machine hits both sides (about 3 s a side, 8 s for *not-selected*); **median** of the "
             "timed steps per side; the ratio is mode median / baseline median of that same interleaving. "
             "Blocks of modes that write no `.npy` file are 3 timed steps after 1 untimed step on both sides "
             "(the first step after the other model ran pays for its caches and allocator state: the "
             "ResNet-ish model's statistic dump read 1.42× alternating single steps, 1.14× in blocks; a "
             "training run dumps step after step); modes that write files run blocks of 2 timed steps, "
             "first step included, and drain the writer after each block.")
    L.append("- Baselines: *plain compiled* (`torch.compile`, inductor) for *graph not-selected* "
             "(opdump's backend, `iteration` set to a step the run never reaches); *plain eager* for every "
             "dump (a dumped graph iteration runs operator by operator, so eager is its floor). The row "
             f"*{FLOOR_MODE}* measures that floor as it really is: `torch.compile(backend=\"aot_eager\")`, "
             "AOTAutograd's forward/backward graphs run by FX code with AOT's runtime wrappers — what opdump's "
             "dump path runs before any tap (on a model with small kernels its Python per operator shows). "
             f"The row *{EAGER_FLOOR_MODE}* is eager capture's floor: the same step under a "
             "`TorchDispatchMode` whose `__torch_dispatch__` only calls the operator (every operator's "
             "arguments go C++ → Python → C++ and its results back: ~3 µs for a one-tensor operator, "
             "~15 µs for a convolution's nine arguments, measured here).")
    L.append("- *amortized*: (sum of the mode's step times + the time to drain the writer after each block, "
             "for modes that write `.npy` files up to an `os.sync()`) / steps — what a long run pays when the "
             "writer cannot hide in later steps and the page cache cannot absorb the files.")
    L.append("- Dumps go to a temp folder on the same disk as the numpy.save baseline, `os.sync()` before "
             "each timed write phase, old iteration folders deleted between rounds, everything deleted after.")
    L.append("- Python's garbage collector runs as in a user's process: one `gc.collect()` before each "
             "interleaving, no `gc.freeze()` (which would hide the full collections that objects a dump "
             "keeps alive trigger).")
    L.append("- Throughput: bytes of `.npy` data written / (sum of dumped step times + writer drains) = "
             "**raw**; bytes / (that − steps × plain-eager median) = **effective** (the time the dump added). "
             "Against a plain loop of `numpy.save` writing the arrays of the last warm-up iteration, read back "
             "into memory, into the same dump folder: one round after each block of the dump (interleaved, so "
             "both meet the same disk and page-cache state), as many times as the block's steps. Both sides "
             "end each timed write phase with an `os.sync()` inside the timing (the dump's drain: writer "
             "flush + sync): bytes on the disk, not in the page cache, whose state otherwise decides the "
             "figure (numpy.save alone read 220 MB/s to 3.3 GB/s between runs on this machine).")
    L.append("- *ratio* = median / median (the figure the targets use); *paired* = median over rounds of (the "
             "mode's block median / the baseline block just before it), robust to a load change between rounds; "
             "*CPU-time* = ratio of median process CPU time per step (all threads, the writer's included), less "
             "sensitive to neighbours than wall time.")
    L.append("- *spread*: (max − min) / median of the timed steps of the mode / of its baseline. *neighbours*: "
             "CPU cores other processes used during the measurement (machine busy time from /proc/stat minus "
             "this process's); each measurement first waits up to 20 s for them to drop below 0.25 cores. "
             "Rows with neighbours ≳ 0.3 or a spread ≳ 50 % were measured on a busy machine: read the paired "
             "and CPU-time ratios next to them.")
    if eager_missing:
        L.append(f"- Eager capture: **not available** in this checkout ({eager_missing}); its rows are empty.")
    L.append("")
    L.append("## Step time per mode")
    for m in models:
        L.append("")
        L.append(f"### {m['name']}: {m['describe']}")
        L.append("")
        L.append(TABLE_HEAD)
        L.append(TABLE_RULE)
        for r in m["rows"]:
            L.append(fmt_row(r))
        comp = _get(models, m["name"], "plain compiled (inductor)")
        if comp and comp.get("warmup_s") is not None:
            L.append("")
            L.append(f"Inductor warm-up (compile + {2} steps): {comp['warmup_s']:.1f} s.")
    L.append("")
    L.append("## MindStudio Probe on the same models")
    L.append("")
    L.extend(msprobe_section(msprobe, models))
    L.append("")
    L.append("## Memory")
    L.append("")
    L.extend(memory_section(memory))
    L.append("")
    L.append("## Scaling")
    L.append("")
    L.extend(scaling_section(scaling))
    L.append("")
    L.append("## Where a dumped step's time goes (AlexNet, graph mode)")
    L.append("")
    L.extend(profile_section(profile))
    L.append("")
    L.append("## Targets of issue 5")
    L.append("")
    L.extend(targets(models, memory, scaling, eager_missing))
    L.append("")
    return "\n".join(L)


def msprobe_section(ms: Dict[str, Any], models) -> List[str]:
    L = []
    if ms.get("status") != "ok":
        L.append(f"Not measured: {ms.get('status')}.")
        if ms.get("message"):
            L.append("")
            L.append("```")
            L.append(ms["message"])
            L.append("```")
        return L
    L.append(f"`mindstudio-probe` {ms.get('version', '?')} (`PrecisionDebugger`, level L1, every step), installed "
             f"in a throwaway venv that uses this project's torch {torch.__version__} (a `.pth`; pip's dry run "
             f"showed no torch change). Measured in its own process, interleaved with its own plain-eager "
             f"baseline, same models and sizes; opdump's ratios from the tables above.")
    L.append("")
    L.append("| model | msprobe statistics | opdump graph statistic (device) | opdump eager statistic (device) | "
             "msprobe tensor | opdump graph tensor | opdump eager tensor |")
    L.append("|---|---|---|---|---|---|---|")

    def counts(r):
        if r.get("apis_per_step") is None:
            return ""
        return f" ({r['apis_per_step']:.0f} APIs, {r['tensors_per_step']:.0f} tensors)"

    for name, r in ms.get("models", {}).items():
        def od(mode):
            row = _get(models, name, mode)
            if row is None or "error" in row:
                return "–"
            n = f" ({row['tensors_per_step']:.0f} tensors)" if row.get("tensors_per_step") else ""
            return H.ratio(row.get("ratio")) + n
        st = r.get("statistics", {})
        te = r.get("tensor", {})
        L.append(f"| {name} | {H.ratio(st.get('ratio'))}{counts(st)} | {od('graph statistic device')} | "
                 f"{od('eager statistic device')} | {H.ratio(te.get('ratio'))}{counts(te)} | {od('graph tensor')} | "
                 f"{od('eager tensor')} |")
    L.append("")
    L.append("MindStudio Probe's L1 dump sees torch API calls (`Functional.conv2d`, `Tensor.add`…: fewer, "
             "coarser than ATen operators; not the optimizer's) and computes Max/Min/Mean/Norm; opdump sees every "
             "ATen operator (graph mode: of the forward and backward graphs; eager mode: also the optimizer's) "
             "and, by default, max/min/l2norm. The counts in brackets are tensors summarised per step.")
    if ms.get("notes"):
        L.append("")
        L.append(ms["notes"])
    return L


def memory_section(mem: Dict[str, Any]) -> List[str]:
    model = next((r.get("model") for r in mem.get("runs", {}).values() if r.get("model")), "the wide MLP")
    L = [f"Peak resident memory (VmHWM of /proc/self/status) of one child process per mode: {model}, 4 steps (1 warm-up), "
         f"every operator dumped, every step, `writer_queue_mb` {mem['queue_mb']}.", "",
         "| mode | peak RSS MiB | vs plain eager | vs its undumped twin | written |", "|---|---|---|---|---|"]
    runs = mem.get("runs", {})
    eager = runs.get("plain-eager", {}).get("peak_rss_mib")
    for k, r in runs.items():
        if "error" in r:
            L.append(f"| {k} | error: {r['error']} | | | |")
            continue
        delta = "" if eager is None or k == "plain-eager" else f"{r['peak_rss_mib'] - eager:+.0f} MiB"
        twin = ""
        if not k.startswith("plain"):
            b = runs.get(memory_baseline(k), {}).get("peak_rss_mib")
            twin = "" if b is None else f"{r['peak_rss_mib'] - b:+.0f} MiB vs {memory_baseline(k)}"
        written = f"{r['bytes_written'] / 2**30:.2f} GiB" if r.get("bytes_written") else ""
        L.append(f"| {k} | {r['peak_rss_mib']:.0f} | {delta} | {twin} | {written} |")
    L.append("")
    L.append("Graph-mode dumps are compared with `torch.compile(backend=\"aot_eager\")`, which runs the same "
             "AOT graphs operator by operator and pays the same compile-time memory; eager capture with plain "
             "eager. Target 4 allows the writer queue plus the constant the README documents: one tensor "
             "larger than the whole queue (here the MLP's 64 MiB weight) and one temporary copy of at most "
             f"32 MiB made for device statistics, {MEMORY_CONSTANT_MB} MiB in all.")
    L.append("")
    L += beyond_ram_section(mem.get("beyond_ram"))
    return L


def beyond_ram_section(br: Optional[Dict[str, Any]]) -> List[str]:
    if not br:
        return ["A model whose per-step tensors exceed RAM: not run (`--quick`)."]
    if br.get("not_measured"):
        return [f"A model whose per-step tensors exceed RAM: not measured, {br['not_measured']}."]
    swap = br.get("swap_mib")
    swap_text = "no swap on this machine" if not swap else f"swap on this machine: {swap:.0f} MiB"
    L = [f"**More per step than the RAM it has.** The same tensor dumps, each child in a memory cgroup limited to "
         f"{br['limit_mib']} MiB (resident memory and page cache together, as a machine's RAM; {swap_text}), "
         "so each step dumps more bytes than the process may hold:", "",
         "| mode | dumped per step | cgroup limit | cgroup peak | OOM kills | completed | .npy on disk at the end | writer errors |",
         "|---|---|---|---|---|---|---|---|"]
    for mode, r in br.get("runs", {}).items():
        peak = f"{r['peak_bytes'] / 2**20:.0f} MiB" if r.get("peak_bytes") is not None else "–"
        kills = r.get("oom_kills", "–")
        if "error" in r:
            L.append(f"| {mode} | – | {br['limit_mib']} MiB | {peak} | {kills} | **no** (exit {r['returncode']}: "
                     f"{r['error']}) | – | – |")
            continue
        per_step = r["bytes_written"] / r["steps"] / 2**30
        disk = f"{r['npy_files']} files, {r['npy_bytes_on_disk'] / 2**30:.2f} GiB"
        L.append(f"| {mode} | {per_step:.2f} GiB | {br['limit_mib']} MiB | {peak} | {kills} | yes, {r['steps']} steps "
                 f"in {r['seconds']:.0f} s | {disk} | {len(r.get('writer_errors') or [])} |")
    L.append("")
    L.append("The writer's byte budget (`writer_queue_mb`) bounds what the dump holds; the kernel reclaims the "
             "written files' page cache as the limit is reached (the peak sits at the limit), so the dump "
             "completes rather than being killed.")
    return L


def scaling_section(sc: Dict[str, Any]) -> List[str]:
    L = ["Statistic dump (`stat_calc_mode` device) of every operator vs plain eager, by number of encoder layers:",
         "", "| layers | eager ms | graph statistic ms | ratio | tensors/step | overhead per tensor | "
             "eager statistic ratio |", "|---|---|---|---|---|---|---|"]
    for row in sc.get("layers", []):
        g = row.get("graph")
        if not g or "error" in g:
            L.append(f"| {row['layers']} | error: {row.get('error') or g.get('error')} | | | | | |")
            continue
        e = row.get("eager")
        per = (g["median"] - g["base_median"]) / g["tensors_per_step"] if g.get("tensors_per_step") else None
        L.append(f"| {row['layers']} | {H.ms(g['base_median'])} | {H.ms(g['median'])} | {H.ratio(g['ratio'])} | "
                 f"{g.get('tensors_per_step', 0):.0f} | {'–' if per is None else f'{per * 1e6:.0f} µs'} | "
                 f"{H.ratio(e['ratio']) if e and 'error' not in e else '–'} |")
    L.append("")
    L.append("By tensor size (the MLP's width; statistic dump, device mode, graph):")
    L.append("")
    L.append("| width | eager ms | graph statistic ms | ratio | overhead per MiB of dumped tensors |")
    L.append("|---|---|---|---|---|")
    for row in sc.get("width", []):
        g = row.get("graph")
        if not g or "error" in g:
            L.append(f"| {row['width']} | error: {row.get('error') or g.get('error')} | | | |")
            continue
        L.append(f"| {row['width']} | {H.ms(g['base_median'])} | {H.ms(g['median'])} | {H.ratio(g['ratio'])} | "
                 f"{_per_mib(g)} |")
    return L


def _per_mib(g) -> str:
    mib = g.get("stat_mib_per_step")
    if not mib:
        return "–"
    return f"{(g['median'] - g['base_median']) / mib * 1e3:.2f} ms"


def profile_section(pr: Dict[str, Any]) -> List[str]:
    L = ["cProfile of the main thread over the dumped steps (each step followed by a writer flush, so the "
         "writer's work that the step did not hide shows as lock waits), and torch.profiler over the same "
         "number of steps. The first table of each mode sorts the main thread's own time into kinds.", ""]
    for label, p in pr.items():
        if label.startswith("_"):
            continue
        L.append(f"### {label} (one dumped step: {p['step_s'] * 1e3:.1f} ms wall incl. writer flush, "
                 f"mean of {p['steps']})")
        L.append("")
        L.append("| where (main thread, own time) | ms per step |")
        L.append("|---|---|")
        for b in p.get("buckets", []):
            L.append(f"| {b['what']} | {b['ms']:.1f} |")
        L.append("")
        L.append("cProfile, main thread, top by own time (writer threads are not in it; waiting for them shows "
                 "as lock waits):")
        L.append("")
        L.append("| function | calls/step | own ms | cumulative ms |")
        L.append("|---|---|---|---|")
        for r in p["python"]:
            L.append(f"| `{r['func']}` | {r['calls']:.0f} | {r['tottime'] * 1e3:.2f} | {r['cumtime'] * 1e3:.2f} |")
        L.append("")
        L.append("torch.profiler, top operators by self CPU time (all threads):")
        L.append("")
        L.append("| op | calls/step | self ms | total ms |")
        L.append("|---|---|---|---|")
        for r in p["ops"]:
            L.append(f"| `{r['op']}` | {r['calls']:.0f} | {r['self_ms']:.2f} | {r['total_ms']:.2f} |")
        L.append("")
    probes = pr.get("_probes")
    if probes:
        L.append("### The primitives behind it (torch alone, this machine, a fresh process)")
        L.append("")
        L.append("| operation | ms | relative error vs float64 |")
        L.append("|---|---|---|")
        for r in probes:
            err = "" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"
            L.append(f"| {r['what']} | {r['ms']:.3f} | {err} |")
        L.append("")
    return L


# =========================================================================== main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small models, 2 timed steps (a smoke check)")
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"), help="report file (written whole)")
    ap.add_argument("--tmp", default=None, help="folder for the temporary dumps (default: the system temp)")
    ap.add_argument("--models", default="alexnet,transformer,mlp")
    ap.add_argument("--skip", default="", help="comma list of: scaling,memory,profile,msprobe")
    ap.add_argument("--no-msprobe-setup", action="store_true",
                    help="do not create the MindStudio Probe venv when it is missing")
    ap.add_argument("--json", default=None, help="also write the raw results as JSON here")
    ap.add_argument("--child-memory", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-probes", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_probes:
        print("RESULT " + json.dumps(_probes(args.quick)), flush=True)
        return 0
    if args.child_memory:
        child_memory(args.child_memory, args.quick, args.tmp or tempfile.gettempdir())
        return 0
    t_start = time.perf_counter()
    bench = Bench(args)
    skip = set(filter(None, args.skip.split(",")))
    try:
        info = H.machine_info(bench.tmp)
        models = []
        for name in filter(None, args.models.split(",")):
            models.append(bench.model(name))
        scaling = {} if "scaling" in skip else bench.scaling()
        memory = {"queue_mb": MEMORY_QUEUE_MB, "runs": {}} if "memory" in skip else bench.memory()
        profile = {} if "profile" in skip else bench.profile()
        msprobe = {"status": "skipped (--skip)"} if "msprobe" in skip else bench.msprobe()
        try:
            info["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        except OSError:
            pass
        elapsed = time.perf_counter() - t_start
        text = report(info, models, scaling, memory, profile, msprobe, bench.eager_missing, args, elapsed)
        with open(args.out, "w") as f:
            f.write(text)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"info": info, "models": models, "scaling": scaling, "memory": memory,
                           "profile": profile, "msprobe": msprobe}, f, indent=1, default=str)
        log(f"wrote {args.out} in {elapsed:.0f} s")
    finally:
        bench.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
