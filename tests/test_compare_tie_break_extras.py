"""The aligned order's value tie-break (:func:`opdump.analysis.compare.match.tie_break`,
shared by the object matcher and the column-wise ones) when one side has an extra call of
the same scope, type and tensors (the compiled Qwen2-MoE drops an unused mask eager
computes; eager runs four ``transpose`` where a compiled graph runs one): the call with
equal values is paired, whichever side holds the extra one, and nothing changes where the
aligned pairs already hold equal values or a fingerprint is unknown."""
from opdump.analysis.compare.tie_break import tie_break

S, T = ("expand", (2, 4)), ("mul", (2, 4))


def _fp(values):
    return lambda k: values[k]


def test_b_has_an_extra_call_with_the_values():
    # A: [mul, expand=ones]; B: [mul, expand=ones, expand=zeros]; aligned: A1 with B2 (zeros)
    got = tie_break([(0, 0), (1, 2)], [T, S], [T, S, S], _fp(["m", "ones"]), _fp(["m", "ones", "zeros"]))
    assert got == [(0, 0), (1, 1)]


def test_a_has_the_extra_call():
    got = tie_break([(0, 0), (2, 1)], [T, S, S], [T, S], _fp(["m", "ones", "zeros"]), _fp(["m", "ones"]))
    assert got == [(0, 0), (1, 1)]


def test_no_equal_values_keeps_the_aligned_pair():
    # eager vs compiled: float noise, no fingerprint equal: the alignment stands
    chosen = [(0, 0), (1, 2)]
    assert tie_break(chosen, [T, S], [T, S, S], _fp(["m", "a"]), _fp(["m", "b", "c"])) == chosen


def test_equal_aligned_values_and_unknown_fingerprints_keep_the_alignment():
    chosen = [(0, 0), (1, 1)]
    assert tie_break(chosen, [T, S], [T, S, S], _fp(["m", "x"]), _fp(["m", "x", "x"])) == chosen
    assert tie_break(chosen, [T, S], [T, S, S], _fp(["m", None]), _fp(["m", "y", "x"])) == chosen
    assert tie_break(chosen, [T, S], [T, S, S], _fp(["m", "x"]), _fp(["m", "y", None])) == chosen


def test_without_extras_the_old_rule():
    # two aligned calls of one signature that traded values: crossed, as before
    got = tie_break([(0, 0), (1, 1)], [S, S], [S, S], _fp(["p", "q"]), _fp(["q", "p"]))
    assert sorted(got) == [(0, 1), (1, 0)]
    assert tie_break([(0, 0)], [S], [S], _fp(["p"]), _fp(["q"])) == [(0, 0)]
