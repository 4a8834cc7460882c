"""The pairs of a statistics-only compare as columns (:mod:`.stat_fast`): verdicts, the
table, the summary and where A and B part, with the per-row stages' rules.

Guarantee: for pairs made as :mod:`.stat_fast` makes them, the same verdicts
(:func:`.verdict.judge_pair` then :func:`.stat_columns.judge_columns`), table (columns,
values, dtypes, order: :meth:`.pairs.Pair.sort_key`), counts, first difference and first
divergence as ``compare``'s per-row stages.  First difference/divergence are computed by
:mod:`.first` itself, on :class:`.pairs.Pair` records built only for the pairs those
functions can look at (the differing ones and the calls they name), in table order.
"""
from __future__ import annotations

import operator
from collections import Counter
from itertools import compress, repeat
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..common import is_garbage, is_random_op
from .fields import make_tensors
from .first import first_difference, first_divergence
from .noise_columns import demote_stat_columns
from .pairs import TABLE_COLUMNS, Pair, _shape_text, shape_from_text
from .result import CompareResult, rule_of
from .stat_csv import Cells
from .stat_result import StatCompareResult, with_cells
from ..undefined import or_undefined
from .stat_cells import iterations_of, per_distinct, scatter
from .stat_columns import _VALUES, column_of_values, judge_columns
from .stat_gather import take_cells as _take
from .stat_onesided import add_one_sided, call_counts, summary_lists, unmatched_warning
from .stat_calls import _KeysOnce, _same_columns, first_rows, operator_calls, row_keys

__all__ = ["StatPairs", "finish_result"]

_SKIPPED = "undefined values (uninitialised or overwritten)"
_NOT_COMPARED = frozenset(("unreadable", "unmatched"))
_DIVERGED = frozenset(("diverged", "nondeterministic"))
_FIRST_CALLS = 64           # calls materialised for the first difference before trying them all


def _dtype(v: Any) -> Optional[str]:
    return v if isinstance(v, str) and v else None          # Tensor.dtype (no np_dtype: no file)


def _shape_text_of(t: Any) -> Optional[str]:
    s = shape_from_text(t)
    return None if s is None else _shape_text(s)


def _shape_texts(texts: List[Any]) -> List[Optional[str]]:
    return per_distinct(_shape_text_of, texts)


def add_identity(c: Dict[str, list], sa, sb, ai: np.ndarray, bi: np.ndarray, rules: np.ndarray) -> None:
    """Append to the columns ``c`` what identifies each pair of one part (A's rows ``ai`` of
    ``sa``, B's rows ``bi`` of ``sb``): A's rank…op_file, B's op…call (``*_b``), both
    iterations and the matching rule (shared by the statistics and tensor-file pairs)."""
    for k in ("rank", "graph", "op", "op_type", "kind", "io", "slot", "call", "order", "op_file"):
        c[k] += _take(sa, k, ai)
    for k, dst in (("op", "op_b"), ("op_type", "op_type_b"), ("io", "io_b"), ("slot", "slot_b"),
                   ("kind", "kind_b"), ("rank", "rank_b"), ("graph", "graph_b"), ("op_file", "op_file_b"),
                   ("call", "call_b")):
        c[dst] += _take(sb, k, bi)
    c["iteration"] += _iterations(sa, ai)
    c["iteration_b"] += _iterations(sb, bi)
    c["match"] += rules.tolist()


def _iterations(frame, rows: np.ndarray) -> List[Optional[int]]:
    """The iteration of each row (None where missing)."""
    its = iterations_of(frame["iteration"])
    return list(map(its.__getitem__, rows.tolist()))


def _dtypes(cells: List[Any]) -> List[Optional[str]]:
    return per_distinct(_dtype, cells)


def _stat_part(frame, col: str, rows: np.ndarray):
    """One part of a statistic column: ("num", float64 values) where the frame's column is
    of int or float dtype (every cell known), else ("obj", the cells as Python objects)."""
    if col not in frame.columns:
        return ("none", len(rows))
    ser = frame[col]
    dt = ser.dtype
    if isinstance(dt, np.dtype) and dt.kind in "if":
        return ("num", ser.to_numpy()[rows].astype(np.float64))
    return ("obj", _take(frame, col, rows))


