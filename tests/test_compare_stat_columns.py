"""Statistics-only pairs judged column-wise (compare.stat_columns) give what the per-pair
rule (verdict.judge_pair) gives: the same verdict, reason, metrics (keys, Python types,
every digit) and ``identical``, on generated rows with NaN, Inf, missing and malformed
cells, MD5s, NaN/Inf counts, zero-size tensors, random operators and mixed dtypes; and the
NaN/Inf flag of every row equals common.stats_nonfinite's."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from opdump.analysis.common import stats_nonfinite
from opdump.analysis.compare.pairs import Pair, Tensor
from opdump.analysis.compare.stat_columns import nonfinite_codes
from opdump.analysis.compare.verdict import Thresholds, judge_pair, judge_statistics

_SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-7, 1e308, -1e308, 5e-324]


def _value(rng: random.Random, base: float):
    r = rng.random()
    if r < 0.06:
        return rng.choice(_SPECIAL)
    if r < 0.08:
        return None                       # a malformed cell (reader: None, never NaN)
    if r < 0.09:
        return rng.choice(["abc", "", True, 3])
    if r < 0.35:
        return base                       # equal on both sides
    scale = rng.choice([1e-9, 1e-7, 1e-4, 1e-3, 5e-3, 2e-2, 1.0])
    return base * (1 + rng.uniform(-scale, scale)) + rng.choice([0.0, 0.0, 1e-7, 2e-6])


def _row(rng: random.Random, base: dict, n: int, side: str) -> dict:
    row = {"rank": 0, "iteration": 0, "graph": 0, "op": f"Default/op-{n}", "op_file": f"Default_op-{n}",
           "op_type": rng.choice(["add", "mul", "dropout", "native_dropout", "rand_like", "relu"]), "kind": "op",
           "io": rng.choice(["input", "output"]), "slot": 0, "call": 0, "order": n,
           "dtype": base["dtype"] if rng.random() < 0.9 else rng.choice(["Float16", "BFloat16", "Int64", None]),
           "path": None, "stat_row": True, "shape": "(2,3)"}
    for k in ("max", "min", "avg", "l2norm"):
        if rng.random() < 0.04:
            continue                      # column absent from this row
        row[k] = _value(rng, base[k]) if side == "a" or rng.random() < 0.7 else base[k]
    for k in ("count", "data_size", "nan_count", "positive_inf_count", "negative_inf_count"):
        r = rng.random()
        if r < 0.5:
            continue
        row[k] = rng.choice([0, 0, 1, 6, float("nan"), None, 24.0]) if r < 0.7 else base.get(k, 6)
    if rng.random() < 0.3:
        row["md5"] = rng.choice([base["md5"], base["md5"], "ffff", "", None, 7])
    return row


def _pairs(seed: int, n: int = 3000):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base = {k: rng.choice([rng.uniform(-5, 5), rng.uniform(-1e-6, 1e-6), rng.uniform(-1e4, 1e4)])
                for k in ("max", "min", "avg", "l2norm")}
        base["md5"] = f"{rng.getrandbits(64):016x}"
        base["dtype"] = rng.choice(["Float32", "Float16", "BFloat16", "Int64", "Bool"])
        out.append((_row(rng, base, i, "a"), _row(rng, base, i, "b")))
    return out


def _same(x, y) -> bool:
    if type(x) is not type(y):
        return False
    if isinstance(x, float) and math.isnan(x):
        return math.isnan(y)
    return x == y


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_column_verdicts_equal_per_pair_verdicts(seed):
    th = Thresholds()
    rows = _pairs(seed)
    one = [Pair(Tensor(dict(a)), Tensor(dict(b)), "name") for a, b in rows]
    many = [Pair(Tensor(dict(a)), Tensor(dict(b)), "name") for a, b in rows]
    for p in one:
        assert judge_pair(p, th) is False
    aside = []
    for p in many:
        assert judge_pair(p, th, aside) is False
    assert len(aside) == len(many)
    judge_statistics(aside, th)
    verdicts = set()
    for i, (p, q) in enumerate(zip(one, many)):
        where = f"pair {i}: {rows[i]}"
        assert (q.mode, q.verdict, q.reason) == (p.mode, p.verdict, p.reason), where
        assert _same(q.identical, p.identical), where
        assert list(q.metrics) == list(p.metrics), where
        assert all(_same(q.metrics[k], p.metrics[k]) for k in p.metrics), where
        verdicts.add((p.verdict, p.reason.split(" ")[0]))
    # the generated rows reach every branch of the rule
    assert {v for v, _ in verdicts} >= {"pass", "warning", "diverged", "nondeterministic"}
    reasons = {r for _, r in verdicts}
    assert {"identical", "NaN/Inf", "statistics", "max", "min", "avg", "l2norm"} <= reasons, reasons


def test_nonfinite_codes_equal_stats_nonfinite():
    rows = [r for a, b in _pairs(7) for r in (a, b)]
    rows += [{}, {"max": None, "min": "abc"}, {"nan_count": 0, "count": None}, {"count": 0, "max": float("nan")},
             {"nan_count": 0, "positive_inf_count": 0, "negative_inf_count": 0, "max": float("nan")}]
    codes = nonfinite_codes(rows).tolist()
    expect = [{True: 1, False: 0, None: -1}[stats_nonfinite(r)] for r in rows]
    assert codes == expect
    assert set(codes) == {-1, 0, 1}


def test_numpy_scalars_in_rows_read_like_floats():
    th = Thresholds()
    a = {"op_type": "add", "io": "output", "slot": 0, "dtype": "Float32", "stat_row": True, "path": None,
         "max": np.float64(1.5), "min": np.float32(-1.0), "avg": 0.25, "l2norm": np.int64(3)}
    b = dict(a, max=1.5000001, l2norm=3.5)
    p, q = Pair(Tensor(dict(a)), Tensor(dict(b))), Pair(Tensor(dict(a)), Tensor(dict(b)))
    judge_pair(p, th)
    aside = []
    judge_pair(q, th, aside)
    judge_statistics(aside, th)
    assert (q.verdict, q.reason, q.metrics, q.identical) == (p.verdict, p.reason, p.metrics, p.identical)
    assert p.verdict == "diverged" and p.reason.startswith("l2norm")
