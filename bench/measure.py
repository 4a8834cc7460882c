"""The measurements: every model x mode interleaved with its baseline, throughput against
``numpy.save``, peak memory and the beyond-RAM runs (child processes), scaling, the profile
of a dumped step and MindStudio Probe; :class:`Bench` returns plain dicts that
:mod:`bench.report` turns into BENCHMARKS.md (and ``run.py --json`` saves)."""
from __future__ import annotations

import cProfile
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import opdump  # noqa: E402
from bench import harness as H  # noqa: E402
from bench import dumps as D  # noqa: E402
from bench import machine  # noqa: E402
from bench import models as M  # noqa: E402
from bench.modes import (BEYOND_RAM_LIMIT_MB, EAGER_FLOOR_MODE, EAGER_MODES, FLOOR_MODE,  # noqa: E402
                         GRAPH_MODES, MEMORY_QUEUE_MB, MSPROBE_VENV, QUICK_MODES, EagerToggle,
                         eager_capture_class, log)
from bench.msprobe_setup import _has_msprobe, setup_msprobe_venv  # noqa: E402
from bench.profiling import _buckets, _top_ops, _top_python  # noqa: E402

#: the command the child processes run (``--child-memory``, ``--child-probes``)
RUN_SCRIPT = os.path.join(HERE, "run.py")


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
        cfg = D.write_config(d, dump, **cfgkw)
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
                writes = (cfgkw.get("saved_data", "tensor") in ("tensor", "full") and "iteration" not in cfgkw
                          and not cfgkw.get("op_debug_mode"))          # the overflow watch writes no tensor here
                # the numpy.save baseline writes the arrays of the last warm-up iteration, one round
                # after each block of the dump, so that both meet the same disk and page-cache state
                npsave = None
                if writes and throughput:
                    npsave = D.NumpySaveBaseline(D.load_iteration_arrays(dump), os.path.join(dump, "numpy-save"))
                D.prune_iterations(dump, keep_last=False)
                b0, f0 = session.writer.bytes_written, session.writer.files_written
                r0 = session.recorder.tensors_recorded

                def enter():
                    if writes:
                        D.sync_disk()
                    if toggle:
                        toggle.enter()

                def after_block():
                    D.prune_iterations(dump, keep_last=True)
                    if npsave is not None:
                        npsave.round(len(mode.blocks[-1]))      # as many times as the block's steps

                mode = H.Side(w.step, enter=enter, exit=toggle.exit if toggle else None,
                              drain=(lambda: (session.writer.flush(), D.sync_disk())) if writes
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
            out.update(D.statistic_volume(dump))
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
        cmd = [sys.executable, RUN_SCRIPT, "--child-memory", mode, "--tmp", self.tmp]
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
        out: Dict[str, Any] = {"limit_mib": BEYOND_RAM_LIMIT_MB, "runs": {}, "swap_mib": machine.swap_total_mib()}
        for mode in modes:
            log(f"[memory] {mode} in a {BEYOND_RAM_LIMIT_MB} MiB memory cgroup")
            try:
                cg = machine.MemoryCgroup.create(f"opdump-bench-{os.getpid()}-{mode}", BEYOND_RAM_LIMIT_MB << 20)
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
            cfg = D.write_config(d, dump, **cfgkw)
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
        cmd = [sys.executable, RUN_SCRIPT, "--child-probes"] + (["--quick"] if self.quick else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT ")), None)
        if line is not None:
            out["_probes"] = json.loads(line[len("RESULT "):])
        return out

    # ======================================================================= msprobe
    def msprobe(self, models=("alexnet", "transformer")) -> Dict[str, Any]:
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
            cmd = [py, os.path.join(HERE, "msprobe_child.py"), "--tmp", self.tmp, "--tasks", task,
                   "--models", ",".join(models)]
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
