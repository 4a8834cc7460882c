"""stat_cells.scatter (StatPairs.build's placing of the judged pairs among the skipped ones)
gives the plain loop's lists: the same cell objects, whatever their type (tuples, lists and
dicts are cells, not sequences to spread)."""
from __future__ import annotations

import random

import pytest

from opdump.analysis.compare.stat_cells import scatter


@pytest.mark.parametrize("seed", range(5))
def test_scatter_is_the_loop(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 300)
    pool = [None, 1, 2.5, float("nan"), "x", (1, 2), [3, 4], {"a": 1}, True, (), []]
    at = sorted(rng.sample(range(n), rng.randint(1, n)))
    dst = [rng.choice(pool) for _ in range(n)]
    src = [rng.choice(pool) for _ in at]
    want = list(dst)
    for k, i in enumerate(at):
        want[i] = src[k]
    other = [{} for _ in range(n)]
    other_src = [{"k": k} for k in range(len(at))]
    scatter(at, (dst, src), (other, other_src))
    assert len(dst) == n and all(x is y for x, y in zip(dst, want))
    assert all(other[i] is other_src[k] for k, i in enumerate(at))
    assert sum(1 for x in other if x == {}) == n - len(at)
