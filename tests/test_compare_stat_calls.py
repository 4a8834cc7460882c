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


def _tuple_partition(cols):
    keys = list(zip(*cols))
    first = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    return [first[k] for k in keys], list(first.values())


@pytest.mark.parametrize("seed", range(12))
def test_row_keys_tell_rows_apart_as_the_tuples_do(seed):
    """Constant columns, B's columns equal to A's, equal-but-distinct objects and NaN
    objects (one shared, several distinct): keys equal exactly where the tuples are."""
    from opdump.analysis.compare.stat_calls import first_rows, row_keys
    rng = random.Random(seed)
    n = 150
    nan = float("nan")
    pool = [0, 1, 2, "op", "parameter", None, nan, 1.0]
    cols = []
    for _ in range(rng.randrange(1, 7)):
        shape = rng.choice(["const", "dup", "rand", "nans", "strs"])
        if shape == "const":
            cols.append([rng.choice(pool)] * n)
        elif shape == "dup" and cols:
            cols.append(list(rng.choice(cols)))
        elif shape == "nans":               # distinct NaN objects: never equal to each other
            cols.append([float("nan") if rng.random() < 0.3 else rng.randrange(3) for _ in range(n)])
        elif shape == "strs":               # equal strings that are different objects
            cols.append(["".join(["op", str(rng.randrange(3))]) for _ in range(n)])
        else:
            cols.append([rng.choice(pool) for _ in range(n)])
    keys = row_keys(cols)
    assert len(keys) == n
    first = {}
    got = [first.setdefault(k, i) for i, k in enumerate(keys)]
    want, want_first = _tuple_partition(cols)
    assert got == want
    assert first_rows(keys) == want_first
