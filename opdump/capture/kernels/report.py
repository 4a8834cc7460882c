"""The ``compare_compiled`` report: per iteration folder, per graph, and on the console at the end.

``{iteration folder}/compiled_vs_eager_graph_{g}.json`` (everything, see
:meth:`.compare.Comparison.report`) and ``…_{g}.csv`` (one row per compared
buffer), written whole; when the session closes, one summary on stderr names,
per graph, the first kernel where compiled and eager numerics part (README,
"Kernel-level graph dump").  Nothing here raises into the step: the caller
turns an exception into the graph's one warning.
"""
from __future__ import annotations

import csv
import io
import json
import os
import sys
import weakref
from typing import Any, Dict, List

from .compare import Comparison

_COLUMNS = ["kernel_index", "kernel", "full_name", "slot", "buffer", "reference_node", "status", "max_abs",
            "max_rel", "compiled_error_vs_float64", "eager_error_vs_float64", "fused_operators", "source"]

#: session -> the reports of its dumped calls that named something (for the summary at close)
_found: "weakref.WeakKeyDictionary[Any, List[Dict[str, Any]]]" = weakref.WeakKeyDictionary()


def report_csv(report: Dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_COLUMNS)
    for k in report["kernels"]:
        for o in k["outputs"]:
            metrics = o["metrics"][0] if o["metrics"] else {}
            writer.writerow([k["index"], k["kernel"], k["full_name"], o["slot"], o["buffer"], o["reference_node"],
                             o["status"]] + [metrics.get(c, "") for c in _COLUMNS[7:11]]
                            + [";".join(k["fused_operators"]), ";".join(k["source"])])
    return out.getvalue()


def write_report(session, graph_id: int, kind: str, comparison: Comparison, folder: str, code_path: str) -> None:
    report = comparison.report(graph_id, kind, session.iteration, code_path)
    os.makedirs(folder, exist_ok=True)
    stem = os.path.join(folder, f"compiled_vs_eager_graph_{graph_id}")
    session.layout.write_small(stem + ".json", json.dumps(report, indent=1, default=str).encode())
    session.layout.write_small(stem + ".csv", report_csv(report).encode())
    if session not in _found:
        _found[session] = []
        session.on_close(lambda ref=weakref.ref(session): _summary(ref))
    if report["first_divergence"] is not None or report["first_difference"] is not None:
        _found[session].append(report)


def _line(k: Dict[str, Any]) -> str:
    source = k["source"][-1] if k["source"] else "no source line"
    return f"{k['kernel']} ({k['full_name']}; fuses {', '.join(k['fused_operators']) or '?'}; {source})"


def summary_lines(reports: List[Dict[str, Any]]) -> List[str]:
    """The console summary: the first real divergence per graph, else the first expected difference."""
    lines, seen = [], set()
    for r in reports:
        first = r["first_divergence"]
        if first is not None and r["graph_id"] not in seen:
            seen.add(r["graph_id"])
            lines.append(f"opdump: compare_compiled: iteration {r['iteration']}, {r['kind']} graph {r['graph_id']}: "
                         f"first diverging kernel {_line(first)}")
    if not lines:
        diffs = [r for r in reports if r["first_difference"] is not None]
        if diffs:
            r = diffs[0]
            lines.append(f"opdump: compare_compiled: no divergence beyond tolerance or fusion precision; first "
                         f"difference ({r['first_difference']['status']}) at iteration {r['iteration']}, "
                         f"{r['kind']} graph {r['graph_id']}: {_line(r['first_difference'])}")
        else:
            lines.append("opdump: compare_compiled: every compared kernel output equals the operator reference")
    return lines


def _summary(ref) -> None:
    session = ref()
    if session is None:
        return
    try:
        for line in summary_lines(_found.pop(session, [])):
            print(line, file=sys.stderr)
    except Exception:  # noqa: BLE001 - a summary must not break the close
        pass
