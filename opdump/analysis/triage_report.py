"""Self-contained HTML reports of a dump's NaN/Inf story: for ``opdump triage`` (and usable for
``overflow`` and ``watch``): per-iteration counts of tensors holding NaN/Inf, the statistic
trends (largest magnitude, L2 norm) of every operator output along the execution order, the
origin marked on both, and the facts (origin, source line, runs, commands, files).

Same style as the compare report (:mod:`.report`: its CSS and escaping); inline SVG, no
script, no external asset: the page opens from disk in any browser. Written whole
(temporary file, then rename).
"""
from __future__ import annotations

import datetime as _dt
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .common import array_nonfinite, is_float_row, progress_bar, stats_nonfinite
from .reader.npy import load_checked
from .report import _CSS, _downsample, _e
from .whole_files import write_text

__all__ = ["series_of", "render_trend_html", "write_trend_html", "write_triage_html", "write_overflow_html",
           "write_watch_html"]

_W, _H, _ML, _MR, _MT, _MB = 1000, 260, 64, 16, 28, 36
_MAX_FILES_READ = 20000            # tensor-only dumps: at most this many files read for the counts


def _f(v: Any) -> Optional[float]:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x


def series_of(dump, rank: Optional[int] = None, progress: bool = False) -> Dict[str, Any]:
    """The plotted data of ``dump`` (one rank: ``rank`` or the first): per output tensor of
    every operator in execution order (iteration, then order) its key, largest magnitude,
    L2 norm and whether it holds NaN/Inf; per iteration the count of such tensors."""
    rec = dump.records()
    out: Dict[str, Any] = {"points": [], "per_iteration": {}, "rank": rank}
    if rec.empty:
        return out
    if rank is None:
        rank = int(rec["rank"].min())
    out["rank"] = rank
    rec = rec[(rec["rank"] == rank) & (rec["kind"] == "op") & (rec["io"] == "output") & rec["iteration"].notna()]
    rec = rec[[is_float_row(d, p) for d, p in zip(rec["dtype"], rec["path"])]]
    rows = sorted(rec.to_dict("records"), key=lambda r: (int(r["iteration"]), int(r["order"])))
    bar = progress_bar(progress, len(rows), "report", "tensor")
    read = 0
    for r in rows:
        if bar is not None:
            bar.update(1)
        it = int(r["iteration"])
        bad = stats_nonfinite(r) if r.get("stat_row") is True else None
        mag = l2 = None
        if r.get("stat_row") is True:
            mx, mn = _f(r.get("max")), _f(r.get("min"))
            vals = [abs(v) for v in (mx, mn) if v is not None and not math.isnan(v)]
            mag = max(vals) if vals else None
            l2 = _f(r.get("l2norm"))
        if bad is None and isinstance(r.get("path"), str) and read < _MAX_FILES_READ:
            read += 1
            try:
                c = array_nonfinite(load_checked(r["path"]))   # header checked against the file size first
                bad = None if c is None else (c["nan"] + c["pos_inf"] + c["neg_inf"]) > 0
            except (OSError, ValueError):
                bad = None
        out["points"].append({"iteration": it, "op": r["op"], "call": r.get("call"), "slot": int(r["slot"]),
                              "mag": mag, "l2": l2, "bad": bool(bad)})
        cnt = out["per_iteration"].setdefault(it, [0, 0])
        cnt[0] += 1
        cnt[1] += int(bool(bad))
    if bar is not None:
        bar.close()
    return out


def _axes(title: str, plot_id: str) -> List[str]:
    pw, ph = _W - _ML - _MR, _H - _MT - _MB
    return [f'<svg class="plot" id="{_e(plot_id)}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" '
            f'width="{_W}" height="{_H}" role="img" aria-label="{_e(title)}">',
            f'<text x="{_ML}" y="16" style="font-size:13px;font-weight:600">{_e(title)}</text>',
            f'<rect class="plot-area" x="{_ML}" y="{_MT}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>']


