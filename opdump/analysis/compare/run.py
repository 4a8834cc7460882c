"""``compare(A, B)``: the stages in order -- read the tensors of both dumps (shapes from
the ``.npy`` headers, checked against the file sizes), pair them (:mod:`.match`), judge
each pair (:mod:`.verdict`, tensor metrics in worker processes), find where A and B part
(:mod:`.first`), build the table and the result (:mod:`.result`).

Errors: a path that is not a dump, a dump with nothing in it, no common iteration, or no
tensor of A matching one of B raise :class:`CompareError` (``opdump compare`` exits 2).
A file that cannot be read is never an error: its pair is ``unreadable``, named with its
path and reason, and the rest is compared.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ..reader.npy import dtype_name, npy_layout, npy_layouts_sized
from ..common import absent_selection
from ..reader import Dump, open_dump
from .first import first_difference, first_divergence
from .noise_floor import demote_noise
from .mapping import load_mapping
from .open_pair import open_pair
from .frontend import RULE_FRONT_END
from .match import default_matchers, match
from .kernels import KERNEL_RULES, with_kernels
from .pairs import TABLE_COLUMNS, Pair, Tensor, shape_from_text
from .fields import make_tensors
from .gcpause import gc_paused, gc_running
from .stat_fast import statistics_compare
from .stat_match import column_pairs
from .stat_onesided import unmatched_warning
from .tensor_fast import tensor_compare
from .result import CompareResult, rule_of
from .stat_result import StatCompareResult, with_cells
from .stat_rows import pathless, table_cells
from .verdict import Thresholds, judge_metrics, judge_pair, judge_statistics
from ..undefined import UndefinedInputs, undefined_pair
from .detach_lines import split_detach_pairs

__all__ = ["compare", "CompareError", "tensors_of_records"]



class CompareError(ValueError):
    """Nothing to compare (empty dump, no common iteration, nothing matched)."""


def _layouts(paths: List[str], sizes: Optional[List[int]] = None) -> List[Any]:
    """:func:`npy_layout` of every path (the exception where one cannot be read), read by a few
    threads: the time goes into open/pread system calls, which run without the GIL.  ``sizes``:
    the files' sizes as the folder scan read them (:func:`.reader.npy.npy_layouts_sized`)."""
    def one(p: str) -> Any:
        try:
            return npy_layout(p)
        except Exception as e:  # noqa: BLE001 - reported, never raised
            return e

    def part(i: int, n: int) -> List[Any]:
        if sizes is not None:
            return npy_layouts_sized(paths[i:i + n], sizes[i:i + n])
        return [one(p) for p in paths[i:i + n]]
    if len(paths) < 64:
        return part(0, len(paths))
    from concurrent.futures import ThreadPoolExecutor
    step = 256                      # one task per 256 files (a future per file costs more than its header)
    with ThreadPoolExecutor(max_workers=4) as ex:
        parts = ex.map(lambda i: part(i, step), range(0, len(paths), step))
        return [x for chunk in parts for x in chunk]


def _tensors(dump: Dump, rank: Optional[int]) -> List[Tensor]:
    """The dump's tensors of one rank (records in execution order), shapes known: every
    file's ``.npy`` header is read here, once (compare's index), and kept in ``Tensor.layout``."""
    rec = dump.records()
    if rec.empty:
        return []
    if rank is not None:
        rec = rec[rec["rank"] == rank]
    return tensors_of_records(rec)


