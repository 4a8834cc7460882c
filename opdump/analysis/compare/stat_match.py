"""The default matchers of :mod:`.match` run over a statistics-only dump's record columns
(row positions, small ints and strings) instead of one :class:`.pairs.Tensor` object per row.

Why: a statistics-only compare of two runs whose sequences differ (fp32 against bf16
autocast: extra casts on one side) cannot take the join of :mod:`.stat_fast`; its matching
took ~3 of ~9 s on 150,000 rows a side, most of it in attribute reads, per-call signature
tuples (shapes, dtype classes) hashed again and again, and fingerprints built call by call.
Here each tensor's signature ``(io, slot, shape, dtype class)`` is a code (one table for both
sides), a call's signature a tuple of codes, a call's statistics fingerprint a tuple of the
codes of :func:`.stat_fast._fingerprint_codes`; the alignment (:func:`.match.align`,
:func:`.match._fill_gaps`) and the tie-break (:func:`.tie_break.pair_by_fingerprint`) are the
matcher's own functions on those codes (they look only at equality and order, which codes
keep).

When it applies: the default matchers (no mapping, no kernel dump), every row a statistics
row without a file (the fingerprint of a call is then its statistics, and no ``add`` can be
shown to add nothing: there are no files to compare).

Guarantee (tests/test_compare_stat_match.py checks it against :func:`.match.match`): for one
rank pair, the same pairs -- the same tensors, the same rule -- as :func:`.match.match` with
:func:`.match.default_matchers` makes them, iteration pair by iteration pair (aligned order,
name, unique signature, then the unpaired tensors marked ``front-end`` or not).  Within an
iteration pair the aligned-order pairs come in A's row order (:mod:`.stat_align`), not the
matcher's: ``compare`` sorts all pairs by :meth:`.pairs.Pair.sort_key`, one key per tensor.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .frontend import EXTRA_OUTPUTS, RULE_FRONT_END, canonical_type, is_front_end
from .match import _fill_gaps, align
from .tie_break import tie_break
from .pairs import RULE_NAME, RULE_ORDER, RULE_SIGNATURE, _base_type, dtype_class, shape_from_text
from .stat_align import CallTable, aligned
from .stat_cells import iterations_of, per_distinct

__all__ = ["ColumnSide", "match_rank", "sides_of"]

#: one pair of row positions: (row of A or None, row of B or None, rule)
RowPair = Tuple[Optional[int], Optional[int], str]


def _ints(ser) -> List[int]:
    """A column's cells as ``int`` (Tensor's ``int(row[k])``): an integer column as it is."""
    if ser.dtype.kind in "iu":
        return ser.to_numpy().tolist()
    values = ser.tolist()
    return values if all(type(v) is int for v in values) else [int(v) for v in values]


def _same(x):
    return x


def _coder(codes: Dict[Any, int], f):
    """``x -> codes[f(x)]``, a new code for each new ``f(x)`` (the table shared by both sides)."""
    def code(x):
        return codes.setdefault(f(x), len(codes))
    return code


def _dclass(d: Any) -> str:
    return dtype_class(d if isinstance(d, str) and d else None)


class _Row:
    """What :func:`.frontend.is_front_end` reads of a tensor."""
    __slots__ = ("kind", "op_type", "io", "slot")

    def __init__(self, kind, op_type, io, slot):
        self.kind, self.op_type, self.io, self.slot = kind, op_type, io, slot


class ColumnSide:
    """One side's records as plain lists (a Tensor's identity fields, row by row), tensor
    signature codes from a table shared with the other side, fingerprint codes."""

    def __init__(self, rec, codes: Dict[str, Dict[Any, int]], fp: List[int]):
        self.kind = rec["kind"].tolist()
        self.op = rec["op"].tolist()
        self.op_file = rec["op_file"].tolist()
        self.op_type = rec["op_type"].tolist()
        self.io = rec["io"].tolist()
        self.slot = _ints(rec["slot"])
        self.call = _ints(rec["call"])
        self.graph = _ints(rec["graph"])
        self.iteration = iterations_of(rec["iteration"])
        # Tensor.signature() (io, slot, shape, dtype class) as one int: each part's code in its bits
        self.io_code = _code_array(_coder(codes["io"], _same), self.io)
        shape_c = _code_array(_coder(codes["shape"], shape_from_text), rec["shape"].tolist())
        dcl_c = _code_array(_coder(codes["dclass"], _dclass),
                            rec["dtype"].tolist() if "dtype" in rec.columns else [None] * len(rec))
        self.slot_arr = slot = np.asarray(self.slot, dtype=np.int64)
        if (len(slot) and (slot.min() < 0 or slot.max() >= 1 << 20) or len(codes["shape"]) >= 1 << 24
                or len(codes["io"]) >= 1 << 11 or len(codes["dclass"]) >= 1 << 8):
            raise ValueError("slot or shape codes out of range")
        self.tsig_arr = ((self.io_code << 52) | (slot << 32)
                         | (shape_c << 8) | dcl_c)
        self.tsig = self.tsig_arr.tolist()
        #: per row a code of its iteration (dense, equal where the iterations are)
        self.it_code = _distinct_codes(self.iteration)
        #: per row a code of its call (iteration, graph, operator file name, call): equal
        #: codes exactly where those tuples (a Tensor's ``call_key``) are equal
        self.call_code = _call_codes(self.it_code, _int_codes(self.graph), _distinct_codes(self.op_file),
                                     _int_codes(self.call))
        self.calls_of_rows = self.call_code.tolist()
        self.is_op = np.asarray(self.kind, dtype=object) == "op"
        self.fp = fp
        self.n = len(self.kind)


def _code_array(code, cells: list) -> np.ndarray:
    """``np.asarray(per_distinct(code, cells))`` for an int-valued ``code``, without the
    list in between."""
    try:
        seen = dict.fromkeys(cells)
        for x in seen:
            seen[x] = code(x)
        return np.fromiter(map(seen.__getitem__, cells), dtype=np.int64, count=len(cells))
    except (KeyError, TypeError):
        return np.asarray([code(x) for x in cells], dtype=np.int64)


def _distinct_codes(cells: list) -> np.ndarray:
    """A code per cell, equal exactly where the cells are (a dict's equality), first seen 0."""
    table: Dict[Any, int] = {}
    return _code_array(lambda x: table.setdefault(x, len(table)), cells)


def _int_codes(ints: List[int]) -> np.ndarray:
    """A code from 0 per ``int``, equal exactly where the ints are (each less the smallest
    when they span under 2**20, else dense codes)."""
    import pandas as pd
    arr = np.asarray(ints, dtype=np.int64)
    if len(arr) and int(arr.max()) - int(arr.min()) < 1 << 20:
        return arr - arr.min()
    return pd.factorize(arr)[0].astype(np.int64, copy=False)


def _call_codes(*codes: np.ndarray) -> np.ndarray:
    """A code per row, equal exactly where the rows' tuples of ``codes`` (each from 0) are:
    mixed radix, squeezed back to dense codes where it would overflow."""
    import pandas as pd
    out = np.zeros(len(codes[0]), dtype=np.int64)
    span = 1
    for c in codes:
        card = int(c.max(initial=-1)) + 1
        if span * card >= 1 << 62:
            out = pd.factorize(out)[0].astype(np.int64, copy=False)
            span = int(out.max(initial=-1)) + 1
        out = out * card + c
        span *= card
    return out


def sides_of(sa, sb) -> Optional[Tuple[ColumnSide, ColumnSide]]:
    """Both sides' columns, or None when a column cannot be read as the Tensor fields are."""
    from .stat_sides import _fingerprint_codes
    try:
        fa, fb = _fingerprint_codes(sa, sb)
        codes: Dict[str, Dict[Any, int]] = {"io": {}, "shape": {}, "dclass": {}}
        A, B = ColumnSide(sa, codes, fa), ColumnSide(sb, codes, fb)
        io_rank = {x: k for k, x in enumerate(sorted(set(A.io) | set(B.io)))}
        rank_of_code = np.asarray([io_rank[x] for x in codes["io"]], dtype=np.int64)   # (codes: first seen order)
        A.io_ranks, B.io_ranks = rank_of_code[A.io_code], rank_of_code[B.io_code]
        A.io_names = B.io_names = list(codes["io"])
        big = max(A.slot + B.slot, default=0) + 1
        op_codes: Dict[str, int] = {}
        A.calls, B.calls = CallTable(A, io_rank, big, op_codes), CallTable(B, io_rank, big, op_codes)
        A.io_rank = B.io_rank = io_rank
        return A, B
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


class _Calls:
    """Free operator rows grouped into calls (first-seen order), per scope (first-seen order):
    :func:`.match._calls` on row positions."""

    def __init__(self, s: ColumnSide, free: Sequence[int]):
        by_call: Dict[int, List[int]] = {}
        kind, ck = s.kind, s.calls_of_rows
        for i in free:
            if kind[i] != "op":
                continue
            lst = by_call.get(ck[i])
            if lst is None:
                by_call[ck[i]] = [i]
            else:
                lst.append(i)
        self.scopes: Dict[str, List[List[int]]] = {}
        op = s.op
        for rows in by_call.values():
            o = op[rows[0]]
            self.scopes.setdefault(o.rsplit("/", 1)[0] if "/" in o else "", []).append(rows)


def _signature(s: ColumnSide, rows: List[int], ios: frozenset, sig_codes: Dict[tuple, int]) -> int:
    """:func:`.frontend.canonical_signature` of a call (its rows) as a code."""
    base = _base_type(s.op_type[rows[0]])
    cut = EXTRA_OUTPUTS.get(base)
    io, slot, tsig = s.io, s.slot, s.tsig
    if cut is None:
        keep = [k for k in rows if io[k] in ios]
    else:
        keep = [k for k in rows if io[k] in ios and not (io[k] == "output" and slot[k] >= cut)]
    keep.sort(key=lambda k: (io[k], slot[k]))
    # (the key :meth:`.stat_align.CallTable.signatures` gives a call all of whose rows are free)
    key = (canonical_type(base), np.asarray([tsig[k] for k in keep], dtype=np.int64).tobytes())
    return sig_codes.setdefault(key, len(sig_codes))


def _signatures(s: ColumnSide, calls: List[List[int]], ios: frozenset, sig_codes: Dict[tuple, int]) -> List[int]:
    """:func:`_signature` of each call (its free rows): a call all of whose rows are free
    takes its code from the call table when the aligned stage worked it out."""
    t = s.calls
    whole = t.sigs.get(ios) if t.unique else None
    if whole is None:
        return [_signature(s, c, ios, sig_codes) for c in calls]
    cid, size = t.cid, t.size
    out = []
    for c in calls:
        k = cid[c[0]]
        out.append(whole[k] if size[k] == len(c) else _signature(s, c, ios, sig_codes))
    return out


def _fingerprint(s: ColumnSide, rows: List[int]) -> tuple:
    """:func:`.match._fingerprint` of a call of statistics rows: its outputs' codes by slot."""
    io, slot, fp = s.io, s.slot, s.fp
    outs = sorted((k for k in rows if io[k] == "output"), key=lambda k: slot[k]) or list(rows)
    return tuple([fp[k] for k in outs])


class _Matching:
    """:class:`.match.Matching` over row positions of the two sides."""

    def __init__(self, A: ColumnSide, B: ColumnSide, ra: List[int], rb: List[int]):
        self.A, self.B, self.ra, self.rb = A, B, ra, rb
        names = A.io_names                                # (io codes: one table for both sides)
        self.ios = (frozenset([names[c] for c in np.unique(A.io_code[np.asarray(ra, dtype=np.int64)]).tolist()])
                    & frozenset([names[c] for c in np.unique(B.io_code[np.asarray(rb, dtype=np.int64)]).tolist()]))
        self.pairs: List[RowPair] = []
        #: pairs made in bulk (:func:`.stat_align._take`): (A rows, B rows, rules) arrays
        self.bulk: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.used_a: set = set()
        self.used_b: set = set()
        self._free_a: Tuple[int, List[int]] = (0, ra)
        self._free_b: Tuple[int, List[int]] = (0, rb)

    def take(self, i: int, j: int, rule: str) -> None:
        if i in self.used_a or j in self.used_b:
            return
        self.pairs.append((i, j, rule))
        self.used_a.add(i)
        self.used_b.add(j)

    def free_a(self) -> List[int]:
        """A's rows not in a pair (a new list only after a pair was made: rows are never
        freed again)."""
        if self._free_a[0] != len(self.used_a):
            u = self.used_a
            self._free_a = (len(u), [i for i in self.ra if i not in u])
        return self._free_a[1]

    def free_b(self) -> List[int]:
        if self._free_b[0] != len(self.used_b):
            u = self.used_b
            self._free_b = (len(u), [j for j in self.rb if j not in u])
        return self._free_b[1]

    def take_calls(self, ia: List[int], ib: List[int], rule: str) -> None:
        """The tensors of two paired calls, by (io, slot), io among both sides' ios."""
        A, B, ios = self.A, self.B, self.ios
        jb = {(B.io[j], B.slot[j]): j for j in ib}
        for i in ia:
            if A.io[i] not in ios:
                continue
            j = jb.get((A.io[i], A.slot[i]))
            if j is not None:
                self.take(i, j, rule)


def _scope_calls(m: _Matching):
    """(A's calls, B's calls) of each scope both sides still have free rows in."""
    calls_b = _Calls(m.B, m.free_b()).scopes
    for scope, ca in _Calls(m.A, m.free_a()).scopes.items():
        cb = calls_b.get(scope)
        if cb:
            yield ca, cb


def _aligned(m: _Matching, sig_codes: Dict[tuple, int]) -> None:
    """:class:`.match.AlignedOrderMatcher` (with its value tie-break)."""
    A, B, ios = m.A, m.B, m.ios
    for ca, cb in _scope_calls(m):
        sig_a = [_signature(A, c, ios, sig_codes) for c in ca]
        sig_b = [_signature(B, c, ios, sig_codes) for c in cb]
        by_sig = align(sig_a, sig_b)
        if sig_a == sig_b:
            named = by_sig
        else:
            anchors = align([(A.op[c[0]], s) for c, s in zip(ca, sig_a)],
                            [(B.op[c[0]], s) for c, s in zip(cb, sig_b)])
            named = _fill_gaps(anchors, sig_a, sig_b) if anchors else by_sig
        chosen = named if len(named) >= len(by_sig) else by_sig
        chosen = _tie_break(chosen, sig_a, ca, cb, A, B, sig_b)
        for x, y in chosen:
            ia, ib = ca[x], cb[y]
            m.take_calls(ia, ib, RULE_NAME if A.op[ia[0]] == B.op[ib[0]] else RULE_ORDER)


def _tie_break(chosen, sig_a, ca, cb, A: ColumnSide, B: ColumnSide, sig_b=()) -> List[Tuple[int, int]]:
    """:func:`.match.tie_break` with statistics fingerprints."""
    return tie_break(chosen, sig_a, sig_b, lambda x: _fingerprint(A, ca[x]), lambda y: _fingerprint(B, cb[y]))


def _by_name(m: _Matching) -> None:
    """:class:`.match.NameMatcher`."""
    A, B = m.A, m.B
    idx: Dict[tuple, List[int]] = {}
    for j in m.free_b():
        idx.setdefault((B.op_file[j], B.io[j], B.slot[j], B.call[j]), []).append(j)
    used_b = m.used_b
    for i in m.free_a():
        js = idx.get((A.op_file[i], A.io[i], A.slot[i], A.call[i]))
        if not js:
            continue
        sig = A.tsig[i]
        cands = [j for j in js if j not in used_b and B.tsig[j] == sig]
        if not cands:
            continue
        g = A.graph[i]
        same_graph = [j for j in cands if B.graph[j] == g]
        m.take(i, (same_graph or cands)[0], RULE_NAME)


def _unique_signature(m: _Matching, sig_codes: Dict[tuple, int]) -> None:
    """:class:`.match.UniqueSignatureMatcher`."""
    A, B, ios = m.A, m.B, m.ios
    for ca, cb in _scope_calls(m):
        count_a: Dict[int, List[int]] = {}
        count_b: Dict[int, List[int]] = {}
        for x, sig in enumerate(_signatures(A, ca, ios, sig_codes)):
            count_a.setdefault(sig, []).append(x)
        for y, sig in enumerate(_signatures(B, cb, ios, sig_codes)):
            count_b.setdefault(sig, []).append(y)
        for sig, xs in count_a.items():
            ys = count_b.get(sig, [])
            if len(xs) != 1 or len(ys) != 1:
                continue
            ia, ib = ca[xs[0]], cb[ys[0]]
            m.take_calls(ia, ib, RULE_NAME if A.op[ia[0]] == B.op[ib[0]] else RULE_SIGNATURE)


def _front_end(m: _Matching) -> List[RowPair]:
    """:func:`.match.mark_front_end` (no file: no call can be shown to add nothing)."""
    A, B = m.A, m.B
    paired = (set(A.call_code[list(m.used_a)].tolist()), set(B.call_code[list(m.used_b)].tolist()))
    out: List[RowPair] = []
    memo: Dict[tuple, bool] = {}
    for side, s, free in ((0, A, m.free_a()), (1, B, m.free_b())):
        for i in free:
            call_paired = s.calls_of_rows[i] in paired[side]
            key = (s.kind[i], s.op_type[i], s.io[i], s.slot[i], call_paired)
            front = memo.get(key)
            if front is None:
                front = memo[key] = is_front_end(_Row(*key[:4]), call_paired)
            rule = RULE_FRONT_END if front else ""
            out.append((i, None, rule) if side == 0 else (None, i, rule))
    return out


def match_rank(A: ColumnSide, B: ColumnSide, it_pairs) -> List[RowPair]:
    """Every row of A and B (one rank pair) in exactly one pair, iteration pair by iteration
    pair in ``it_pairs`` order, as :func:`.match.match` pairs the tensors of those rows."""
    out: List[RowPair] = []
    for ai, bi, rules in _rank_parts(A, B, it_pairs):
        out += [(None if i < 0 else i, None if j < 0 else j, r) for i, j, r in zip(ai.tolist(), bi.tolist(), rules)]
    return out


def _rank_parts(A: ColumnSide, B: ColumnSide, it_pairs) -> List[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """:func:`match_rank`'s pairs, in its order, as chunks of (A rows, B rows, rules) arrays
    (-1: no partner)."""
    from .stat_sides import _positions                  # rows of each iteration, in row order
    pos_a = {k: v.tolist() for k, v in _positions(A.iteration).items()}
    pos_b = {k: v.tolist() for k, v in _positions(B.iteration).items()}
    sig_codes: Dict[tuple, int] = {}
    plans: dict = {}
    out: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for ia, ib in it_pairs:
        m = _Matching(A, B, pos_a.get(ia, []), pos_b.get(ib, []))
        if not aligned(m, sig_codes, A.io_rank, plans):          # numpy passes (.stat_align), else call by call
            _aligned(m, sig_codes)
        _by_name(m)
        _unique_signature(m, sig_codes)
        out += m.bulk
        rest = m.pairs + _front_end(m)
        if rest:
            rules = np.empty(len(rest), dtype=object)
            rules[:] = [r for _, _, r in rest]
            out.append((np.fromiter((-1 if i is None else i for i, _, _ in rest), dtype=np.int64, count=len(rest)),
                        np.fromiter((-1 if j is None else j for _, j, _ in rest), dtype=np.int64, count=len(rest)),
                        rules))
    return out


def column_pairs(da, ra, db, rb, io, include_parameters, ta, tb, it_pairs) -> Optional[list]:
    """``compare``'s pairs of one rank pair (``ta``/``tb``: its tensors, made of the records
    :func:`.stat_fast._side` selects) matched over the columns, or None when this does not
    apply (module doc; ``OPDUMP_COMPARE_FAST=0`` too): the caller then runs the matchers."""
    from .pairs import Pair
    from .stat_sides import _side, _usable, enabled
    if not enabled() or ra not in da.ranks or rb not in db.ranks:
        return None
    sa, sb = _side(da, ra, io, include_parameters), _side(db, rb, io, include_parameters)
    if len(sa) != len(ta) or len(sb) != len(tb) or not _usable(sa) or not _usable(sb):
        return None
    sides = sides_of(sa, sb)
    if sides is None:
        return None
    return [Pair(None if i is None else ta[i], None if j is None else tb[j], rule)
            for i, j, rule in match_rank(sides[0], sides[1], it_pairs)]


def row_part(sa, sb, it_pairs):
    """``(A rows, B rows, rules)`` of one rank pair as :mod:`.stat_pairs` takes them (-1 where
    a tensor has no partner: ``Pair(a, None)``/``Pair(None, b)``), in :func:`match_rank`'s
    order, or None when the columns cannot be read as the Tensor fields are."""
    sides = sides_of(sa, sb)
    if sides is None:
        return None
    parts = _rank_parts(sides[0], sides[1], it_pairs)
    if not parts:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=object)
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))
