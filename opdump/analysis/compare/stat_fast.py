"""A statistics-only compare, column by column: pairs, verdicts, table and summary built
from the records' columns instead of one :class:`.pairs.Tensor` and :class:`.pairs.Pair`
per row.

Why: a statistics-only compare of 136,000 rows spent ~1 s in each of ten per-row Python
stages (tensors, matching, verdicts, table, sorting, sources...).

When it applies (:func:`statistics_compare` returns None otherwise and ``compare`` runs the
per-row stages): the default matchers (no mapping, no kernel dump); every compared record
of both dumps is a statistics row without a tensor file; and, for every iteration pair,
A's records and B's records are the same sequence of tensors -- equal kind, operator name,
file name, type, io, slot, call, graph, shape text and dtype class, position by position --
with (iteration, graph, operator file name, io, slot, call) unique on each side.

Guarantee (tests/test_compare_stat_fastpath.py checks it against the per-row stages): the
same table (values, dtypes, row order), summary, first difference and first divergence as
the per-row stages.  Why the pairs are the same: with equal sequences the aligned-order
matcher aligns every scope's calls position by position (equal signature sequences), so
each tensor pairs with the one at its position -- a join on (iteration, graph, file name,
io, slot, call) -- except where the value tie-break (:func:`.match._tie_break`: several
calls of one scope with equal signatures, re-paired by their statistics fingerprints)
re-pairs calls; that re-pairing is reproduced here call group by call group with the
matcher's own fingerprint rule, and a re-paired call whose tensors differ in (io, slot)
from its partner's sends the whole compare back to the per-row stages.  Parameters and
constants pair by name, which is also position by position.  ``OPDUMP_COMPARE_FAST=0``
turns this path off.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .frontend import EXTRA_OUTPUTS, canonical_type
from .pairs import RULE_NAME, RULE_ORDER, _base_type, dtype_class, shape_from_text
from .stat_pairs import StatPairs, finish_result

__all__ = ["statistics_compare", "enabled"]

#: columns that must agree position by position for the join to be the matchers' pairing
_SAME = ("kind", "op", "op_file", "op_type", "io", "slot", "call", "graph")
_KEY = ("graph", "op_file", "io", "slot", "call")


def enabled() -> bool:
    """False when ``OPDUMP_COMPARE_FAST=0`` (the per-row stages, e.g. to check this path)."""
    return os.environ.get("OPDUMP_COMPARE_FAST", "1") != "0"


def _its(rec) -> List[Optional[int]]:
    return [None if v is None or v != v else int(v) for v in rec["iteration"].astype(object).tolist()]


def _obj(rec, c: str) -> List[Any]:
    """A column as Python objects, as ``DataFrame.to_dict('records')`` gives them."""
    return rec[c].tolist()


def _usable(rec) -> bool:
    """Statistics rows only: no tensor file, a statistics row each."""
    if rec.empty:
        return False
    return bool(rec["path"].isna().all()) and all(v is True for v in rec["stat_row"].tolist())


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


def statistics_compare(da, db, rank_pairs, iterations, io, include_parameters, thresholds, check_samples,
                       iteration_pairs, sources) -> Optional[Any]:
    """The :class:`.result.CompareResult` of a statistics-only compare built column-wise, or
    None when this path does not apply (module doc); ``check_samples``,
    ``iteration_pairs`` and ``sources`` are ``compare``'s own helpers."""
    if not enabled():
        return None
    sides = []
    for ra, rb in rank_pairs:
        check_samples(da, ra, db, rb)
        if ra not in da.ranks or rb not in db.ranks:
            return None
        sa, sb = _side(da, ra, io, include_parameters), _side(db, rb, io, include_parameters)
        if not _usable(sa) or not _usable(sb):
            return None
        sides.append((sa, sb))
    all_it: List[Tuple[int, int]] = []
    parts = []
    for sa, sb in sides:
        it_a, it_b = _its(sa), _its(sb)
        class _T:                                 # what _iteration_pairs reads of a tensor
            __slots__ = ("iteration",)

            def __init__(self, i):
                self.iteration = i
        it_pairs = iteration_pairs([_T(i) for i in set(it_a)], [_T(i) for i in set(it_b)], iterations)
        all_it += [p for p in it_pairs if p[0] is not None and p not in all_it]
        part = _pair_rank(sa, sb, it_a, it_b, it_pairs)
        if part is None:
            return None
        parts.append(part)
    if not any(len(p[0]) for p in parts):
        return None                               # nothing matched: the per-row stages raise
    sp = StatPairs.build(sides, parts, thresholds)
    return finish_result(da, db, sp, rank_pairs, all_it, thresholds, sources)


def _positions(its: List[Optional[int]]) -> Dict[Optional[int], np.ndarray]:
    out: Dict[Optional[int], List[int]] = {}
    for i, v in enumerate(its):
        out.setdefault(v, []).append(i)
    return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}


