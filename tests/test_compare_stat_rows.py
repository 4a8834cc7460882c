"""A statistics-only compare of two runs whose operator sequences differ (the column-wise
path, opdump/analysis/compare/stat_fast.py, steps aside; the per-row stages pair the tensors)
builds its table as columns (opdump/analysis/compare/stat_rows.py): the same table (values,
dtypes, row order), CSV bytes, summary, first difference and first divergence as the table
built row by row (``run._table``, forced here by reporting the pairs as holding files); and
the statistics verdicts read as columns from the records tables (stat_gather.py) are those
read from each tensor's row dict (forced here by turning the gather off).

Cases: generated statistics dumps with extra cast operators on one side, an operator
missing, NaN/Inf cells, calls that need the value tie-break, two ranks, io/iteration
filters, parameters left out; and a real pair (a tiny eager model, fp32 against bf16
autocast).
"""
from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.analysis.compare import compare
from opdump.analysis.compare import run as run_mod
from opdump.analysis.compare import stat_gather
from opdump.analysis.compare.stat_result import StatCompareResult
from opdump.capture.eager import EagerCapture

from conftest import write_config
from test_compare_stat_fastpath import write_stats_dump


def add_casts(root: Path, every: int = 3) -> Path:
    """Insert a ``_to_copy`` call (a bf16 cast: one input, one output) before every
    ``every``-th operator call of each statistic.csv under ``root`` (what autocast adds)."""
    for path in sorted(root.glob("rank_*/Net/0/*/statistic.csv")):
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        out, seen, k = [rows[0]], set(), 0
        for row in rows[1:]:
            name = row[1]
            if row[0] != "Parameter" and name not in seen:
                seen.add(name)
                k += 1
                if k % every == 0:
                    scope = name.rsplit("/", 1)[0]
                    for io in ("input", "output"):
                        cast = list(row)
                        cast[0], cast[1], cast[5], cast[6] = "_to_copy", f"{scope}/_to_copy-cast{k}", io, "0"
                        cast[8] = "BFloat16" if io == "output" else "Float32"
                        out.append(cast)
            out.append(row)
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows(out)
    return root


def _both(a, b, monkeypatch, **kw):
    """(row-by-row table, column table) results of one compare, both by the per-row stages
    (``OPDUMP_COMPARE_FAST=0``: statistics_compare now takes differing sequences too)."""
    monkeypatch.setenv("OPDUMP_COMPARE_FAST", "0")
    new = compare(str(a), str(b), progress=False, **kw)
    monkeypatch.setattr(run_mod, "pathless", lambda pairs: False)     # the row-by-row table
    monkeypatch.setattr(stat_gather, "gathered_columns", lambda pairs, keys, conv: None)   # the row dicts
    old = compare(str(a), str(b), progress=False, **kw)
    monkeypatch.undo()
    return old, new


def _same(old, new, tmp_path):
    assert isinstance(new, StatCompareResult) and not isinstance(old, StatCompareResult)
    assert old.summary() == new.summary()                  # before the frame is made: from the cells
    assert old.counts == new.counts
    old.to_csv(tmp_path / "old.csv")
    new.to_csv(tmp_path / "new.csv")
    assert (tmp_path / "old.csv").read_bytes() == (tmp_path / "new.csv").read_bytes()
    pd.testing.assert_frame_equal(old.table, new.table, check_exact=True)
    assert list(old.table.dtypes) == list(new.table.dtypes)
    assert old.to_dict() == new.to_dict()
    assert old.first_difference == new.first_difference
    assert old.first_divergence == new.first_divergence
    assert (old.unmatched_a, old.unmatched_b, old.front_end_a, old.front_end_b, old.matched_by, old.operators) == (
        new.unmatched_a, new.unmatched_b, new.front_end_a, new.front_end_b, new.matched_by, new.operators)


CASES = {
    "casts_in_a": (dict(seed=0, perturb=1e-2), dict(seed=0), True, {}),
    "casts_nonfinite_ties": (dict(nonfinite=True, md5=True, calls=2),
                             dict(seed=0, nonfinite=True, swap_ties=True, calls=2, perturb=1e-4), True, {}),
    "missing_op_two_ranks": (dict(ranks=(0, 1)), dict(seed=0, ranks=(0, 1), drop=(1, 2), perturb=1e-3), False, {}),
    "casts_io_output": (dict(seed=0), dict(seed=3), True, dict(io="output")),
    "casts_iterations": (dict(seed=0), dict(seed=0, perturb=1e-3), True, dict(iterations=[(0, 1), 2])),
    "casts_no_parameters": (dict(seed=0, nonfinite=True), dict(seed=1), True, dict(include_parameters=False)),
    "same_dtypes_missing_op": (dict(seed=0), dict(seed=0, drop=(0, 5)), False, {}),
    "same_dtypes_md5_nonfinite": (dict(seed=0, md5=True, nonfinite=True), dict(seed=2, md5=True, nonfinite=True,
                                                                                 drop=(2, 7)), False, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_column_table_matches_row_table(case, tmp_path, monkeypatch):
    spec_a, spec_b, casts, kw = CASES[case]
    a = write_stats_dump(tmp_path / "a", **spec_a)
    if casts:
        add_casts(a)
    b = write_stats_dump(tmp_path / "b", **spec_b)
    old, new = _both(a, b, monkeypatch, **kw)
    assert (old.table["verdict"] == "unmatched").any()     # the sequences differ: per-row stages
    _same(old, new, tmp_path)


def _stats_run(root: Path, name: str, bf16: bool, categories=("max", "min", "avg", "l2norm", "count")) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8))
    cfg = write_config(root, common={"saved_data": "statistic", "path": str(root / name),
                                     "statistic_category": list(categories)},
                       name=f"{name}.json")
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    with opdump.Session(cfg) as s, EagerCapture(s), torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model(x)
    return str(root / name)


@pytest.mark.parametrize("categories", [("max", "min", "avg", "l2norm", "count"), ("count",)])
def test_real_bf16_autocast_against_fp32(categories, tmp_path, monkeypatch):
    a, b = _stats_run(tmp_path, "bf16", True, categories), _stats_run(tmp_path, "fp32", False, categories)
    old, new = _both(a, b, monkeypatch)
    assert (old.table["verdict"] == "unmatched").any()     # autocast's casts: one side only
    _same(old, new, tmp_path)
