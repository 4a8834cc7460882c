"""The iteration grammar shared by ``iteration`` / ``dump_step`` (README "Config reference")."""
import re

import pytest
from hypothesis import given, settings, strategies as st

from opdump.config.errors import ConfigError
from opdump.config.iteration import merge_ranges, parse_iteration
from opdump.config.model import IterationSpec


@pytest.mark.parametrize("text, ranges", [
    ("0|5-8|100-120", ((0, 0), (5, 8), (100, 120))),
    ("0 | 5-8 | 100-120", ((0, 0), (5, 8), (100, 120))),
    (" 7 ", ((7, 7),)),
    ("3 - 4", ((3, 4),)),
    ("8|9", ((8, 9),)),                       # adjacent singles merge
    ("10-20|0|15-30|2-2", ((0, 0), (2, 2), (10, 30))),
    ("0-0", ((0, 0),)),
])
def test_valid(text, ranges):
    assert parse_iteration(text) == IterationSpec(all=False, ranges=ranges)


@pytest.mark.parametrize("text", ["all", " all "])
def test_all(text):
    spec = parse_iteration(text)
    assert spec.all and 10**9 in spec and str(spec) == "all"


@pytest.mark.parametrize("text, needle", [
    ("5-3", "range start 5 is after end 3"),
    ("0|5-3", 'range start 5 is after end 3 in token "5-3"'),
    ("", "is empty"),
    ("   ", "is empty"),
    ("1||2", "empty token"),
    ("|1", "empty token"),
    ("1|", "empty token"),
    ("-3", "non-negative"),
    ("1-2-3", "exactly one '-'"),
    ("4-", "numbers on both sides"),
    ("1 2", "expected a number"),
    ("1,2", "character ',' is not allowed; use digits, '-', '|', spaces, or the word all"),
    ("ALL", "character 'A' is not allowed"),
    ("all|3", "character 'a' is not allowed"),
    ("1.5", "character '.' is not allowed"),
])
def test_invalid(text, needle):
    with pytest.raises(ConfigError) as info:
        parse_iteration(text, "common_dump_settings.iteration")
    msg = str(info.value)
    assert needle in msg
    assert msg.startswith(f"common_dump_settings.iteration: {text!r}: ")


@pytest.mark.parametrize("value", [3, None, ["0"], True])
def test_not_a_string(value):
    with pytest.raises(ConfigError, match="must be a string"):
        parse_iteration(value)


def test_merge_ranges():
    assert merge_ranges([(5, 9), (0, 2), (3, 4), (20, 21), (8, 12)]) == ((0, 12), (20, 21))


# ---------------------------------------------------------------- properties
ranges_st = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8)).map(lambda t: (t[0], t[0] + t[1])),
                     min_size=1, max_size=6)
space = st.sampled_from(["", " ", "  ", "\t"])


@st.composite
def spelled(draw):
    """A random valid spelling of a random set of ranges."""
    ranges = draw(ranges_st)
    tokens = []
    for lo, hi in ranges:
        body = str(lo) if lo == hi and draw(st.booleans()) else f"{lo}{draw(space)}-{draw(space)}{hi}"
        tokens.append(draw(space) + body + draw(space))
    return ranges, "|".join(tokens)


@settings(max_examples=150, deadline=None)
@given(spelled())
def test_membership_matches_union(case):
    ranges, text = case
    spec = parse_iteration(text)
    expected = {i for lo, hi in ranges for i in range(lo, hi + 1)}
    assert {i for i in range(80) if i in spec} == expected
    assert spec.last() == max(expected)


@settings(max_examples=150, deadline=None)
@given(spelled())
def test_round_trip(case):
    _, text = case
    spec = parse_iteration(text)
    assert parse_iteration(str(spec)) == spec
    assert str(parse_iteration(str(spec))) == str(spec)
    # canonical: sorted, disjoint, non-adjacent
    flat = [x for r in spec.ranges for x in r]
    assert flat == sorted(flat)
    assert all(b[0] > a[1] + 1 for a, b in zip(spec.ranges, spec.ranges[1:]))


GRAMMAR = re.compile(r"\s*(all|\d+(\s*-\s*\d+)?(\s*\|\s*\d+(\s*-\s*\d+)?)*)\s*")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789-| a,l", max_size=12))
def test_random_strings_parse_iff_grammatical(text):
    try:
        spec = parse_iteration(text)
    except ConfigError as err:
        assert err.value == text
        m = GRAMMAR.fullmatch(text)
        # grammatical strings fail only on a reversed range
        assert m is None or "is after end" in str(err)
    else:
        assert GRAMMAR.fullmatch(text) is not None
        assert isinstance(spec, IterationSpec)
