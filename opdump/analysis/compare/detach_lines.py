"""``detach`` pairs whose source lines differ are two front-end operators, not one pair.

Why: ``detach`` is how each front end hands a tensor on, not a computation of the model.
Compiled against eager with a scalar parameter used through ``exp`` (CLIP's
``logit_scale``), the compiled backward detaches the saved ``exp`` output (the forward's
``.exp()`` line) while eager autograd detaches the gradient it accumulates into ``.grad``
(the script's ``backward()`` line): the only 0-d ``detach`` of that scope on each side, so
the aligned order paired them and named the pair the first divergence at every iteration.

Rule: a matched pair of ``detach`` operators whose innermost user source lines are both
known and differ (the code text of the line; the file's base name and line number where
either side has no code) is split into two unmatched tensors, ``front-end`` (README,
compare).  Applied after either matcher (per-row or column-wise), so both keep giving the
same pairs.
"""
from __future__ import annotations

import os
from typing import Callable, List, Optional, Tuple

from ..common import base_op_type
from .frontend import RULE_FRONT_END
from .pairs import Pair

__all__ = ["split_detach_pairs"]


def _line(src: Tuple[str, str]) -> Optional[tuple]:
    where, code = src
    if code.strip():
        return ("code", code.strip())
    if where:
        path, _, line = where.rpartition(":")
        return ("line", os.path.basename(path), line)
    return None


def split_detach_pairs(pairs: List[Pair], source_a: Callable, source_b: Callable) -> List[Pair]:
    """``pairs`` with each ``detach`` pair whose lines differ split in two (module doc).
    ``source_a(tensor)``/``source_b(tensor)``: its operator's (``file:line``, code)."""
    out: List[Pair] = []
    for p in pairs:
        a, b = p.a, p.b
        if (a is not None and b is not None and a.kind == "op" and b.kind == "op"
                and base_op_type(a.op_type) == "detach" == base_op_type(b.op_type)):
            la, lb = _line(source_a(a)), _line(source_b(b))
            if la is not None and lb is not None and la[0] == lb[0] and la != lb:
                out += [Pair(a, None, RULE_FRONT_END), Pair(None, b, RULE_FRONT_END)]
                continue
        out.append(p)
    return out


class DumpLines:
    """``(rank, graph, op full name) -> line key`` (:func:`_line`) of one dump, cached."""

    def __init__(self, dump):
        self.dump, self.cache = dump, {}

    def __call__(self, rank, graph, op) -> Optional[tuple]:
        key = (rank, graph, op)
        if key not in self.cache:
            info = self.dump.op_info(op, rank=rank, graph=graph)
            self.cache[key] = _line((info.source, info.code)) if info is not None else None
        return self.cache[key]


def _detach_rows(frame):
    """Rows of operator ``detach`` calls (column-wise: the distinct types judged once)."""
    import numpy as np
    types = frame["op_type"]
    detach = [t for t in types.unique().tolist() if base_op_type(t) == "detach"]
    if not detach:
        return np.zeros(len(frame), dtype=bool)
    return types.isin(detach).to_numpy() & (frame["kind"] == "op").to_numpy()


def split_detach_part(part, sa, sb, da, db):
    """:func:`split_detach_pairs` on the column-wise pairing ``part`` = (A rows, B rows,
    rules), -1 for no partner (:mod:`.stat_pairs`), of the record frames ``sa``/``sb``:
    each split pair becomes (a, -1) then (-1, b), both ``front-end``, where it stood."""
    import numpy as np
    ai, bi, rules = part
    both = (ai >= 0) & (bi >= 0)
    if not both.any():
        return part
    det_a = _detach_rows(sa)
    if not det_a.any():
        return part
    det_b = _detach_rows(sb)
    idx = np.nonzero(both)[0]
    idx = idx[det_a[ai[idx]] & det_b[bi[idx]]]
    if not len(idx):
        return part
    la, lb = DumpLines(da), DumpLines(db)
    cols = [(f["rank"].tolist(), f["graph"].tolist(), f["op"].tolist()) for f in (sa, sb)]
    split = []
    for k in idx.tolist():
        i, j = int(ai[k]), int(bi[k])
        x = la(cols[0][0][i], cols[0][1][i], cols[0][2][i])
        y = lb(cols[1][0][j], cols[1][1][j], cols[1][2][j])
        if x is not None and y is not None and x[0] == y[0] and x != y:
            split.append(k)
    if not split:
        return part
    reps = np.ones(len(ai), dtype=np.int64)
    reps[split] = 2
    new_ai, new_bi, new_rules = np.repeat(ai, reps), np.repeat(bi, reps), np.repeat(rules, reps)
    s = (np.cumsum(reps) - reps)[split]
    new_bi[s] = -1
    new_ai[s + 1] = -1
    new_rules[s] = RULE_FRONT_END
    new_rules[s + 1] = RULE_FRONT_END
    return new_ai, new_bi, new_rules
