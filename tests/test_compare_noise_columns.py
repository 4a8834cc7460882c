"""The precision-noise rule over columns (opdump.analysis.compare.noise_columns) gives the
verdicts and reasons of the rule over Pair records (noise_floor.demote_columns, which
builds the pairs' records and runs noise_floor.demote_noise), on generated statistics
pairs: NaN/Inf/None/text cells, float and object columns, counts 0/1/missing, repeated
fingerprints (an output's values consumed by a later call's input), calls without a
floating input, tensors alone on one side."""
from __future__ import annotations

import copy
import math
import random

import numpy as np
import pandas as pd
import pytest

from opdump.analysis.compare.noise_columns import demote_stat_columns
from opdump.analysis.compare.noise_floor import compared_dtypes, demote_columns
from opdump.analysis.compare.stat_calls import _call_keys
from opdump.analysis.compare.stat_pairs import StatPairs

_SPECIAL = [math.nan, math.inf, -math.inf, None, "abc"]


def _value(rng, pool):
    r = rng.random()
    if r < 0.08:
        return rng.choice(_SPECIAL)
    return rng.choice(pool)


def _frames(rng, n_calls, typed):
    """Records of A and B (one row per tensor: 1-3 inputs, 1-2 outputs per call) with close
    statistics; ``typed``: the statistic columns float64 (no special cell but NaN/Inf)."""
    rows_a, rows_b = [], []
    pool = [round(rng.uniform(-4, 4), 3) for _ in range(6)] + [0.0]
    last_out = None
    for call in range(n_calls):
        it = call // 7
        op_type = rng.choice(["mean", "add", "mul", "expand", "view", "clone"])     # the last three move values
        tensors = [("input", s) for s in range(rng.randint(1, 3))] + [("output", s) for s in range(rng.randint(1, 2))]
        for io, slot in tensors:
            base = {"rank": 0, "iteration": it, "graph": 0, "op": f"Default/f-op{call}", "op_file": f"f-op{call}",
                    "op_type": op_type, "kind": "op", "io": io, "slot": slot,
                    "call": 0, "order": len(rows_a), "shape": rng.choice(["(4)", "(2,3)", "()"])}
            sa = {k: _value(rng, pool) for k in ("max", "min", "avg", "l2norm")}
            sb = {k: (v + rng.choice([0.0, 1e-3, 0.5]) if isinstance(v, float) and math.isfinite(v) else v)
                  for k, v in sa.items()}
            if rng.random() < 0.1:
                sb[rng.choice(list(sb))] = rng.choice(_SPECIAL)
            ca, cb = rng.choice([0, 1, 16, None, 1024]), rng.choice([0, 1, 16, None, 1024])
            da = rng.choice(["bfloat16", "float32", "int64"]) if rng.random() < 0.3 else "bfloat16"
            db = "float32" if da != "int64" else "int64"
            if io == "input" and last_out is not None and rng.random() < 0.5:             # consumed
                sa, sb, base["shape"], ca, cb, da, db = dict(last_out[0]), dict(last_out[1]), *last_out[2:]
            rows_a.append(dict(base, dtype=da, count=ca, md5="", **sa))
            rows_b.append(dict(base, dtype=db, count=cb, md5="", **sb))
            if io == "output":
                last_out = (sa, sb, base["shape"], ca, cb, da, db)
    fa, fb = pd.DataFrame(rows_a), pd.DataFrame(rows_b)
    for f in (fa, fb):
        for k in ("max", "min", "avg", "l2norm"):
            if typed:
                f[k] = [v if isinstance(v, float) else math.nan for v in f[k]]
                f[k] = f[k].astype(np.float64)
            else:
                f[k] = f[k].astype(object)
    return fa, fb


def _pairs(rng, fa, fb, one_sided):
    n = len(fa)
    sp = StatPairs()
    sp.sides = [(fa, fb)]
    verdicts = [rng.choice(["diverged", "diverged", "nondeterministic", "pass", "warning", "skipped"]) for _ in range(n)]
    c = {k: fa[k].tolist() for k in ("rank", "iteration", "graph", "op", "op_file", "op_type", "call", "kind", "io",
                                     "slot")}
    c.update({
        "verdict": verdicts, "reason": [rng.choice(["", "cosine 0.1 < 0.9"]) for _ in range(n)],
        "mode": ["" if v == "skipped" else "statistics" for v in verdicts],
        "dtype_a": fa["dtype"].tolist(), "dtype_b": fb["dtype"].tolist(),
        "shape_a": ["(" + ",".join(str(int(x)) for x in s.strip("()").split(",") if x) + ")" for s in fa["shape"]],
        "side": [0] * n, "row_a": list(range(n)), "row_b": list(range(n)), "match": ["name"] * n,
        "identical": [False] * n, "metrics": [{} for _ in range(n)], "source": [""] * n})
    c["same"] = [a == b for a, b in zip(c["dtype_a"], c["dtype_b"])]
    if one_sided:
        c["has_a"] = [rng.random() > 0.1 for _ in range(n)]
        c["has_b"] = [True] * n
        c["row_a"] = [r if h else None for r, h in zip(c["row_a"], c["has_a"])]
    sp.cols = c
    return sp


def _by_records(sp):
    c = sp.cols
    demote_columns(c["verdict"], c["reason"], c["same"], lambda: _call_keys(c), sp.tensors,
                   lambda: compared_dtypes(c["dtype_a"], c["dtype_b"], c["kind"], c["mode"], c["verdict"]))


@pytest.mark.parametrize("seed", range(40))
def test_columns_give_the_records_verdicts_and_reasons(seed):
    rng = random.Random(seed)
    fa, fb = _frames(rng, 60, typed=seed % 2 == 0)
    sp = _pairs(rng, fa, fb, one_sided=seed % 5 == 4)
    ref = copy.copy(sp)
    ref.cols = {k: list(v) for k, v in sp.cols.items()}
    _by_records(ref)
    demote_stat_columns(sp)
    assert sp.cols["verdict"] == ref.cols["verdict"]
    assert sp.cols["reason"] == ref.cols["reason"]


def test_generated_pairs_reach_every_branch():
    """The generator is worth its cases: demotions of outputs and of consumed inputs happen."""
    outs = ins = moved = 0
    for seed in range(40):
        rng = random.Random(seed)
        fa, fb = _frames(rng, 60, typed=seed % 2 == 0)
        sp = _pairs(rng, fa, fb, one_sided=seed % 5 == 4)
        demote_stat_columns(sp)
        outs += sum(r.startswith("max abs error its statistics show") for r in sp.cols["reason"])
        ins += sum(r.startswith("the values of ") for r in sp.cols["reason"])
        moved += sum("only moves values" in r for r in sp.cols["reason"])
    assert outs > 20 and ins > 5 and moved > 3, (outs, ins, moved)


def test_tensor_pairs_take_the_records_path(monkeypatch):
    """A pair compared by its tensor files: the rule over Pair records (metrics), as before."""
    from opdump.analysis.compare import noise_columns
    rng = random.Random(1)
    fa, fb = _frames(rng, 10, typed=True)
    sp = _pairs(rng, fa, fb, one_sided=False)
    sp.cols["mode"] = ["tensor"] * len(fa)
    seen = []
    monkeypatch.setattr(noise_columns, "demote_columns", lambda *a: seen.append(1))
    demote_stat_columns(sp)
    assert seen
