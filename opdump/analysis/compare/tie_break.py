"""The aligned order's value tie-break of one scope (:class:`.match.AlignedOrderMatcher`),
one function for the object matcher (:func:`.match._tie_break`) and the column-wise ones
(:mod:`.stat_match`, :mod:`.stat_align`): both keep giving the same pairs
(tests/test_compare_stat_match.py's property test).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

__all__ = ["tie_break", "by_values", "value_groups", "pair_by_fingerprint"]


def tie_break(chosen: List[Tuple[int, int]], sig_a: Sequence, sig_b: Sequence,
              fp_a: Callable[[int], Any], fp_b: Callable[[int], Any]) -> List[Tuple[int, int]]:
    """The value tie-break of one scope's aligned calls ``chosen`` (positions (x, y) into
    the scope's calls, ``sig_a``/``sig_b`` their signatures, ``fp_a``/``fp_b`` their
    fingerprints, None: unknown), shared by this matcher and the column-wise ones.

    A signature whose aligned calls are all the calls of that signature in the scope, on
    both sides: its calls re-paired by :func:`pair_by_fingerprint` when it has two or more
    whose fingerprints differ.  A signature that a call left unpaired by the alignment also
    has (one side ran an extra call of the same scope, type and tensors: a mask computed and
    not used, four ``transpose`` where the other side runs one): the aligned pairs whose
    fingerprints are equal are kept; every other call of that signature, aligned or not,
    takes in order the first call of the other side with an equal fingerprint; the aligned
    pairs left whole are kept.  An unknown fingerprint keeps the aligned pairs as they are."""
    parts = _by_signature(chosen, sig_a, sig_b)
    if parts is None:
        return chosen
    out: List[Tuple[int, int]] = []
    for group, ea, eb, reads in parts:
        out += by_values(group, ea, eb, fp_a, fp_b) if reads else group
    return out


def by_values(group: List[Tuple[int, int]], ea: List[int], eb: List[int],
              fp_a: Callable[[int], Any], fp_b: Callable[[int], Any]) -> List[Tuple[int, int]]:
    """:func:`tie_break`'s pairs of one signature: its aligned pairs ``group`` and the calls
    ``ea``/``eb`` the alignment left unpaired that share it."""
    fa = [fp_a(x) for x, _ in group]
    fb = [fp_b(y) for _, y in group]
    if fa == fb or None in fa or None in fb:
        return group
    if not ea and not eb:
        return [(group[i][0], group[j][1]) for i, j in pair_by_fingerprint(fa, fb)]
    fea, feb = [fp_a(x) for x in ea], [fp_b(y) for y in eb]
    if None in fea or None in feb:
        return group
    return _with_extras(group, fa, fb, list(zip(ea, fea)), list(zip(eb, feb)))


def value_groups(chosen: List[Tuple[int, int]], sig_a: Sequence, sig_b: Sequence):
    """``(kept, read)``: the pairs of ``chosen`` :func:`tie_break` keeps whatever the
    fingerprints, and the ``(group, ea, eb)`` of each signature whose pairs it works out by
    :func:`by_values`; its answer is ``kept`` and those pairs (in another order).  Depends
    on the signatures and ``chosen`` only."""
    parts = _by_signature(chosen, sig_a, sig_b)
    if parts is None:
        return chosen, []
    kept: List[Tuple[int, int]] = []
    read = []
    for group, ea, eb, reads in parts:
        if reads:
            read.append((group, ea, eb))
        else:
            kept += group
    return kept, read


def _by_signature(chosen: List[Tuple[int, int]], sig_a: Sequence, sig_b: Sequence):
    """Per signature of ``chosen`` (first seen first): its aligned pairs, the calls of A and
    of B the alignment left unpaired that share it (none without ``sig_b``), and whether
    :func:`by_values` has to work its pairs out (two pairs or more, or such a call); None
    when no signature has to."""
    groups: Dict[Any, List[Tuple[int, int]]] = {}
    for x, y in chosen:
        groups.setdefault(sig_a[x], []).append((x, y))
    extra_a: Dict[Any, List[int]] = {}
    extra_b: Dict[Any, List[int]] = {}
    if sig_b:
        used_a, used_b = {x for x, _ in chosen}, {y for _, y in chosen}
        for x, s in enumerate(sig_a):
            if x not in used_a and s in groups:
                extra_a.setdefault(s, []).append(x)
        for y, s in enumerate(sig_b):
            if y not in used_b and s in groups:
                extra_b.setdefault(s, []).append(y)
    if len(groups) == len(chosen) and not extra_a and not extra_b:
        return None
    out = []
    for s, group in groups.items():
        ea, eb = extra_a.get(s, []), extra_b.get(s, [])
        out.append((group, ea, eb, len(group) >= 2 or bool(ea) or bool(eb)))
    return out


def _with_extras(group, fa, fb, ea, eb) -> List[Tuple[int, int]]:
    """:func:`tie_break` of a signature whose unpaired calls ``ea``/``eb`` ((position,
    fingerprint)) join the aligned ``group``."""
    same = [f == g for f, g in zip(fa, fb)]
    kept = [p for p, s in zip(group, same) if s]
    rest_a = sorted([(x, f) for (x, _), f, s in zip(group, fa, same) if not s] + ea, key=_first)
    free_b: Dict[Any, List[int]] = {}
    for y, g in sorted([(y, g) for (_, y), g, s in zip(group, fb, same) if not s] + eb, key=_first):
        free_b.setdefault(g, []).append(y)
    taken_a, taken_b = set(), set()
    found = []
    for x, f in rest_a:
        ys = free_b.get(f)
        if ys:
            y = ys.pop(0)
            found.append((x, y))
            taken_a.add(x)
            taken_b.add(y)
    whole = [(x, y) for (x, y), s in zip(group, same) if not s and x not in taken_a and y not in taken_b]
    return sorted(kept + found + whole)


def _first(item) -> Any:
    return item[0]


def pair_by_fingerprint(fa: Sequence, fb: Sequence) -> List[Tuple[int, int]]:
    """Positions ``(i, j)`` pairing ``fa`` with ``fb``: each ``i`` in order takes the first free
    ``j`` with an equal fingerprint; the ``i`` left over take the free ``j`` in order (the value
    tie-break's rule, also reproduced on columns by :mod:`.stat_fast`)."""
    free: Dict[Any, List[int]] = {}
    for j, f in enumerate(fb):
        free.setdefault(f, []).append(j)
    out: List[Tuple[int, int]] = []
    left: List[int] = []
    for i, f in enumerate(fa):
        js = free.get(f)
        if js:
            out.append((i, js.pop(0)))
        else:
            left.append(i)
    taken = {j for _, j in out}
    return out + list(zip(left, [j for j in range(len(fb)) if j not in taken]))
