"""Operator-by-operator comparison of two dumps (SPEC F30, F30a).

``compare(A, B)`` -- A is the dump under test, B the reference (``max_rel_err`` is
relative to B).  Two devices, precisions, compilers, frameworks, or a MindSpore dump
against an opdump dump.

Matching (per rank and iteration; tensor = operator call × io × slot):

0. a user mapping file, when given (explicit pairs win over the rules below);
1. the same full name (and graph id), then the same full name in any graph;
2. the same scope + operator type + occurrence order among the still unmatched
   operators of that scope and type (type compared case-insensitively, overload
   dropped) -- e.g. after an extra operator shifted the ``-opN`` numbers;
3. what is left is reported as unmatched (``only in A`` / ``only in B``).

Mapping file: text, one pair per line ``A_name,B_name`` (``#`` starts a comment, an
optional ``a,b`` header line); names are full names or their file-name form.
Append ``:input.N`` / ``:output.N`` to both names to pair single tensors (useful
across frameworks whose operators take their inputs in another order).  A JSON
object ``{"A_name": "B_name"}`` is accepted as well.

Metrics per tensor pair (float64, any dtypes; bf16 is stored as float32 anyway):
cosine similarity, max absolute error, max relative error (``|a-b|/|b|``), mean
absolute error, RMSE, Euclidean distance ``||a-b||``, share of elements with
relative error < 1/1000 and < 5/1000, non-finite mismatches.

Verdicts (thresholds in :class:`Thresholds`, defaults shown):

* ``diverged`` when any of: element counts differ; NaN/Inf at different places;
  ``cosine < 0.9``; ``cosine < 0.99 and max_abs_err > 1e-3``;
  ``max_abs_err > 1 and max_abs_err > 1e-2 * max|b|``.  That is MindStudio Probe's
  rule (cos < 0.99 & abs > 0.001, or cos < 0.9, or abs > 1) with two refinements:
  the ``abs > 1`` clause is scaled for large-magnitude tensors (an error of 2 on
  values ~1e4 is a 2e-4 relative error, not a divergence), and a pair whose
  ``max_abs_err <= 1e-6`` never diverges (cosine is meaningless on round-off of
  near-zero tensors).  When exactly one side is all zeros, cosine is undefined
  (NaN) and ``max_abs_err > 1e-3`` decides.
* ``warning``: not diverged, but ``cosine < 0.999`` or ``max_abs_err > 1e-3``.
* ``pass``: otherwise (``identical`` is noted in ``reason`` when bit-equal).
* ``nondeterministic``: outputs of random operators (dropout, bernoulli, rand*,
  normal, uniform, randperm, multinomial, native_dropout …) that would be ``diverged``.
* ``skipped``: undefined values, never compared (F30a): outputs of
  ``empty``/``empty_like``/``empty_strided``/``new_empty``, the destination input
  of ``fill_``/``zero_``/``copy_``/``uniform_``/``normal_`` ….
* statistics-only pairs (no tensor file on a side): equal MD5 -> ``pass``;
  NaN/Inf on one side only -> ``diverged``; else the largest relative difference
  ``|a-b|/max(|a|,|b|)`` of max/min/avg/l2norm (differences <= 1e-6 ignored):
  > 1e-2 -> ``diverged``, > 1e-3 -> ``warning``.
* ``unmatched``: the tensor exists in one dump only.

The **first divergence** is the first operator, in A's execution order (iteration,
graph run order, execution-order CSV), with a ``diverged`` tensor; parameters are
reported separately (``diverged_parameters``), not as the first divergence.  Its
``cause`` says whether its output diverged while its inputs matched (the operator
computes differently) or an input already differed (a weight, a graph input, or an
operator that was not dumped).

Tensor pairs run in a ``ProcessPoolExecutor`` with a bounded number in flight when
there are many (``parallel_min`` pairs or more), serially otherwise.
"""
from __future__ import annotations

import json
import math
import os
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .common import base_op_type, is_garbage, is_random_op, stats_nonfinite, progress_bar
from .metrics import _batch, _task
from .reader import Dump, open_dump, sanitize, scope_of

