"""manifest.json's ``dumped_iterations`` text (opdump/write/manifest.py ``iteration_ranges``).

The function runs at every iteration's end on the training thread over every iteration
dumped so far; its contiguous fast path and its early stop past the page's bound must give
exactly the text of the plain run-by-run walk (kept here as the reference)."""
from __future__ import annotations

import random

import pytest

from opdump.write.manifest import iteration_ranges


def reference(iterations) -> str:
    """The walk over every run, then the bound (the implementation before the fast paths)."""
    out = []
    its = sorted(iterations)
    i = 0
    while i < len(its):
        j = i
        while j + 1 < len(its) and its[j + 1] == its[j] + 1:
            j += 1
        out.append(str(its[i]) if i == j else f"{its[i]}-{its[j]}")
        i = j + 1
    text = "|".join(out)
    if len(text) > 1024:
        text = text[:1000].rsplit("|", 1)[0] + "|…"
    return text


@pytest.mark.parametrize("its", [set(), {0}, {7}, {0, 1, 2, 5}, set(range(10_000)), set(range(3, 40)),
                                 {0, 2}, {1, 2, 3, 10, 11, 30}, frozenset(range(5, 9))])
def test_small_and_contiguous_sets(its):
    assert iteration_ranges(its) == reference(its)


def test_contiguous_run_is_its_ends():
    assert iteration_ranges(set(range(100_000))) == "0-99999"
    assert iteration_ranges({4}) == "4"


def test_random_sets_match_the_walk():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(0, 600)
        top = rng.choice([n + 1, 2 * n + 2, 10 * n + 10])
        its = set(rng.sample(range(top), min(n, top)))
        assert iteration_ranges(its) == reference(its)


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 6])
def test_bound_edges_match_the_walk(width):
    """Scattered iterations whose text crosses the 1024-character bound at every offset: the
    early stop must still take the truncation exactly when the whole text would."""
    base = 10 ** (width - 1) if width > 1 else 0
    for count in range(150, 520, 7):
        its = set(range(base, base + 2 * count, 2))          # no two consecutive: one part each
        assert iteration_ranges(its) == reference(its)
        its2 = its | {max(its) + 1}                            # the last part a run
        assert iteration_ranges(its2) == reference(its2)


def test_a_list_with_repeats_is_walked():
    """Only a set is told by its ends (a list may repeat an iteration)."""
    assert iteration_ranges([0, 0, 2]) == reference([0, 0, 2])
