"""Pairing the tensors of A with those of B: pluggable matchers run in turn over what is
still unpaired (one rank pair × one iteration pair at a time).

* :class:`MappingMatcher` -- the user's mapping file (explicit pairs win);
* :class:`AlignedOrderMatcher` -- per scope, the two execution orders are aligned as
  sequences of operator calls (``difflib.SequenceMatcher``) whose elements are the
  operator type and the signature of every tensor (io, slot, shape, dtype class). An
  operator inserted or missing on one side (an extra ``_to_copy`` from ``.float()``, a
  ``detach`` that only eager mode runs) is left out and shifts nothing; two calls are
  paired only when their signatures are equal, so a weight is never paired with a bias.
  The alignment is done twice -- on full name + signature (gaps then filled on signature
  alone), and on signature alone -- and the one pairing more operators wins (ties: the
  names), so renumbered names (eager vs compiled, an inserted operator) cannot anchor it;
* :class:`NameMatcher` -- what is left (parameters, constants, operators that ran in
  another order) by the same full name, io, slot and call, signatures equal;
* :class:`UniqueSignatureMatcher` -- operators that ran in another order within their
  scope and whose signature occurs once among the unpaired calls of that scope on each side;
* :func:`mark_front_end` -- what is still unpaired and exists on one side only because of
  the front end (:mod:`.frontend`) is marked ``front-end`` instead of unmatched.

Operator types are compared through :func:`.frontend.canonical_type`: an in-place operator
and its functional twin (``add_``/``add``), functionalization's twins
(``_native_batch_norm_legit_functional``/``native_batch_norm``, ``lift_fresh_copy``/
``lift_fresh``) are the same computation; a twin's extra outputs (the new running
statistics a functionalized batch norm returns) take no part in its signature.

Tie-break among equal signatures: two calls of one scope with the same type and tensor
signature (the weight-gradient and bias-gradient ``detach`` of a LayerNorm, accumulated in
one order by eager autograd and in the other around a compiled backward) cannot be told
apart by order. Where a scope holds several such calls, the aligned pairs of that signature
are re-paired by value identity: a call of A whose output data (the last 64 KiB of each output
file, or its statistics row) is byte-identical to that of a call of B is paired with it, in
order among equal fingerprints; the calls left over keep their aligned order. Values only
break ties between calls the rules already consider interchangeable, so a real difference
is still compared (and reported) against the call order gives it.

Guarantees: every tensor ends in at most one pair; two tensors of different shapes (or
dtype classes) are never paired by a rule (only a user mapping can pair them, and the
verdict stage then reports them as unmatched when their element counts differ).
"""
from __future__ import annotations

import os
from difflib import SequenceMatcher
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..reader import sanitize
from ..reader.statistics import STAT_COLUMNS
from .frontend import RULE_FRONT_END, adds_nothing, canonical_signature, is_front_end
from .mapping import split_tensor_ref
from .pairs import RULE_MAPPING, RULE_NAME, RULE_ORDER, RULE_SIGNATURE, OpCall, Pair, Tensor
from .tie_break import tie_break

#: the records' statistic keys (not the CSV headers) a statistics fingerprint is made of
STAT_KEYS = tuple(dict.fromkeys(STAT_COLUMNS.values()))

__all__ = ["Matching", "Matcher", "MappingMatcher", "AlignedOrderMatcher", "NameMatcher", "UniqueSignatureMatcher", "match", "align",
           "default_matchers", "mark_front_end"]


