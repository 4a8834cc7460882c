"""The column-wise statistics-only compare (opdump/analysis/compare/stat_fast.py) gives what
the per-row stages give: the same table (values, dtypes, row order), summary, first
difference, first divergence and CSV, on generated statistics-only dumps -- several
iterations and ranks, calls of one scope with equal signatures whose statistics make the
matcher's value tie-break re-pair them, NaN/Inf cells, MD5 columns, dtypes and shapes that
differ, a random operator, and dumps where the fast path must step aside (a row missing on
one side, a shape that differs).  ``OPDUMP_COMPARE_FAST=0`` forces the per-row stages.
"""
from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import pandas as pd
import pytest

from opdump.analysis.compare import compare
from opdump.analysis.compare import run as run_mod
from opdump.analysis.compare.stat_fast import statistics_compare
from opdump.analysis.compare.verdict import Thresholds
from opdump.analysis.reader import open_dump

from analysis_fixtures import make_dump

HEADER = ["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size", "Data Type", "Shape",
          "Max Value", "Min Value", "Avg Value", "Count", "NaN Count", "Negative Inf Count", "Positive Inf Count",
          "MD5", "L2Norm Value"]


def _ops(blocks: int):
    """(op type, full name, [(io, slot, shape)]) in execution order: per block a forward
    t/addmm/relu/dropout and a backward with two mm and two detach calls of equal signatures."""
    out = []
    n = 0
    for k in range(blocks):
        fwd = f"Default/Net/blk{k}-Block"
        bwd = f"Gradients/Default/Net/blk{k}-Block"
        for typ, ios in (("t", [("input", 0, (4, 4)), ("output", 0, (4, 4))]),
                         ("addmm", [("input", 0, (4,)), ("input", 1, (2, 4)), ("input", 2, (4, 4)),
                                    ("output", 0, (2, 4))]),
                         ("relu", [("input", 0, (2, 4)), ("output", 0, (2, 4))]),
                         ("native_dropout", [("input", 0, (2, 4)), ("output", 0, (2, 4))])):
            out.append((typ, f"{fwd}/{typ}-op{n}", ios))
            n += 1
        for typ, ios in (("mm", [("input", 0, (2, 4)), ("input", 1, (4, 4)), ("output", 0, (2, 4))]),
                         ("mm", [("input", 0, (4, 2)), ("input", 1, (2, 4)), ("output", 0, (4, 4))]),
                         ("detach", [("input", 0, (4, 4)), ("output", 0, (4, 4))]),
                         ("detach", [("input", 0, (4, 4)), ("output", 0, (4, 4))]),
                         ("empty_like", [("input", 0, (4,)), ("output", 0, (4,))])):
            out.append((typ, f"{bwd}/{typ}-op{n}", ios))
            n += 1
    return out


def _fmt(v: float) -> str:
    return "nan" if v != v else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))