def tensors_of_records(rec) -> List[Tensor]:
    """:class:`Tensor` records of a records table (:meth:`Dump.records` rows, already in
    execution order), shapes known (``.npy`` headers read once, kept in ``Tensor.layout``).
    The online compare (:mod:`opdump.debug.online_compare`) reads its reference through this,
    one iteration at a time, so both compares see the same records."""
    if rec.empty:
        return []
    rec = rec[rec["iteration"].notna() | (rec["kind"] == "constant")]
    out = make_tensors(rec)                   # Tensor(row) per record, built column-wise (.fields)
    # Tensor.path and row["shape"] read from the columns the rows were made of (.fields)
    paths = rec["path"].tolist() if "path" in rec.columns else [None] * len(out)
    shapes = rec["shape"].tolist() if "shape" in rec.columns else [None] * len(out)
    with_file = [t for t, p in zip(out, paths) if isinstance(p, str) and p]
    for t, lay in zip(with_file, _layouts([t.path for t in with_file])):
        if isinstance(lay, Exception):
            t.problem = str(lay) or type(lay).__name__
        else:
            t.layout = lay
            t.shape, t.np_dtype = lay[0], dtype_name(lay[1])
    for t, s in zip(out, shapes):
        if t.shape is None:
            t.shape = shape_from_text(s)
    return out


def _data_bytes(t: Tensor) -> int:
    """Bytes of the tensor's data (from its header; the reader's size otherwise)."""
    if t.layout is not None:
        shape, dtype = t.layout[0], t.layout[1]
        n = dtype.itemsize
        for x in shape:
            n *= x
        return n
    return t.nbytes


def _borrow_shapes(a: List[Tensor], b: List[Tensor]) -> None:
    """An unreadable file keeps its place in the alignment: it takes the shape of the tensor
    with the same name in the other dump (it is reported as unreadable, not unmatched)."""
    for x, y in ((a, b), (b, a)):
        if not any(t.problem for t in x):
            continue
        idx = {(t.iteration, t.op_file, t.io, t.slot, t.call): t for t in y}
        for t in x:
            if t.problem and t.shape is None:
                o = idx.get((t.iteration, t.op_file, t.io, t.slot, t.call))
                if o is not None:
                    t.shape, t.np_dtype = o.shape, o.np_dtype


def _iteration_pairs(ta: List[Tensor], tb: List[Tensor], iterations) -> List[Tuple[Optional[int], Optional[int]]]:
    ia = {t.iteration for t in ta if t.iteration is not None}
    ib = {t.iteration for t in tb if t.iteration is not None}
    if iterations:
        pairs = [(int(it[0]), int(it[1])) if isinstance(it, (tuple, list)) else (int(it), int(it))
                 for it in iterations]
    elif ia & ib:
        pairs = [(i, i) for i in sorted(ia & ib)]
    elif len(ia) == 1 and len(ib) == 1:
        pairs = [(next(iter(ia)), next(iter(ib)))]
    else:
        pairs = []
    return pairs + [(None, None)]      # constants/


class _Sources:
    """Source line of an operator (A's, else B's), looked up once per operator."""

    def __init__(self, da: Dump, db: Dump):
        self.da, self.db = da, db
        self.cache: Dict[tuple, Tuple[str, str]] = {}

    def of_tensor(self, dump: Dump, t: Tensor) -> Tuple[str, str]:
        if t.kind != "op":
            return "", ""
        key = (id(dump), t.rank, t.graph, t.op)
        if key not in self.cache:
            info = dump.op_info(t.op, rank=t.rank, graph=t.graph)
            self.cache[key] = (info.source, info.code) if info is not None else ("", "")
        return self.cache[key]

    def __call__(self, p: Pair) -> Tuple[str, str]:
        src = self.of_tensor(self.da, p.a) if p.a is not None else ("", "")
        if not src[0] and p.b is not None:
            src = self.of_tensor(self.db, p.b)
        return src


def _check_samples(da: Dump, ra: int, db: Dump, rb: int) -> None:
    """Sample dumps (README, "Debug dumps") compare only with sample dumps of the same size:
    a sample against a whole tensor, or two sample sizes, would be reported as a shape
    difference on every tensor."""
    sa = da.ranks[ra].sample_num if ra in da.ranks else None
    sb = db.ranks[rb].sample_num if rb in db.ranks else None
    if sa == sb:
        return
    def what(n: Optional[int]) -> str:
        return f"sampled (first {n} elements of each tensor)" if n else "whole tensors"
    raise CompareError(f"A holds {what(sa)} but B holds {what(sb)}: tensor files are not comparable; "
                       "dump both with the same e2e_dump_settings.sample_mode/sample_num "
                       "(or compare statistics with saved_data \"statistic\")")


