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
with (iteration, graph, operator file name, io, slot, call) unique on each side.  Where the
sequences differ (fp32 against bf16 autocast: extra casts), the pairs are those the matchers
make, computed over the columns (:mod:`.stat_match`), and the tensors left without a partner
get their rows as the per-row stages give them (:mod:`.stat_onesided`).

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

from operator import itemgetter
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .frontend import EXTRA_OUTPUTS, canonical_type
from .pairs import RULE_NAME, RULE_ORDER, _base_type, dtype_class, shape_from_text
from .stat_cells import per_distinct
from .stat_match import row_part
from .stat_sides import _fingerprint_codes, _its, _positions, _side, _usable, enabled  # noqa: F401 (re-exported)
from .stat_pairs import StatPairs, finish_result
from ..undefined import UndefinedInputs
from .detach_lines import split_detach_part

__all__ = ["statistics_compare", "enabled"]

#: columns that must agree position by position for the join to be the matchers' pairing
_SAME = ("kind", "op", "op_file", "op_type", "io", "slot", "call", "graph")
_KEY = ("graph", "op_file", "io", "slot", "call")


class _Iteration:
    """What ``compare``'s ``_iteration_pairs`` reads of a tensor: its iteration."""
    __slots__ = ("iteration",)

    def __init__(self, i):
        self.iteration = i


def iteration_pairs_of(it_a, it_b, iterations, iteration_pairs):
    """``compare``'s ``iteration_pairs`` of the iterations two sides' rows hold."""
    return iteration_pairs([_Iteration(i) for i in set(it_a)], [_Iteration(i) for i in set(it_b)], iterations)


def usable_sides(da, db, rank_pairs, io, include_parameters, check_samples, usable):
    """``[(A's records, B's records)]`` of each rank pair (:func:`_side`), or None when a rank
    is missing or ``usable(records)`` refuses a side: a column-wise path then does not apply."""
    sides = []
    for ra, rb in rank_pairs:
        check_samples(da, ra, db, rb)
        if ra not in da.ranks or rb not in db.ranks:
            return None
        sa, sb = _side(da, ra, io, include_parameters), _side(db, rb, io, include_parameters)
        if not usable(sa) or not usable(sb):
            return None
        sides.append((sa, sb))
    return sides


def statistics_compare(da, db, rank_pairs, iterations, io, include_parameters, thresholds, check_samples,
                       iteration_pairs, sources) -> Optional[Any]:
    """The :class:`.result.CompareResult` of a statistics-only compare built column-wise, or
    None when this path does not apply (module doc); ``check_samples``,
    ``iteration_pairs`` and ``sources`` are ``compare``'s own helpers."""
    if not enabled():
        return None
    sides = usable_sides(da, db, rank_pairs, io, include_parameters, check_samples, _usable)
    if sides is None:
        return None
    all_it: List[Tuple[int, int]] = []
    parts = []
    for sa, sb in sides:
        it_a, it_b = _its(sa), _its(sb)
        it_pairs = iteration_pairs_of(it_a, it_b, iterations, iteration_pairs)
        all_it += [p for p in it_pairs if p[0] is not None and p not in all_it]
        part = _pair_rank(sa, sb, it_a, it_b, it_pairs)
        if part is None:                          # sequences differ: the matchers over columns (.stat_match)
            part = row_part(sa, sb, it_pairs)
        if part is None:
            return None
        parts.append(split_detach_part(part, sa, sb, da, db))     # .detach_lines
    if not any(((p[0] >= 0) & (p[1] >= 0)).any() for p in parts):
        return None                               # nothing matched: the per-row stages raise
    sp = StatPairs.build(sides, parts, thresholds, (UndefinedInputs(da), UndefinedInputs(db)))
    return finish_result(da, db, sp, rank_pairs, all_it, thresholds, sources)


