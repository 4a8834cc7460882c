"""The pairs of a tensor-file compare as columns (:mod:`.tensor_fast`): metrics, verdicts,
the table, the summary and where A and B part, with the per-pair stages' rules.

Guarantee: for pairs made as :mod:`.tensor_fast` makes them, the same verdicts
(:func:`.verdict.judge_pair` then :func:`.verdict.judge_metrics`, whose rules are called
here on the same metrics), table (columns, values, dtypes, order: :meth:`.pairs.Pair.sort_key`;
each column's objects converted by pandas' own ``convert_object_array``, as
``DataFrame(rows)`` converts them), counts, unreadable files, first difference and first
divergence as ``compare``'s per-pair stages.  First difference/divergence are computed by
:mod:`.first` itself on :class:`.pairs.Pair` records built only for the pairs those
functions can look at (:mod:`.stat_pairs`' selection).  The metrics are the worker pool's
(:func:`.pool.run_pairs`) on the same tasks.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..reader.bincache import sources as on_disk_all
from ..reader.npy import dtype_name
from .fields import make_tensors
from .pairs import METRIC_COLUMNS, TABLE_COLUMNS, Pair
from .result import CompareResult
from .stat_cells import per_distinct
from .stat_pairs import (_SKIPPED, _mask, _same_dtype, _take, add_identity, column_summary,
                         garbage, random_rule)
from .verdict import _tolerance, verdict_for_metrics
from ..undefined import or_undefined

__all__ = ["TensorPairs", "finish_tensor_result"]


def _nbytes(layout) -> int:
    """Bytes of a tensor's data from its header (``compare``'s ``_data_bytes``)."""
    n = layout[1].itemsize
    for x in layout[0]:
        n *= x
    return n


class TensorPairs:
    """Column lists, one entry per pair, in table order; ``row_a``/``row_b`` and ``side``
    locate each pair's records (:meth:`tensors`)."""

    def __init__(self):
        self.cols: Dict[str, list] = {}

    @classmethod
    def build(cls, sides, originals, lays, parts, th, run_metrics: Callable[[list], Dict[int, Dict[str, Any]]],
              undefined=None) -> "TensorPairs":
        """``undefined``: (A's, B's) :class:`opdump.analysis.undefined.UndefinedInputs`, or None."""
        self = cls()
        c: Dict[str, list] = {k: [] for k in (
            "rank", "iteration", "iteration_b", "graph", "op", "op_b", "op_type", "kind", "io", "slot", "call",
            "match", "order", "dtype_a", "dtype_b", "shape_a", "shape_b", "side", "row_a", "row_b",
            "op_type_b", "io_b", "slot_b", "kind_b", "rank_b", "graph_b", "op_file", "op_file_b", "call_b",
            "path_a", "path_b", "layout_a", "layout_b")}
        for s, ((sa, sb), (la, lb), (ai, bi, rules)) in enumerate(zip(sides, lays, parts)):
            add_identity(c, sa, sb, ai, bi, rules)
            c["dtype_a"] += _take(sa, "dtype", ai)            # Tensor.dtype: the record's name (a str: .tensor_fast)
            c["dtype_b"] += _take(sb, "dtype", bi)
            c["shape_a"] += _take(sa, "shape", ai)            # the header shape's text (.tensor_fast)
            c["shape_b"] += _take(sb, "shape", bi)
            c["path_a"] += _take(sa, "path", ai)
            c["path_b"] += _take(sb, "path", bi)
            ai_l, bi_l = ai.tolist(), bi.tolist()
            c["layout_a"] += list(map(la.__getitem__, ai_l))
            c["layout_b"] += list(map(lb.__getitem__, bi_l))
            c["side"] += [s] * len(ai_l)
            c["row_a"] += ai_l
            c["row_b"] += bi_l
        for k in ("rank", "graph", "slot", "call", "order", "rank_b", "graph_b", "slot_b", "call_b"):
            if set(map(type, c[k])) - {int}:
                c[k] = [int(v) for v in c[k]]
        n = len(c["rank"])
        ga, gb = garbage(c["op_type"], c["io"], c["slot"]), garbage(c["op_type_b"], c["io_b"], c["slot_b"])
        if undefined is not None:           # out= destinations, empty* outputs (.undefined)
            ga, gb = or_undefined(ga, undefined[0], c), or_undefined(gb, undefined[1], c, "_b")
        live = [k for k in range(n) if not (ga[k] or gb[k])]
        pa, pb, lya, lyb = c["path_a"], c["path_b"], c["layout_a"], c["layout_b"]
        tasks = [(k, pa[k], pb[k], _nbytes(lya[k]) + _nbytes(lyb[k]), lya[k], lyb[k]) for k in live]
        results = run_metrics(tasks)
        same = per_distinct(_same_dtype, list(zip(c["dtype_a"], c["dtype_b"])))
        verdict: List[Optional[str]] = ["skipped"] * n
        reason: List[str] = [_SKIPPED] * n
        mode: List[str] = [""] * n
        metrics: List[Dict[str, Any]] = [{} for _ in range(n)]
        identical: List[Optional[bool]] = [None] * n
        for k in live:                                 # judge_pair (tensor mode), then judge_metrics
            m = results[k]
            v, why = verdict_for_metrics(m, th)
            metrics[k] = m                             # as the worker gave it (.tensors: judge_metrics' copy)
            mode[k], verdict[k], reason[k] = "tensor", v, why
            if v != "unreadable" and v != "unmatched" and same[k]:
                mae, ref = m.get("max_abs_err", 0.0), m.get("max_abs_ref", 0.0) or 0.0
                mae = 0.0 if mae != mae else mae
                identical[k] = (not m.get("nonfinite_mismatch") and mae <= _tolerance(c["dtype_a"][k], th) * ref)
        random_rule(c["op_type"], c["io"], verdict, reason)
        c["verdict"], c["reason"], c["mode"], c["metrics"], c["identical"], c["same"] = (
            verdict, reason, mode, metrics, identical, same)
        it_key = np.asarray([1 << 60 if x is None else x for x in c["iteration"]], dtype=np.int64)
        order = np.lexsort((np.asarray(c["order"], np.int64), np.asarray(c["rank"], np.int64), it_key))
        if bool(np.all(order == np.arange(n))):
            self.cols = dict(c)                        # already in table order
        else:
            ol = order.tolist()
            self.cols = {k: list(map(v.__getitem__, ol)) for k, v in c.items()}
        self.sides = originals
        return self

    def tensors(self, idx: List[int]) -> List[Pair]:
        """:class:`Pair` records (fields as the per-pair stages set them) of the pairs ``idx``."""
        c = self.cols
        made: Dict[tuple, Any] = {}
        for s, (sa, sb) in enumerate(self.sides):
            for frame, rows_key, lay_key, tag in ((sa, "row_a", "layout_a", "a"), (sb, "row_b", "layout_b", "b")):
                lay_of = {c[rows_key][k]: c[lay_key][k] for k in idx if c["side"][k] == s}
                rows = sorted(lay_of)
                if not rows:
                    continue
                for r, t in zip(rows, make_tensors(frame.iloc[rows])):
                    lay = lay_of[r]
                    t.layout = lay
                    t.shape, t.np_dtype = lay[0], dtype_name(lay[1])
                    made[(s, tag, r)] = t
        return [Pair(made[(c["side"][k], "a", c["row_a"][k])], made[(c["side"][k], "b", c["row_b"][k])],
                     c["match"][k], c["mode"][k], c["verdict"][k], c["reason"][k], c["identical"][k],
                     _kept(c["metrics"][k]), c["source"][k]) for k in idx]


