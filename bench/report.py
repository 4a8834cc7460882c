"""BENCHMARKS.md from the measurements' dicts (as ``run.py --json`` saves them): the tables,
the targets and their verdicts; a pure function of its inputs, so ``run.py --from-json``
rebuilds the report without measuring anything."""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


from bench import units as U  # noqa: E402
from bench.modes import EAGER_FLOOR_MODE, FLOOR_MODE  # noqa: E402
from bench.report_sections import (_get, MEMORY_CONSTANT_MB, memory_baseline, memory_section,  # noqa: E402
                                   msprobe_section, profile_section, scaling_section)


TABLE_HEAD = ("| mode | median ms | baseline, median ms | **ratio** | paired | CPU-time | amortized ms (ratio) | "
              "per step | throughput | steps | spread mode / base | neighbours |")
TABLE_RULE = "|---|---|---|---|---|---|---|---|---|---|---|---|"


def fmt_row(r: Dict[str, Any]) -> str:
    if "error" in r:
        return f"| {r['mode']} | – | {r.get('baseline', '–')} | – | | | | | {r['error']} | | | |"
    tput = ""
    if r.get("throughput_ratio_raw") is not None:
        eff = r.get("throughput_ratio_effective")
        tput = (f"{U.mbps(r['dump_rate_raw'])} raw = {r['throughput_ratio_raw']:.0%} of numpy.save's"
                f" {U.mbps(r['numpy_rate'])}"
                + (f"; {U.mbps(r['dump_rate_effective'])} effective = {eff:.0%}" if eff else ""))
    per_step = ""
    if r.get("tensors_per_step"):
        per_step = f"{r['tensors_per_step']:.0f} tensors"
        if r.get("bytes_per_step"):
            per_step += f", {r['bytes_per_step'] / 2**20:.1f} MiB in {r['files_per_step']:.0f} files"
    base = r.get("base_median")
    amort = "" if r.get("amortized") is None else f"{U.ms(r['amortized'])} ({r['amortized_ratio']:.2f}×)"
    if base is None:
        return (f"| {r['mode']} | {U.ms(r['median'])} | – | 1.00× | | | | | | {r.get('steps', '')} | "
                f"{r.get('spread', float('nan')):.0%} | |")
    return (f"| {r['mode']} | {U.ms(r['median'])} | {r.get('baseline', '–')} {U.ms(base)} | "
            f"**{U.ratio(r.get('ratio'))}** | {U.ratio(r.get('paired_ratio'))} | {U.ratio(r.get('cpu_ratio'))} | "
            f"{amort} | {per_step} | {tput} | {r.get('steps', '')} | "
            f"{r.get('spread', float('nan')):.0%} / {r.get('base_spread', float('nan')):.0%} | "
            f"{r.get('neighbours', float('nan')):.2f} |")


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


def report(info, models, scaling, memory, profile, msprobe, eager_missing, quick: bool,
           elapsed: Optional[float]) -> str:
    L: List[str] = []
    L.append("# opdump benchmarks")
    L.append("")
    took = "" if elapsed is None else f" in {elapsed / 60:.1f} min"
    L.append("Generated by `.venv/bin/python bench/run.py" + (" --quick" if quick else "") +
             f"`{took} — do not edit by hand; rerun the command (or `--from-json` its saved results).")
    if quick:
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
    L.extend(msprobe_section(msprobe, models, info.get("torch", "?")))
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