def _origin_line(x: float, label: str, prefix: str = "origin") -> str:
    ph = _H - _MT - _MB
    anchor, dx = ("start", 4) if x < _ML + (_W - _ML - _MR) * 0.6 else ("end", -4)
    return (f'<line class="origin" x1="{x:.1f}" y1="{_MT}" x2="{x:.1f}" y2="{_MT + ph}" stroke="#c62828" '
            f'stroke-width="2" stroke-dasharray="5,3"/><text class="origin-label" x="{x + dx:.1f}" y="{_MT + 12}" '
            f'text-anchor="{anchor}" style="fill:#c62828">{_e(prefix)}: {_e(label)}</text>')


def _bars(per_it: Dict[int, List[int]], origin_it: Optional[int], label: str, prefix: str = "origin") -> str:
    """Per iteration: output tensors holding NaN/Inf (red) over all output tensors (grey)."""
    its = sorted(per_it)
    pw, ph = _W - _ML - _MR, _H - _MT - _MB
    out = _axes("Output tensors holding NaN/Inf per iteration (of all output tensors)", "plot-nonfinite")
    top = max([per_it[i][0] for i in its] + [1])
    n = max(1, len(its))
    bw = pw / n
    for k in range(5):
        v = top * k / 4
        y = _MT + ph - v * ph / top
        out.append(f'<line x1="{_ML}" y1="{y:.1f}" x2="{_ML + pw}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{_ML - 6}" y="{y + 4:.1f}" text-anchor="end">{v:.0f}</text>')
    step = max(1, int(math.ceil(n / 20)))
    origin_x = None
    for j, it in enumerate(its):
        total, bad = per_it[it]
        x = _ML + j * bw
        hb, ht = bad * ph / top, total * ph / top
        w = max(1.0, bw * 0.8)
        out.append(f'<rect class="bar-total" x="{x + bw * 0.1:.1f}" y="{_MT + ph - ht:.1f}" width="{w:.1f}" '
                   f'height="{ht:.1f}" fill="#cfd8dc"><title>iteration {it}: {total} output tensors</title></rect>')
        if bad:
            out.append(f'<rect class="bar-nonfinite" x="{x + bw * 0.1:.1f}" y="{_MT + ph - hb:.1f}" width="{w:.1f}" '
                       f'height="{hb:.1f}" fill="#c62828"><title>iteration {it}: {bad} hold NaN/Inf</title></rect>')
        if j % step == 0:
            out.append(f'<text x="{x + bw / 2:.1f}" y="{_H - 14}" text-anchor="middle">{it}</text>')
        if origin_it is not None and it == origin_it:
            origin_x = x + bw / 2
    if origin_x is not None:                  # drawn last: over the bars, its label unclipped
        out.append(_origin_line(origin_x, label, prefix))
    out.append(f'<text x="{_ML + pw / 2:.1f}" y="{_H - 2}" text-anchor="middle">iteration</text></svg>')
    return "".join(out)