def _kept(m: Dict[str, Any]) -> Dict[str, Any]:
    """The metrics :func:`.verdict.judge_metrics` keeps in ``Pair.metrics`` (no tuples or lists)."""
    return {k: v for k, v in m.items() if not isinstance(v, (tuple, list))}


def _table(tp: TensorPairs, pd):
    """The table ``compare``'s ``_result`` builds from one row of Python objects per pair:
    the same cells, each column converted by pandas' ``convert_object_array`` (what
    ``DataFrame(rows)`` runs per column); ``order`` (0..n-1, int64) and the ``Int64``
    iterations (ints, None where missing) made directly, as ``_result`` ends with them."""
    from pandas.core.internals.construction import convert_object_array
    c = tp.cols
    n = len(c["rank"])
    m = c["metrics"]
    data: Dict[str, List[Any]] = {
        "rank": c["rank"], "graph": c["graph"], "op": c["op"], "op_b": c["op_b"], "op_type": c["op_type"], "kind": c["kind"],
        "io": c["io"], "slot": c["slot"], "call": c["call"], "match": c["match"], "mode": c["mode"],
        "verdict": c["verdict"], "reason": c["reason"], "identical": c["identical"],
        "dtype_a": c["dtype_a"], "dtype_b": c["dtype_b"], "shape_a": c["shape_a"], "shape_b": c["shape_b"],
        "source": c["source"], "path_a": on_disk_all(c["path_a"]), "path_b": on_disk_all(c["path_b"])}
    for k in METRIC_COLUMNS:
        data[k] = list(map(operator.methodcaller("get", k), m))
    direct = {"order": np.arange(n, dtype=np.int64),       # _result: range(len(table)), Int64 iterations
              "iteration": pd.array(c["iteration"], dtype="Int64"),
              "iteration_b": pd.array(c["iteration_b"], dtype="Int64")}
    names = [k for k in TABLE_COLUMNS if k not in direct]
    arrays = []
    for k in names:
        arr = np.empty(n, dtype=object)
        arr[:] = data[k]
        arrays.append(arr)
    cols = dict(zip(names, convert_object_array(arrays, dtype=None)))
    cols.update(direct)
    return pd.DataFrame({k: cols[k] for k in TABLE_COLUMNS}, columns=TABLE_COLUMNS)


def finish_tensor_result(da, db, tp: TensorPairs, rank_pairs, it_pairs, thresholds, sources) -> CompareResult:
    """The :class:`CompareResult` of ``tp`` (``compare``'s last stages, column-wise)."""
    import pandas as pd
    matched_by, ops, settle = column_summary(da, db, tp, sources, thresholds)
    c = tp.cols
    n = len(c["rank"])
    unreadable: Dict[str, str] = {}
    for k in np.flatnonzero(_mask(map("unreadable".__eq__, c["verdict"]), n)).tolist():
        mk = c["metrics"][k]
        path = mk.get("unreadable")
        if path:
            unreadable.setdefault(path, str(mk.get("error", "")).replace(f"cannot read {path}: ", ""))
    result = CompareResult(str(da.path), str(db.path), _table(tp, pd), None, [], [], [], [], thresholds, it_pairs,
                           (rank_pairs[0] if len(rank_pairs) == 1 else (None, None)), matched_by=matched_by,
                           operators=ops, unreadable=sorted(unreadable.items()), warnings=[], front_end_a=[],
                           front_end_b=[], kernel_only_a=[], kernel_only_b=[])
    return settle(result)

