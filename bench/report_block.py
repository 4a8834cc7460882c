"""One marked block of BENCHMARKS.md for the models of a partial run (``run.py --block NAME``).

A partial run (``--models decoder``, say) must not rewrite the whole report: the other
models' tables stay as the last full run measured them.  This module renders what such a
run measured — the command, when, the machine's load, each model's step-time table (the
full report's columns), issue 24's targets for those models and MindStudio Probe's rows —
as ``<!-- NAME: begin -->`` … ``<!-- NAME: end -->``, and replaces (or appends) that block
in the file, written whole (temp + rename).  A pure function of the saved results like
:mod:`bench.report`: ``--from-json FILE --block NAME`` rebuilds it without measuring.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from bench.modes import EAGER_FLOOR_MODE, FLOOR_MODE
from bench.report import TABLE_HEAD, TABLE_RULE, fmt_row
from bench.report_sections import _get, msprobe_section

#: issue 24 item 5's targets (ratios in one process, medians)
EAGER_STAT_LIMIT = 1.5          # eager statistics ≤ 1.5× plain eager on small-kernel models
GRAPH_OVER_FLOOR = 0.15         # graph statistics ≤ the aot_eager floor + 0.15×
HOST_OVER_DEVICE = 1.1          # host statistics within 1.1× of device statistics on CPU


def _ratio(models, name: str, mode: str, key: str = "ratio") -> Optional[float]:
    r = _get(models, name, mode)
    return None if r is None or "error" in r else r.get(key)


def _x(v: Optional[float]) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _verdict(value: Optional[float], limit: Optional[float]) -> str:
    if value is None or limit is None:
        return "not measured"
    return "**met**" if value <= limit else "**not met**"


def issue24_targets(models) -> List[str]:
    """Issue 24 item 5's targets for each model of the run, with the paired and CPU-time
    ratios next to the median ratio (the machine is shared: a verdict on wall time alone
    can be a neighbour's)."""
    L = ["| model | target | measured: ratio (paired, CPU-time) | verdict |", "|---|---|---|---|"]

    def show(name, mode):
        return (f"{_x(_ratio(models, name, mode))} ({_x(_ratio(models, name, mode, 'paired_ratio'))}, "
                f"{_x(_ratio(models, name, mode, 'cpu_ratio'))})")

    for m in models:
        n = m["name"]
        L.append(f"| {n} | eager statistic (device) ≤ {EAGER_STAT_LIMIT}× plain eager | "
                 f"{show(n, 'eager statistic device')} | "
                 f"{_verdict(_ratio(models, n, 'eager statistic device'), EAGER_STAT_LIMIT)} |")
        floor = _ratio(models, n, FLOOR_MODE)
        limit = None if floor is None else floor + GRAPH_OVER_FLOOR
        L.append(f"| {n} | graph statistic (device) ≤ aot_eager floor ({_x(floor)}) + {GRAPH_OVER_FLOOR}× | "
                 f"{show(n, 'graph statistic device')} | "
                 f"{_verdict(_ratio(models, n, 'graph statistic device'), limit)} |")
        for front in ("graph", "eager"):
            host = _ratio(models, n, f"{front} statistic host")
            dev = _ratio(models, n, f"{front} statistic device")
            both = None if host is None or dev is None else host / dev
            L.append(f"| {n} | {front} statistic host within {HOST_OVER_DEVICE}× of device | "
                     f"host {_x(host)} / device {_x(dev)} = {_x(both)} | {_verdict(both, HOST_OVER_DEVICE)} |")
        floor_e = _ratio(models, n, EAGER_FLOOR_MODE)
        L.append(f"| {n} | (for scale) eager floor: a do-nothing dispatch mode | {show(n, EAGER_FLOOR_MODE)} | "
                 f"(no target; {_x(floor_e)}) |")
    return L


def render_block(name: str, results: Dict[str, Any]) -> str:
    """The marked block for ``results`` (what ``run.py --json`` saves)."""
    info, models = results["info"], results["models"]
    describe = "; ".join(f"{m['name']}: {m['describe']}" for m in models)
    cmd = info.get("command") or ".venv/bin/python bench/run.py --models " + ",".join(m["name"] for m in models)
    L = [f"<!-- {name}: begin -->", f"## {', '.join(m['name'] for m in models)} (partial run: `--block {name}`)", ""]
    took = results.get("elapsed_s")
    L.append(f"Measured by `{cmd}`" + (f" in {took / 60:.1f} min" if took else "") +
             f" on {info.get('date', '?')} (opdump commit {info.get('opdump commit', '?')}, torch "
             f"{info.get('torch', '?')}, {info.get('torch threads', '?')} torch threads, {info.get('cores', '?')} "
             f"cores; load average {info.get('load average at start', '?')} at start, "
             f"{info.get('load average at end', '?')} at end). Only this block was written; the rest of this "
             f"report is from the last full run. Method: as in *Method* above. The machine is shared: read "
             f"*paired* and *CPU-time* next to each ratio, and *neighbours* (other processes' CPU cores while "
             f"measured).")
    if results.get("quick"):
        L += ["", "**A `--quick` smoke run: small models, 2 timed steps. The numbers are not the benchmark.**"]
    for m in models:
        L += ["", f"### {m['name']}: {m['describe']}", "", TABLE_HEAD, TABLE_RULE]
        L += [fmt_row(r) for r in m["rows"]]
        comp = _get(models, m["name"], "plain compiled (inductor)")
        if comp and comp.get("warmup_s") is not None:
            L += ["", f"Inductor warm-up (compile + 2 steps): {comp['warmup_s']:.1f} s."]
    L += ["", f"### Targets of issue 24 item 5 ({describe})", ""]
    L += issue24_targets(models)
    L += ["", "### MindStudio Probe on the same model" + ("s" if len(models) > 1 else ""), ""]
    L += msprobe_section(results.get("msprobe") or {"status": "not measured"}, models, info.get("torch", "?"))
    if results.get("notes"):
        L += ["", results["notes"]]
    L.append(f"<!-- {name}: end -->")
    return "\n".join(L) + "\n"


def replace_block(path: str, name: str, block: str) -> None:
    """Replace the block ``name`` in ``path`` (or append it); the file is written whole."""
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    try:
        with open(path, encoding="utf-8") as f:
            old = f.read()
    except FileNotFoundError:
        old = ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(old):
        new = pattern.sub(lambda _: block, old, count=1)
    else:
        new = (old.rstrip("\n") + "\n\n" if old.strip() else "") + block
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new)
    os.replace(tmp, path)
