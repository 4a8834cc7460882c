"""The column matcher of a statistics-only compare (opdump/analysis/compare/stat_match.py)
pairs exactly as the per-object matchers (opdump/analysis/compare/match.py): property tests
on random operator sequences (insertions, deletions, renamed and renumbered operators,
front-end operators, twins, repeated calls that need the value tie-break, parameters,
constants, two graphs), then whole compares of generated and real statistics dumps whose
sequences differ, against the per-row stages (``OPDUMP_COMPARE_FAST=0``).
"""
from __future__ import annotations

import random

import pandas as pd
import pytest
from hypothesis import assume, HealthCheck, given, settings
from hypothesis import strategies as st

from opdump.analysis.compare import compare
from opdump.analysis.compare.match import default_matchers, match
from opdump.analysis.compare.run import _iteration_pairs, _tensors, tensors_of_records
from opdump.analysis.compare.stat_match import column_pairs, match_rank, sides_of
from opdump.analysis.reader import open_dump

from test_compare_stat_fastpath import _both, _fast_applies, _same, write_stats_dump
from test_compare_stat_rows import CASES as ROW_CASES, add_casts

#: (op type, [(io, slot, shape)]) of the calls the random sequences are made of
CALLS = [
    ("addmm", [("input", 0, "(4)"), ("input", 1, "(2,4)"), ("input", 2, "(4,4)"), ("output", 0, "(2,4)")]),
    ("relu", [("input", 0, "(2,4)"), ("output", 0, "(2,4)")]),
    ("_to_copy", [("input", 0, "(2,4)"), ("output", 0, "(2,4)")]),
    ("detach", [("input", 0, "(4,4)"), ("output", 0, "(4,4)")]),
    ("add_", [("input", 0, "(2,4)"), ("input", 1, "(2,4)"), ("output", 0, "(2,4)")]),
    ("add", [("input", 0, "(2,4)"), ("input", 1, "(2,4)"), ("output", 0, "(2,4)")]),
    ("clone", [("input", 0, "(2,4)"), ("output", 0, "(2,4)")]),
    ("empty_like", [("input", 0, "(4)"), ("output", 0, "(4)")]),
    ("_native_batch_norm_legit_functional", [("input", 0, "(2,4)"), ("output", 0, "(2,4)"), ("output", 3, "(4)"),
                                             ("output", 4, "(4)")]),
    ("native_batch_norm", [("input", 0, "(2,4)"), ("output", 0, "(2,4)")]),
    ("view", [("input", 0, "(8)"), ("output", 0, "(2,4)")]),
    ("_unsafe_view", [("input", 0, "(8)"), ("output", 0, "(2,4)")]),
    ("native_dropout", [("input", 0, "(2,4)"), ("output", 0, "(2,4)")]),
]
SCOPES = ["Default/Net/a-L", "Default/Net/b-L", "Gradients/Default/Net/a-L", ""]

#: one call of a sequence: (CALLS index, scope index, op number, value seed, dtype, graph)
call_st = st.tuples(st.integers(0, len(CALLS) - 1), st.integers(0, len(SCOPES) - 1), st.integers(0, 40),
                    st.integers(0, 3), st.sampled_from(["Float32", "BFloat16", "Int64", ""]), st.integers(0, 1))


def _frame(calls_by_it, params, constants, rank=0) -> pd.DataFrame:
    """A records table (the columns :meth:`Dump.records` gives a statistics dump) of the calls
    of each iteration, parameters and constants."""
    rows = []
    order = 0

    def row(it, kind, op, op_type, io, slot, call, graph, shape, dtype, seed):
        nonlocal order
        rng = random.Random(seed)
        mx = rng.choice([1.0, 2.5, float("nan"), float("inf")])
        rows.append(dict(rank=rank, graph=graph, iteration=it, order=order, op=op,
                         op_file=op.replace("/", "_"), op_type=op_type, kind=kind, io=io, slot=slot, call=call,
                         dtype=dtype, path=None, nbytes=0, stat_row=True, shape=shape, max=mx,
                         min=rng.choice([0.0, -1.0]), avg=rng.choice([0.5, 0.25]), l2norm=1.0))
        order += 1
    for it, calls in calls_by_it.items():
        seen = {}
        for ci, si, num, seed, dtype, graph in calls:
            typ, tensors = CALLS[ci]
            name = (SCOPES[si] + "/" if SCOPES[si] else "") + f"{typ}-op{num}"
            call = seen.get((graph, name), 0)
            seen[(graph, name)] = call + 1
            for io, slot, shape in tensors:
                row(it, "op", name, typ, io, slot, call, graph, shape, dtype, seed * 100 + slot * 2 + (io == "output"))
        for p, seed, graph in params:           # one name in two graphs: the name matcher prefers the same graph
            row(it, "parameter", f"Parameter.{p}", "Parameter", "output", 0, 0, graph, "(4,4)", "Float32", seed)
    for c, seed in constants:
        row(None, "constant", f"constants/{c}", "Constant", "output", 0, 0, 0, "(4)", "Float32", seed)
    rec = pd.DataFrame(rows)
    rec["iteration"] = rec["iteration"].astype("Int64")
    return rec


