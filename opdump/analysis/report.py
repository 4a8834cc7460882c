"""Self-contained HTML report of a comparison: inline SVG plots (per-tensor cosine
similarity and max absolute error along the execution order, the first divergence
marked), the summary and the table. No server, no CDN, no external file: it opens
from disk in any browser.  A few lines of inline JavaScript only filter the table
(the page is complete without them)."""
from __future__ import annotations

import datetime as _dt
import html
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .whole_files import write_text

__all__ = ["write_html_report", "render_html_report"]

_COLORS = {"pass": "#2e7d32", "warning": "#f9a825", "diverged": "#c62828", "nondeterministic": "#6a1b9a",
           "skipped": "#9e9e9e", "unmatched": "#546e7a", "unreadable": "#000000"}

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222}
h1{font-size:20px;margin:0 0 8px} h2{font-size:16px;margin:24px 0 8px}
.meta{color:#555;font-size:13px} .box{border:1px solid #ddd;border-radius:6px;padding:10px 14px;margin:8px 0}
.first{border-color:#c62828;background:#fff5f5} .ok{border-color:#2e7d32;background:#f4fbf4}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
table{border-collapse:collapse;font-size:12px;width:100%} th,td{border:1px solid #e0e0e0;padding:3px 6px;text-align:left}
th{background:#fafafa;position:sticky;top:0} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.verdict-diverged td{background:#ffebee} tr.verdict-warning td{background:#fffde7}
tr.verdict-nondeterministic td{background:#f3e5f5} tr.verdict-unmatched td{background:#eceff1}
tr#first-divergence td{outline:2px solid #c62828}
.badge{display:inline-block;padding:1px 6px;border-radius:8px;color:#fff;font-size:11px}
svg.plot{background:#fff;border:1px solid #ddd;border-radius:6px;max-width:100%;height:auto}
svg text{font-size:11px;fill:#333} .legend span{margin-right:12px;font-size:12px}
"""

_JS = """
(function(){var cb=document.getElementById('only-problems');if(!cb)return;
cb.addEventListener('change',function(){var rows=document.querySelectorAll('#compare-table tbody tr');
for(var i=0;i<rows.length;i++){var c=rows[i].className;rows[i].style.display=(cb.checked&&c.indexOf('verdict-pass')>=0)?'none':'';}});})();
"""


def _missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        return bool(v != v) or type(v).__name__ == "NAType"
    except (TypeError, ValueError):
        return type(v).__name__ == "NAType"


def _e(v: Any) -> str:
    return html.escape("" if _missing(v) else str(v), quote=True)


def _num(v: Any, fmt: str = "{:.6g}") -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return ""
    if math.isnan(x):
        return ""
    return fmt.format(x)


def _downsample(xs: Sequence[int], ys: Sequence[float], width: int, keep: str) -> List[Tuple[int, float]]:
    """At most ~2 points per pixel column, keeping the extreme (min for cosine, max for error)."""
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None and not math.isnan(y)]
    if len(pts) <= 2 * width:
        return pts
    lo, hi = pts[0][0], pts[-1][0]
    span = max(1, hi - lo)
    buckets: Dict[int, Tuple[int, float]] = {}
    for x, y in pts:
        b = int((x - lo) * width / span)
        cur = buckets.get(b)
        if cur is None or (keep == "min" and y < cur[1]) or (keep == "max" and y > cur[1]):
            buckets[b] = (x, y)
    return [buckets[k] for k in sorted(buckets)]


def _svg_plot(plot_id: str, title: str, xs: List[int], ys: List[float], verdicts: List[str], n_total: int,
              first_x: Optional[int], first_label: str, log: bool, keep: str,
              y_fixed: Optional[Tuple[float, float]] = None) -> str:
    W, H, ml, mr, mt, mb = 1000, 260, 64, 16, 28, 36
    pw, ph = W - ml - mr, H - mt - mb
    vals = []
    zero_floor = None
    if log:
        pos = [float(y) for y in ys if y is not None and not math.isnan(y) and 0 < y < math.inf]
        zero_floor = math.floor(math.log10(min(pos))) - 1 if pos else -1.0
    for y in ys:
        if y is None or (isinstance(y, float) and math.isnan(y)):
            vals.append(None)
        elif log:
            vals.append(math.log10(float(y)) if y > 0 else zero_floor)
        else:
            vals.append(float(y))
    finite = [v for v in vals if v is not None and not math.isinf(v)]
    if y_fixed:
        y0, y1 = y_fixed
    elif finite:
        y0, y1 = min(finite), max(finite)
        if log:
            y0, y1 = math.floor(y0), math.ceil(y1)
    else:
        y0, y1 = 0.0, 1.0
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
    x0, x1 = 0, max(1, n_total - 1)

    def sx(x):
        return ml + (x - x0) * pw / (x1 - x0)

    def sy(v):
        v = min(max(v, y0), y1)
        return mt + ph - (v - y0) * ph / (y1 - y0)

    out = [f'<svg class="plot" id="{_e(plot_id)}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" '
           f'width="{W}" height="{H}" role="img" aria-label="{_e(title)}">',
           f'<text x="{ml}" y="16" style="font-size:13px;font-weight:600">{_e(title)}</text>',
           f'<rect class="plot-area" x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>']
    # y ticks
    if log:
        step = max(1, int(math.ceil((y1 - y0) / 6)))
        ticks = [float(v) for v in range(int(y0), int(y1) + 1, step)]
    else:
        ticks = [y0 + (y1 - y0) * k / 4 for k in range(5)]
    for v in ticks:
        yy = sy(v)
        if log:
            lab = "0" if zero_floor is not None and v == zero_floor else f"1e{int(v)}"
        else:
            lab = f"{v:.4g}"
        out.append(f'<line x1="{ml}" y1="{yy:.1f}" x2="{ml + pw}" y2="{yy:.1f}" stroke="#eee"/>'
                   f'<text x="{ml - 6}" y="{yy + 4:.1f}" text-anchor="end">{_e(lab)}</text>')
    # x ticks
    for k in range(6):
        x = int(round(x0 + (x1 - x0) * k / 5))
        out.append(f'<text x="{sx(x):.1f}" y="{H - 14}" text-anchor="middle">{x}</text>')
    out.append(f'<text x="{ml + pw / 2:.1f}" y="{H - 2}" text-anchor="middle">tensor (execution order)</text>')
    pts = _downsample(xs, [v if v is not None else float("nan") for v in vals], pw, keep)
    pts = [(x, v) for x, v in pts if not math.isinf(v)]
    if pts:
        poly = " ".join(f"{sx(x):.1f},{sy(v):.1f}" for x, v in pts)
        out.append(f'<polyline class="series" fill="none" stroke="#1565c0" stroke-width="1.2" points="{poly}"/>')
    # problem points, always drawn (capped)
    bad = [(x, v, vd) for x, v, vd in zip(xs, vals, verdicts) if vd in ("diverged", "warning", "nondeterministic")]
    if len(bad) > 4000:
        bad = bad[:4000]
    for x, v, vd in bad:
        if v is None:
            continue
        v = y1 if math.isinf(v) and v > 0 else (y0 if math.isinf(v) else v)
        out.append(f'<circle class="pt pt-{_e(vd)}" cx="{sx(x):.1f}" cy="{sy(v):.1f}" r="2.6" '
                   f'fill="{_COLORS.get(vd, "#000")}"/>')
    if first_x is not None:
        fx = sx(first_x)
        out.append(f'<line class="first-divergence" x1="{fx:.1f}" y1="{mt}" x2="{fx:.1f}" y2="{mt + ph}" '
                   f'stroke="#c62828" stroke-width="2" stroke-dasharray="5,3"/>')
        anchor = "start" if fx < ml + pw * 0.6 else "end"
        dx = 4 if anchor == "start" else -4
        out.append(f'<text class="first-divergence-label" x="{fx + dx:.1f}" y="{mt + 12}" text-anchor="{anchor}" '
                   f'style="fill:#c62828">first divergence: {_e(first_label)}</text>')
    out.append("</svg>")
    return "".join(out)


def render_html_report(result, max_rows: int = 20000, title: Optional[str] = None) -> str:
    """The report as an HTML string (see :func:`write_html_report`)."""
    t = result.table
    fd = result.first_divergence
    rows = t.to_dict("records")
    # plot series: compared tensor rows, in table order
    xs, cos, err, vds = [], [], [], []
    first_x = None
    first_row_order = None
    if fd is not None:
        for r in rows:
            if r["op"] == fd["op"] and not _missing(r["iteration"]) and r["iteration"] == fd["iteration"] \
                    and r["io"] == fd["io"] and int(r["slot"]) == int(fd["slot"]) and r["verdict"] == "diverged":
                first_row_order = r["order"]
                break
    plot_rows = [r for r in rows if r["op"] is not None and r["verdict"] not in ("unmatched", "skipped")]
    for i, r in enumerate(plot_rows):
        xs.append(i)
        c = r.get("cosine")
        e = r.get("max_abs_err")
        if (c is None or (isinstance(c, float) and math.isnan(c))) and r.get("stat_max_rel_diff") is not None:
            c = None
        cos.append(float(c) if c is not None else float("nan"))
        err.append(float(e) if e is not None else float("nan"))
        vds.append(r["verdict"])
        if first_row_order is not None and r["order"] == first_row_order:
            first_x = i
    n = len(plot_rows)
    label = fd["op"] if fd else ""
    cos_vals = [c for c in cos if not math.isnan(c)]
    cmin = min(cos_vals) if cos_vals else 0.0
    y_fixed = (min(0.9, math.floor(cmin * 100) / 100) if cos_vals else 0.0, 1.0)
    plots = []
    if n:
        plots.append(_svg_plot("plot-cosine", "Cosine similarity per tensor", xs, cos, vds, n, first_x, label,
                               False, "min", y_fixed))
        plots.append(_svg_plot("plot-error", "Max absolute error per tensor (log scale)", xs, err, vds, n, first_x,
                               label, True, "max"))
        if all(math.isnan(c) for c in cos) and "stat_max_rel_diff" in t.columns:
            sd = [float(r["stat_max_rel_diff"]) if r.get("stat_max_rel_diff") is not None else float("nan")
                  for r in plot_rows]
            plots.append(_svg_plot("plot-stats", "Statistics: largest relative difference (log scale)", xs, sd, vds,
                                   n, first_x, label, True, "max"))
    counts = result.counts
    title = title or "opdump compare"
    h: List[str] = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
                    f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
                    f"<h1>{_e(title)}</h1>",
                    f"<div class='meta'>A (compared): <code>{_e(result.a)}</code><br>B (reference): "
                    f"<code>{_e(result.b)}</code><br>generated {_e(_dt.datetime.now().isoformat(timespec='seconds'))}"
                    f"</div>"]
    h.append("<div class='legend' id='summary'>" + " ".join(
        f"<span><span class='badge' style='background:{_COLORS.get(k, '#000')}'>{_e(k)}</span> {v}</span>"
        for k, v in sorted(counts.items())) + "</div>")
    rule = getattr(result, "rule", "")
    h.append(f"<div class='box' id='matching'>{_e(result.matching_line())}<br>rule: <b>{_e(rule)}</b> "
             f"{_e(getattr(result, 'rule_note', ''))}</div>" if hasattr(result, "matching_line") else "")
    fdf = getattr(result, "first_difference", None)
    if rule == "first difference":
        if fdf:
            h.append("<div class='box first' id='first-difference-box'><b>First difference:</b> "
                     f"<code>{_e(fdf['op'])}</code><br>iteration {_e(fdf['iteration'])}, rank {_e(fdf['rank'])}"
                     + (f"<br>matched in B: <code>{_e(fdf['op_b'])}</code>"
                        if fdf.get("op_b") and fdf["op_b"] != fdf["op"] else "")
                     + (f"<br>source: <code>{_e(fdf['source'])}</code> {_e(fdf.get('code') or '')}"
                        if fdf.get("source") else "")
                     + f"<br>{_e(fdf['reason'])}<br>cause: {_e(fdf['cause'])}</div>")
        else:
            h.append("<div class='box ok' id='first-difference-box'>No difference: every compared tensor is "
                     "identical within the same-dtype tolerance.</div>")
    for w in getattr(result, "warnings", []) or []:
        h.append(f"<div class='box first'><b>Warning:</b> {_e(w)}</div>")
    unreadable = getattr(result, "unreadable", []) or []
    if unreadable:
        h.append(f"<details class='box first' id='unreadable' open><summary>Unreadable files: {len(unreadable)} "
                 "(not compared)</summary><ul>" + "".join(f"<li><code>{_e(p)}</code>: {_e(r)}</li>"
                                                          for p, r in unreadable[:2000]) + "</ul></details>")
    if fd:
        h.append("<div class='box first' id='first-divergence-box'><b>First diverging operator:</b> "
                 f"<code>{_e(fd['op'])}</code><br>iteration {_e(fd['iteration'])}, tensor {_e(fd['io'])}.{_e(fd['slot'])}, "
                 f"rank {_e(fd['rank'])}"
                 + (f"<br>matched in B: <code>{_e(fd['op_b'])}</code>" if fd.get("op_b") and fd["op_b"] != fd["op"] else "")
                 + (f"<br>source: <code>{_e(fd['source'])}</code> {_e(fd.get('code') or '')}" if fd.get("source") else "")
                 + f"<br>{_e(fd['reason'])}<br>cause: {_e(fd['cause'])}</div>")
    else:
        h.append("<div class='box ok' id='first-divergence-box'>No diverging operator.</div>")
    if result.diverged_parameters:
        h.append("<div class='box'><b>Diverged parameters:</b> " + ", ".join(
            f"<code>{_e(p)}</code>" for p in result.diverged_parameters) + "</div>")
    if result.nondeterministic_before:
        h.append("<div class='box'><b>Random operators that differ before the first divergence:</b> " + ", ".join(
            f"<code>{_e(p)}</code>" for p in result.nondeterministic_before) + "</div>")
    if result.unmatched_a or result.unmatched_b:
        h.append(f"<details class='box' id='unmatched'><summary>Unmatched operators: {len(result.unmatched_a)} only in A, "
                 f"{len(result.unmatched_b)} only in B</summary><ul>"
                 + "".join(f"<li>A: <code>{_e(x)}</code></li>" for x in result.unmatched_a[:2000])
                 + "".join(f"<li>B: <code>{_e(x)}</code></li>" for x in result.unmatched_b[:2000]) + "</ul></details>")
    h.append("<h2>Along the execution order</h2>")
    h.extend(plots if plots else ["<p>No compared tensors.</p>"])
    th = result.thresholds
    h.append("<details class='box'><summary>Verdict thresholds</summary><p>diverged: NaN/Inf at different places; "
             f"cosine &lt; {th.cos_fail}; cosine &lt; {th.cos_strict} and max abs error &gt; {th.abs_with_cos}; "
             f"max abs error &gt; {th.abs_fail} and &gt; {th.abs_fail_scale}·max|B|; never when max abs error ≤ {th.atol}. "
             f"warning: cosine &lt; {th.cos_warn} or max abs error &gt; {th.abs_warn}. Statistics: relative difference "
             f"&gt; {th.stat_fail} diverged, &gt; {th.stat_warn} warning.</p></details>")
    # table
    shown = rows
    note = ""
    if len(rows) > max_rows:
        problems = [r for r in rows if r["verdict"] != "pass"]
        rest = [r for r in rows if r["verdict"] == "pass"][: max(0, max_rows - len(problems))]
        keep = {id(r) for r in problems[:max_rows]} | {id(r) for r in rest}
        shown = [r for r in rows if id(r) in keep]
        note = (f"<p>Showing {len(shown)} of {len(rows)} rows (every non-pass row first); the CSV has them all.</p>")
    h.append("<h2>Tensors</h2>" + note +
             "<label><input type='checkbox' id='only-problems'> only rows that are not <i>pass</i></label>")
    cols = [("order", "#"), ("iteration", "iter"), ("op", "operator (A)"), ("op_b", "operator (B)"), ("io", "io"),
            ("slot", "slot"), ("match", "match"), ("mode", "mode"), ("verdict", "verdict"), ("cosine", "cosine"),
            ("max_abs_err", "max abs err"), ("max_rel_err", "max rel err"), ("rmse", "RMSE"),
            ("within_1e-3", "rel err<0.001"), ("within_5e-3", "rel err<0.005"), ("stat_max_rel_diff", "stat diff"),
            ("dtype_a", "dtype A"), ("dtype_b", "dtype B"), ("reason", "reason"), ("source", "source")]
    h.append("<table id='compare-table'><thead><tr>" + "".join(f"<th>{_e(c[1])}</th>" for c in cols)
             + "</tr></thead><tbody>")
    numeric = {"cosine", "max_abs_err", "max_rel_err", "rmse", "within_1e-3", "within_5e-3", "stat_max_rel_diff"}
    for r in shown:
        rid = " id='first-divergence'" if first_row_order is not None and r["order"] == first_row_order else ""
        cells = []
        for k, _ in cols:
            v = r.get(k)
            if k in numeric:
                cells.append(f"<td class='num'>{_num(v)}</td>")
            elif k == "op_b" and v == r.get("op"):
                cells.append("<td>=</td>")
            else:
                cells.append(f"<td>{_e(v)}</td>")
        h.append(f"<tr class='verdict-{_e(r['verdict'])}'{rid}>" + "".join(cells) + "</tr>")
    h.append("</tbody></table>")
    h.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(h)


def write_html_report(result, path: Union[str, os.PathLike], max_rows: int = 20000, title: Optional[str] = None) -> str:
    """Write the HTML report of a :class:`~opdump.analysis.compare.CompareResult` to ``path``."""
    text = render_html_report(result, max_rows=max_rows, title=title)
    return write_text(path, text)