def _open(x: Union[str, os.PathLike, Dump]) -> Dump:
    return x if isinstance(x, Dump) else open_dump(x)


@gc_paused                                  # 2.8 of 13 s on 136,000 rows (.gcpause)
def compare(a: Union[str, os.PathLike, Dump], b: Union[str, os.PathLike, Dump], *,
            mapping: Union[None, str, os.PathLike, Sequence[Tuple[str, str]]] = None,
            rank: Optional[int] = None, rank_b: Optional[int] = None,
            iterations: Optional[Iterable[Union[int, Tuple[int, int]]]] = None,
            io: Optional[str] = None, thresholds: Thresholds = Thresholds(),
            workers: Optional[int] = None, parallel_min: int = 64, progress: bool = True,
            include_parameters: bool = True, matchers=None) -> CompareResult:
    """Compare dump ``a`` (under test) against the reference ``b`` (README, "Analysis").

    ``rank``/``rank_b``: ranks to compare (default: each rank with the same id; with
    ``rank_b``, rank ``rank`` of A against ``rank_b`` of B). ``iterations``: ints or
    (iteration_a, iteration_b) pairs (default: the iterations both dumps hold). ``io``:
    ``input``/``output`` only. ``matchers``: the matching rules (default
    :func:`.match.default_matchers`). Raises :class:`CompareError` when there is nothing
    to compare."""
    if isinstance(a, Dump) or isinstance(b, Dump):
        da, db = _open(a), _open(b)
    else:                                       # two paths: B read by a child meanwhile (.open_pair)
        da, db = open_pair(a, b, open_dump)     # before pandas is imported: each process imports it
    import pandas as pd                         # while reading (the records), the import off the serial path
    if isinstance(mapping, (str, os.PathLike)):
        mapping = load_mapping(mapping)
    plain = None
    if matchers is None:
        plain = default_matchers(mapping)
        matchers = with_kernels(plain, da, db)     # a kernel dump: buffers -> operators
    if rank_b is not None and rank is None:
        rank = min(da.rank_ids) if da.rank_ids else 0
    rank_pairs = ([(rank, rank_b if rank_b is not None else rank)] if rank is not None
                  else [(r, r) for r in sorted(set(da.rank_ids) | set(db.rank_ids))])
    if rank is not None:            # a rank a side does not hold: say so, not "holds nothing"
        for side, d, r in (("A", da, rank), ("B", db, rank_pairs[0][1])):
            why = absent_selection(d, rank=r) if d.rank_ids else ""
            if why:
                raise CompareError(f"{side}: {why}")
    if matchers is plain and not mapping:        # statistics only: column-wise when it applies (.stat_fast)
        fast = statistics_compare(da, db, rank_pairs, iterations, io, include_parameters, thresholds,
                                  _check_samples, _iteration_pairs, _Sources(da, db))
        if fast is not None:
            return fast
    from .pool import default_workers, run_pairs    # the worker pool (multiprocessing): not for statistics only
    if workers is None:
        workers = default_workers()
    if matchers is plain and not mapping:        # tensor files only: column-wise when it applies (.tensor_fast)
        def _metrics(tasks):
            with gc_running():
                return run_pairs(tasks, workers, parallel_min, progress)
        fast = tensor_compare(da, db, rank_pairs, iterations, io, include_parameters, thresholds, _check_samples,
                              _iteration_pairs, _Sources(da, db), _layouts, _metrics, workers, parallel_min,
                              progress)
        if fast is not None:
            return fast
    pairs: List[Pair] = []
    all_it_pairs: List[Tuple[int, int]] = []
    seen_a = seen_b = False
    for ra, rb in rank_pairs:
        _check_samples(da, ra, db, rb)
        ta = _tensors(da, ra) if ra in da.ranks else []
        tb = _tensors(db, rb) if rb in db.ranks else []
        seen_a, seen_b = seen_a or bool(ta), seen_b or bool(tb)
        if io:
            ta, tb = [t for t in ta if t.io == io], [t for t in tb if t.io == io]
        if not include_parameters:
            ta, tb = [t for t in ta if t.kind == "op"], [t for t in tb if t.kind == "op"]
        _borrow_shapes(ta, tb)
        it_pairs = _iteration_pairs(ta, tb, iterations)
        all_it_pairs += [p for p in it_pairs if p[0] is not None and p not in all_it_pairs]
        by_it_a: Dict[Optional[int], List[Tensor]] = {}
        by_it_b: Dict[Optional[int], List[Tensor]] = {}
        for t in ta:
            by_it_a.setdefault(t.iteration, []).append(t)
        for t in tb:
            by_it_b.setdefault(t.iteration, []).append(t)
        col = (column_pairs(da, ra, db, rb, io, include_parameters, ta, tb, it_pairs)
               if matchers is plain and not mapping else None)     # statistics only: over columns (.stat_match)
        if col is not None:
            pairs += col
            continue
        for ia, ib in it_pairs:
            pairs += match(by_it_a.get(ia, []), by_it_b.get(ib, []), matchers)
    for side, seen, d in (("A", seen_a, da), ("B", seen_b, db)):
        if not seen:
            raise CompareError(f"{side}: {d.path} holds no dumped tensors or statistics: nothing to compare")
    if not all_it_pairs and not any(p.matched for p in pairs):
        raise CompareError("A and B have no iteration in common; pair them with --iterations A:B (e.g. 3:4)")
    if not any(p.matched for p in pairs):
        raise CompareError("no tensor of A matches one of B (different models?): nothing compared")

    src = _Sources(da, db)                  # detach pairs of other lines: front-end operators (.detach_lines)
    pairs = split_detach_pairs(pairs, lambda t: src.of_tensor(da, t), lambda t: src.of_tensor(db, t))

    # judge: what needs no data, then tensor metrics
    tasks = []
    stat_pairs: List[Pair] = []
    ua, ub = UndefinedInputs(da), UndefinedInputs(db)      # out= destinations, empty* outputs
    for n, p in enumerate(pairs):
        if p.a is not None and p.b is not None and undefined_pair(p, ua, ub):
            p.verdict, p.reason = "skipped", "undefined values (uninitialised or overwritten)"
        elif judge_pair(p, thresholds, stat_pairs):
            tasks.append((n, p.a.path, p.b.path, _data_bytes(p.a) + _data_bytes(p.b), p.a.layout, p.b.layout))
    judge_statistics(stat_pairs, thresholds)              # column-wise, all at once
    with gc_running():                                  # arrays: the collector on (.gcpause)
        metrics = run_pairs(tasks, workers, parallel_min, progress)
    for n, m in metrics.items():
        judge_metrics(pairs[n], m, thresholds)
    pairs.sort(key=Pair.sort_key)
    demote_noise(pairs)                     # a precision compare's rounding noise: not diverged (.noise_floor)

    sources = _Sources(da, db)
    for p in pairs:
        p.source = sources(p)[0]
    compared = [p for p in pairs if p.identical is not None or (p.matched and p.mode and p.verdict
                                                                 not in ("unreadable", "unmatched"))]
    same_flags = [p.same_dtype for p in compared]          # once per pair (a property: not cached)
    same = bool(compared) and all(same_flags)
    fdiff, nondet_d = first_difference(pairs, sources) if same else (None, [])
    fdiv, nondet, params = first_divergence(pairs, sources)
    rule, note = rule_of(same, same_flags.count(False), len(compared), thresholds)
    result = _result(da, db, pairs, rank_pairs, all_it_pairs, thresholds, pd)
    result.first_divergence, result.diverged_parameters = fdiv, params
    result.nondeterministic_before = nondet_d if same and fdiff is not None else nondet
    result.first_difference, result.rule, result.rule_note = fdiff, rule, note
    return result