def _edit(rng: random.Random, calls):
    """B's sequence: A's with calls inserted, dropped, renumbered or given other values."""
    out = []
    for c in calls:
        r = rng.random()
        if r < 0.1:
            continue                                                    # missing in B
        if r < 0.2:
            out.append((2, c[1], rng.randint(0, 40), 0, "BFloat16", c[5]))   # an extra cast before it
        if r < 0.3:
            c = (c[0], c[1], rng.randint(0, 40)) + c[3:]                # renumbered
        if r > 0.9:
            c = c[:3] + (rng.randint(0, 3),) + c[4:]                    # other values (tie-break)
        out.append(c)
    return out


def _key(p):
    """Pairs compared as sets (compare sorts them by Pair.sort_key, one key per tensor)."""
    return (p[0] is None, p[0] or 0, p[1] is None, p[1] or 0, p[2])


def _object_pairs(ra, rb, it_pairs):
    ta, tb = tensors_of_records(ra), tensors_of_records(rb)
    by_a, by_b = {}, {}
    for t in ta:
        by_a.setdefault(t.iteration, []).append(t)
    for t in tb:
        by_b.setdefault(t.iteration, []).append(t)
    pos = {id(t): k for k, t in enumerate(ta)}
    pos.update({id(t): k for k, t in enumerate(tb)})
    out = []
    for ia, ib in it_pairs:
        for p in match(by_a.get(ia, []), by_b.get(ib, []), default_matchers()):
            out.append((None if p.a is None else pos[id(p.a)], None if p.b is None else pos[id(p.b)], p.rule))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(call_st, min_size=0, max_size=30), st.lists(call_st, min_size=0, max_size=30),
       st.integers(0, 10 ** 6), st.booleans(), st.booleans())
def test_column_matcher_is_the_object_matcher(it0, it1, seed, params, second_iteration_in_b):
    rng = random.Random(seed)
    a_calls = {0: it0, 1: it1}
    b_calls = {0: _edit(rng, it0)}
    if second_iteration_in_b:
        b_calls[1] = _edit(rng, it1)
    pa = [("w0", 1, 0), ("w1", 2, 0), ("w1", 2, 1)] if params else []
    pb = [("w1", 2, 1), ("w0", 1, 0), ("w1", 2, 0), ("w2", 3, 0)] if params else []
    ra = _frame(a_calls, pa, [("c0", 1)])
    rb = _frame(b_calls, pb, [("c0", 1), ("c1", 1)])
    ta, tb = tensors_of_records(ra), tensors_of_records(rb)
    it_pairs = _iteration_pairs(ta, tb, None)
    sides = sides_of(ra, rb)
    assert sides is not None
    assert sorted(match_rank(*sides, it_pairs), key=_key) == sorted(_object_pairs(ra, rb, it_pairs), key=_key)


def test_tie_break_and_rules_are_exercised():
    """A fixed case where every rule of the matchers shows up: the property test's cases are
    not vacuous."""
    ops = [(3, 2, 1, 0, "Float32", 0), (3, 2, 2, 1, "Float32", 0), (0, 0, 3, 0, "Float32", 0),
           (1, 0, 4, 0, "Float32", 0), (6, 1, 5, 0, "Float32", 0), (4, 1, 6, 2, "Float32", 0),
           (8, 0, 7, 0, "Float32", 0), (1, 1, 8, 0, "Float32", 0), (1, 1, 9, 1, "Float32", 0)]
    b_ops = [(3, 2, 1, 1, "Float32", 0), (3, 2, 2, 0, "Float32", 0), (2, 0, 30, 0, "BFloat16", 0),
             (0, 0, 3, 0, "Float32", 0), (1, 0, 14, 0, "Float32", 0), (5, 1, 6, 2, "Float32", 0),
             (9, 0, 7, 0, "Float32", 0), (1, 1, 9, 1, "Float32", 0), (1, 1, 8, 0, "Float32", 0)]
    ra = _frame({0: ops}, [("w0", 1, 0)], [("c0", 1)])
    rb = _frame({0: b_ops}, [("w0", 1, 0)], [])
    it_pairs = _iteration_pairs(tensors_of_records(ra), tensors_of_records(rb), None)
    got = match_rank(*sides_of(ra, rb), it_pairs)
    assert sorted(got, key=_key) == sorted(_object_pairs(ra, rb, it_pairs), key=_key)
    rules = {r for _, _, r in got}
    assert {"name", "aligned order", "front-end", ""} <= rules, rules
    # the two detach calls traded values in B: the tie-break pairs them across
    a_op, b_op = ra["op"].tolist(), rb["op"].tolist()
    crossed = [(a_op[i], b_op[j]) for i, j, _ in got if i is not None and j is not None and "detach" in a_op[i]]
    assert ("Gradients/Default/Net/a-L/detach-op1", "Gradients/Default/Net/a-L/detach-op2") in crossed


