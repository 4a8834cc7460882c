"""The operator-call counts of a compare's pair columns (opdump.analysis.compare.stat_calls)
against the plain count (a set of key tuples per side), on columns where B's equal A's and
where they differ in each key column; and a real statistics compare of two dumps whose B
calls differ (B's count must be B's own)."""
import random
from itertools import compress

import pytest

from opdump.analysis.compare.stat_calls import _KeysOnce, operator_calls

_CALL = ("rank", "iteration", "graph", "op_file", "call")


def _plain(c):
    out = []
    for suffix in ("", "_b"):
        keys = zip(*(c[k + suffix] for k in _CALL))
        out.append(len(set(compress(keys, map("op".__eq__, c["kind" + suffix])))))
    return tuple(out)


def _columns(rng, n):
    c = {"rank": [rng.randrange(2) for _ in range(n)], "iteration": [rng.randrange(3) for _ in range(n)],
         "graph": [0] * n, "op_file": [rng.choice(["Add.op1", "MatMul.op2", "Relu.op3"]) for _ in range(n)],
         "call": [rng.randrange(4) for _ in range(n)],
         "kind": [rng.choice(["op", "op", "op", "parameter"]) for _ in range(n)]}
    for k in _CALL + ("kind",):
        c[k + "_b"] = list(c[k])
    return c


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("changed", [None, *_CALL, "kind"])
def test_counts_match_the_plain_count(seed, changed):
    rng = random.Random(seed)
    c = _columns(rng, 200)
    if changed is not None:             # B's column differs: B's own count, not A's
        col = c[changed + "_b"]
        for i in range(len(col)):
            if changed == "kind":
                col[i] = "op"
            elif changed == "op_file":
                col[i] = col[i] + str(i % 7)
            else:
                col[i] = col[i] + 10 * (i % 5)
    want = _plain(c)
    assert operator_calls(c) == want
    keys = _KeysOnce(c)
    assert operator_calls(c, keys) == want
    assert keys() is keys()             # built once, shared
    if changed is not None and changed != "graph":
        assert want[0] != want[1]       # the case tests the B side for real