def _result(da, db, pairs: List[Pair], rank_pairs, it_pairs, thresholds, pd) -> CompareResult:
    unmatched_a: Dict[str, None] = {}
    unmatched_b: Dict[str, None] = {}
    matched_by: Dict[str, int] = {}
    unreadable: Dict[str, str] = {}
    front_a: Dict[str, None] = {}
    front_b: Dict[str, None] = {}
    kernel_a: Dict[str, None] = {}                 # left on one side by a kernel dump (.kernels)
    kernel_b: Dict[str, None] = {}
    for p in pairs:
        if p.a is not None and p.b is None:
            (front_a if p.rule == RULE_FRONT_END else kernel_a if p.rule in KERNEL_RULES
             else unmatched_a).setdefault(p.a.op, None)
        elif p.b is not None and p.a is None:
            (front_b if p.rule == RULE_FRONT_END else kernel_b if p.rule in KERNEL_RULES
             else unmatched_b).setdefault(p.b.op, None)
        else:
            matched_by[p.rule] = matched_by.get(p.rule, 0) + 1
        for t in (p.a, p.b):
            if t is not None and t.problem and t.path:
                unreadable.setdefault(t.path, t.problem)
        if p.verdict == "unreadable" and p.metrics.get("unreadable"):
            path = p.metrics["unreadable"]
            unreadable.setdefault(path, str(p.metrics.get("error", "")).replace(f"cannot read {path}: ", ""))
    (n_a, m_a), (n_b, m_b) = _call_counts(pairs, True), _call_counts(pairs, False)
    ops = {"calls_a": n_a, "matched_a": m_a, "calls_b": n_b, "matched_b": m_b}
    warnings = unmatched_warning(ops)      # both sides mostly unmatched (one side a subset is fine: eager vs graph)
    # rows as lists (Pair.table_values, TABLE_COLUMNS order): the same frame as from one dict
    # per pair (pandas infers each column's dtype from the same objects), built faster
    cells = table_cells(pairs) if pathless(pairs) else None      # statistics only: columns (.stat_rows)
    table = None if cells is not None else _table(pairs, pd)
    cls = CompareResult if cells is None else StatCompareResult
    result = cls(str(da.path), str(db.path), table, None, [], [], list(unmatched_a), list(unmatched_b),
                         thresholds, it_pairs, (rank_pairs[0] if len(rank_pairs) == 1 else (None, None)),
                         matched_by=matched_by, operators=ops, unreadable=sorted(unreadable.items()),
                         warnings=warnings, front_end_a=[o for o in front_a if o not in unmatched_a],
                         front_end_b=[o for o in front_b if o not in unmatched_b],
                         kernel_only_a=[o for o in kernel_a if o not in unmatched_a],
                         kernel_only_b=[o for o in kernel_b if o not in unmatched_b])
    return result if cells is None else with_cells(result, cells)


def _call_counts(pairs: List[Pair], a_side: bool) -> Tuple[int, int]:
    """(operator calls, calls with a matched pair) of A's side (``a_side``) or B's: the
    groups :func:`.first.calls_in_order` makes of that side's pairs, counted (their order
    does not matter for a count: no sort of B's side)."""
    seen: Dict[tuple, bool] = {}
    for p in pairs:
        t = p.a if a_side else p.b
        if t is None or t.kind != "op":
            continue
        k = (t.rank,) + t.call_key
        if p.a is not None and p.b is not None:
            seen[k] = True
        elif k not in seen:
            seen[k] = False
    return len(seen), sum(seen.values())


def _table(pairs: List[Pair], pd):
    """The table of ``pairs`` built row by row (pairs with files; :mod:`.stat_rows` otherwise)."""
    table = pd.DataFrame([p.table_values() for p in pairs], columns=TABLE_COLUMNS)
    table["order"] = range(len(table))
    for c in ("iteration", "iteration_b"):
        table[c] = pd.array([None if v is None or v != v else int(v) for v in table[c]], dtype="Int64")
    return table