def write_stats_dump(root: Path, *, iterations=(0, 1, 2), ranks=(0,), blocks=3, seed=0, perturb=0.0,
                     swap_ties=False, nonfinite=False, drop=None, dtype_of=None, shape_of=None, calls=1,
                     md5=False) -> Path:
    """A statistics-only dump in the MindSpore layout (statistic.csv + execution orders).
    Values come from ``seed``; ``perturb`` scales B-like changes; ``swap_ties`` gives each
    block's two backward ``detach`` calls each other's statistics; ``drop`` (iteration, op
    index) leaves an operator out; ``dtype_of``/``shape_of`` override by op index."""
    ops = _ops(blocks)
    for rank in ranks:
        rdir = root / f"rank_{rank}"
        (rdir / "execution_order").mkdir(parents=True, exist_ok=True)
        order = "".join(f"{name}\n" for _, name, _ in ops for _ in range(calls))
        (rdir / "execution_order" / "ms_execution_order_graph_0.csv").write_text(
            "NodeExecutionOrder-FullNameWithScope\n" + order)
        (rdir / "execution_order" / "ms_global_execution_order_graph_0.csv").write_text(
            "".join(f"{i}\n" for i in iterations))
        ts = 1_700_000_000_000_000 + rank
        for it in iterations:
            d = rdir / "Net" / "0" / str(it)
            d.mkdir(parents=True, exist_ok=True)
            rows = []
            vals_rng = random.Random(hash((seed, rank, it)) & 0xFFFF)
            for p in ("w0", "w1"):
                ts += 10
                v = vals_rng.uniform(-1, 1)
                rows.append(["Parameter", f"net.{p}", "0", "0", str(ts), "output", "0", "64", "Float32", "(4,4)",
                             _fmt(v + perturb), _fmt(-v), _fmt(v / 3), "16", "0", "0", "0",
                             "" if not md5 else f"{p}{it}", _fmt(abs(v) * 2)])
            stats_by_op = {}
            for idx, (typ, name, ios) in enumerate(ops):
                if drop is not None and drop == (it, idx):
                    continue
                for c in range(calls):
                    ts += 10
                    for io, slot, shape in ios:
                        shape = (shape_of or {}).get(idx, shape)
                        mx = round(vals_rng.uniform(0, 4), 3)
                        mn = round(-vals_rng.uniform(0, 4), 3)
                        avg = vals_rng.choice([0.0, 0.5, mx / 7])
                        l2 = round(vals_rng.uniform(0, 9), 4)
                        nan = inf = 0
                        if io == "output" and idx % 7 == 3:
                            mx, avg, l2 = mx * (1 + perturb), avg + perturb, l2 * (1 + 3 * perturb)
                        if nonfinite and vals_rng.random() < 0.08:
                            mx, nan = float("nan"), 1
                        if nonfinite and vals_rng.random() < 0.05:
                            mx, inf = math.inf, 1
                        dt = (dtype_of or {}).get(idx, "Float32")
                        row = [typ, name, "0", "0", str(ts), io, str(slot), "64", dt,
                               "(" + ",".join(map(str, shape)) + ")", _fmt(mx), _fmt(mn), _fmt(avg), "16", str(nan),
                               "0", str(inf), (f"{idx}.{io}{slot}" if md5 and vals_rng.random() < 0.5 else ""),
                               _fmt(l2)]
                        stats_by_op.setdefault((name, c), []).append(row)
                        rows.append(row)
            if swap_ties:                   # each block's two detach calls trade their statistics
                names = [name for typ, name, _ in ops if typ == "detach"]
                for x, y in zip(names[::2], names[1::2]):
                    for rx, ry in zip(stats_by_op.get((x, 0), []), stats_by_op.get((y, 0), [])):
                        rx[10:], ry[10:] = ry[10:], rx[10:]
            with open(d / "statistic.csv", "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(HEADER)
                w.writerows(rows)
    return root


def _both(a, b, monkeypatch, **kw):
    monkeypatch.setenv("OPDUMP_COMPARE_FAST", "0")
    old = compare(str(a), str(b), progress=False, **kw)
    monkeypatch.setenv("OPDUMP_COMPARE_FAST", "1")
    new = compare(str(a), str(b), progress=False, **kw)
    return old, new


def _fast_applies(a, b, **kw) -> bool:
    da, db = open_dump(str(a)), open_dump(str(b))
    ranks = [(r, r) for r in sorted(set(da.rank_ids) | set(db.rank_ids))]
    return statistics_compare(da, db, ranks, kw.get("iterations"), kw.get("io"), kw.get("include_parameters", True),
                              Thresholds(), run_mod._check_samples, run_mod._iteration_pairs,
                              run_mod._Sources(da, db)) is not None


def _same(old, new, tmp_path):
    pd.testing.assert_frame_equal(old.table, new.table, check_exact=True)
    assert list(old.table.dtypes) == list(new.table.dtypes)
    assert old.to_dict() == new.to_dict()
    assert old.first_difference == new.first_difference
    assert old.first_divergence == new.first_divergence
    assert (old.rule, old.rule_note, old.matched_by, old.operators) == (new.rule, new.rule_note, new.matched_by,
                                                                         new.operators)
    old.to_csv(tmp_path / "old.csv")
    new.to_csv(tmp_path / "new.csv")
    assert (tmp_path / "old.csv").read_bytes() == (tmp_path / "new.csv").read_bytes()


CASES = {
    "perturbed": dict(b=dict(seed=0, perturb=1e-2)),
    "identical": dict(b=dict(seed=0)),
    "ties_swapped": dict(b=dict(seed=0, swap_ties=True, perturb=1e-4)),
    "ties_swapped_ranks": dict(a=dict(ranks=(0, 1)), b=dict(seed=0, swap_ties=True, ranks=(0, 1))),
    "nonfinite_md5": dict(a=dict(nonfinite=True, md5=True), b=dict(seed=1, nonfinite=True, md5=True)),
    "other_values": dict(b=dict(seed=5)),
    "dtypes_differ": dict(b=dict(seed=0, perturb=1e-3, dtype_of={1: "Float16", 4: "BFloat16"})),
    "several_calls": dict(a=dict(calls=2), b=dict(seed=0, calls=2, swap_ties=True, perturb=1e-3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_path_matches_per_row_stages(case, tmp_path, monkeypatch):
    spec = CASES[case]
    a = write_stats_dump(tmp_path / "a", **spec.get("a", {}))
    b = write_stats_dump(tmp_path / "b", **{**spec.get("a", {}), **spec["b"]})
    assert _fast_applies(a, b)
    old, new = _both(a, b, monkeypatch)
    _same(old, new, tmp_path)


def test_tie_break_reorders_and_fast_path_follows(tmp_path, monkeypatch):
    """The swapped detach calls are re-paired by value (rule ``aligned order``): the fast path
    must reproduce it, a plain join would pair them by name."""
    a = write_stats_dump(tmp_path / "a")
    b = write_stats_dump(tmp_path / "b", swap_ties=True)
    old, new = _both(a, b, monkeypatch)
    assert old.matched_by.get("aligned order", 0) > 0
    _same(old, new, tmp_path)


@pytest.mark.parametrize("kw", [dict(io="output"), dict(include_parameters=False), dict(iterations=[(0, 1), 2])])
def test_options(kw, tmp_path, monkeypatch):
    a = write_stats_dump(tmp_path / "a")
    b = write_stats_dump(tmp_path / "b", perturb=1e-3, swap_ties=True)
    old, new = _both(a, b, monkeypatch, **kw)
    _same(old, new, tmp_path)


@pytest.mark.parametrize("b_spec", [dict(drop=(1, 5)), dict(shape_of={2: (3, 4)}), dict(dtype_of={6: "Int32"})])
def test_fast_path_steps_aside(b_spec, tmp_path, monkeypatch):
    """A row missing on one side, a shape or dtype class that differs: no join, the matchers
    decide (run over the columns: stat_match.py, tests/test_compare_stat_match.py)."""
    a = write_stats_dump(tmp_path / "a")
    b = write_stats_dump(tmp_path / "b", perturb=1e-3, **b_spec)
    assert _fast_applies(a, b)
    old, new = _both(a, b, monkeypatch)
    _same(old, new, tmp_path)


def test_fixture_dump_statistics(tmp_path, monkeypatch):
    """The analysis fixture's statistics dump (fill_/empty_like garbage, dropout, two graphs)."""
    a = make_dump(tmp_path / "a", saved_data="statistic", iterations=(0, 1, 2),
                  stats=("max", "min", "avg", "nan count", "md5", "l2norm"))
    b = make_dump(tmp_path / "b", saved_data="statistic", iterations=(0, 1, 2),
                  stats=("max", "min", "avg", "nan count", "md5", "l2norm"), seed=3)
    old, new = _both(a, b, monkeypatch)
    _same(old, new, tmp_path)


def test_tie_break_differs_between_repeated_blocks(tmp_path, monkeypatch):
    """Iterations with the same rows share the tie groups (stat_fast._tie_groups, derived
    once), but each re-pairs by its own values: iterations 1 and 3 of B trade the detach
    calls' statistics, 0 and 2 do not."""
    import shutil
    a = write_stats_dump(tmp_path / "a", iterations=(0, 1, 2, 3))
    b = write_stats_dump(tmp_path / "b", iterations=(0, 1, 2, 3), swap_ties=True, perturb=1e-4)
    plain = write_stats_dump(tmp_path / "p", iterations=(0, 1, 2, 3), perturb=1e-4)
    for it in (0, 2):
        shutil.copy(plain / "rank_0" / "Net" / "0" / str(it) / "statistic.csv",
                    b / "rank_0" / "Net" / "0" / str(it) / "statistic.csv")
    assert _fast_applies(a, b)
    old, new = _both(a, b, monkeypatch)
    moved = old.table[old.table["match"] == "aligned order"]
    assert sorted(set(moved["iteration"])) == [1, 3]
    _same(old, new, tmp_path)


def test_fingerprints_of_other_columns(tmp_path, monkeypatch):
    """Fingerprint codes where the statistic column is text on one side (an MD5-like l2norm
    column): compared through ``str`` as the matcher does."""
    a = write_stats_dump(tmp_path / "a", iterations=(0, 1))
    b = write_stats_dump(tmp_path / "b", iterations=(0, 1), swap_ties=True)
    for it in (0, 1):
        p = b / "rank_0" / "Net" / "0" / str(it) / "statistic.csv"
        rows = list(csv.reader(open(p, newline="")))
        for r in rows[1:3]:
            r[-1] = "n/a"                          # the column turns to text in B only
        with open(p, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    assert _fast_applies(a, b)
    old, new = _both(a, b, monkeypatch)
    _same(old, new, tmp_path)


def test_tie_break_fingerprint_uses_every_statistic(tmp_path, monkeypatch):
    """Two equal-signature calls whose l2norm is the same but whose other statistics differ,
    traded in B: the value tie-break must tell them apart by those other statistics (it once
    iterated the CSV header names, "Max Value"..., against the records' keys, so that only the
    l2norm column, whose header is its key, made the fingerprint), on both paths."""
    a = write_stats_dump(tmp_path / "a", iterations=(0,))
    b = write_stats_dump(tmp_path / "b", iterations=(0,), swap_ties=True)
    for d in (a, b):
        p = d / "rank_0" / "Net" / "0" / "0" / "statistic.csv"
        rows = list(csv.reader(open(p, newline="")))
        for r in rows[1:]:
            if r[0] == "detach":
                r[-1] = "1.5"                       # the same l2norm for every detach row
        with open(p, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    for fast in ("0", "1"):
        monkeypatch.setenv("OPDUMP_COMPARE_FAST", fast)
        r = compare(str(a), str(b), progress=False)
        det = r.table[r.table["op_type"] == "detach"]
        assert len(det) and (det["verdict"] == "pass").all(), det[["op", "op_b", "verdict"]]
        assert r.matched_by.get("aligned order", 0) > 0
    old, new = _both(a, b, monkeypatch)
    _same(old, new, tmp_path)