__all__ = ["Thresholds", "CompareResult", "compare", "load_mapping", "verdict_for_metrics"]

TABLE_COLUMNS = [
    "order", "rank", "iteration", "iteration_b", "graph", "op", "op_b", "op_type", "kind", "io", "slot", "call",
    "match", "mode", "verdict", "reason", "cosine", "max_abs_err", "max_rel_err", "mean_abs_err", "rmse",
    "euclidean", "within_1e-3", "within_5e-3", "nonfinite_mismatch", "stat_max_rel_diff",
    "dtype_a", "dtype_b", "shape_a", "shape_b", "source", "path_a", "path_b",
]


@dataclass(frozen=True)
class Thresholds:
    """Verdict thresholds (see the module documentation)."""

    cos_fail: float = 0.9              # cosine below this: diverged
    cos_strict: float = 0.99           # cosine below this and max_abs_err above abs_with_cos: diverged
    abs_with_cos: float = 1e-3
    abs_fail: float = 1.0              # max_abs_err above this (and above abs_fail_scale * max|b|): diverged
    abs_fail_scale: float = 1e-2
    atol: float = 1e-6                 # max_abs_err at or below this never diverges
    cos_warn: float = 0.999            # cosine below this: warning
    abs_warn: float = 1e-3             # max_abs_err above this: warning
    stat_fail: float = 1e-2            # statistics relative difference above this: diverged
    stat_warn: float = 1e-3
    stat_atol: float = 1e-6


def verdict_for_metrics(m: Dict[str, Any], th: Thresholds = Thresholds()) -> Tuple[str, str]:
    """(verdict, reason) for the metrics of one tensor pair."""
    if m.get("error"):
        return "diverged", m["error"]
    mism = int(m.get("nonfinite_mismatch") or 0)
    if mism:
        return "diverged", f"NaN/Inf at {mism} different positions"
    n = m.get("n") or 0
    if n == 0:
        return "pass", "empty or all non-finite alike"
    cos = m.get("cosine", float("nan"))
    mae = m.get("max_abs_err", 0.0)
    ref = m.get("max_abs_ref", 0.0) or 0.0
    if mae == 0.0:
        return "pass", "identical"
    if mae <= th.atol:
        return "pass", f"max abs error {mae:.3g} <= {th.atol:g}"
    reasons = []
    if math.isnan(cos):
        if mae > th.abs_with_cos:
            reasons.append(f"one side all zeros, max abs error {mae:.3g} > {th.abs_with_cos:g}")
    else:
        if cos < th.cos_fail:
            reasons.append(f"cosine {cos:.6f} < {th.cos_fail:g}")
        elif cos < th.cos_strict and mae > th.abs_with_cos:
            reasons.append(f"cosine {cos:.6f} < {th.cos_strict:g} and max abs error {mae:.3g} > {th.abs_with_cos:g}")
    if mae > th.abs_fail and mae > th.abs_fail_scale * ref:
        reasons.append(f"max abs error {mae:.3g} > {th.abs_fail:g} (max|ref| {ref:.3g})")
    if reasons:
        return "diverged", "; ".join(reasons)
    if (not math.isnan(cos) and cos < th.cos_warn) or mae > th.abs_warn:
        return "warning", f"cosine {cos:.6f}, max abs error {mae:.3g}"
    return "pass", ""


_STATS_FOR_COMPARE = ("max", "min", "avg", "l2norm")