def _stat_column(parts, live: Optional[np.ndarray]):
    """:func:`.stat_columns.column_of_values` of the concatenated parts at ``live`` (all
    when None): float64 columns as they are (known everywhere: the values a list of their
    Python floats converts to), any other cells through ``column_of_values``."""
    if all(kind == "num" for kind, _ in parts):
        vals = np.concatenate([v for _, v in parts]) if len(parts) != 1 else parts[0][1]
        if live is not None:
            vals = vals[live]
        return vals, np.ones(len(vals), dtype=bool)
    if all(kind == "none" for kind, _ in parts):             # no such column: every cell unknown (None)
        m = sum(n for _, n in parts) if live is None else len(live)
        return np.full(m, np.nan), np.zeros(m, dtype=bool)
    cells: List[Any] = []
    for kind, v in parts:
        cells += v.tolist() if kind == "num" else [None] * v if kind == "none" else v
    if live is not None:
        cells = [cells[i] for i in live.tolist()]
    return column_of_values(cells)


def _same_dtype(xy) -> bool:
    x, y = xy
    return bool(x) and x.lower() == (y or "").lower()


class StatPairs:
    """Column lists, one entry per pair, in table order; ``src`` (side frame, row) per pair."""

    def __init__(self):
        self.cols: Dict[str, list] = {}

    @classmethod
    def build(cls, sides, parts, th, undefined=None) -> "StatPairs":
        """``undefined``: (A's, B's) :class:`opdump.analysis.undefined.UndefinedInputs`, or None."""
        from .verdict import same_dtype_tolerance
        self = cls()
        c: Dict[str, list] = {k: [] for k in (
            "rank", "iteration", "iteration_b", "graph", "op", "op_b", "op_type", "kind", "io", "slot", "call",
            "match", "order", "dtype_a", "dtype_b", "shape_a", "shape_b", "side", "row_a", "row_b",
            "op_type_b", "io_b", "slot_b", "kind_b", "rank_b", "graph_b", "op_file", "op_file_b", "call_b")}
        stat_keys = _VALUES + ("count", "data_size", "nan_count", "positive_inf_count", "negative_inf_count")
        # statistics per side: per part, the frame's column (typed where it is) at the pair rows
        stat: Dict[str, Dict[str, list]] = {"a": {k: [] for k in stat_keys + ("md5",)},
                                            "b": {k: [] for k in stat_keys + ("md5",)}}
        has_any: List[bool] = []
        one_sided = []                                  # (side pair, its rows without a partner)
        for s, ((sa, sb), (ai, bi, rules)) in enumerate(zip(sides, parts)):
            both = (ai >= 0) & (bi >= 0)
            if not both.all():                          # pairs of .stat_match: some tensors alone
                one_sided.append((s, sa, sb, ai[~both], bi[~both], rules[~both]))
                ai, bi, rules = ai[both], bi[both], rules[both]
            add_identity(c, sa, sb, ai, bi, rules)
            c["dtype_a"] += _dtypes(_take(sa, "dtype", ai))
            c["dtype_b"] += _dtypes(_take(sb, "dtype", bi))
            c["shape_a"] += _shape_texts(_take(sa, "shape", ai))
            c["shape_b"] += _shape_texts(_take(sb, "shape", bi))
            c["side"] += [s] * len(ai)
            c["row_a"] += ai.tolist()
            c["row_b"] += bi.tolist()
            for tag, frame, rows in (("a", sa, ai), ("b", sb, bi)):
                for k in stat_keys:
                    stat[tag][k].append(_stat_part(frame, k, rows))
                stat[tag]["md5"] += _take(sa if tag == "a" else sb, "md5", rows)
            any_k = any(k in sa.columns and k in sb.columns for k in _VALUES)
            has_any += [any_k] * len(ai)
        for k in ("rank", "graph", "slot", "call", "order", "rank_b", "graph_b", "slot_b", "call_b"):
            if set(map(type, c[k])) - {int}:
                c[k] = [int(v) for v in c[k]]
        n = len(c["rank"])
        # verdicts (judge_pair, then the statistics of the pairs it does not skip)
        ga = garbage(c["op_type"], c["io"], c["slot"])
        gb = ga if _same_columns(c, ("op_type", "io", "slot")) else garbage(c["op_type_b"], c["io_b"], c["slot_b"])
        if undefined is not None:           # out= destinations, empty* outputs (.undefined)
            ga, gb = or_undefined(ga, undefined[0], c), or_undefined(gb, undefined[1], c, "_b")
        all_live = not (any(ga) or any(gb))
        live = list(range(n)) if all_live else list(compress(range(n), map(operator.not_, map(operator.or_, ga, gb))))
        same = per_distinct(_same_dtype, list(zip(c["dtype_a"], c["dtype_b"])))
        if live:
            live_a = None if all_live else np.asarray(live, dtype=np.int64)

            def col(side):
                def f(k):
                    return _stat_column(stat[side][k], live_a)
                return f

            def pick(v):
                return v if all_live else list(map(v.__getitem__, live))
            v, r, ex, ident = judge_columns(col("a"), col("b"), len(live), pick(stat["a"]["md5"]),
                                            pick(stat["b"]["md5"]), pick(has_any), pick(same),
                                            pick(c["dtype_a"]), th, lambda dtype: same_dtype_tolerance(dtype, th))
        if all_live and live:
            verdict, reason, metrics, identical, mode = v, r, ex, ident, ["statistics"] * n
        else:
            verdict: List[Optional[str]] = ["skipped"] * n
            reason = [_SKIPPED] * n
            mode = [""] * n
            metrics: List[Dict[str, Any]] = [{} for _ in range(n)]
            identical: List[Optional[bool]] = [None] * n
            if live:
                scatter(live, (verdict, v), (reason, r), (metrics, ex), (identical, ident), (mode, ["statistics"] * len(live)))
        random_rule(c["op_type"], c["io"], verdict, reason)
        c["verdict"], c["reason"], c["mode"], c["metrics"], c["identical"], c["same"] = (
            verdict, reason, mode, metrics, identical, same)
        keys = {"flag": [0] * n, "it": list(c["iteration"]), "rank": list(c["rank"]), "order": list(c["order"])}
        if one_sided:                                   # the tensors alone, then every pair sorted together
            c["has_a"], c["has_b"] = [True] * n, [True] * n
            for s, sa, sb, ai, bi, rules in one_sided:
                add_one_sided(c, keys, s, sa, sb, ai, bi, rules, iterations_of(sa["iteration"]),
                              iterations_of(sb["iteration"]), _dtypes, _shape_texts)
            n = len(c["rank"])
        # table order: Pair.sort_key (A's tensors first, B's alone after them)
        it_key = np.asarray([1 << 60 if x is None else x for x in keys["it"]], dtype=np.int64)
        order = np.lexsort((np.asarray(keys["order"], np.int64), np.asarray(keys["rank"], np.int64), it_key,
                            np.asarray(keys["flag"], np.int64)))
        self.cols = {}
        if bool(np.all(order == np.arange(n))):
            self.cols = dict(c)                          # already in table order
        elif n >= 2:                                     # one C-level gather per column (itemgetter)
            take = operator.itemgetter(*order.tolist())
            for k, v in c.items():
                self.cols[k] = list(take(v))
        else:
            self.cols = {k: [v[i] for i in order.tolist()] for k, v in c.items()}
        self.sides = sides
        return self

    def tensors(self, idx: List[int]) -> List[Pair]:
        """:class:`Pair` records (fields as the per-row stages set them) of the pairs ``idx``."""
        c = self.cols
        made: Dict[tuple, Any] = {}
        for s, (sa, sb) in enumerate(self.sides):
            for frame, rows_key, tag in ((sa, "row_a", "a"), (sb, "row_b", "b")):
                rows = sorted({c[rows_key][k] for k in idx if c["side"][k] == s and c[rows_key][k] is not None})
                if not rows:
                    continue
                for r, t in zip(rows, make_tensors(frame.iloc[rows])):
                    t.shape = shape_from_text(t.row.get("shape"))
                    made[(s, tag, r)] = t
        return [Pair(made.get((c["side"][k], "a", c["row_a"][k])), made.get((c["side"][k], "b", c["row_b"][k])),
                     c["match"][k], c["mode"][k], c["verdict"][k], c["reason"][k], c["identical"][k],
                     dict(c["metrics"][k]), c["source"][k]) for k in idx]