def _trend(points: List[Dict[str, Any]], key: str, title: str, plot_id: str, origin_x: Optional[int],
           label: str, prefix: str = "origin", marks: Sequence[int] = ()) -> str:
    """One statistic per output tensor along the execution order (log scale), NaN/Inf tensors
    as red marks at the top, iteration boundaries as grey lines."""
    pw, ph = _W - _ML - _MR, _H - _MT - _MB
    xs = list(range(len(points)))
    ys = []
    for p in points:
        v = p.get(key)
        ys.append(math.log10(v) if v is not None and v > 0 and not math.isinf(v) and not math.isnan(v)
                  else float("nan"))
    finite = [y for y in ys if not math.isnan(y)]
    y0, y1 = (math.floor(min(finite)), math.ceil(max(finite))) if finite else (0.0, 1.0)
    if y1 - y0 < 1:
        y0, y1 = y0 - 1, y1 + 1
    x1 = max(1, len(points) - 1)

    def sx(x):
        return _ML + x * pw / x1

    def sy(v):
        return _MT + ph - (min(max(v, y0), y1) - y0) * ph / (y1 - y0)

    out = _axes(title, plot_id)
    stepy = max(1, int(math.ceil((y1 - y0) / 6)))
    for v in range(int(y0), int(y1) + 1, stepy):
        out.append(f'<line x1="{_ML}" y1="{sy(v):.1f}" x2="{_ML + pw}" y2="{sy(v):.1f}" stroke="#eee"/>'
                   f'<text x="{_ML - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">1e{v}</text>')
    starts: List[Tuple[int, int]] = []        # (x, iteration) where each iteration starts
    for x, p in enumerate(points):
        if not starts or starts[-1][1] != p["iteration"]:
            starts.append((x, p["iteration"]))
    every = max(1, int(math.ceil(len(starts) / 16)))          # at most ~16 labels, lines up to 100 iterations
    for k, (x, it) in enumerate(starts):
        if k and len(starts) <= 100:
            out.append(f'<line class="iteration-start" x1="{sx(x):.1f}" y1="{_MT}" x2="{sx(x):.1f}" '
                       f'y2="{_MT + ph}" stroke="#90a4ae" stroke-dasharray="2,3"/>')
        if k % every == 0:
            out.append(f'<text x="{sx(x) + 2:.1f}" y="{_H - 14}">it {_e(it)}</text>')
    segments: List[List[int]] = []          # runs of tensors with a value: no line across a NaN gap
    for x, y in zip(xs, ys):
        if math.isnan(y):
            continue
        if segments and segments[-1][-1] == x - 1:
            segments[-1].append(x)
        else:
            segments.append([x])
    for seg in segments:
        pts = _downsample(seg, [ys[x] for x in seg], max(1, int(pw * len(seg) / max(1, len(xs)))), "max")
        if len(pts) == 1:
            out.append(f'<circle class="pt" cx="{sx(pts[0][0]):.1f}" cy="{sy(pts[0][1]):.1f}" r="1.8" '
                       'fill="#1565c0"/>')
            continue
        poly = " ".join(f"{sx(x):.1f},{sy(v):.1f}" for x, v in pts)
        out.append(f'<polyline class="series" fill="none" stroke="#1565c0" stroke-width="1.2" points="{poly}"/>')
    bad = [x for x, p in enumerate(points) if p["bad"]][:4000]
    for x in bad:
        out.append(f'<circle class="pt pt-nonfinite" cx="{sx(x):.1f}" cy="{_MT + 3}" r="2.6" fill="#c62828"/>')
    for x in list(marks)[:4000]:
        out.append(f'<circle class="pt pt-mark" cx="{sx(x):.1f}" cy="{_MT + ph - 3}" r="2.6" fill="#ef6c00"/>')
    if origin_x is not None:
        out.append(_origin_line(sx(origin_x), label, prefix))
    legend = "red marks: NaN/Inf" + ("; orange marks: hits" if marks else "")
    out.append(f'<text x="{_ML + pw / 2:.1f}" y="{_H - 2}" text-anchor="middle">output tensor (execution order; '
               f'{legend})</text></svg>')
    return "".join(out)


def render_trend_html(dump, title: str, boxes: Sequence[str] = (), origin: Optional[Tuple[Any, Any]] = None,
                      rank: Optional[int] = None, progress: bool = False, prefix: str = "origin",
                      marks: Sequence[Tuple[Any, Any]] = ()) -> str:
    """The page: ``boxes`` (HTML fragments, already escaped) then the plots. ``origin``:
    (iteration, operator full name) marked on the plots with ``prefix``; ``marks``: more
    (iteration, operator) tensors marked (watch hits)."""
    data = series_of(dump, rank=rank, progress=progress)
    pts = data["points"]
    origin_x = None
    label = ""
    wanted = {(it, op) for it, op in marks}
    mark_x = [x for x, p in enumerate(pts) if (p["iteration"], p["op"]) in wanted]
    if origin is not None:
        label = str(origin[1])
        for x, p in enumerate(pts):
            if p["iteration"] == origin[0] and p["op"] == origin[1]:
                origin_x = x
                break
    h = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
         f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{_e(title)}</h1>",
         f"<div class='meta'>dump: <code>{_e(dump.path)}</code>, rank {_e(data['rank'])}<br>generated "
         f"{_e(_dt.datetime.now().isoformat(timespec='seconds'))}</div>"]
    h.extend(boxes)
    h.append("<h2>NaN/Inf per iteration</h2>")
    if data["per_iteration"]:
        h.append(_bars(data["per_iteration"], origin[0] if origin else None, label, prefix))
    else:
        h.append("<p>No floating operator outputs in this dump.</p>")
    h.append("<h2>Statistics along the execution order</h2>")
    if any(p["mag"] is not None for p in pts):
        h.append(_trend(pts, "mag", "Largest magnitude max(|max|, |min|) per output tensor (log scale)",
                        "plot-magnitude", origin_x, label, prefix, mark_x))
    if any(p["l2"] is not None for p in pts):
        h.append(_trend(pts, "l2", "L2 norm per output tensor (log scale)", "plot-l2norm", origin_x, label, prefix,
                        mark_x))
    if not any(p["mag"] is not None or p["l2"] is not None for p in pts):
        h.append("<p>No statistics in this dump (saved_data \"tensor\"): trends need statistic.csv.</p>")
    h.append("</body></html>")
    return "\n".join(h)