class Matching:
    """The tensors of one rank pair × iteration pair, the pairs made so far and what is free."""

    def __init__(self, a: Sequence[Tensor], b: Sequence[Tensor]):
        self.A = list(a)
        self.B = list(b)
        self.ios = frozenset(t.io for t in self.A) & frozenset(t.io for t in self.B)
        self.pairs: List[Pair] = []
        self.used_a: set = set()
        self.used_b: set = set()

    def take(self, i: int, j: int, rule: str) -> bool:
        if i in self.used_a or j in self.used_b:
            return False
        self.pairs.append(Pair(self.A[i], self.B[j], rule))
        self.used_a.add(i)
        self.used_b.add(j)
        return True

    def free_a(self) -> List[int]:
        return [i for i in range(len(self.A)) if i not in self.used_a]

    def free_b(self) -> List[int]:
        return [j for j in range(len(self.B)) if j not in self.used_b]

    def free_b_by_slot(self) -> Dict[Tuple[str, str, int, int], List[int]]:
        """B's free tensors by (operator file name, io, slot, call)."""
        idx: Dict[Tuple[str, str, int, int], List[int]] = {}
        for j in self.free_b():
            t = self.B[j]
            idx.setdefault((t.op_file, t.io, t.slot, t.call), []).append(j)
        return idx

    def unmatched(self) -> List[Pair]:
        return ([Pair(self.A[i], None) for i in self.free_a()]
                + [Pair(None, self.B[j]) for j in self.free_b()])


class Matcher:
    """A matching rule: adds pairs to a :class:`Matching` among its free tensors."""

    rule = ""

    def __call__(self, m: Matching) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class MappingMatcher(Matcher):
    """Pairs named by the user (operator names, or ``name:io.slot`` for single tensors)."""

    rule = RULE_MAPPING

    def __init__(self, mapping: Iterable[Tuple[str, str]]):
        self.op_map: Dict[str, str] = {}
        self.t_map: Dict[Tuple[str, str, int], Tuple[str, str, int]] = {}
        for an, bn in mapping:
            a_op, a_io, a_slot = split_tensor_ref(an)
            b_op, b_io, b_slot = split_tensor_ref(bn)
            if a_io is not None and b_io is not None:
                self.t_map[(sanitize(a_op), a_io, a_slot)] = (sanitize(b_op), b_io, b_slot)
            else:
                self.op_map[sanitize(a_op)] = sanitize(b_op)

    def __call__(self, m: Matching) -> None:
        if not self.op_map and not self.t_map:
            return
        idx = m.free_b_by_slot()
        for i in m.free_a():
            t = m.A[i]
            tgt = self.t_map.get((t.op_file, t.io, t.slot))
            if tgt is not None:
                key = (tgt[0], tgt[1], tgt[2], t.call)
            elif t.op_file in self.op_map:
                key = (self.op_map[t.op_file], t.io, t.slot, t.call)
            else:
                continue
            for j in idx.get(key, []):
                if m.take(i, j, self.rule):
                    break


def align(a: Sequence, b: Sequence) -> List[Tuple[int, int]]:
    """Order-preserving pairs (i, j) with ``a[i] == b[j]``: common prefix and suffix, then
    ``SequenceMatcher`` (no junk heuristic) on the middle -- linear when one side has a few
    insertions, which is the common case."""
    n, m = len(a), len(b)
    p = 0
    while p < n and p < m and a[p] == b[p]:
        p += 1
    s = 0
    while s < n - p and s < m - p and a[n - 1 - s] == b[m - 1 - s]:
        s += 1
    out = [(k, k) for k in range(p)]
    mid_a, mid_b = a[p:n - s], b[p:m - s]
    if mid_a and mid_b:
        sm = SequenceMatcher(None, mid_a, mid_b, autojunk=False)
        for blk in sm.get_matching_blocks():
            out.extend((p + blk.a + k, p + blk.b + k) for k in range(blk.size))
    out.extend((n - s + k, m - s + k) for k in range(s))
    return out


def _fill_gaps(anchors: List[Tuple[int, int]], a: Sequence, b: Sequence) -> List[Tuple[int, int]]:
    """Anchors plus an alignment of ``a`` and ``b`` inside every gap between two anchors."""
    out: List[Tuple[int, int]] = []
    pi, pj = 0, 0
    for i, j in anchors + [(len(a), len(b))]:
        if i > pi and j > pj:
            out.extend((pi + x, pj + y) for x, y in align(a[pi:i], b[pj:j]))
        if i < len(a) and j < len(b):
            out.append((i, j))
        pi, pj = i + 1, j + 1
    return out