def _pair_rank(sa, sb, it_a, it_b, it_pairs):
    """(A rows, B rows, rules) of one rank pair in the matchers' pairing, or None (module doc)."""
    pos_a, pos_b = _positions(it_a), _positions(it_b)
    ai, bi = [], []
    runs: List[Tuple[int, int]] = []                # (start, end) of each iteration pair's rows, none empty
    for ia, ib in it_pairs:
        pa = pos_a.get(ia, np.empty(0, np.int64))
        pb = pos_b.get(ib, np.empty(0, np.int64))
        if len(pa) != len(pb):
            return None
        ai.append(pa)
        bi.append(pb)
        if len(pa):
            start = runs[-1][1] if runs else 0
            runs.append((start, start + len(pa)))
    ai = np.concatenate(ai) if ai else np.empty(0, np.int64)
    bi = np.concatenate(bi) if bi else np.empty(0, np.int64)
    if len(ai) == 0:
        return None
    for c in _SAME:
        x, y = sa[c].to_numpy(dtype=object)[ai], sb[c].to_numpy(dtype=object)[bi]
        if not bool(np.all(x == y)):
            return None
    ai_l, bi_l = ai.tolist(), bi.tolist()
    shp_a, shp_b = sa["shape"].tolist(), sb["shape"].tolist()
    xa, xb = list(map(shp_a.__getitem__, ai_l)), list(map(shp_b.__getitem__, bi_l))
    # equal lists (each cell the same object or ==) pass the per-cell rule below: checked first, in C
    if xa != xb and any(x != y and not (x != x and y != y) for x, y in zip(xa, xb)):
        return None
    if list(map(type, xa)) != list(map(type, xb)):
        return None
    dca, dcb = _dclass(sa), _dclass(sb)
    if list(map(dca.__getitem__, ai_l)) != list(map(dcb.__getitem__, bi_l)):     # str cells: == is the rule
        return None
    for s in ((sa,) if b_mirrors_a(len(sa), len(sb), ai, bi, it_pairs) else (sa, sb)):
        if s.duplicated(["iteration", *_KEY]).any():
            return None
    rules = np.full(len(ai), RULE_NAME, dtype=object)
    bi = bi.copy()
    if not _tie_breaks(sa, sb, runs, ai, bi, rules, dca):
        return None
    return ai, bi, rules


def b_mirrors_a(n_a: int, n_b: int, ai: np.ndarray, bi: np.ndarray, it_pairs) -> bool:
    """Whether B's (iteration, graph, file name, io, slot, call) repeat exactly where A's do,
    once :func:`_pair_rank` has found A's rows ``ai`` and B's rows ``bi`` equal in every key
    column but the iteration (cell by cell): every row of each side paired (``ai``, ``bi``
    cover all ``n_a``, ``n_b`` rows) and the iteration pairs one to one (no iteration of
    either side in two pairs), so that two B rows share a key exactly when their A rows do.
    Then B's duplicate check (pandas' ``duplicated``, ~25-45 ms on 100,000 rows) answers
    what A's does and is left out."""
    if len(ai) != n_a or len(bi) != n_b:
        return False
    its_a, its_b = [p[0] for p in it_pairs], [p[1] for p in it_pairs]
    return len(set(its_a)) == len(its_a) and len(set(its_b)) == len(its_b)


def _dclass(rec) -> List[str]:
    """``dtype_class(Tensor.dtype)`` per row (statistics rows: the row's dtype when a string),
    worked out once per distinct cell (:func:`per_distinct`)."""
    return per_distinct(lambda d: dtype_class(d if isinstance(d, str) and d else None), rec["dtype"].tolist())