def write_trend_html(dump, path: Union[str, os.PathLike], title: str, boxes: Sequence[str] = (),
                     origin: Optional[Tuple[Any, Any]] = None, rank: Optional[int] = None, prefix: str = "origin",
                     marks: Sequence[Tuple[Any, Any]] = (), progress: bool = False) -> str:
    """Write :func:`render_trend_html` to ``path``."""
    return write_text(path, render_trend_html(dump, title, boxes, origin, rank, progress=progress, prefix=prefix,
                                              marks=marks))


def _triage_boxes(result) -> List[str]:
    s, o, rep = result.suspects, result.suspects.origin, result.reproduction
    boxes = []
    if o is None:
        boxes.append(f"<div class='box ok' id='origin-box'>Nothing found ({_e(result.mode)}).</div>")
    elif rep is None or not rep.reproduced:
        boxes.append("<div class='box first' id='not-reproduced'><b>Not reported:</b> "
                     + "<br>".join(_e(x) for x in (rep.describe() if rep else "run 2 did not run").splitlines())
                     + f"<br>run 1 pointed at <code>{_e(o.op)}</code> (iteration {_e(o.iteration)}). The script "
                       "does not compute the same values twice: fix its seeds and set "
                       "<code>torch.use_deterministic_algorithms(True)</code>.</div>")
    else:
        boxes.append("<div class='box first' id='origin-box'><b>Origin:</b> "
                     f"<code>{_e(o.op)}</code> ({_e(o.kind)})<br>type {_e(o.op_type)}, iteration {_e(o.iteration)}, "
                     f"rank {_e(o.rank)}"
                     + (f"<br>source: <code>{_e(o.source)}</code> {_e(o.code)}" if o.source else "")
                     + (f"<br>{_e(o.detail)}" if o.detail else "") + f"<br>{_e(rep.describe())}</div>")
    runs = [r for r in (result.run1, result.run2) if r is not None]
    boxes.append("<div class='box' id='runs'><b>Runs</b> (reproduce each with its command)<ul>" + "".join(
        f"<li>{_e(r.name)}: dump <code>{_e(r.dump)}</code>, exit {_e(r.returncode)}, log <code>{_e(r.log)}</code>"
        f"<br><code>{_e(r.shell_command)}</code></li>" for r in runs) + "</ul></div>")
    if s.kernels:
        files = result.files if rep is not None and rep.reproduced else {}     # not reproduced: no files offered
        boxes.append("<div class='box' id='suspects'><b>Suspects</b> (run 2 dumps their tensors at iteration(s) "
                     f"{_e('|'.join(map(str, s.iterations)))})<ul>" + "".join(
                         f"<li><code>{_e(k)}</code>" + "".join(f"<br>&nbsp;&nbsp;<code>{_e(p)}</code>"
                                                               for p in files.get(k, [])) + "</li>"
                         for k in s.kernels) + "</ul></div>")
    if s.notes:
        boxes.append("<details class='box' id='notes'><summary>Analysis notes</summary><pre>"
                     + _e("\n".join(s.notes[:50])) + "</pre></details>")
    return boxes


def write_triage_html(result, dump1, path: Union[str, os.PathLike], progress: bool = False) -> str:
    """The triage report: origin, runs and their commands, suspects and their files, then
    run 1's per-iteration NaN/Inf counts and statistic trends with the origin marked."""
    o = result.suspects.origin
    origin = (o.iteration, o.op) if o is not None else None
    return write_trend_html(dump1, path, "opdump triage", _triage_boxes(result), origin,
                            rank=o.rank if o is not None else None, progress=progress)