def _pair_rank(sa, sb, it_a, it_b, it_pairs):
    """(A rows, B rows, rules) of one rank pair in the matchers' pairing, or None (module doc)."""
    pos_a, pos_b = _positions(it_a), _positions(it_b)
    ai, bi, blocks = [], [], []
    for ia, ib in it_pairs:
        pa = pos_a.get(ia, np.empty(0, np.int64))
        pb = pos_b.get(ib, np.empty(0, np.int64))
        if len(pa) != len(pb):
            return None
        ai.append(pa)
        bi.append(pb)
        blocks.append(np.full(len(pa), len(blocks), np.int64))
    ai = np.concatenate(ai) if ai else np.empty(0, np.int64)
    bi = np.concatenate(bi) if bi else np.empty(0, np.int64)
    if len(ai) == 0:
        return None
    blocks = np.concatenate(blocks).tolist()
    for c in _SAME:
        x, y = sa[c].to_numpy(dtype=object)[ai], sb[c].to_numpy(dtype=object)[bi]
        if not bool(np.all(x == y)):
            return None
    shp_a, shp_b = sa["shape"].tolist(), sb["shape"].tolist()
    if any(shp_a[i] != shp_b[j] and not (shp_a[i] != shp_a[i] and shp_b[j] != shp_b[j]) for i, j in
           zip(ai.tolist(), bi.tolist())):
        return None
    if any(type(shp_a[i]) is not type(shp_b[j]) for i, j in zip(ai.tolist(), bi.tolist())):
        return None
    dca, dcb = _dclass(sa), _dclass(sb)
    if any(dca[i] != dcb[j] for i, j in zip(ai.tolist(), bi.tolist())):
        return None
    for s in (sa, sb):
        if s.duplicated(["iteration", *_KEY]).any():
            return None
    rules = np.full(len(ai), RULE_NAME, dtype=object)
    bi = bi.copy()
    if not _tie_breaks(sa, sb, blocks, ai, bi, rules, dca):
        return None
    return ai, bi, rules


def _dclass(rec) -> List[str]:
    """``dtype_class(Tensor.dtype)`` per row (statistics rows: the row's dtype when a string)."""
    return [dtype_class(d if isinstance(d, str) and d else None) for d in rec["dtype"].tolist()]


def _tie_breaks(sa, sb, blocks, ai, bi, rules, dclass) -> bool:
    """Reproduce :func:`.match._tie_break` on the position-by-position pairing (module doc):
    ``bi`` and ``rules`` are changed in place where it re-pairs calls.  False: a re-paired
    call does not pair tensor by tensor; the per-row stages must decide."""
    from .match import STAT_KEYS, pair_by_fingerprint    # the fingerprint's keys and pairing, as the matcher's
    kind = sa["kind"].tolist()
    ops, files, types = sa["op"].tolist(), sa["op_file"].tolist(), sa["op_type"].tolist()
    iob, slots, graphs, calls = sa["io"].tolist(), sa["slot"].tolist(), sa["graph"].tolist(), sa["call"].tolist()
    shapes = sa["shape"].tolist()
    # calls of each (iteration pair, scope), in order of first appearance among A's rows
    where: Dict[tuple, List[int]] = {}           # call key -> positions k (into ai)
    call_order: List[tuple] = []
    ai_l = ai.tolist()
    for k, i in enumerate(ai_l):
        if kind[i] != "op":
            continue
        key = (blocks[k], graphs[i], files[i], int(calls[i]))      # a call of one iteration pair
        lst = where.get(key)
        if lst is None:
            where[key] = [k]
            call_order.append(key)
        else:
            lst.append(k)
    head: Dict[tuple, tuple] = {}                # call -> (scope, base type); ties need two of one
    count: Dict[tuple, int] = {}
    for key in call_order:
        first = ai_l[where[key][0]]
        op = ops[first]
        h = head[key] = (key[0], op.rsplit("/", 1)[0] if "/" in op else "", _base_type(types[first]))
        count[h] = count.get(h, 0) + 1
    scopes: Dict[tuple, Dict[tuple, List[tuple]]] = {}
    for key in call_order:
        blk, scope, base = head[key]
        if count[(blk, scope, base)] < 2:
            continue                             # its signature occurs once in its scope: no tie
        cut = EXTRA_OUTPUTS.get(base)
        sig = [(iob[ai_l[k]], int(slots[ai_l[k]]), shape_from_text(shapes[ai_l[k]]), dclass[ai_l[k]])
               for k in where[key]
               if not (cut is not None and iob[ai_l[k]] == "output" and int(slots[ai_l[k]]) >= cut)]
        sig = (canonical_type(base),) + tuple(sorted(sig, key=lambda s: (s[0], s[1])))
        scopes.setdefault((key[0], scope), {}).setdefault(sig, []).append(key)
    cols_a = {c: sa[c].tolist() for c in STAT_KEYS if c in sa.columns}
    cols_b = {c: sb[c].tolist() for c in STAT_KEYS if c in sb.columns}
    io_b, slot_b, ops_b = sb["io"].tolist(), sb["slot"].tolist(), sb["op"].tolist()
    bi_l = bi.tolist()

    def fingerprint(ks: List[int], rows: List[int], io, slot, cols) -> tuple:
        outs = sorted((k for k in ks if io[rows[k]] == "output"), key=lambda k: slot[rows[k]]) or list(ks)
        return tuple(tuple(str(cols[c][rows[k]]) for c in cols) for k in outs)

    moved = {}
    for groups in scopes.values():
        for group in groups.values():
            if len(group) < 2:
                continue
            fa = [fingerprint(where[c], ai_l, iob, slots, cols_a) for c in group]
            fb = [fingerprint(where[c], bi_l, io_b, slot_b, cols_b) for c in group]
            if fa == fb:
                continue
            for x, y in pair_by_fingerprint(fa, fb):
                if x != y:
                    moved[group[x]] = group[y]
    for cx, cy in moved.items():
        kx, ky = where[cx], where[cy]
        by_key = {(io_b[bi_l[k]], slot_b[bi_l[k]]): bi_l[k] for k in ky}
        if len(by_key) != len(ky) or len(kx) != len(ky):
            return False
        rule = RULE_NAME if ops[ai_l[kx[0]]] == ops_b[bi_l[ky[0]]] else RULE_ORDER
        for k in kx:
            j = by_key.get((iob[ai_l[k]], slots[ai_l[k]]))
            if j is None:
                return False
            bi[k] = j
            rules[k] = rule
    return True