def _tie_breaks(sa, sb, runs, ai, bi, rules, dclass) -> bool:
    """Reproduce :func:`.match._tie_break` on the position-by-position pairing (module doc):
    ``bi`` and ``rules`` are changed in place where it re-pairs calls.  False: a re-paired
    call does not pair tensor by tensor; the per-row stages must decide.

    Done iteration pair by iteration pair (``runs``: their rows, start to end): which calls tie
    depends only on the block's rows (kind, names, types, io, slot, call, shape, dtype
    class), so blocks with the same rows share it (:func:`_tie_groups`, computed once);
    only the fingerprints (statistics values, as codes: :func:`_fingerprint_codes`) are
    block by block, and only the groups where a fingerprint of A meets another call's in B
    (:func:`_cross_matches`, all blocks of a kind at once) can re-pair."""
    from .tie_break import pair_by_fingerprint      # the matcher's pairing of fingerprints
    cols = ("kind", "graph", "op_file", "call", "op", "op_type", "io", "slot", "shape")
    arr_a = {c: sa[c].to_numpy(dtype=object) for c in cols}
    dclass_a = np.empty(len(dclass), dtype=object)
    dclass_a[:] = dclass
    code_a, code_b = _fingerprint_codes(sa, sb)
    code_a_np, code_b_np = np.asarray(code_a, dtype=np.int64), np.asarray(code_b, dtype=np.int64)
    io_b, slot_b, ops_b = sb["io"].tolist(), sb["slot"].tolist(), sb["op"].tolist()
    ops_a, iob, slots = arr_a["op"], arr_a["io"], arr_a["slot"]
    bi_l = bi.tolist()
    ai_l = ai.tolist()
    memo: Dict[tuple, int] = {}                     # a block's rows -> its place in kinds
    kinds: List[List[tuple]] = []                   # (tie groups with their getters) of each kind of block
    tied: List[Tuple[int, int, int]] = []           # (start, end, kind) of the blocks holding tie groups
    for s0, e0 in runs:
        rows = ai[s0:e0]
        block = [arr_a[c][rows].tolist() for c in cols] + [dclass_a[rows].tolist()]
        try:
            key = tuple(tuple(x) for x in block)
            k = memo.get(key)
        except TypeError:                           # an unhashable cell: this block on its own
            key, k = None, None
        if k is None:
            k = len(kinds)
            kinds.append(_with_getters(_tie_groups(*block)))
            if key is not None:
                memo[key] = k
        if kinds[k]:
            tied.append((s0, e0, k))
    moved: List[Tuple[List[int], List[int]]] = []
    for (s0, e0, k), check in zip(tied, _cross_matches(tied, kinds, ai, bi, code_a_np, code_b_np)):
        if not check.any():
            continue                                # pair_by_fingerprint keeps every pair in place
        blk_a = code_a_np[ai[s0:e0]].tolist()       # the block's codes by row offset (one gather a side)
        blk_b = code_b_np[bi[s0:e0]].tolist()
        for (group, getters), needed in zip(kinds[k], check.tolist()):
            if not needed:
                continue
            fa = [g(blk_a) for g in getters]        # a call's fingerprint: its codes at its offsets
            fb = [g(blk_b) for g in getters]
            for x, y in pair_by_fingerprint(fa, fb):
                if x != y:
                    moved.append(([s0 + o for o in group[x][0]], [s0 + o for o in group[y][0]]))
    for kx, ky in moved:
        by_key = {(io_b[bi_l[k]], slot_b[bi_l[k]]): bi_l[k] for k in ky}
        if len(by_key) != len(ky) or len(kx) != len(ky):
            return False
        rule = RULE_NAME if ops_a[ai_l[kx[0]]] == ops_b[bi_l[ky[0]]] else RULE_ORDER
        for k in kx:
            j = by_key.get((iob[ai_l[k]], slots[ai_l[k]]))
            if j is None:
                return False
            bi[k] = j
            rules[k] = rule
    return True


def _with_getters(groups: List[List[tuple]]) -> List[Tuple[List[tuple], List[Callable]]]:
    """Each tie group with, per call, a function taking a block's codes (by row offset) to
    the call's fingerprint: the codes at its offsets as a tuple (``itemgetter``: made in C).
    Fingerprints are only compared with each other, for equality, within a group (the calls
    of one signature: as many offsets each), so a one-offset call's fingerprint may be the
    code itself instead of a 1-tuple."""
    return [(group, [itemgetter(*fp) for _, fp in group]) for group in groups]


