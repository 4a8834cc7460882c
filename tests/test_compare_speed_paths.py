"""Statistics-only compare, column-wise (issue 25: 100,000 rows): the same results as the
per-row code it replaced, to the last digit.

* ``reference_read_statistic_csv`` below is a verbatim copy of the cell-by-cell reader
  (only renamed, module names qualified): the column-wise reader must give the same rows
  (keys in the same order, same Python types and values, same error and refused-line
  reports) on hand-written files full of edge cases and on generated dumps;
* ``reference_compare_table`` runs compare's stages with the per-pair verdict
  (``judge_pair`` without the column-wise set-aside) and the one-dict-per-pair table that
  compare used before: ``compare()`` must give the same table (every column, dtype and
  value) and summary on statistics dumps with NaN/Inf, overflow, an operator missing on
  either side, other dropout masks, other weights, MD5 and NaN/Inf counts, a reversed
  argument order (B vs A), and a real eager statistics dump pair.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Dict, List

import pandas as pd
import pytest

from analysis_fixtures import make_dump
from opdump.analysis.compare import compare
from opdump.analysis.compare import run as R
from opdump.analysis.compare.first import first_difference, first_divergence
from opdump.analysis.compare.match import default_matchers, match
from opdump.analysis.compare.pairs import METRIC_COLUMNS, TABLE_COLUMNS, Pair, on_disk
from opdump.analysis.compare.verdict import Thresholds, judge_pair
from opdump.analysis.reader import open_dump
from opdump.analysis.reader import statistics as S



def _old_row(p):
    """The per-pair dict row compare built before its table was made from lists (the oracle)."""
    a, b, t = p.a, p.b, p.side
    row = {
        "rank": t.rank, "iteration": a.iteration if a is not None else None,
        "iteration_b": b.iteration if b is not None else None, "graph": t.graph,
        "op": a.op if a is not None else None, "op_b": b.op if b is not None else None,
        "op_type": t.op_type, "kind": t.kind, "io": t.io, "slot": t.slot, "call": t.call,
        "match": p.rule, "mode": p.mode, "verdict": p.verdict, "reason": p.reason,
        "identical": p.identical,
        "dtype_a": a.dtype if a is not None else None, "dtype_b": b.dtype if b is not None else None,
        "shape_a": a.shape_text() if a is not None else None,
        "shape_b": b.shape_text() if b is not None else None,
        "source": p.source, "path_a": on_disk(a.path) if a is not None and a.path else None,
        "path_b": on_disk(b.path) if b is not None and b.path else None,
    }
    for k in METRIC_COLUMNS:
        if k in p.metrics:
            row[k] = p.metrics[k]
    return row


def reference_read_statistic_csv(path: Path) -> List[Dict[str, Any]]:
    """Rows of one statistic.csv as dicts (normalised column names).

    Shapes such as ``(2,3)`` are accepted quoted or not (an unquoted shape spans
    several CSV fields and is glued back together).  A line the CSV parser refuses (a
    field over the parser's limit, a NUL byte) is skipped and its error, naming the file
    and line, goes into ``stat_skipped`` of the next row read (or the last one; that row's
    own cells are still trusted); a file whose lines are all refused raises ValueError
    naming the file."""
    rows: List[Dict[str, Any]] = []
    refused: List[str] = []
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            return rows
        except csv.Error as e:
            raise ValueError(f"{path}: line {reader.line_num}: not a readable statistic.csv ({e})") from None
        while header and header[-1] == "":
            header.pop()
        shape_i = header.index("Shape") if "Shape" in header else None
        while True:
            try:
                rec = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                refused.append(f"{path}: line {reader.line_num}: unreadable CSV line ({e})")
                if len(refused) > 1000:          # a file of garbage: stop, it is reported
                    break
                continue
            if not rec or all(not x.strip() for x in rec):
                continue
            while len(rec) > len(header) and rec[-1] == "":
                rec = rec[:-1]
            if shape_i is not None and len(rec) > len(header):
                # glue an unquoted "(a,b,c)" back into one field
                j = shape_i
                while j < len(rec) and not rec[j].rstrip().endswith(")"):
                    j += 1
                rec = rec[:shape_i] + [",".join(rec[shape_i:j + 1])] + rec[j + 1:]
            if len(rec) < len(header):
                continue  # torn row (whole files are written, so only a foreign writer's)
            row: Dict[str, Any] = {}
            errors: List[str] = []
            line = reader.line_num
            for h, v in zip(header, rec):
                key = S._STRUCT_COLUMNS.get(h) or S.STAT_COLUMNS.get(h) or h
                if key in S._INT_KEYS:
                    try:
                        row[key] = int(float(v))
                    except (ValueError, OverflowError):
                        row[key] = -1
                        errors.append(S._cell_error(path, line, h, v))
                elif key in ("op_type", "op", "dtype", "format", "md5"):
                    row[key] = v.strip()
                elif key == "io":
                    row[key] = v.strip().lower()
                elif key == "shape":
                    row[key] = S._norm_shape(v)
                elif key in S._NUMERIC:
                    try:
                        row[key] = S._num(v)
                    except S._Malformed:
                        row[key] = None          # unknown, never NaN
                        errors.append(S._cell_error(path, line, h, v))
                else:                            # a column this reader does not know: kept as read
                    try:
                        row[key] = S._num(v)
                    except S._Malformed:
                        row[key] = v.strip()
            if errors:
                row["stat_errors"] = "; ".join(errors)
            if refused:
                row["stat_skipped"], refused = "; ".join(refused), []
            rows.append(row)
    if refused:
        if not rows:
            raise ValueError("; ".join(refused[:3]))
        last = rows[-1]
        last["stat_skipped"] = "; ".join(([last["stat_skipped"]] if last.get("stat_skipped") else []) + refused)
    return rows



def _same_rows(x: List[Dict[str, Any]], y: List[Dict[str, Any]]) -> None:
    assert len(x) == len(y)
    for i, (a, b) in enumerate(zip(x, y)):
        assert list(a) == list(b), (i, a, b)
        for k in a:
            u, v = a[k], b[k]
            assert type(u) is type(v), (i, k, u, v)
            assert u == v or (isinstance(u, float) and math.isnan(u) and math.isnan(v)), (i, k, u, v)


HEADER = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,"
          "Avg Value,Count,NaN Count,MD5,L2Norm Value,Mystery,Note")

EDGE_LINES = [
    'Add,Default/add-op1,0,0,10,input,0,24,Float32,"(2,3)",1.5,-1,0.25,6,0,abc,2.5,7,x',
    "Add,Default/add-op1,0,0,11,output,0,24,Float32,(2,3),nan,inf,-inf,6,2,,1e400,,",       # unquoted shape
    "Mul,Default/mul-op2,0,0,12, INPUT ,1,8,Float16,(2),true,false, 3 ,1_0,,d41d,1,text,  y ",
    "Mul,Default/mul-op2,0,0,13,output,0,8,Float16,(),NOT_A_NUMBER,1,2,3,4,5,6,7,8",          # malformed numbers
    "Mul,Default/mul-op2,x,0,inf,output,1,8,Float16,(),1,1,1,1,1,1,1,1,1",                     # malformed ints
    "",                                                                                      # blank line
    " , , , ",                                                                               # whitespace only
    "Sub,Default/sub-op3,0,0,14,output,0,8",                                                # torn row
    "Sub,Default/sub-op3,0,0,15,output,0,8,Int64,(1),1,1,1,1,1,1,1,1,1,,,",                  # trailing commas
    'Sub,Default/sub-op3,0,0,16,output,0,8,Int64,"(4,4)",' + "9" * 30 + ",-0.0,5e-324,1e308,0,f,1,2,3",
]


def _write(path: Path, lines) -> Path:
    path.write_text("\n".join([HEADER] + list(lines)) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("case", ["edges", "refused", "refused_last", "all_refused", "header_only", "empty",
                                  "no_shape", "empty_header"])
def test_reader_gives_the_rows_of_the_cell_by_cell_reader(tmp_path, case):
    p = tmp_path / "statistic.csv"
    if case == "edges":
        _write(p, EDGE_LINES)
    elif case == "refused":                 # a NUL byte and an over-long field in the middle
        _write(p, EDGE_LINES[:2] + ["Add,x\0y,0,0,1,input,0,1,Float32,(1),1,1,1,1,1,1,1,1,1",
                                    '"' + "z" * 200_000 + '",1'] + EDGE_LINES[2:])
    elif case == "refused_last":
        _write(p, EDGE_LINES[:3] + ["Add,x\0y,0,0,1,input,0,1,Float32,(1),1,1,1,1,1,1,1,1,1"])
    elif case == "all_refused":
        _write(p, ["Add,x\0y,0,0,1,input,0,1,Float32,(1),1,1,1,1,1,1,1,1,1"])
    elif case == "header_only":
        _write(p, [])
    elif case == "empty":
        p.write_text("")
    elif case == "no_shape":
        p.write_text("Op Type,Op Name,Max Value,Mystery\nAdd,a,1,2\nAdd,b,x,y\nAdd,c,3,4,5,6\n")
    else:
        p.write_text(",,\n1,2\n\n")
    try:
        ref = reference_read_statistic_csv(p)
    except ValueError as e:
        with pytest.raises(ValueError) as got:
            S.read_statistic_csv(p)
        assert str(got.value) == str(e)
        return
    _same_rows(S.read_statistic_csv(p), ref)
    if case == "edges":
        assert any("stat_errors" in r for r in ref) and len(ref) == 7


def reference_compare_table(a, b, th: Thresholds = Thresholds()) -> pd.DataFrame:
    """compare()'s table, built by its stages with the per-pair verdict and one dict per
    pair (the code compare ran before the column-wise statistics path)."""
    da, db = open_dump(a), open_dump(b)
    pairs: List[Pair] = []
    for rid in sorted(set(da.rank_ids) | set(db.rank_ids)):
        ta, tb = R._tensors(da, rid), R._tensors(db, rid)
        R._borrow_shapes(ta, tb)
        by_a: Dict[Any, list] = {}
        by_b: Dict[Any, list] = {}
        for t in ta:
            by_a.setdefault(t.iteration, []).append(t)
        for t in tb:
            by_b.setdefault(t.iteration, []).append(t)
        for ia, ib in R._iteration_pairs(ta, tb, None):
            pairs += match(by_a.get(ia, []), by_b.get(ib, []), default_matchers())
    for p in pairs:
        assert judge_pair(p, th) is False            # statistics only: nothing left for the pool
    pairs.sort(key=Pair.sort_key)
    sources = R._Sources(da, db)
    for p in pairs:
        p.source = sources(p)[0]
    rows = []
    for p in pairs:
        r = _old_row(p)
        rows.append({k: r.get(k) for k in TABLE_COLUMNS})
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    table["order"] = range(len(table))
    for c in ("iteration", "iteration_b"):
        table[c] = pd.array([None if v is None or v != v else int(v) for v in table[c]], dtype="Int64")
    first_divergence(pairs, sources)
    first_difference(pairs, sources)
    return table


STATS = ["max", "min", "avg", "count", "nan count", "positive inf count", "negative inf count", "md5", "l2norm"]

VARIANTS = {
    "weights": dict(weight_delta={"fc1.weight": 1e-3}),
    "nan": dict(nan_weight_at=1),
    "overflow": dict(overflow_at=0),
    "extra_op": dict(extra_op=True),
    "dropout": dict(dropout_seed=3),
    "same": dict(),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("swap", [False, True])
def test_statistics_compare_equals_the_per_pair_path(tmp_path, variant, swap):
    ref = make_dump(tmp_path / "ref", iterations=(0, 1, 2), saved_data="statistic", stats=STATS)
    other = make_dump(tmp_path / "other", iterations=(0, 1, 2), saved_data="statistic", stats=STATS,
                      quote_shape=False, **VARIANTS[variant])
    a, b = (ref, other) if swap else (other, ref)
    got = compare(a, b, progress=False)
    expect = reference_compare_table(a, b)
    pd.testing.assert_frame_equal(got.table, expect, check_exact=True)
    assert set(got.table["mode"]) - {""} == {"statistics"}
    if variant != "same":
        assert (got.table["verdict"] != "pass").any()


def test_real_eager_statistics_dumps_equal_the_per_pair_path(tmp_path):
    """Real eager capture (torch) of a small MLP, statistics with every category: A with a
    perturbed weight (one NaN) and two more operators, B the reference."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    import opdump
    from opdump.capture.eager import EagerCapture
    from opdump.config.iteration import IterationSpec
    from opdump.config.model import DumpConfig

    def run(path, perturb: bool):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
        if perturb:
            with torch.no_grad():
                m[0].weight.mul_(1 + 1e-3)
                m[0].weight[0, 0] = float("nan")
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        cfg = DumpConfig(path=str(path), iteration=IterationSpec(ranges=((0, 1),)), saved_data="statistic",
                         statistic_category=tuple(c for c in STATS))
        with opdump.Session(cfg) as s, EagerCapture(s):
            for _ in range(2):
                opt.zero_grad()
                out = m(x)
                if perturb:
                    out = torch.tanh(out) * 4.0
                F.cross_entropy(out, y).backward()
                opt.step()
        return str(path)

    a, b = run(tmp_path / "a", True), run(tmp_path / "b", False)
    got = compare(a, b, progress=False)
    pd.testing.assert_frame_equal(got.table, reference_compare_table(a, b), check_exact=True)
    assert {"diverged", "pass"} <= set(got.table["verdict"])
    assert (got.table["verdict"] == "unmatched").any()        # the extra operators of A
    for p in Path(a).rglob("statistic.csv"):
        _same_rows(S.read_statistic_csv(p), reference_read_statistic_csv(p))


# ---------------------------------------------------------------- tensors built column-wise, GC paused
_FIELDS = ("rank", "iteration", "graph", "op", "op_file", "op_type", "kind", "io", "slot", "call", "order",
           "call_key", "tensor_key")


def _reference_tensors(rec):
    """``tensors_of_records``' loop before :mod:`.fields`: ``Tensor(row)`` per record,
    fields computed by the cached properties."""
    from opdump.analysis.compare.pairs import Tensor
    out = []
    for r in rec.to_dict("records"):
        it = r["iteration"]
        try:
            r["iteration"] = None if it is None or it != it else int(it)
        except TypeError:  # pd.NA
            r["iteration"] = None
        out.append(Tensor(r))
    return out


@pytest.mark.parametrize("saved_data", ["statistic", "tensor", "full"])
def test_tensors_built_column_wise_equal_tensor_of_each_row(tmp_path, saved_data):
    from opdump.analysis.compare.fields import make_tensors
    d = make_dump(tmp_path / "d", iterations=(0, 1), saved_data=saved_data, stats=STATS, extra_op=True)
    rec = open_dump(d).records()
    rec = rec[rec["iteration"].notna() | (rec["kind"] == "constant")]
    got, ref = make_tensors(rec), _reference_tensors(rec)
    assert len(got) == len(ref) > 10
    for x, y in zip(got, ref):
        assert list(x.row) == list(y.row)
        for k in x.row:
            u, v = x.row[k], y.row[k]
            assert type(u) is type(v) and (u == v or u is v or (u != u and v != v)), (k, u, v)
        for k in _FIELDS:                 # y computes them now, x had them filled
            assert getattr(x, k) == getattr(y, k) and type(getattr(x, k)) is type(getattr(y, k)), k
        assert (x.shape, x.np_dtype, x.problem, x.layout) == (None, None, None, None)
        assert x.dtype == y.dtype and x.path == y.path and x.has_stats == y.has_stats


def test_tensors_with_a_cell_int_cannot_read_fall_back_to_the_properties(tmp_path):
    """A slot that is not a number: the fields are left to the properties, which raise as before."""
    from opdump.analysis.compare.fields import make_tensors
    rec = open_dump(make_dump(tmp_path / "d", iterations=(0,), saved_data="statistic")).records()
    rec = rec.astype({"slot": object})
    rec.loc[rec.index[0], "slot"] = "x"
    got = make_tensors(rec)
    assert got[1].slot == _reference_tensors(rec)[1].slot
    with pytest.raises(ValueError):
        got[0].slot


def test_compare_runs_with_the_collector_paused_and_restores_it(tmp_path):
    import gc
    from opdump.analysis.compare.gcpause import gc_paused
    seen = []
    f = gc_paused(lambda: seen.append(gc.isenabled()) or 7)
    assert gc.isenabled()
    assert f() == 7 and seen == [False] and gc.isenabled()
    gc.disable()
    try:
        f()
        assert not gc.isenabled()          # a caller's choice is kept
    finally:
        gc.enable()

    def boom():
        raise KeyError("x")
    with pytest.raises(KeyError):
        gc_paused(boom)()
    assert gc.isenabled()
    d = make_dump(tmp_path / "d", iterations=(0,), saved_data="statistic")
    assert len(compare(d, d, progress=False).table) and gc.isenabled()


def test_reader_sanitize_memo_equals_the_rule():
    from opdump.analysis.reader.names_cache import sanitize as memo
    from opdump.format.names import sanitize
    for name in ["Default/net-Net/add-op1", "a b:c*d?e\"f<g>h|i\\j", "", "x\x00y", "Default/add-op1"] * 2:
        assert memo(name) == sanitize(name)


def test_the_collector_runs_again_around_the_tensor_metrics(tmp_path):
    """Tensor metrics (arrays, in process or in workers forked there) run with the collector
    on; the statistics stages around them with it paused; outside a compare nothing changes."""
    import gc
    from opdump.analysis.compare.gcpause import gc_paused, gc_running
    seen = []

    def body():
        seen.append(gc.isenabled())
        with gc_running():
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())
    gc_paused(body)()
    assert seen == [False, True, False] and gc.isenabled()
    with gc_running():
        assert gc.isenabled()
    gc.disable()
    try:
        seen.clear()
        gc_paused(body)()                 # the caller turned it off: it stays off throughout
        assert seen == [False, False, False]
    finally:
        gc.enable()
    a = make_dump(tmp_path / "a", iterations=(0,), saved_data="tensor")
    b = make_dump(tmp_path / "b", iterations=(0,), saved_data="tensor", weight_delta={"fc1.weight": 1e-3})
    r = compare(a, b, progress=False, workers=2, parallel_min=0)
    assert set(r.table["mode"]) - {""} == {"tensor"} and gc.isenabled()
