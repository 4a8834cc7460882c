"""Does run 2 of ``opdump triage`` reproduce run 1 at the suspects?

Why: run 2 re-runs the script; its tensors explain run 1's finding only if the script
computed the same values again. A script that is not deterministic (unseeded data,
non-deterministic kernels, a data order that changes) would otherwise have triage report
tensors of a different computation (README, Analysis: triage).

Each tensor of a suspect operator at a suspect iteration that both runs dumped is
compared by its statistics (run 2 always writes ``statistic.csv``; for run 1 its
statistics, or its ``.npy`` when it has none): NaN/+Inf/-Inf counts and max/min must be
equal (NaN equal to NaN), avg and l2norm within 1e-6 relative. A suspect tensor that run 1
dumped and run 2 did not is a failure too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .reader import Dump, load_array

__all__ = ["Reproduction", "check_reproduction"]

_EXACT = ("nan_count", "positive_inf_count", "negative_inf_count", "max", "min")
_CLOSE = ("avg", "l2norm")
RTOL = 1e-6


@dataclass
class Reproduction:
    compared: int = 0
    mismatches: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        return self.compared > 0 and not self.mismatches and not self.missing

    def describe(self) -> str:
        if self.reproduced:
            return f"run 2 reproduces run 1 at the suspects ({self.compared} tensors' statistics equal)"
        if not self.compared and not self.missing:
            return ("run 2 could not be checked against run 1: no suspect tensor with statistics (or data) in both "
                    "runs")
        parts = [f"run 2 does NOT reproduce run 1 at the suspects ({len(self.mismatches)} of {self.compared} "
                 "compared tensors differ" + (f", {len(self.missing)} not dumped again" if self.missing else "") + ")"]
        parts += [f"  {m}" for m in (self.mismatches + self.missing)[:8]]
        return "\n".join(parts)


def _num(v: Any) -> Optional[float]:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x


def _from_array(path: str) -> Dict[str, float]:
    a = np.asarray(load_array(path))
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer) or a.dtype == bool):
        return {}
    a = a.astype(np.float64, copy=False)
    out = {"nan_count": float(np.isnan(a).sum()), "positive_inf_count": float((a == np.inf).sum()),
           "negative_inf_count": float((a == -np.inf).sum())}
    if a.size:
        out["max"] = float(np.nan if np.isnan(a).any() else a.max())
        out["min"] = float(np.nan if np.isnan(a).any() else a.min())
    return out


def _values(row: Dict[str, Any]) -> Dict[str, float]:
    vals = {k: _num(row.get(k)) for k in _EXACT + _CLOSE}
    vals = {k: v for k, v in vals.items() if v is not None}
    stat_row = row.get("stat_row") is True
    if not stat_row and isinstance(row.get("path"), str):
        try:
            return _from_array(row["path"])
        except (OSError, ValueError):
            return {}
    return vals


def _same(k: str, x: float, y: float) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if k in _CLOSE:
        return x == y or abs(x - y) <= RTOL * max(abs(x), abs(y))
    return x == y


def _rows(dump: Dump, names: Sequence[str], iterations: Sequence[int], rank: int) -> Dict[Tuple, Dict[str, Any]]:
    rec = dump.records()
    if rec.empty:
        return {}
    rec = rec[(rec["rank"] == rank) & rec["op"].isin(set(names)) & rec["iteration"].isin(set(iterations))]
    out: Dict[Tuple, Dict[str, Any]] = {}
    for r in rec.to_dict("records"):
        key = (int(r["iteration"]), r["op"], r["io"], int(r["slot"]), int(r["call"]) if r["call"] == r["call"] else 0)
        out.setdefault(key, r)
    return out


def check_reproduction(run1: Dump, run2: Dump, names: Sequence[str], iterations: Sequence[int],
                       rank: int = 0) -> Reproduction:
    """Compare run 1's and run 2's statistics of ``names`` at ``iterations`` (see module doc)."""
    a = _rows(run1, names, iterations, rank)
    b = _rows(run2, names, iterations, rank)
    res = Reproduction()
    for key, ra in a.items():
        label = f"{key[1]} {key[2]}.{key[3]} (iteration {key[0]})"
        rb = b.get(key)
        if rb is None:
            res.missing.append(f"{label}: not dumped by run 2")
            continue
        va, vb = _values(ra), _values(rb)
        common = [k for k in _EXACT + _CLOSE if k in va and k in vb]
        if not common:
            continue
        res.compared += 1
        diff = [f"{k} {va[k]!r} vs {vb[k]!r}" for k in common if not _same(k, va[k], vb[k])]
        if diff:
            res.mismatches.append(f"{label}: run 1 vs run 2: " + ", ".join(diff))
    return res