def _stats_verdict(ra: Dict[str, Any], rb: Dict[str, Any], th: Thresholds) -> Tuple[str, str, Dict[str, Any]]:
    out: Dict[str, Any] = {}
    ma, mb = ra.get("md5"), rb.get("md5")
    if isinstance(ma, str) and isinstance(mb, str) and ma and mb and ma == mb:
        return "pass", "identical (MD5)", {"stat_max_rel_diff": 0.0}
    na, nb = stats_nonfinite(ra), stats_nonfinite(rb)
    if na is not None and nb is not None and na != nb:
        return "diverged", "NaN/Inf in " + ("A only" if na else "B only"), out
    worst, worst_k = 0.0, None
    for k in _STATS_FOR_COMPARE:
        try:
            a, b = float(ra.get(k)), float(rb.get(k))
        except (TypeError, ValueError):
            continue
        if math.isnan(a) or math.isnan(b):
            if math.isnan(a) != math.isnan(b) and not (na or nb):
                return "diverged", f"{k}: {a} vs {b}", out
            continue
        if math.isinf(a) or math.isinf(b):
            if a != b:
                worst, worst_k = float("inf"), k
            continue
        d = abs(a - b)
        if d <= th.stat_atol:
            continue
        rel = d / max(abs(a), abs(b))
        if rel > worst:
            worst, worst_k = rel, k
    out["stat_max_rel_diff"] = worst
    if worst_k is None:
        if any(k in ra and k in rb for k in _STATS_FOR_COMPARE):
            return "pass", "statistics agree", out
        return "pass", "no comparable statistics", out
    msg = f"{worst_k} differs by {worst:.3g} (relative)"
    if worst > th.stat_fail:
        return "diverged", msg, out
    if worst > th.stat_warn:
        return "warning", msg, out
    return "pass", msg, out


# ----------------------------------------------------------------------------- mapping

def load_mapping(path: Union[str, os.PathLike]) -> List[Tuple[str, str]]:
    """Read a mapping file (see module doc): ``[(A name, B name)]``."""
    text = Path(path).read_text(encoding="utf-8")
    s = text.lstrip()
    pairs: List[Tuple[str, str]] = []
    if s.startswith("{"):
        data = json.loads(s)
        return [(str(k), str(v)) for k, v in data.items()]
    for ln in text.splitlines():
        ln = ln.split("#", 1)[0].strip()
        if not ln:
            continue
        parts = [p.strip() for p in ln.split(",")]
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"{path}: bad mapping line {ln!r} (expected 'A_name,B_name')")
        if (parts[0].lower(), parts[1].lower()) == ("a", "b"):
            continue
        pairs.append((parts[0], parts[1]))
    return pairs


def _split_tensor_ref(name: str) -> Tuple[str, Optional[str], Optional[int]]:
    """``op:output.0`` -> (op, output, 0); ``op`` -> (op, None, None)."""
    if ":" in name:
        head, tail = name.rsplit(":", 1)
        parts = tail.split(".")
        if len(parts) == 2 and parts[0] in ("input", "output") and parts[1].isdigit():
            return head, parts[0], int(parts[1])
    return name, None, None


# ----------------------------------------------------------------------------- result

