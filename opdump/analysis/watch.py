"""Watchpoints over a dump, in the style of an offline debugger (README, Analysis: watch).

Conditions (``name:param=value,param=value``; a condition hits when *any* of its
given parameters is satisfied):

=====================  =============================================================  ==================
condition              parameters                                                     default
=====================  =============================================================  ==================
``nan``                --                                                             
``inf``                --                                                             
``overflow``           -- (NaN or Inf)                                                
``too_large``          ``abs_mean_gt``, ``max_gt``, ``min_gt``, ``mean_gt``          ``abs_mean_gt=1e4``
``too_small``          ``abs_mean_lt``, ``max_lt``, ``min_lt``, ``mean_lt``          ``abs_mean_lt=1e-8``
``all_zero``           ``zero_percentage_ge`` (percent of elements == 0)              ``100``
``range``              ``range_start``, ``range_end``, and ``range_percentage_lt``     ``range_percentage_lt=100``
                       / ``range_percentage_gt`` (percent of elements in the range)
``not_changed``        ``rtol``, ``atol`` (allclose to the previous dumped iteration)  ``rtol=1e-5,atol=0``
``change_too_large``   ``abs_update_ratio_mean_gt``: mean|cur-prev| / (mean|prev|+eps)  ``0.1``
``change_too_small``   ``abs_update_ratio_mean_lt``                                   ``1e-4``
=====================  =============================================================  ==================

max/min/mean/abs_mean are over the finite elements.  Values come from
``statistic.csv`` when it has them (max, min, avg, counts), else from the tensor data
(memory-mapped, chunked).  The change conditions compare a tensor with the same
tensor in the previous dumped iteration; they watch parameters (weights,
optimizer state) by default, every other condition watches every tensor
(``target`` changes that: ``params``, ``ops``, ``all``; graph inputs, the
``Parameter.inputsN`` files, are left out of the default).  Undefined values
(``empty*`` outputs, destinations of ``fill_``/``copy_``/…, see :mod:`.common`) are never
watched.

**Bad input.**  :func:`watch` returns a :class:`WatchResult` (a list of hits) that also
lists, in ``unreadable``, each tensor file that could not be read (truncated, garbage, a
header describing more bytes than the file holds: checked before anything is allocated)
and each statistics row with malformed cells, as ``(path, reason)``; the rest is
analysed.  ``checked`` counts the tensors evaluated; ``nothing`` is set (one line saying
where it looked) when there was nothing to watch, which the CLI reports as an error.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from .common import (is_float_row, is_garbage, iter_chunks, nothing_to_analyse, progress_bar,
                     read_error, stat_errors_of, table_stat_problems)
from .reader.npy import load_checked
from .reader import Dump

__all__ = ["Condition", "WatchHit", "WatchResult", "watch", "CONDITIONS"]

CONDITIONS: Dict[str, Dict[str, Any]] = {
    "nan": {"params": {}, "default": {}},
    "inf": {"params": {}, "default": {}},
    "overflow": {"params": {}, "default": {}},
    "too_large": {"params": {"abs_mean_gt", "max_gt", "min_gt", "mean_gt"}, "default": {"abs_mean_gt": 1e4}},
    "too_small": {"params": {"abs_mean_lt", "max_lt", "min_lt", "mean_lt"}, "default": {"abs_mean_lt": 1e-8}},
    "all_zero": {"params": {"zero_percentage_ge"}, "default": {"zero_percentage_ge": 100.0}},
    "range": {"params": {"range_start", "range_end", "range_percentage_lt", "range_percentage_gt"},
              "default": {"range_percentage_lt": 100.0}},
    "not_changed": {"params": {"rtol", "atol"}, "default": {"rtol": 1e-5, "atol": 0.0}},
    "change_too_large": {"params": {"abs_update_ratio_mean_gt", "epsilon"},
                         "default": {"abs_update_ratio_mean_gt": 0.1, "epsilon": 1e-9}},
    "change_too_small": {"params": {"abs_update_ratio_mean_lt", "epsilon"},
                         "default": {"abs_update_ratio_mean_lt": 1e-4, "epsilon": 1e-9}},
}
_ALIASES = {"tensor_too_large": "too_large", "tensor_too_small": "too_small", "zero": "all_zero",
            "tensor_all_zero": "all_zero", "tensor_range": "range", "weight_not_changed": "not_changed",
            "weight_change_too_large": "change_too_large", "weight_change_too_small": "change_too_small",
            "nan_inf": "overflow", "inf_nan": "overflow"}
_CHANGE = {"not_changed", "change_too_large", "change_too_small"}
_GRAPH_INPUT = re.compile(r"^Parameter\.inputs\d+$")


@dataclass(frozen=True)
class Condition:
    name: str
    params: Tuple[Tuple[str, float], ...] = ()

    def __init__(self, name: str, **params: float):
        n = _ALIASES.get(name.strip().lower(), name.strip().lower())
        if n not in CONDITIONS:
            import difflib
            near = difflib.get_close_matches(n, list(CONDITIONS) + list(_ALIASES), n=1)
            raise ValueError(f"unknown watch condition {name!r}"
                             + (f"; did you mean {near[0]!r}?" if near else "")
                             + f" (known: {', '.join(CONDITIONS)})")
        allowed = CONDITIONS[n]["params"]
        for k in params:
            if k not in allowed:
                raise ValueError(f"condition {n!r}: unknown parameter {k!r}"
                                 + (f" (allowed: {', '.join(sorted(allowed))})" if allowed else " (takes none)"))
        merged = dict(params)
        if n == "range":
            if "range_start" not in merged and "range_end" not in merged:
                raise ValueError("condition 'range' needs range_start and/or range_end")
            if not any(k in merged for k in ("range_percentage_lt", "range_percentage_gt")):
                merged["range_percentage_lt"] = CONDITIONS[n]["default"]["range_percentage_lt"]
        elif n in _CHANGE:
            for k, v in CONDITIONS[n]["default"].items():
                merged.setdefault(k, v)
        elif not merged:
            merged = dict(CONDITIONS[n]["default"])
        object.__setattr__(self, "name", n)
        object.__setattr__(self, "params", tuple(sorted((k, float(v)) for k, v in merged.items())))

    @classmethod
    def parse(cls, text: str) -> "Condition":
        """``too_large:max_gt=100,abs_mean_gt=10`` / ``nan`` / ``range:range_start=-1,range_end=1``."""
        name, _, rest = text.partition(":")
        params: Dict[str, float] = {}
        for part in filter(None, (p.strip() for p in re.split(r"[,;]", rest))):
            if "=" not in part:
                raise ValueError(f"watch condition {text!r}: expected param=value, got {part!r}")
            k, v = part.split("=", 1)
            try:
                params[k.strip()] = float(v)
            except ValueError:
                raise ValueError(f"watch condition {text!r}: {k.strip()} must be a number, got {v!r}") from None
        return cls(name, **params)

    @property
    def p(self) -> Dict[str, float]:
        return dict(self.params)

    @property
    def is_change(self) -> bool:
        return self.name in _CHANGE

    def __str__(self) -> str:
        return self.name + (":" + ",".join(f"{k}={v:g}" for k, v in self.params) if self.params else "")


@dataclass
class WatchHit:
    condition: str
    rank: int
    iteration: Optional[int]
    graph: int
    op: str
    io: str
    slot: int
    param: str                    # which parameter fired (e.g. max_gt), "" for nan/inf
    threshold: Optional[float]
    value: Any                    # the actual value
    detail: str = ""
    path: Optional[str] = None
    previous_iteration: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)


class WatchResult(list):
    """The hits (a list of :class:`WatchHit`, in execution order), with what could not be
    read (``unreadable``: ``(path, reason)``), how many tensors were evaluated
    (``checked``) and, when there was nothing to watch, ``nothing``: the line saying so."""

    def __init__(self, hits: Iterable["WatchHit"] = ()):
        super().__init__(hits)
        self.unreadable: List[Tuple[str, str]] = []
        self.checked = 0
        self.nothing: Optional[str] = None


class _Unreadable(Exception):
    """A tensor file that cannot be read: (path, reason)."""


def _load(path: str) -> np.ndarray:
    try:
        return load_checked(path)       # header checked against the file size first
    except Exception as e:  # noqa: BLE001 - reported by path, the rest analysed
        raise _Unreadable(path, read_error(e)) from None


def _data_stats(path: str, need_range: Optional[Tuple[float, float]]) -> Dict[str, float]:
    a = _load(path)
    if np.iscomplexobj(a):
        a = np.abs(a)
    n = nan = pinf = ninf = zeros = inr = 0
    s = sa = 0.0
    mx, mn = -math.inf, math.inf
    nfin = 0
    for c in iter_chunks(a):
        x = np.asarray(c, dtype=np.float64)
        n += x.size
        fin = np.isfinite(x)
        if not fin.all():
            nan += int(np.isnan(x).sum())
            pinf += int((x == np.inf).sum())
            ninf += int((x == -np.inf).sum())
            x = x[fin]
        if x.size:
            nfin += x.size
            s += float(x.sum())
            sa += float(np.abs(x).sum())
            mx = max(mx, float(x.max()))
            mn = min(mn, float(x.min()))
            zeros += int((x == 0).sum())
            if need_range is not None:
                lo, hi = need_range
                inr += int(((x >= lo) & (x <= hi)).sum())
    return {"count": n, "nan_count": nan, "positive_inf_count": pinf, "negative_inf_count": ninf,
            "max": mx if nfin else float("nan"), "min": mn if nfin else float("nan"),
            "mean": s / nfin if nfin else float("nan"), "abs_mean": sa / nfin if nfin else float("nan"),
            "zero_count": zeros, "range_count": inr}


def _num(v) -> Optional[float]:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


#: quantities that are over the finite elements (README, watch): a statistic that is Inf
#: includes Inf elements, so it says nothing about them
_FINITE_ONLY = frozenset({"max", "min", "mean"})


def _row_values(row: Dict[str, Any], conds: Sequence[Condition]) -> Optional[Dict[str, float]]:
    """The quantities the conditions need, from statistics when enough, else from data."""
    need = set()
    rng = None
    for c in conds:
        if c.name in ("nan", "inf", "overflow"):
            need |= {"nan_count", "positive_inf_count", "negative_inf_count"}
        elif c.name in ("too_large", "too_small"):
            for k in c.p:
                need.add(k.rsplit("_", 1)[0])          # abs_mean / max / min / mean
        elif c.name == "all_zero":
            need |= {"zero_count", "count"}
        elif c.name == "range":
            need |= {"range_count", "count"}
            rng = (c.p.get("range_start", -math.inf), c.p.get("range_end", math.inf))
    vals: Dict[str, float] = {}
    if row.get("stat_row") is True and stat_errors_of(row) is None:
        m = {"max": row.get("finite_max") if _num(row.get("finite_max")) is not None else row.get("max"),
             "min": row.get("finite_min") if _num(row.get("finite_min")) is not None else row.get("min"),
             "mean": row.get("avg"), "count": row.get("count"), "zero_count": row.get("zero_count"),
             "nan_count": row.get("nan_count"), "positive_inf_count": row.get("positive_inf_count"),
             "negative_inf_count": row.get("negative_inf_count")}
        for k, v in m.items():
            x = _num(v)
            if x is not None and not (k in _FINITE_ONLY and math.isinf(x)):
                vals[k] = x             # (an Inf max/min/avg is not over the finite elements: unknown)
        if "nan_count" not in vals and "positive_inf_count" not in vals:
            # no counts: NaN/Inf in max/min/avg/l2norm tell there is some
            raw = [row.get(k) for k in ("max", "min", "avg", "l2norm")]
            raw = [float(x) for x in raw if _num(x) is not None or (isinstance(x, float) and math.isnan(x))]
            if raw:
                vals["nan_any"] = float(any(math.isnan(x) for x in raw))
                vals["inf_any"] = float(any(math.isinf(x) for x in raw))
                if vals["nan_any"] or vals["inf_any"] or not isinstance(row.get("path"), str):
                    need -= {"nan_count", "positive_inf_count", "negative_inf_count"}
    if need - set(vals):
        p = row.get("path")
        if isinstance(p, str):
            vals.update(_data_stats(p, rng))      # _Unreadable: reported by watch()
        elif not vals:
            return None
    return vals


def _eval(c: Condition, v: Dict[str, float]) -> Optional[Tuple[str, Optional[float], Any, str]]:
    """(param, threshold, actual, detail) when the condition holds."""
    def g(k):
        return v.get(k)
    if c.name in ("nan", "inf", "overflow"):
        nan = g("nan_count")
        inf = (g("positive_inf_count") or 0) + (g("negative_inf_count") or 0)
        if nan is None and g("positive_inf_count") is None:
            # statistics without counts: max/min/avg/l2norm being NaN/Inf tell
            if c.name in ("nan", "overflow") and g("nan_any"):
                return ("", None, "some", "NaN (from statistics)")
            if c.name in ("inf", "overflow") and g("inf_any"):
                return ("", None, "some", "Inf (from statistics)")
            return None
        if c.name in ("nan", "overflow") and nan:
            return ("", None, int(nan), f"{int(nan)} NaN")
        if c.name in ("inf", "overflow") and inf:
            return ("", None, int(inf), f"{int(inf)} Inf")
        return None
    if c.name in ("too_large", "too_small"):
        for k, th in c.params:
            q, op = k.rsplit("_", 1)
            x = g(q)
            if x is None or math.isnan(x):
                continue
            if (op == "gt" and x > th) or (op == "lt" and x < th):
                return (k, th, x, f"{q} {x:.6g} {'>' if op == 'gt' else '<'} {th:g}")
        return None
    if c.name == "all_zero":
        n, z = g("count"), g("zero_count")
        if not n or z is None:
            return None
        pct = 100.0 * z / n
        th = c.p["zero_percentage_ge"]
        if pct >= th:
            return ("zero_percentage_ge", th, pct, f"{pct:.4g}% zeros >= {th:g}%")
        return None
    if c.name == "range":
        n, r = g("count"), g("range_count")
        if not n or r is None:
            return None
        pct = 100.0 * r / n
        lo, hi = c.p.get("range_start", -math.inf), c.p.get("range_end", math.inf)
        if "range_percentage_lt" in c.p and pct < c.p["range_percentage_lt"]:
            return ("range_percentage_lt", c.p["range_percentage_lt"], pct,
                    f"{pct:.4g}% in [{lo:g}, {hi:g}] < {c.p['range_percentage_lt']:g}%")
        if "range_percentage_gt" in c.p and pct > c.p["range_percentage_gt"]:
            return ("range_percentage_gt", c.p["range_percentage_gt"], pct,
                    f"{pct:.4g}% in [{lo:g}, {hi:g}] > {c.p['range_percentage_gt']:g}%")
        return None
    return None


def _change(c: Condition, prev: Dict[str, Any], cur: Dict[str, Any]) -> Optional[Tuple[str, Optional[float], Any, str]]:
    pa, pb = prev.get("path"), cur.get("path")
    if not (isinstance(pa, str) and isinstance(pb, str)):
        if c.name == "not_changed" and isinstance(prev.get("md5"), str) and prev.get("md5") \
                and prev.get("md5") == cur.get("md5"):
            return ("md5", None, prev["md5"], "MD5 unchanged")
        return None
    a, b = _load(pa), _load(pb)
    if a.size != b.size:
        return None
    p = c.p
    if c.name == "not_changed":
        rtol, atol = p.get("rtol", 1e-5), p.get("atol", 0.0)
        for ca, cb in zip(iter_chunks(a), iter_chunks(b)):
            if not np.allclose(np.asarray(cb, np.float64), np.asarray(ca, np.float64), rtol=rtol, atol=atol,
                               equal_nan=True):
                return None
        return ("rtol", rtol, 0.0, f"allclose to iteration {prev['iteration']} (rtol={rtol:g}, atol={atol:g})")
    eps = p.get("epsilon", 1e-9)
    sd = sp = 0.0
    n = 0
    for ca, cb in zip(iter_chunks(a), iter_chunks(b)):
        xa, xb = np.asarray(ca, np.float64), np.asarray(cb, np.float64)
        fin = np.isfinite(xa) & np.isfinite(xb)
        xa, xb = xa[fin], xb[fin]
        sd += float(np.abs(xb - xa).sum())
        sp += float(np.abs(xa).sum())
        n += xa.size
    if n == 0:
        return None
    ratio = (sd / n) / (sp / n + eps)
    if "abs_update_ratio_mean_gt" in p and ratio > p["abs_update_ratio_mean_gt"]:
        th = p["abs_update_ratio_mean_gt"]
        return ("abs_update_ratio_mean_gt", th, ratio, f"update ratio {ratio:.4g} > {th:g}")
    if "abs_update_ratio_mean_lt" in p and ratio < p["abs_update_ratio_mean_lt"]:
        th = p["abs_update_ratio_mean_lt"]
        return ("abs_update_ratio_mean_lt", th, ratio, f"update ratio {ratio:.4g} < {th:g}")
    return None


def watch(dump: Dump, conditions: Iterable[Union[Condition, str]], *, rank: Optional[int] = None,
          iterations: Optional[Iterable[int]] = None, op: Optional[str] = None, io: Optional[str] = None,
          target: Optional[str] = None, progress: bool = True, limit: Optional[int] = None) -> WatchResult:
    """Evaluate ``conditions`` over ``dump``; the hits in execution order.

    ``op``: a regular expression searched in the operator (or parameter) name;
    ``target``: ``params``, ``ops`` or ``all`` (default: params for the change
    conditions, all for the others); ``limit``: stop after that many hits."""
    conds = [c if isinstance(c, Condition) else Condition.parse(c) for c in conditions]
    if not conds:
        raise ValueError("watch: no condition given")
    rec = dump.records()
    hits = WatchResult()
    if rec.empty:
        hits.nothing = nothing_to_analyse(dump, "tensor files or statistics rows")
        return hits
    hits.unreadable.extend(table_stat_problems(rec))
    if rank is not None:
        rec = rec[rec["rank"] == rank]
    if iterations is not None:
        rec = rec[rec["iteration"].isin(set(int(i) for i in iterations))]
    if io:
        rec = rec[rec["io"] == io]
    if op:
        rx = re.compile(op)
        rec = rec[[bool(rx.search(str(n))) for n in rec["op"]]] if not rec.empty else rec
    if not rec.empty:      # (a boolean list selects nothing from an empty frame: pandas raises)
        rec = rec[[is_float_row(d, p, hits.unreadable) for d, p in zip(rec["dtype"], rec["path"])]]
    if not rec.empty:
        rec = rec[[not is_garbage(t, i, s) for t, i, s in zip(rec["op_type"], rec["io"], rec["slot"])]]
    rows = rec.to_dict("records")
    for r in rows:
        it = r["iteration"]
        try:
            r["iteration"] = None if it is None or it != it else int(it)
        except TypeError:
            r["iteration"] = None

    def targeted(c: Condition, r: Dict[str, Any]) -> bool:
        t = target or ("params" if c.is_change else "all")
        if target is None and c.is_change and _GRAPH_INPUT.match(str(r["op"])):
            return False    # graph inputs (a new batch each step) are not weights
        if t == "params":
            return r["kind"] in ("parameter", "constant")
        if t == "ops":
            return r["kind"] == "op"
        return True

    plain = [c for c in conds if not c.is_change]
    change = [c for c in conds if c.is_change]
    bar = progress_bar(progress, len(rows), "watch", "tensor")
    rows.sort(key=lambda r: (r["rank"], -1 if r["iteration"] is None else r["iteration"], r["order"]))

    def mk(c, r, res, prev_it=None):
        param, th, val, detail = res
        return WatchHit(str(c), int(r["rank"]), r["iteration"], int(r["graph"]), r["op"], r["io"], int(r["slot"]),
                        param, th, val, detail, r.get("path") if isinstance(r.get("path"), str) else None, prev_it)

    prev_of: Dict[tuple, Dict[str, Any]] = {}
    for r in rows:
        if bar is not None:
            bar.update(1)
        if limit is not None and len(hits) >= limit:
            break
        cs = [c for c in plain if targeted(c, r)]
        if cs:
            hits.checked += 1
            try:
                vals = _row_values(r, cs)
            except _Unreadable as e:
                hits.unreadable.append(e.args)
                vals = None
            if vals is not None:
                for c in cs:
                    res = _eval(c, vals)
                    if res is not None:
                        hits.append(mk(c, r, res))
        if change:
            key = (r["rank"], r["graph"], r["op"], r["io"], r["slot"], r["call"])
            prev = prev_of.get(key)
            if not cs and any(targeted(c, r) for c in change):
                hits.checked += 1
            if prev is not None and prev["iteration"] != r["iteration"]:
                for c in change:
                    if targeted(c, r):
                        try:
                            res = _change(c, prev, r)
                        except _Unreadable as e:
                            hits.unreadable.append(e.args)
                            res = None
                        if res is not None:
                            hits.append(mk(c, r, res, prev["iteration"]))
            prev_of[key] = r
    if bar is not None:
        bar.close()
    hits.unreadable = list(dict.fromkeys(tuple(u) for u in hits.unreadable))
    if not rows:
        sel = [f"rank {rank}"] if rank is not None else []
        sel += [f"iterations {sorted(set(int(i) for i in iterations))}"] if iterations is not None else []
        sel += [f"--io {io}"] if io else []
        sel += [f"--op {op!r}"] if op else []
        hits.nothing = nothing_to_analyse(dump, "floating tensors" + (f" ({', '.join(sel)})" if sel else ""))
    if limit is not None and len(hits) > limit:
        del hits[limit:]
    return hits