def write_overflow_html(dump, report, path: Union[str, os.PathLike]) -> str:
    """``opdump overflow --html``: the origin of a
    :class:`~opdump.analysis.overflow.OverflowReport` and the next affected operators, then the
    plots with the origin marked."""
    o = report.origin
    if o is None:
        boxes = [f"<div class='box ok' id='origin-box'>No NaN/Inf found ({report.scanned_tensors} floating "
                 f"tensors scanned{' from ' + _e(report.method) if report.method else ''}).</div>"]
    else:
        boxes = ["<div class='box first' id='origin-box'><b>Origin:</b> "
                 f"<code>{_e(o.op)}</code> ({_e(o.kind)})<br>type {_e(o.op_type)}, iteration {_e(o.iteration)}, "
                 f"rank {_e(o.rank)}, graph {_e(o.graph)}"
                 + (f"<br>source: <code>{_e(o.source)}</code> {_e(o.code)}" if o.source else "")
                 + "".join(f"<br>{_e(t.describe())}" + (f" <code>{_e(t.path)}</code>" if t.path else "")
                           for t in o.tensors) + "</div>"]
        if report.affected:
            boxes.append("<div class='box' id='affected'><b>Next affected operators</b><ul>" + "".join(
                f"<li><code>{_e(e.op)}</code> (iteration {_e(e.iteration)}"
                + (f", <code>{_e(e.source)}</code>" if e.source else "") + ")</li>" for e in report.affected)
                + "</ul></div>")
        more = getattr(report, "more_origins", [])
        if more:
            boxes.append("<div class='box' id='more-origins'><b>Also overflowed on their own (finite inputs)</b><ul>"
                         + "".join(f"<li><code>{_e(e.op)}</code> (iteration {_e(e.iteration)}"
                                   + (f", <code>{_e(e.source)}</code>" if e.source else "") + ")</li>" for e in more)
                         + "</ul></div>")
    return write_trend_html(dump, path, "opdump overflow", boxes, (o.iteration, o.op) if o else None,
                            rank=o.rank if o else None)


def write_watch_html(dump, hits, conditions: Sequence[Any], path: Union[str, os.PathLike],
                     max_rows: int = 2000) -> str:
    """``opdump watch --html``: the conditions and the hits (a table), then the plots with the
    first hit marked and every hit's tensor marked along the execution order."""
    conds = ", ".join(f"<code>{_e(c)}</code>" for c in conditions)
    if not hits:
        boxes = [f"<div class='box ok' id='hits-box'>No hit: {conds}</div>"]
        return write_trend_html(dump, path, "opdump watch", boxes)
    f = hits[0]
    info = dump.op_info(f.op, rank=f.rank, graph=f.graph)
    boxes = [f"<div class='box first' id='hits-box'><b>{len(hits)} hit(s)</b> of {conds}<br>first: "
             f"<code>{_e(f.op)}</code> {_e(f.io)}.{_e(f.slot)}, iteration {_e(f.iteration)}, rank {_e(f.rank)}: "
             f"{_e(f.detail)}" + (f"<br>source: <code>{_e(info.source)}</code> {_e(info.code)}"
                                   if info is not None and info.source else "") + "</div>"]
    rows = "".join(f"<tr><td>{_e(h.condition)}</td><td>{_e(h.iteration)}</td><td>{_e(h.op)}</td><td>{_e(h.io)}."
                   f"{_e(h.slot)}</td><td>{_e(h.rank)}</td><td>{_e(h.detail)}</td></tr>" for h in hits[:max_rows])
    more = f"<p>Showing {max_rows} of {len(hits)} hits.</p>" if len(hits) > max_rows else ""
    boxes.append("<h2>Hits</h2>" + more + "<table id='hits-table'><thead><tr><th>condition</th><th>iter</th>"
                 "<th>operator</th><th>tensor</th><th>rank</th><th>detail</th></tr></thead><tbody>" + rows
                 + "</tbody></table>")
    marks = [(h.iteration, h.op) for h in hits if h.rank == f.rank]
    return write_trend_html(dump, path, "opdump watch", boxes, (f.iteration, f.op), rank=f.rank,
                            prefix="first hit", marks=marks)