def _sources(sp: StatPairs, da, db, sources) -> None:
    """``_Sources`` of every pair (A's operator, else B's), looked up once per operator."""
    class _T:
        __slots__ = ("kind", "rank", "graph", "op")

        def __init__(self, kind, rank, graph, op):
            self.kind, self.rank, self.graph, self.op = kind, rank, graph, op
    c = sp.cols
    kind_a = c["kind"] if "has_a" not in c else [k if x else None for k, x in zip(c["kind"], c["has_a"])]
    cols = (kind_a, c["rank"], c["graph"], c["op"], c["kind_b"], c["rank_b"], c["graph_b"], c["op_b"])
    keys = row_keys(list(cols))                     # equal where the 8-tuples are (.stat_calls)
    cache: Dict[Any, str] = {}
    for i in first_rows(keys):                      # once per distinct operator pair, first seen first
        ka, ra, ga, oa, kb, rb, gb, ob = (col[i] for col in cols)
        s = sources.of_tensor(da, _T(ka, ra, ga, oa))
        if not s[0]:
            s = sources.of_tensor(db, _T(kb, rb, gb, ob))
        cache[keys[i]] = s[0]
    c["source"] = list(map(cache.__getitem__, keys))


def _table_cells(sp: StatPairs) -> Cells:
    """The table the per-row stages build from rows of Python objects, as cells
    (:mod:`.stat_csv`: made a DataFrame only when read): each column of one of
    int/float/bool as that array (what ``infer_objects`` makes of it), any other as objects
    then inferred; ``order`` 0.. and the iterations ``Int64``; columns no pair fills all None."""
    c = sp.cols
    n = len(c["rank"])
    m = c["metrics"]
    data = {
        "rank": c["rank"], "graph": c["graph"], "op": c["op"], "op_b": c["op_b"], "op_type": c["op_type"],
        "kind": c["kind"], "io": c["io"], "slot": c["slot"], "call": c["call"], "match": c["match"],
        "mode": c["mode"], "verdict": c["verdict"], "reason": c["reason"], "identical": c["identical"],
        "stat_max_rel_diff": [x.get("stat_max_rel_diff") for x in m],
        "dtype_a": c["dtype_a"], "dtype_b": c["dtype_b"], "shape_a": c["shape_a"], "shape_b": c["shape_b"],
        "source": c["source"]}
    cells: Cells = {}
    for k in TABLE_COLUMNS:
        if k == "order":
            cells[k] = ("order", n)
        elif k in ("iteration", "iteration_b"):
            cells[k] = ("Int64", c[k])
        elif k not in data:
            cells[k] = ("none", n)
        else:
            cells[k] = ("cells", data[k])
    return cells