def _cross_matches(tied, kinds, ai, bi, code_a, code_b) -> List[np.ndarray]:
    """Per tied block, per tie group: whether a call's fingerprint in A equals another
    call's in B (the same codes at their offsets).  Where none does, the matcher's
    :func:`.tie_break.pair_by_fingerprint` pairs every call with itself (a call can only find
    its own place's fingerprint; the calls left over take the free places in order: their
    own), so only the groups marked here can move.  Worked out for all blocks of one kind
    at once (the same offsets: one array of codes per side, blocks by rows)."""
    out: List[Optional[np.ndarray]] = [None] * len(tied)
    by_kind: Dict[int, List[int]] = {}
    for i, (_, _, k) in enumerate(tied):
        by_kind.setdefault(k, []).append(i)
    for k, idx in by_kind.items():
        starts = np.asarray([tied[i][0] for i in idx], dtype=np.int64)
        width = tied[idx[0]][1] - tied[idx[0]][0]
        at = starts[:, None] + np.arange(width, dtype=np.int64)
        ca, cb = code_a[ai[at]], code_b[bi[at]]     # blocks x row offsets
        flags = np.zeros((len(idx), len(kinds[k])), dtype=bool)
        for g, (group, _) in enumerate(kinds[k]):
            offs = [np.asarray(fp, dtype=np.int64) for _, fp in group]
            for x, ox in enumerate(offs):
                for y, oy in enumerate(offs):
                    if x != y and len(ox) == len(oy):
                        flags[:, g] |= (ca[:, ox] == cb[:, oy]).all(axis=1)
        for row, i in enumerate(idx):
            out[i] = flags[row]
    return out


def _tie_groups(kind, graphs, files, calls, ops, types, iob, slots, shapes, dclass) -> List[List[tuple]]:
    """The tie groups of one block's rows (A's side, in pair order): for each group of calls
    of one scope with equal signatures (two or more), per call (its row offsets, the offsets
    whose statistics make its fingerprint: outputs by slot, else all) -- :func:`.match._tie_break`'s
    grouping, as the per-row matcher makes it."""
    where: Dict[tuple, List[int]] = {}              # call key -> row offsets
    for k, kd in enumerate(kind):
        if kd != "op":
            continue
        key = (graphs[k], files[k], int(calls[k]))
        lst = where.get(key)
        if lst is None:
            where[key] = [k]
        else:
            lst.append(k)
    head: Dict[tuple, tuple] = {}                   # call -> (scope, base type); ties need two of one
    count: Dict[tuple, int] = {}
    for key, ks in where.items():
        op = ops[ks[0]]
        h = head[key] = (op.rsplit("/", 1)[0] if "/" in op else "", _base_type(types[ks[0]]))
        count[h] = count.get(h, 0) + 1
    scopes: Dict[str, Dict[tuple, List[tuple]]] = {}
    for key, ks in where.items():
        scope, base = head[key]
        if count[(scope, base)] < 2:
            continue                                # its signature occurs once in its scope: no tie
        cut = EXTRA_OUTPUTS.get(base)
        sig = [(iob[k], int(slots[k]), shape_from_text(shapes[k]), dclass[k]) for k in ks
               if not (cut is not None and iob[k] == "output" and int(slots[k]) >= cut)]
        sig = (canonical_type(base),) + tuple(sorted(sig, key=lambda s: (s[0], s[1])))
        outs = sorted((k for k in ks if iob[k] == "output"), key=lambda k: slots[k]) or list(ks)
        scopes.setdefault(scope, {}).setdefault(sig, []).append((ks, tuple(outs)))
    return [group for sigs in scopes.values() for group in sigs.values() if len(group) >= 2]