# --- whole compares: the column matcher inside compare against the per-row stages ---------------

DIFFERING = {
    "missing_in_b": (dict(), dict(seed=0, perturb=1e-3, drop=(1, 5))),
    "missing_in_a": (dict(drop=(0, 2)), dict(seed=0, perturb=1e-2, drop=None)),
    "ties_and_missing": (dict(), dict(seed=0, swap_ties=True, drop=(2, 7))),
    "shape_differs": (dict(), dict(seed=0, perturb=1e-3, shape_of={2: (3, 4)})),
    "dtype_class_differs": (dict(), dict(seed=0, dtype_of={6: "Int32", 1: "BFloat16"})),
    "nonfinite_md5_two_ranks": (dict(ranks=(0, 1), nonfinite=True, md5=True),
                                dict(seed=1, ranks=(0, 1), nonfinite=True, md5=True, drop=(0, 3))),
    "several_calls": (dict(calls=2), dict(seed=0, calls=2, swap_ties=True, drop=(1, 1))),
    "most_unmatched": (dict(), dict(seed=0, dtype_of={i: "Int32" for i in range(26)})),   # warns; front-end
}


@pytest.mark.parametrize("case", sorted(DIFFERING))
def test_differing_sequences_match_per_row_stages(case, tmp_path, monkeypatch):
    a_spec, b_spec = DIFFERING[case]
    a = write_stats_dump(tmp_path / "a", **a_spec)
    b = write_stats_dump(tmp_path / "b", **{**a_spec, **b_spec})
    assert _fast_applies(a, b)                           # column-wise, pairs by the column matcher
    da, db = open_dump(str(a)), open_dump(str(b))
    ta, tb = _tensors(da, 0), _tensors(db, 0)
    assert column_pairs(da, 0, db, 0, None, True, ta, tb, _iteration_pairs(ta, tb, None)) is not None
    old, new = _both(a, b, monkeypatch)
    _same(old, new, tmp_path)
    assert old.counts.get("unmatched", 0) > 0
    assert (old.warnings, old.front_end_a, old.unmatched_b) == (new.warnings, new.front_end_a, new.unmatched_b)
    if case == "most_unmatched":
        assert old.warnings and old.front_end_a


def test_rank_only_in_a(tmp_path, monkeypatch):
    """A rank that B lacks: the per-row stages run, the column matcher pairing the rank both hold."""
    a = write_stats_dump(tmp_path / "a", ranks=(0, 1))
    b = write_stats_dump(tmp_path / "b", ranks=(0,), perturb=1e-3, drop=(2, 3))
    assert not _fast_applies(a, b)
    old, new = _both(a, b, monkeypatch)
    _same(old, new, tmp_path)
    assert old.unmatched_a and old.counts.get("unmatched", 0) > 0


@pytest.mark.parametrize("kw", [dict(io="output"), dict(include_parameters=False), dict(iterations=[(0, 1), 2]),
                                dict(rank=1, rank_b=0)])
def test_differing_sequences_options(kw, tmp_path, monkeypatch):
    a = write_stats_dump(tmp_path / "a", ranks=(0, 1))
    b = write_stats_dump(tmp_path / "b", ranks=(0, 1), perturb=1e-3, swap_ties=True, drop=(1, 4))
    old, new = _both(a, b, monkeypatch, **kw)
    _same(old, new, tmp_path)


