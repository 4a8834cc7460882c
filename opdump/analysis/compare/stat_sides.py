"""One side of a column-wise statistics compare: the records ``compare`` turns into tensors
for one rank, their iterations and per-iteration row positions, the statistics fingerprints
as codes -- shared by the join (:mod:`.stat_fast`) and the column matcher (:mod:`.stat_match`),
so that neither imports the other.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from .stat_cells import iterations_of

__all__ = ["enabled"]


def enabled() -> bool:
    """False when ``OPDUMP_COMPARE_FAST=0`` (the per-row stages, e.g. to check this path)."""
    return os.environ.get("OPDUMP_COMPARE_FAST", "1") != "0"


def _its(rec) -> List[Optional[int]]:
    """Each row's iteration as an int, None where missing."""
    return iterations_of(rec["iteration"])


def _usable(rec) -> bool:
    """Statistics rows only: no tensor file, a statistics row each."""
    if rec.empty:
        return False
    if not bool(rec["path"].isna().all()):
        return False
    rows = rec["stat_row"]
    if rows.dtype == np.bool_:                      # the records' dtype: each cell True or False
        return bool(rows.to_numpy().all())
    return all(v is True for v in rows.tolist())


def _side(dump, rank, io, include_parameters):
    """The records ``compare`` turns into tensors for one rank (``_tensors`` + its filters)."""
    rec = dump.records()
    if rec.empty:
        return rec
    rec = rec[rec["rank"] == rank]
    if rec.empty:
        return rec
    rec = rec[rec["iteration"].notna() | (rec["kind"] == "constant")]
    if io:
        rec = rec[rec["io"] == io]
    if not include_parameters:
        rec = rec[rec["kind"] == "op"]
    return rec.reset_index(drop=True)


def _positions(its: List[Optional[int]]) -> Dict[Optional[int], np.ndarray]:
    """Row positions of each iteration, in row order (taken run by run: records come
    grouped by iteration)."""
    import operator
    n = len(its)
    if not n:
        return {}
    cuts = np.flatnonzero(np.fromiter(map(operator.ne, its[1:], its[:-1]), dtype=bool, count=n - 1)) + 1
    starts = [0] + cuts.tolist()
    out: Dict[Optional[int], List[np.ndarray]] = {}
    for s0, e0 in zip(starts, starts[1:] + [n]):
        out.setdefault(its[s0], []).append(np.arange(s0, e0, dtype=np.int64))
    return {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in out.items()}


def _fingerprint_codes(sa, sb) -> Tuple[List[int], List[int]]:
    """Per row of A and of B, a code standing for its statistics fingerprint (the matcher's
    ``tuple(str(row[k]) for k in STAT_KEYS if k in row)``, STAT_KEYS the statistic keys): equal codes across the sides
    exactly where those tuples are equal (float64 columns by their bits, NaN as one, as
    ``str`` tells them apart; any other column through ``str``)."""
    import pandas as pd
    from .match import STAT_KEYS
    ka = [c for c in STAT_KEYS if c in sa.columns]
    kb = [c for c in STAT_KEYS if c in sb.columns]
    na, nb = len(sa), len(sb)
    if len(ka) != len(kb):                          # tuples of other lengths never agree
        return [0] * na, [1] * nb
    codes = np.zeros(na + nb, dtype=np.int64)
    for ca, cb in zip(ka, kb):
        x, y = sa[ca], sb[cb]
        if x.dtype == y.dtype and x.dtype in (np.float64, np.int64, np.bool_):
            vals = np.concatenate([x.to_numpy(), y.to_numpy()])
            if vals.dtype == np.float64:
                nan = np.isnan(vals)
                vals = vals.view(np.int64).copy()
                vals[nan] = 0x7FF8000000000000      # every NaN prints as nan
        else:
            vals = np.asarray(list(map(str, x.tolist())) + list(map(str, y.tolist())), dtype=object)
        col, uniq = pd.factorize(vals)
        codes = pd.factorize(codes * len(uniq) + col)[0]
    return codes[:na].tolist(), codes[na:].tolist()
