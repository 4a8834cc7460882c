"""Work a statistics compare's summary and CSV writer no longer do twice (issue 25):

* A's call keys made once (``stat_calls._KeysOnce``) and read by the noise rule
  (``noise_columns.demote_stat_columns``) and the operator counts (``stat_onesided.call_counts``)
  as well as the first-divergence search: the same verdicts, reasons and counts as each
  building its own;
* B's calls counted on ``row_keys`` of its columns (constant columns left out): the count of
  the plain tuples, on generated columns with tensors alone on either side (None cells);
* the CSV fields of a column of bools and Nones (``identical``) made without pandas inferring
  the column: pandas' bytes all the same (floats with Nones stay with pandas: the same bytes).
"""
from __future__ import annotations

import copy
import random
from itertools import compress

import pytest

from opdump.analysis.compare import stat_csv
from opdump.analysis.compare.noise_columns import demote_stat_columns
from opdump.analysis.compare.stat_calls import _KeysOnce
from opdump.analysis.compare.stat_csv import frame_of_cells, write_cells_csv
from opdump.analysis.compare.stat_onesided import call_counts

_CALL = ("rank", "iteration", "graph", "op_file", "call")


def _one_sided_columns(rng: random.Random, n: int, constant_rank: bool):
    """Pair columns with ``has_a``/``has_b``: a tensor alone has None in the other side's cells."""
    c = {k: [] for k in _CALL + ("kind",)}
    c.update({k + "_b": [] for k in _CALL + ("kind",)})
    c["has_a"], c["has_b"] = [], []
    for _ in range(n):
        row = {"rank": 0 if constant_rank else rng.randrange(2), "iteration": rng.choice([0, 1, None]),
               "graph": 0, "op_file": rng.choice(["Add.op1", "MatMul.op2", "Relu.op3"]),
               "call": rng.randrange(3), "kind": rng.choice(["op", "op", "parameter"])}
        side = rng.choice(["both", "both", "a", "b"])
        for k, v in row.items():
            c[k].append(v if side != "b" else None)
            vb = v if k != "call" else (v + rng.randrange(2))          # B's calls differ from A's
            c[k + "_b"].append(vb if side != "a" else None)
        c["has_a"].append(side != "b")
        c["has_b"].append(side != "a")
    return c


def _plain_counts(c):
    both = [x and y for x, y in zip(c["has_a"], c["has_b"])]
    out = []
    for side, suffix in ((c["has_a"], ""), (c["has_b"], "_b")):
        here = [s and k == "op" for s, k in zip(side, c["kind" + suffix])]
        calls = list(zip(*(c[k + suffix] for k in _CALL)))
        out += [len(set(compress(calls, here))), len(set(compress(calls, [h and b for h, b in zip(here, both)])))]
    return out


@pytest.mark.parametrize("seed", range(12))
def test_call_counts_with_shared_keys_are_the_plain_counts(seed):
    rng = random.Random(seed)
    c = _one_sided_columns(rng, 300, constant_rank=seed % 2 == 0)
    n = len(c["rank"])
    want = _plain_counts(c)
    assert call_counts(c, n) == want
    built = []

    class Counting(_KeysOnce):
        def __call__(self):
            built.append(self.keys is None)
            return super().__call__()
    keys = Counting(c)
    assert call_counts(c, n, keys) == want
    assert built == [True]                  # A's keys were the shared ones, made once
    assert want[0] != want[2]               # B's count is B's own (its calls differ)


def test_noise_rule_with_shared_keys_gives_the_same_verdicts():
    """demote_stat_columns reading A's keys from a shared _KeysOnce: the verdicts and reasons
    of it building its own, on the generated pairs of test_compare_noise_columns."""
    from tests.test_compare_noise_columns import _frames, _pairs
    used = 0
    for seed in range(20):
        rng = random.Random(seed)
        fa, fb = _frames(rng, 60, typed=seed % 2 == 0)
        sp = _pairs(rng, fa, fb, one_sided=seed % 5 == 4)
        ref = copy.copy(sp)
        ref.cols = {k: list(v) for k, v in sp.cols.items()}
        demote_stat_columns(ref)
        keys = _KeysOnce(sp.cols)
        demote_stat_columns(sp, keys)
        assert sp.cols["verdict"] == ref.cols["verdict"]
        assert sp.cols["reason"] == ref.cols["reason"]
        if keys.keys is not None:
            used += 1
            assert keys.keys == list(zip(*(sp.cols[k] for k in _CALL)))
    assert used > 5                          # the shared keys were read, not only made


N = 500


def _mixed_columns(rng: random.Random):
    pick = lambda xs: [rng.choice(xs) for _ in range(N)]      # noqa: E731
    return {
        "identical": ("cells", pick([True, False, None])),
        "identical_no_false": ("cells", pick([True, None])),
        "first_none": ("cells", [None] + pick([True, False])[1:]),
    }


def _others(rng: random.Random):
    """Columns that are not bools and Nones alone: pandas decides (the same bytes)."""
    pick = lambda xs: [rng.choice(xs) for _ in range(N)]      # noqa: E731
    return {
        "rel": ("cells", pick([None, 0.0, -0.0, 1e-7, 2.5, float("nan"), float("inf"), 1e16, 123456789.123])),
        "int_bool_none": ("cells", pick([1, True, None])),
        "str_bool_none": ("cells", pick(["x", True, None])),
    }


@pytest.mark.parametrize("seed", range(4))
def test_bool_columns_with_none_are_written_without_pandas(seed, tmp_path, monkeypatch):
    """Each column's CSV is pandas' bytes for the frame the cells make, and the writer made
    the fields without handing the column to pandas (frame_of_cells not called while
    writing); other columns still go to pandas, with its bytes."""
    rng = random.Random(seed)
    for name, col in list(_mixed_columns(rng).items()) + list(_others(rng).items()):
        cells = {"order": ("order", N), name: col}
        frame = frame_of_cells(cells)
        frame.to_csv(tmp_path / "pandas.csv", index=False, errors="backslashreplace")
        went = []

        def spy(*a, **k):
            went.append(1)
            return frame_of_cells(*a, **k)
        with monkeypatch.context() as m:
            m.setattr(stat_csv, "frame_of_cells", spy)
            assert write_cells_csv(cells, str(tmp_path / "cells.csv")), name
        assert (tmp_path / "cells.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes(), name
        assert bool(went) == (name not in _mixed_columns(rng)), name