@dataclass
class CompareResult:
    a: str
    b: str
    table: Any                                    # pandas DataFrame, TABLE_COLUMNS
    first_divergence: Optional[Dict[str, Any]]
    diverged_parameters: List[str] = field(default_factory=list)
    nondeterministic_before: List[str] = field(default_factory=list)   # random ops differing before the divergence
    unmatched_a: List[str] = field(default_factory=list)
    unmatched_b: List[str] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=Thresholds)
    iteration_pairs: List[Tuple[int, int]] = field(default_factory=list)
    ranks: Tuple[Optional[int], Optional[int]] = (None, None)

    @property
    def counts(self) -> Dict[str, int]:
        if self.table is None or len(self.table) == 0:
            return {}
        return {str(k): int(v) for k, v in self.table["verdict"].value_counts().items()}

    @property
    def diverged(self) -> bool:
        return self.first_divergence is not None or bool(self.diverged_parameters)

    def to_csv(self, path: Union[str, os.PathLike]) -> None:
        self.table.to_csv(path, index=False)

    def to_html(self, path: Union[str, os.PathLike], **kw) -> None:
        from .report import write_html_report
        write_html_report(self, path, **kw)

    def summary(self) -> str:
        lines = [f"A: {self.a}", f"B: {self.b} (reference)"]
        c = self.counts
        lines.append("tensors: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) if c else "tensors: none")
        fd = self.first_divergence
        if fd:
            lines.append(f"first divergence: {fd['op']} (iteration {fd['iteration']}, {fd['io']}.{fd['slot']}, "
                         f"rank {fd['rank']})")
            if fd.get("op_b") and fd["op_b"] != fd["op"]:
                lines.append(f"  matched in B: {fd['op_b']}")
            if fd.get("source"):
                lines.append(f"  source: {fd['source']}" + (f"  {fd['code']}" if fd.get("code") else ""))
            lines.append(f"  {fd['reason']}")
            lines.append(f"  cause: {fd['cause']}")
        else:
            lines.append("first divergence: none")
        if self.diverged_parameters:
            lines.append("diverged parameters: " + ", ".join(self.diverged_parameters[:10])
                         + (" …" if len(self.diverged_parameters) > 10 else ""))
        if self.nondeterministic_before:
            lines.append("random operators that differ before it: " + ", ".join(self.nondeterministic_before[:5]))
        if self.unmatched_a or self.unmatched_b:
            lines.append(f"unmatched operators: {len(self.unmatched_a)} only in A, {len(self.unmatched_b)} only in B")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- matching

def _rows(dump: Dump, rank: Optional[int]) -> List[Dict[str, Any]]:
    rec = dump.records()
    if rec.empty:
        return []
    if rank is not None:
        rec = rec[rec["rank"] == rank]
    rec = rec[rec["iteration"].notna() | (rec["kind"] == "constant")]
    rows = rec.to_dict("records")
    for r in rows:
        it = r["iteration"]
        try:
            r["iteration"] = None if it is None or it != it else int(it)
        except TypeError:  # pd.NA
            r["iteration"] = None
    return rows


def _op_key_name(r: Dict[str, Any]) -> str:
    return r["op"]


def _match(rows_a, rows_b, pairs_it, mapping, rank_a, rank_b):
    """Returns (matches [(ra, rb, method)], only_a [rows], only_b [rows])."""
    it_map = {ia: ib for ia, ib in pairs_it}
    A = [r for r in rows_a if r["iteration"] in it_map or (r["iteration"] is None and None in it_map)]
    itb = set(it_map.values())
    B = [r for r in rows_b if r["iteration"] in itb or (r["iteration"] is None and None in itb)]
    used_b = set()
    matched_a = set()
    matches = []

    def tkey(r, name=None, graph=True, it=None):
        return ((r["graph"] if graph else None), it if it is not None else r["iteration"],
                name if name is not None else r["op"], r["io"], int(r["slot"]), int(r["call"]))

    # index B
    idx_b_full: Dict[tuple, int] = {}
    idx_b_any: Dict[tuple, List[int]] = {}
    idx_b_file: Dict[tuple, List[int]] = {}
    for j, r in enumerate(B):
        idx_b_full.setdefault(tkey(r), j)
        k = tkey(r, graph=False)
        idx_b_any.setdefault(k, []).append(j)
        idx_b_file.setdefault((r["iteration"], r["op_file"], r["io"], int(r["slot"]), int(r["call"])), []).append(j)

    def take(i, j, how):
        matches.append((A[i], B[j], how))
        used_b.add(j)
        matched_a.add(i)

    # 0. user mapping
    if mapping:
        op_map: Dict[str, str] = {}
        t_map: Dict[Tuple[str, str, int], Tuple[str, str, int]] = {}
        for an, bn in mapping:
            a_op, a_io, a_slot = _split_tensor_ref(an)
            b_op, b_io, b_slot = _split_tensor_ref(bn)
            if a_io is not None and b_io is not None:
                t_map[(sanitize(a_op), a_io, a_slot)] = (sanitize(b_op), b_io, b_slot)
            else:
                op_map[sanitize(a_op)] = sanitize(b_op)
        for i, r in enumerate(A):
            tgt = t_map.get((r["op_file"], r["io"], int(r["slot"])))
            if tgt is not None:
                k = (it_map[r["iteration"]], tgt[0], tgt[1], tgt[2], int(r["call"]))
            elif r["op_file"] in op_map:
                k = (it_map[r["iteration"]], op_map[r["op_file"]], r["io"], int(r["slot"]), int(r["call"]))
            else:
                continue
            for j in idx_b_file.get(k, []):
                if j not in used_b:
                    take(i, j, "mapping")
                    break
    # 1. full name, same graph; then any graph
    for i, r in enumerate(A):
        if i in matched_a:
            continue
        j = idx_b_full.get(tkey(r, it=it_map[r["iteration"]]))
        if j is not None and j not in used_b:
            take(i, j, "name")
    for i, r in enumerate(A):
        if i in matched_a:
            continue
        for j in idx_b_any.get(tkey(r, graph=False, it=it_map[r["iteration"]]), []):
            if j not in used_b:
                take(i, j, "name")
                break
    # 2. scope + type + occurrence order, among unmatched op calls
    def calls(rows, taken):
        seq: Dict[tuple, List[tuple]] = {}
        members: Dict[tuple, List[int]] = {}
        order = []
        for n, r in enumerate(rows):
            if n in taken or r["kind"] != "op":
                continue
            ck = (r["iteration"], r["graph"], r["op_file"], int(r["call"]))
            if ck not in members:
                members[ck] = []
                order.append(ck)
            members[ck].append(n)
        for ck in order:
            r = rows[members[ck][0]]
            sk = (r["iteration"], scope_of(r["op"]) if "/" in r["op"] else "", base_op_type(r["op_type"]))
            seq.setdefault(sk, []).append(ck)
        return seq, members

    seq_a, mem_a = calls(A, matched_a)
    seq_b, mem_b = calls(B, used_b)
    for (it, scope, typ), cks in seq_a.items():
        cands = seq_b.get((it_map.get(it), scope, typ), [])
        for ca, cb in zip(cks, cands):
            jb = {(B[j]["io"], int(B[j]["slot"])): j for j in mem_b[cb] if j not in used_b}
            for i in mem_a[ca]:
                j = jb.get((A[i]["io"], int(A[i]["slot"])))
                if j is not None and i not in matched_a:
                    take(i, j, "scope+type+order")
    only_a = [A[i] for i in range(len(A)) if i not in matched_a]
    only_b = [B[j] for j in range(len(B)) if j not in used_b]
    return matches, only_a, only_b


# ----------------------------------------------------------------------------- compare

def _iteration_pairs(da: Dump, db: Dump, ra, rb, iterations) -> List[Tuple[Optional[int], Optional[int]]]:
    def its(d, r):
        rec = d.records()
        if rec.empty:
            return set()
        if r is not None:
            rec = rec[rec["rank"] == r]
        return set(int(x) for x in rec["iteration"].dropna().unique())
    ia, ib = its(da, ra), its(db, rb)
    if iterations:
        pairs = []
        for it in iterations:
            if isinstance(it, (tuple, list)):
                pairs.append((int(it[0]), int(it[1])))
            else:
                pairs.append((int(it), int(it)))
        return pairs
    common = sorted(ia & ib)
    if common:
        pairs = [(i, i) for i in common]
    elif len(ia) == 1 and len(ib) == 1:
        pairs = [(next(iter(ia)), next(iter(ib)))]
    else:
        pairs = []
    pairs.append((None, None))      # constants/
    return pairs


def _mp_context():
    import multiprocessing as mp
    methods = mp.get_all_start_methods()
    if sys.platform.startswith("linux") and sys.version_info < (3, 12) and "fork" in methods:
        return mp.get_context("fork")
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        try:
            ctx.set_forkserver_preload(["opdump.analysis.metrics"])
        except Exception:  # pragma: no cover
            pass
        return ctx
    return mp.get_context("spawn")


def _batches(tasks: List[Tuple[int, str, str, int]], max_bytes: int = 32 << 20, max_count: int = 64):
    cur, size = [], 0
    for t in tasks:
        cur.append(t)
        size += t[3]
        if size >= max_bytes or len(cur) >= max_count:
            yield cur
            cur, size = [], 0
    if cur:
        yield cur


def _run_pairs(tasks: List[Tuple[int, str, str, int]], workers: int, parallel_min: int, progress: bool,
               max_inflight: Optional[int] = None) -> Dict[int, Dict[str, Any]]:
    """Metrics of every (index, path_a, path_b, bytes) task; in worker processes when there are
    ``parallel_min`` or more, in batches of small pairs, with at most ``max_inflight`` batches
    submitted at a time (bounded memory: workers memory-map their files)."""
    results: Dict[int, Dict[str, Any]] = {}
    bar = progress_bar(progress, len(tasks), "compare", "pair")
    if workers <= 1 or len(tasks) < parallel_min:
        for t in tasks:
            idx, m = _task(t)
            results[idx] = m
            if bar is not None:
                bar.update(1)
    else:
        inflight_cap = max_inflight or workers * 2
        per_batch = max(1, min(64, len(tasks) // (workers * 4) or 1))
        with ProcessPoolExecutor(max_workers=workers, mp_context=_mp_context()) as ex:
            pending = set()
            it = _batches(tasks, max_count=per_batch)
            exhausted = False
            while True:
                while not exhausted and len(pending) < inflight_cap:
                    try:
                        b = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    pending.add(ex.submit(_batch, b))
                if not pending:
                    break
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    out = f.result()
                    for idx, m in out:
                        results[idx] = m
                    if bar is not None:
                        bar.update(len(out))
    if bar is not None:
        bar.close()
    return results


def _fmt_shape(s) -> Optional[str]:
    if s is None:
        return None
    if isinstance(s, str):
        return s
    return "(" + ",".join(str(int(x)) for x in s) + ")"


def compare(a: Union[str, os.PathLike, Dump], b: Union[str, os.PathLike, Dump], *,
            mapping: Union[None, str, os.PathLike, Sequence[Tuple[str, str]]] = None,
            rank: Optional[int] = None, rank_b: Optional[int] = None,
            iterations: Optional[Iterable[Union[int, Tuple[int, int]]]] = None,
            io: Optional[str] = None, thresholds: Thresholds = Thresholds(),
            workers: Optional[int] = None, parallel_min: int = 64, progress: bool = True,
            include_parameters: bool = True) -> CompareResult:
    """Compare dump ``a`` against reference ``b`` (see module doc).

    ``rank``/``rank_b``: ranks to compare (default: each rank with the same id; with
    ``rank_b``, rank ``rank`` of A against ``rank_b`` of B, e.g. two data-parallel
    replicas of one dump). ``iterations``: ints or (iteration_a, iteration_b) pairs
    (default: the iterations both dumps hold). ``io``: ``input``/``output`` to compare
    only those."""
    import pandas as pd
    da = a if isinstance(a, Dump) else open_dump(a)
    db = b if isinstance(b, Dump) else open_dump(b)
    if isinstance(mapping, (str, os.PathLike)):
        mapping = load_mapping(mapping)
    if workers is None:
        workers = max(1, min(8, os.cpu_count() or 1))
    if rank_b is not None and rank is None:
        rank = min(da.rank_ids) if da.rank_ids else 0
    if rank is not None:
        rank_pairs = [(rank, rank_b if rank_b is not None else rank)]
    else:
        rank_pairs = [(r, r) for r in sorted(set(da.rank_ids) | set(db.rank_ids))]
    out_rows: List[Dict[str, Any]] = []
    unmatched_a: Dict[str, None] = {}
    unmatched_b: Dict[str, None] = {}
    all_it_pairs: List[Tuple[int, int]] = []
    for ra, rb in rank_pairs:
        rows_a = _rows(da, ra) if ra in da.ranks else []
        rows_b = _rows(db, rb) if rb in db.ranks else []
        if io:
            rows_a = [r for r in rows_a if r["io"] == io]
            rows_b = [r for r in rows_b if r["io"] == io]
        if not include_parameters:
            rows_a = [r for r in rows_a if r["kind"] == "op"]
            rows_b = [r for r in rows_b if r["kind"] == "op"]
        it_pairs = _iteration_pairs(da, db, ra, rb, iterations)
        all_it_pairs += [p for p in it_pairs if p[0] is not None and p not in all_it_pairs]
        matches, only_a, only_b = _match(rows_a, rows_b, it_pairs, mapping, ra, rb)
        for r in only_a:
            unmatched_a.setdefault(r["op"], None)
            out_rows.append(_row(r, None, "", "unmatched", "only in A"))
        for r in only_b:
            unmatched_b.setdefault(r["op"], None)
            out_rows.append(_row(None, r, "", "unmatched", "only in B"))
        for ra_, rb_, how in matches:
            out_rows.append(_row(ra_, rb_, how, None, None))
    # decide how each matched pair is compared
    tasks = []
    for n, row in enumerate(out_rows):
        if row["verdict"] is not None:
            continue
        ra_, rb_ = row["_a"], row["_b"]
        if is_garbage(ra_["op_type"], ra_["io"], ra_["slot"]) or is_garbage(rb_["op_type"], rb_["io"], rb_["slot"]):
            row["verdict"], row["reason"], row["mode"] = "skipped", "undefined values (F30a)", ""
            continue
        pa, pb = ra_.get("path"), rb_.get("path")
        if isinstance(pa, str) and isinstance(pb, str):
            row["mode"] = "tensor"
            tasks.append((n, pa, pb, int(ra_.get("nbytes") or 0) + int(rb_.get("nbytes") or 0)))
        elif ra_.get("stat_row") is True and rb_.get("stat_row") is True:
            row["mode"] = "statistics"
            v, why, extra = _stats_verdict(ra_, rb_, thresholds)
            row.update(extra)
            row["verdict"], row["reason"] = v, why
        else:
            row["mode"] = ""
            row["verdict"], row["reason"] = "unmatched", "no data to compare on one side (tensor vs statistics)"
    results = _run_pairs(tasks, workers, parallel_min, progress)
    for n, m in results.items():
        row = out_rows[n]
        v, why = verdict_for_metrics(m, thresholds)
        for k in ("cosine", "max_abs_err", "max_rel_err", "mean_abs_err", "rmse", "euclidean", "within_1e-3",
                  "within_5e-3", "nonfinite_mismatch"):
            if k in m:
                row[k] = m[k]
        row["shape_a"], row["shape_b"] = _fmt_shape(m.get("shape_a")), _fmt_shape(m.get("shape_b"))
        if row["shape_a"] and row["shape_b"] and row["shape_a"] != row["shape_b"] and not m.get("error"):
            why = (why + "; " if why else "") + f"shapes differ {row['shape_a']} vs {row['shape_b']} (compared flat)"
        row["verdict"], row["reason"] = v, why
    # random operators: differences are nondeterminism
    for row in out_rows:
        if row["verdict"] == "diverged" and row["_a"] is not None and row["io"] == "output" \
                and is_random_op(row["op_type"]):
            row["verdict"] = "nondeterministic"
            row["reason"] = "random operator: " + (row["reason"] or "")
    # order: A's execution order, unmatched-B rows after
    for row in out_rows:
        src = row["_a"] if row["_a"] is not None else row["_b"]
        it = src["iteration"]
        row["_sort"] = (0 if row["_a"] is not None else 1, src["rank"], -1 if it is None else it, int(src["order"]))
    out_rows.sort(key=lambda r: (r["_sort"][0], r["_sort"][2] if r["_sort"][2] >= 0 else 1 << 60,
                                 r["_sort"][1], r["_sort"][3]))
    # sources
    src_cache: Dict[Tuple[int, int, str, str], Tuple[str, str]] = {}

    def source_of(dump, r):
        key = (id(dump), r["rank"], r["graph"], r["op"])
        if key not in src_cache:
            info = dump.op_info(r["op"], rank=r["rank"], graph=r["graph"]) if r["kind"] == "op" else None
            src_cache[key] = (info.source, info.code) if info is not None else ("", "")
        return src_cache[key]

    # first divergence
    first = None
    nondet: List[str] = []
    diverged_params: List[str] = []
    for row in out_rows:
        ra_ = row["_a"]
        if ra_ is None:
            continue
        if row["verdict"] == "nondeterministic" and first is None and row["op"] not in nondet:
            nondet.append(row["op"])
        if row["verdict"] != "diverged":
            continue
        if ra_["kind"] != "op":
            if row["op"] not in diverged_params:
                diverged_params.append(row["op"])
            continue
        if first is None:
            first = row
    first_info = None
    if first is not None:
        fa = first["_a"]
        op_rows = [r for r in out_rows if r["_a"] is not None and r["_a"]["rank"] == fa["rank"]
                   and r["_a"]["iteration"] == fa["iteration"] and r["_a"]["op_file"] == fa["op_file"]
                   and r["_a"]["call"] == fa["call"]]
        bad_in = [r for r in op_rows if r["io"] == "input" and r["verdict"] == "diverged"]
        ok_in = [r for r in op_rows if r["io"] == "input" and r["verdict"] in ("pass", "warning")]
        if bad_in:
            cause = ("input " + ", ".join(f"{r['io']}.{r['slot']}" for r in bad_in)
                     + " already differs (from a parameter, a graph input, or an operator not dumped)")
        elif ok_in:
            cause = "inputs match, output differs: this operator computes differently"
        elif any(r["io"] == "input" for r in op_rows):
            cause = "output differs (its inputs were not compared: unmatched or without data)"
        else:
            cause = "output differs (inputs not dumped)"
        srcs, code = source_of(da, fa)
        if not srcs and first["_b"] is not None:
            srcs, code = source_of(db, first["_b"])
        first_info = {
            "rank": fa["rank"], "iteration": fa["iteration"], "graph": fa["graph"], "op": fa["op"],
            "op_b": first["op_b"], "op_type": fa["op_type"], "io": first["io"], "slot": first["slot"],
            "order": int(fa["order"]), "reason": first["reason"], "cause": cause, "source": srcs, "code": code,
            "cosine": first.get("cosine"), "max_abs_err": first.get("max_abs_err"),
            "path_a": first.get("path_a"), "path_b": first.get("path_b"),
        }
    for row in out_rows:
        r = row["_a"] if row["_a"] is not None else row["_b"]
        if r["kind"] == "op":
            d = da if row["_a"] is not None else db
            s, _ = source_of(d, r)
            row["source"] = s
    table = pd.DataFrame([{k: row.get(k) for k in TABLE_COLUMNS} for row in out_rows], columns=TABLE_COLUMNS)
    table["order"] = range(len(table))
    for c in ("iteration", "iteration_b"):
        table[c] = pd.array([None if v is None or v != v else int(v) for v in table[c]], dtype="Int64")
    return CompareResult(str(da.path), str(db.path), table, first_info, diverged_params, nondet,
                         list(unmatched_a), list(unmatched_b), thresholds, all_it_pairs,
                         (rank_pairs[0] if len(rank_pairs) == 1 else (None, None)))


def _row(ra: Optional[Dict[str, Any]], rb: Optional[Dict[str, Any]], how: str, verdict, reason) -> Dict[str, Any]:
    r = ra if ra is not None else rb
    return {
        "_a": ra, "_b": rb, "rank": r["rank"], "iteration": ra["iteration"] if ra is not None else None,
        "iteration_b": rb["iteration"] if rb is not None else None, "graph": r["graph"],
        "op": ra["op"] if ra is not None else None, "op_b": rb["op"] if rb is not None else None,
        "op_type": r["op_type"], "kind": r["kind"], "io": r["io"], "slot": int(r["slot"]), "call": int(r["call"]),
        "match": how, "mode": "", "verdict": verdict, "reason": reason,
        "dtype_a": ra.get("dtype") if ra is not None else None, "dtype_b": rb.get("dtype") if rb is not None else None,
        "shape_a": ra.get("shape") if ra is not None else None, "shape_b": rb.get("shape") if rb is not None else None,
        "path_a": ra.get("path") if ra is not None else None, "path_b": rb.get("path") if rb is not None else None,
    }