def _real_run(root, bf16: bool):
    """A real statistics dump of one training step of a tiny model (eager capture)."""
    import torch
    import torch.nn as nn

    import opdump
    from opdump.capture.eager import EagerCapture
    from opdump.config import DumpConfig, IterationSpec

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1)
    cfg = DumpConfig(path=str(root), saved_data="statistic", iteration=IterationSpec(ranges=((0, 1),)))
    with opdump.Session(cfg) as s, EagerCapture(s):
        for _ in range(2):
            x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = model(x)
            loss = ((out.float() - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.step()
    return root


def test_real_fp32_vs_bf16_autocast(tmp_path, monkeypatch):
    """Two real runs whose sequences differ by autocast's casts: the column matcher's compare
    is the per-row stages' (table, CSV bytes, summary, first difference and divergence)."""
    a = _real_run(tmp_path / "bf16", True)
    b = _real_run(tmp_path / "fp32", False)
    assert _fast_applies(a, b)
    da, db = open_dump(str(a)), open_dump(str(b))
    ta, tb = _tensors(da, 0), _tensors(db, 0)
    assert column_pairs(da, 0, db, 0, None, True, ta, tb, _iteration_pairs(ta, tb, None)) is not None
    old, new = _both(a, b, monkeypatch)
    _same(old, new, tmp_path)
    assert old.counts.get("unmatched", 0) > 0 and old.matched_by.get("aligned order", 0) > 0


@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_cast_cases_match_per_row_stages(case, tmp_path, monkeypatch):
    """tests/test_compare_stat_rows.py's cases (extra casts on one side, NaN/Inf, MD5, ties,
    filters): the column path against the per-row stages."""
    spec_a, spec_b, casts, kw = ROW_CASES[case]
    a = write_stats_dump(tmp_path / "a", **spec_a)
    if casts:
        add_casts(a)
    b = write_stats_dump(tmp_path / "b", **spec_b)
    assert _fast_applies(a, b, **kw)
    old, new = _both(a, b, monkeypatch, **kw)
    assert (old.table["verdict"] == "unmatched").any()
    _same(old, new, tmp_path)
    assert (old.unmatched_a, old.unmatched_b, old.front_end_a, old.front_end_b, old.warnings) == (
        new.unmatched_a, new.unmatched_b, new.front_end_a, new.front_end_b, new.warnings)


def _reseed(rng: random.Random, calls):
    """The same calls with other values (the value seed of some calls changed)."""
    return [c[:3] + (rng.randint(0, 3),) + c[4:] if rng.random() < 0.5 else c for c in calls]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(call_st, min_size=1, max_size=30), st.integers(0, 10 ** 6), st.integers(2, 4))
def test_repeated_iterations_tie_break_by_their_own_values(calls, seed, n_its):
    """Iterations running one sequence (a training run's steps) with other values each: the
    column matcher works the alignment out once for them (stat_align's plans) and the value
    tie-break of every iteration still reads that iteration's values, as the object matcher."""
    rng = random.Random(seed)
    b_calls = _edit(rng, calls)
    ra = _frame({it: _reseed(rng, calls) for it in range(n_its)}, [("w0", 1, 0)], [])
    rb = _frame({it: _reseed(rng, b_calls) for it in range(n_its)}, [("w0", 1, 0)], [])
    it_pairs = _iteration_pairs(tensors_of_records(ra), tensors_of_records(rb), None)
    got = match_rank(*sides_of(ra, rb), it_pairs)
    assert sorted(got, key=_key) == sorted(_object_pairs(ra, rb, it_pairs), key=_key)


def _with_duplicates(rec: pd.DataFrame, rng: random.Random) -> pd.DataFrame:
    """``rec`` with a few operator rows written twice (a call holding two tensors of one io
    and slot), each copy right after its row, ``order`` renumbered."""
    ops = rec.index[rec["kind"] == "op"].tolist()
    dup = set(rng.sample(ops, min(len(ops), 2)))
    rows = [k for i in rec.index for k in ([i, i] if i in dup else [i])]
    out = rec.loc[rows].reset_index(drop=True)
    out["order"] = range(len(out))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(call_st, min_size=1, max_size=25), st.integers(0, 10 ** 6), st.booleans())
def test_call_by_call_stage_is_the_object_matcher(calls, seed, dup_in_b):
    """A call holding two rows of one io and slot sends the aligned stage call by call
    (stat_match._aligned, not stat_align's passes): same pairs as the object matcher."""
    rng = random.Random(seed)
    ra = _frame({0: calls, 1: _reseed(rng, calls)}, [("w0", 1, 0)], [])
    b_calls = _edit(rng, calls)
    rb = _frame({0: b_calls, 1: _reseed(rng, b_calls)}, [("w0", 1, 0)], [])
    if dup_in_b:
        rb = _with_duplicates(rb, rng)
    else:
        ra = _with_duplicates(ra, rng)
    sides = sides_of(ra, rb)
    # a side whose edit left no operator has no row to write twice: nothing to test there
    assume(not (sides[0].calls.unique and sides[1].calls.unique))
    it_pairs = _iteration_pairs(tensors_of_records(ra), tensors_of_records(rb), None)
    assert sorted(match_rank(*sides, it_pairs), key=_key) == sorted(_object_pairs(ra, rb, it_pairs), key=_key)
