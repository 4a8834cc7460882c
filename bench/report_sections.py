"""The report's sections after the main tables: MindStudio Probe, memory, beyond RAM,
scaling and the profile (each a list of Markdown lines from its measurement's dict)."""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


from bench import units as U  # noqa: E402


def _get(models, name, mode):
    for m in models:
        if m["name"] == name:
            for r in m["rows"]:
                if r["mode"] == mode:
                    return r
    return None


MEMORY_CONSTANT_MB = 64 + 32


def memory_baseline(mode: str) -> str:
    """Graph-mode dumps run the AOT graph op by op: their undumped twin is torch.compile(backend="aot_eager")
    (same execution, same compile-time memory); eager capture's is plain eager."""
    return "plain-aot-eager" if mode.startswith("graph") else "plain-eager"


def msprobe_section(ms: Dict[str, Any], models, torch_version: str) -> List[str]:
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
             f"in a throwaway venv that uses this project's torch {torch_version} (a `.pth`; pip's dry run "
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
            return U.ratio(row.get("ratio")) + n
        st = r.get("statistics", {})
        te = r.get("tensor", {})
        L.append(f"| {name} | {U.ratio(st.get('ratio'))}{counts(st)} | {od('graph statistic device')} | "
                 f"{od('eager statistic device')} | {U.ratio(te.get('ratio'))}{counts(te)} | {od('graph tensor')} | "
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
        L.append(f"| {row['layers']} | {U.ms(g['base_median'])} | {U.ms(g['median'])} | {U.ratio(g['ratio'])} | "
                 f"{g.get('tensors_per_step', 0):.0f} | {'–' if per is None else f'{per * 1e6:.0f} µs'} | "
                 f"{U.ratio(e['ratio']) if e and 'error' not in e else '–'} |")
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
        L.append(f"| {row['width']} | {U.ms(g['base_median'])} | {U.ms(g['median'])} | {U.ratio(g['ratio'])} | "
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
