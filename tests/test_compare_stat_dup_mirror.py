"""stat_fast.b_mirrors_a: when it says B's key repeats mirror A's, B's duplicate check
(pandas ``duplicated`` over iteration + key, what _pair_rank asks) must answer as A's.
Generated sides built as _pair_rank pairs them: B's rows copy A's keys under an iteration
mapping; some cases give B an extra unpaired iteration holding a repeated key, or A
repeated keys, or a mapping that sends two A iterations to one B iteration."""
import random

import numpy as np
import pandas as pd
import pytest

from opdump.analysis.compare.stat_fast import _KEY, b_mirrors_a
from opdump.analysis.compare.stat_sides import _positions


def _rows(rng, it, m, dup):
    rows = [{"iteration": it, "graph": 0, "op_file": f"Op.op{j}", "io": rng.choice(["input", "output"]),
             "slot": j % 2, "call": j // 2} for j in range(m)]
    if dup and m >= 2:
        rows[-1] = dict(rows[0])
    return rows


def _case(seed):
    rng = random.Random(seed)
    its = list(range(rng.randrange(1, 5)))
    a_rows = []
    for it in its:
        a_rows += _rows(rng, it, 6, rng.random() < 0.2)
    shape = rng.choice(["plain", "extra_b", "merge", "shift"])
    if shape == "merge" and len(its) >= 2:
        mapping = {it: 0 for it in its}             # two A iterations onto one B iteration
    elif shape == "shift":
        mapping = {it: it + 10 for it in its}
    else:
        mapping = {it: it for it in its}
    b_rows = [dict(r, iteration=mapping[r["iteration"]]) for r in a_rows]
    if shape == "extra_b":                          # an iteration only B holds, a key repeated in it
        b_rows += _rows(rng, 99, 6, True)
    it_pairs = [(it, mapping[it]) for it in its]
    return pd.DataFrame(a_rows).astype({"iteration": "Int64"}), pd.DataFrame(b_rows).astype({"iteration": "Int64"}), it_pairs


@pytest.mark.parametrize("seed", range(60))
def test_b_check_left_out_only_where_it_answers_as_a(seed):
    sa, sb, it_pairs = _case(seed)
    pos_a = _positions(sa["iteration"].astype(object).tolist())
    pos_b = _positions(sb["iteration"].astype(object).tolist())
    ai = np.concatenate([pos_a.get(ia, np.empty(0, np.int64)) for ia, _ in it_pairs])
    bi = np.concatenate([pos_b.get(ib, np.empty(0, np.int64)) for _, ib in it_pairs])
    if len(ai) != len(bi):
        return                                      # _pair_rank gives up before the check
    dup_a = bool(sa.duplicated(["iteration", *_KEY]).any())
    dup_b = bool(sb.duplicated(["iteration", *_KEY]).any())
    if b_mirrors_a(len(sa), len(sb), ai, bi, it_pairs):
        assert dup_a == dup_b


def test_cases_reach_both_answers():
    """The generated cases hold B-only repeats the check must still see."""
    seen = set()
    for seed in range(60):
        sa, sb, it_pairs = _case(seed)
        seen.add((bool(sa.duplicated(["iteration", *_KEY]).any()), bool(sb.duplicated(["iteration", *_KEY]).any())))
    assert (False, True) in seen
