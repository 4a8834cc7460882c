#!/usr/bin/env python
"""opdump's benchmarks (issue 5): one command, writes BENCHMARKS.md.

    .venv/bin/python bench/run.py [--quick] [--out BENCHMARKS.md] [--json RESULTS.json]
    .venv/bin/python bench/run.py --from-json RESULTS.json [--out BENCHMARKS.md]
    .venv/bin/python bench/run.py --models decoder --block decoder [--json RESULTS.json]

For each model (AlexNet, a 4-layer transformer encoder, a wide MLP, a small-kernel
Llama-style decoder) it times a

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
``--block NAME``: write only the marked block ``<!-- NAME: begin -->`` … ``<!-- NAME: end -->``
of ``--out`` (the measured models' tables, issue 24's targets for them, MindStudio Probe on
them; :mod:`bench.report_block`), keeping the rest of the file — for a run of some models only.
``--from-json``: rebuild the report from the results a run saved with ``--json``, measuring
nothing.  The stages: :mod:`bench.measure` (with :mod:`bench.modes`, :mod:`bench.profiling`,
:mod:`bench.memory_child`, :mod:`bench.msprobe_setup`) gives plain dicts; :mod:`bench.report`
(and :mod:`bench.report_sections`) turns them into Markdown.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from typing import Any, Dict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.report import report  # noqa: E402

def render(results: Dict[str, Any]) -> str:
    """BENCHMARKS.md from a run's results (the dict ``--json`` saves)."""
    return report(results["info"], results["models"], results.get("scaling") or {},
                  results.get("memory") or {"runs": {}}, results.get("profile") or {},
                  results.get("msprobe") or {"status": "not measured"}, results.get("eager_missing"),
                  bool(results.get("quick")), results.get("elapsed_s"))


_BLOCK = re.compile(r"<!-- (?P<name>[\w.-]+): begin -->.*?<!-- (?P=name): end -->\n?", re.S)


def keep_marked_blocks(old: str, new: str, drop=()) -> str:
    """``new`` plus every ``<!-- NAME: begin --> … <!-- NAME: end -->`` block of ``old``
    that ``new`` lacks: sections other benchmarks maintain (``compare_bench.py --update``)
    survive a full rewrite of the report.  Blocks named in ``drop`` (a partial run's
    ``--block`` named after a model the full run has measured again) are superseded."""
    have = {m.group("name") for m in _BLOCK.finditer(new)} | set(drop)
    kept = [m.group(0) for m in _BLOCK.finditer(old) if m.group("name") not in have]
    if not kept:
        return new
    return new.rstrip("\n") + "\n\n" + "\n".join(b if b.endswith("\n") else b + "\n" for b in kept)


def _write_whole(path: str, text: str, drop=()) -> None:
    try:
        with open(path) as f:
            text = keep_marked_blocks(f.read(), text, drop)
    except FileNotFoundError:
        pass
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _add_notes(results: Dict[str, Any], path) -> None:
    if path:
        with open(path, encoding="utf-8") as f:
            results["notes"] = f.read().strip("\n")


def write_report(path: str, results: Dict[str, Any], block=None) -> None:
    """The whole report, or with ``block`` only that marked block of ``path``."""
    if block:
        from bench.report_block import render_block, replace_block
        replace_block(path, block, render_block(block, results))
    else:
        _write_whole(path, render(results), drop=[m["name"] for m in results["models"]])


def measure(args) -> Dict[str, Any]:
    """Every measurement the report needs, as plain data (see :mod:`bench.measure`)."""
    from bench import machine
    from bench.measure import Bench
    from bench.modes import MEMORY_QUEUE_MB

    t_start = time.perf_counter()
    bench = Bench(args)
    skip = set(filter(None, args.skip.split(",")))
    try:
        info = machine.machine_info(bench.tmp)
        info["command"] = " ".join([".venv/bin/python bench/run.py"] + list(args.argv))
        models = [bench.model(name) for name in filter(None, args.models.split(","))]
        scaling = {} if "scaling" in skip else bench.scaling()
        memory = {"queue_mb": MEMORY_QUEUE_MB, "runs": {}} if "memory" in skip else bench.memory()
        profile = {} if "profile" in skip else bench.profile()
        # MindStudio Probe on the measured models but the MLP (large tensors, nothing to compare)
        ms_models = [m["name"] for m in models if m["name"] != "mlp"]
        msprobe = ({"status": "skipped (--skip)"} if "msprobe" in skip
                   else {"status": "not run: no model for it (--models)"} if not ms_models
                   else bench.msprobe(ms_models))
        try:
            info["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        except OSError:
            pass
        return {"info": info, "models": models, "scaling": scaling, "memory": memory, "profile": profile,
                "msprobe": msprobe, "eager_missing": bench.eager_missing, "quick": args.quick,
                "elapsed_s": time.perf_counter() - t_start}
    finally:
        bench.cleanup()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small models, 2 timed steps (a smoke check)")
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"), help="report file (written whole)")
    ap.add_argument("--tmp", default=None, help="folder for the temporary dumps (default: the system temp)")
    ap.add_argument("--models", default="alexnet,transformer,mlp,decoder",
                    help="comma list of bench/models.py's BUILDERS")
    ap.add_argument("--block", default=None, metavar="NAME",
                    help="write only the marked block NAME of --out (a partial run's section), keep the rest")
    ap.add_argument("--notes", default=None, metavar="FILE",
                    help="with --block: a Markdown file appended to the block (findings, a second reading)")
    ap.add_argument("--skip", default="", help="comma list of: scaling,memory,profile,msprobe")
    ap.add_argument("--no-msprobe-setup", action="store_true",
                    help="do not create the MindStudio Probe venv when it is missing")
    ap.add_argument("--json", default=None, help="also write the raw results as JSON here")
    ap.add_argument("--from-json", default=None, metavar="FILE",
                    help="rebuild the report from results saved by --json, measuring nothing")
    ap.add_argument("--child-memory", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-probes", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.child_probes:
        from bench.profiling import _probes
        print("RESULT " + json.dumps(_probes(args.quick)), flush=True)
        return 0
    if args.child_memory:
        from bench.memory_child import child_memory
        child_memory(args.child_memory, args.quick, args.tmp or tempfile.gettempdir())
        return 0
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        _add_notes(results, args.notes)
        write_report(args.out, results, args.block)
        print(f"wrote {args.out} from {args.from_json}", file=sys.stderr)
        return 0
    from bench.modes import log
    results = measure(args)
    _add_notes(results, args.notes)
    write_report(args.out, results, args.block)
    if args.json:
        _write_whole(args.json, json.dumps(results, indent=1, default=str))
    log(f"wrote {args.out} in {results['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