def finish_result(da, db, sp: StatPairs, rank_pairs, it_pairs, thresholds, sources) -> CompareResult:
    """The :class:`CompareResult` of ``sp`` (``compare``'s last stages, column-wise); its
    table is held as cells (:mod:`.stat_result`)."""
    matched_by, ops, settle = column_summary(da, db, sp, sources, thresholds)
    un_a, un_b, front_a, front_b = summary_lists(sp.cols)
    result = StatCompareResult(str(da.path), str(db.path), None, None, [], [], un_a, un_b, thresholds, it_pairs,
                               (rank_pairs[0] if len(rank_pairs) == 1 else (None, None)), matched_by=matched_by,
                               operators=ops, unreadable=[], warnings=unmatched_warning(ops), front_end_a=front_a,
                               front_end_b=front_b, kernel_only_a=[], kernel_only_b=[])
    return with_cells(settle(result), _table_cells(sp))


def column_summary(da, db, sp, sources, thresholds):
    """What ``compare``'s last stages say of column-wise pairs (``sp.cols``: statistics or
    tensor-file pairs alike), after filling in their sources: ``(matched_by, operators,
    settle)``, where ``settle(result)`` sets the first difference, the first divergence, the
    rule and its note on a result and returns it."""
    _sources(sp, da, db, sources)
    c = sp.cols
    n = len(c["rank"])
    keys = _KeysOnce(c)                                         # A's call keys, made once for all below
    # a precision compare's rounding noise is not diverged (.noise_floor): before anything reads verdicts
    demote_stat_columns(sp, keys)                               # .noise_columns
    # compared: identical known, or a mode and a verdict other than unreadable/unmatched
    compared = _mask(map(operator.is_not, c["identical"], repeat(None)), n) | (
        _mask(map(bool, c["mode"]), n) & ~_mask(map(_NOT_COMPARED.__contains__, c["verdict"]), n))
    same_at = _mask(map(bool, c["same"]), n)[compared]
    same = bool(len(same_at)) and bool(same_at.all())
    fdiff, nondet_d = _first_difference(sp, sources, keys) if same else (None, [])
    fdiv, nondet, params = _first_divergence(sp, sources, keys)
    rule, note = rule_of(same, int((~same_at).sum()), len(same_at), thresholds)
    if "has_a" in c:                                            # some tensors alone (.stat_onesided)
        matched_by = dict(Counter(compress(c["match"], map(operator.and_, c["has_a"], c["has_b"]))))
        n_a, m_a, n_b, m_b = call_counts(c, n, keys)
        ops = {"calls_a": n_a, "matched_a": m_a, "calls_b": n_b, "matched_b": m_b}
    else:
        matched_by = dict(Counter(c["match"]))                   # first seen first, as the loop counted
        calls_a, calls_b = operator_calls(c, keys)
        ops = {"calls_a": calls_a, "matched_a": calls_a, "calls_b": calls_b, "matched_b": calls_b}

    def settle(result):
        result.first_divergence, result.diverged_parameters = fdiv, params
        result.nondeterministic_before = nondet_d if same and fdiff is not None else nondet
        result.first_difference, result.rule, result.rule_note = fdiff, rule, note
        return result
    return matched_by, ops, settle