def _calls(tensors: Sequence[Tensor], free: Iterable[int]) -> Dict[str, List[Tuple[OpCall, List[int]]]]:
    """Free operator tensors grouped into calls (execution order kept), per scope."""
    by_call: Dict[tuple, Tuple[OpCall, List[int]]] = {}
    order: List[tuple] = []
    for i in free:
        t = tensors[i]
        if t.kind != "op":
            continue
        k = t.call_key
        if k not in by_call:
            by_call[k] = (OpCall([], len(order)), [])
            order.append(k)
        by_call[k][0].tensors.append(t)
        by_call[k][1].append(i)
    out: Dict[str, List[Tuple[OpCall, List[int]]]] = {}
    for k in order:
        c = by_call[k]
        out.setdefault(c[0].scope, []).append(c)
    return out


_FINGERPRINT_BYTES = 1 << 16


def _tail(path: str) -> bytes:
    """The last 64 KiB of a file (all of it when smaller), read with one ``pread``: the bytes
    ``open``/``seek``/``read`` gave, without a buffered file object per file (a scope of
    thousands of small same-signature calls reads thousands of them)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - _FINGERPRINT_BYTES)
        parts = []
        pos = start
        while pos < size:
            chunk = os.pread(fd, size - pos, pos)
            if not chunk:
                break
            parts.append(chunk)
            pos += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)


def _fingerprint(c: OpCall) -> Optional[tuple]:
    """What identifies a call's output values (None: unknown): the last 64 KiB of each output
    file (the data; same-dtype files of one shape have the same header), else its statistics."""
    outs = sorted((t for t in c.tensors if t.io == "output"), key=lambda t: t.slot) or list(c.tensors)
    parts = []
    for t in outs:
        path = t.path
        if path:
            try:
                parts.append(hash(_tail(path)))
                continue
            except OSError:
                return None
        if t.has_stats:
            row = t.row
            parts.append(tuple([str(row[k]) for k in STAT_KEYS if k in row]))
            continue
        return None
    return tuple(parts) if parts else None


def _tie_break(chosen: List[Tuple[int, int]], sig_a: Sequence, ca: Sequence, cb: Sequence,
               sig_b: Sequence = ()) -> List[Tuple[int, int]]:
    """Re-pair the aligned calls of each signature that occurs more than once in the scope by
    value identity (module doc), or that a call left unpaired on either side shares
    (:func:`.tie_break.tie_break`); every other pair is kept."""
    return tie_break(chosen, sig_a, sig_b, lambda x: _fingerprint(ca[x][0]), lambda y: _fingerprint(cb[y][0]))


class AlignedOrderMatcher(Matcher):
    """Operators paired by aligning the two execution orders, scope by scope (module doc)."""

    rule = RULE_ORDER

    def __init__(self, order_on_tie: bool = False):
        #: when the name alignment and the signature alignment pair as many calls: the
        #: signature (execution order) one -- the online compare's batches, whose reference
        #: window starts at the first unpaired operator, so order is the position and a name
        #: shifted by an inserted operator (a ``.float()`` cast in one run) would pair the
        #: other of two equal calls (two LayerNorm-backward ``detach``); else the names
        self.order_on_tie = order_on_tie

    def __call__(self, m: Matching) -> None:
        ios = m.ios
        calls_a = _calls(m.A, m.free_a())
        calls_b = _calls(m.B, m.free_b())
        for scope, ca in calls_a.items():
            cb = calls_b.get(scope)
            if not cb:
                continue
            sig_a = [canonical_signature(c, ios) for c, _ in ca]
            sig_b = [canonical_signature(c, ios) for c, _ in cb]
            by_sig = align(sig_a, sig_b)
            if sig_a == sig_b:
                named = by_sig
            else:
                anchors = align([(c.op,) + s for (c, _), s in zip(ca, sig_a)],
                                [(c.op,) + s for (c, _), s in zip(cb, sig_b)])
                named = _fill_gaps(anchors, sig_a, sig_b) if anchors else by_sig
            tie_to_names = not self.order_on_tie and len(named) == len(by_sig)
            chosen = named if len(named) > len(by_sig) or tie_to_names else by_sig
            chosen = _tie_break(chosen, sig_a, ca, cb, sig_b)
            for x, y in chosen:
                (oa, ia), (ob, ib) = ca[x], cb[y]
                rule = RULE_NAME if oa.op == ob.op else self.rule
                jb = {m.B[j].tensor_key: j for j in ib}
                for i in ia:
                    if m.A[i].io not in ios:
                        continue
                    j = jb.get(m.A[i].tensor_key)
                    if j is not None:
                        m.take(i, j, rule)


class UniqueSignatureMatcher(Matcher):
    """Operators that ran in another order within their scope (autograd may accumulate a
    bias gradient before or after the weight's): among the calls still unpaired in a scope,
    a signature that occurs exactly once on each side pairs those two calls."""

    rule = RULE_SIGNATURE

    def __call__(self, m: Matching) -> None:
        ios = m.ios
        calls_b = _calls(m.B, m.free_b())
        for scope, ca in _calls(m.A, m.free_a()).items():
            cb = calls_b.get(scope)
            if not cb:
                continue
            count_a: Dict[tuple, List[int]] = {}
            count_b: Dict[tuple, List[int]] = {}
            for x, (c, _) in enumerate(ca):
                count_a.setdefault(canonical_signature(c, ios), []).append(x)
            for y, (c, _) in enumerate(cb):
                count_b.setdefault(canonical_signature(c, ios), []).append(y)
            for sig, xs in count_a.items():
                ys = count_b.get(sig, [])
                if len(xs) != 1 or len(ys) != 1:
                    continue
                (oa, ia), (ob, ib) = ca[xs[0]], cb[ys[0]]
                jb = {m.B[j].tensor_key: j for j in ib}
                for i in ia:
                    j = jb.get(m.A[i].tensor_key)
                    if j is not None and m.A[i].io in ios:
                        m.take(i, j, RULE_NAME if oa.op == ob.op else self.rule)


class NameMatcher(Matcher):
    """The same full name, io, slot and call, with equal signatures (same graph first)."""

    rule = RULE_NAME

    def __call__(self, m: Matching) -> None:
        idx = m.free_b_by_slot()
        for i in m.free_a():
            t = m.A[i]
            cands = [j for j in idx.get((t.op_file, t.io, t.slot, t.call), [])
                     if j not in m.used_b and m.B[j].signature() == t.signature()]
            if not cands:
                continue
            same_graph = [j for j in cands if m.B[j].graph == t.graph]
            m.take(i, (same_graph or cands)[0], self.rule)


def default_matchers(mapping: Optional[Iterable[Tuple[str, str]]] = None,
                     order_on_tie: bool = False) -> List[Matcher]:
    """Mapping (when given), aligned order (``order_on_tie``: :class:`AlignedOrderMatcher`),
    name, then unique signature."""
    out: List[Matcher] = []
    if mapping:
        out.append(MappingMatcher(mapping))
    out += [AlignedOrderMatcher(order_on_tie), NameMatcher(), UniqueSignatureMatcher()]
    return out


def mark_front_end(m: Matching) -> List[Pair]:
    """The tensors still unpaired: ``front-end`` (rule) when only the front end puts them on
    one side (:func:`.frontend.is_front_end`), plain unmatched otherwise."""
    paired_calls = {m.A[i].call_key for i in m.used_a}, {m.B[j].call_key for j in m.used_b}
    out = []
    for side, idx in ((0, m.free_a()), (1, m.free_b())):
        tensors = m.A if side == 0 else m.B
        calls: Dict[tuple, List[Tensor]] = {}
        for i in idx:
            if tensors[i].kind == "op" and tensors[i].call_key not in paired_calls[side]:
                calls.setdefault(tensors[i].call_key, []).append(tensors[i])
        no_op = {k for k, ts in calls.items() if adds_nothing(ts)}
        for i in idx:
            t = tensors[i]
            front = t.call_key in no_op or is_front_end(t, t.call_key in paired_calls[side])
            rule = RULE_FRONT_END if front else ""
            out.append(Pair(t, None, rule) if side == 0 else Pair(None, t, rule))
    return out


def match(a: Sequence[Tensor], b: Sequence[Tensor], matchers: Sequence[Matcher]) -> List[Pair]:
    """Every tensor of ``a`` and ``b`` in exactly one :class:`Pair` (matched or unmatched)."""
    m = Matching(a, b)
    for matcher in matchers:
        matcher(m)
    return m.pairs + mark_front_end(m)