def _mask(bools, n: int) -> np.ndarray:
    """A bool array of an iterator of ``n`` truth values (built in C, no Python loop)."""
    return np.fromiter(bools, dtype=bool, count=n)


def _first_divergence(sp: StatPairs, sources, keys_of: Optional[Callable[[], List[tuple]]] = None):
    """:func:`.first.first_divergence` on the pairs it can look at: the nondeterministic ones
    before the first diverged operator, the diverged parameters, and every pair of the first
    diverged operator's call (the other diverged operators change nothing it reports)."""
    c = sp.cols
    n = len(c["verdict"])
    verdict, kind = c["verdict"], c["kind"]
    idx = np.flatnonzero(_mask(map(_DIVERGED.__contains__, verdict), n)).tolist()
    first = next((i for i in idx if verdict[i] == "diverged" and kind[i] == "op"), None)
    if first is not None:
        keys = (keys_of or _KeysOnce(c))()
        same_call = np.flatnonzero(_mask(map(keys[first].__eq__, keys), n)).tolist()
        idx = sorted({i for i in idx if (verdict[i] == "nondeterministic" and i < first)
                      or (verdict[i] == "diverged" and kind[i] != "op")} | set(same_call))
    return first_divergence(sp.tensors(idx), sources)


def _first_difference(sp: StatPairs, sources, keys_of: Optional[Callable[[], List[tuple]]] = None):
    """:func:`.first.first_difference` on the pairs it can look at: the calls of A holding a
    pair that is not identical (the first few, then all when those decide nothing) and the
    parameters that are not identical."""
    c = sp.cols
    n = len(c["kind"])
    is_op = _mask(map("op".__eq__, c["kind"]), n)
    differs = _mask(map(operator.is_, c["identical"], repeat(False)), n)
    params = np.flatnonzero(~is_op & differs).tolist()
    rows = np.flatnonzero(is_op & differs).tolist()
    keys = (keys_of or _KeysOnce(c))() if rows else []
    order = list(dict.fromkeys(map(keys.__getitem__, rows)))       # A's calls holding one, first seen first
    for limit in (_FIRST_CALLS, None):
        chosen = set(order[:limit] if limit else order)
        in_chosen = np.flatnonzero(is_op & _mask(map(chosen.__contains__, keys), n)).tolist() if chosen else []
        idx = sorted(set(params) | set(in_chosen))
        out = first_difference(sp.tensors(idx), sources)
        if out[0] is not None or limit is None or len(order) <= limit:
            return out
    return out  # pragma: no cover


def random_rule(op_types: List[str], ios: List[str], verdicts: List[str], reasons: List[str],
                is_random: Callable[[Any], bool] = is_random_op) -> None:
    """:func:`.verdict._random` over columns (in place)."""
    cache: Dict[Any, bool] = {}
    for i, v in enumerate(verdicts):
        if v == "diverged" and ios[i] == "output":
            t = op_types[i]
            r = cache.get(t)
            if r is None:
                r = cache[t] = is_random(t)
            if r:
                verdicts[i] = "nondeterministic"
                reasons[i] = "random operator: " + (reasons[i] or "")


def garbage(op_types: List[str], ios: List[str], slots: List[Any]) -> List[bool]:
    """:func:`opdump.analysis.common.is_garbage` per row, once per distinct (type, io, slot)."""
    keys = list(zip(op_types, ios, slots))
    cache = {k: is_garbage(*k) for k in dict.fromkeys(keys)}      # once per distinct key, first seen first
    return list(map(cache.__getitem__, keys))
