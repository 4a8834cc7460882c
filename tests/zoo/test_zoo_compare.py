"""Zoo check 2 (issue 17, "The model zoo"): ``compare`` of the eager dump against
the graph dump of the same steps: every tensor matched, none diverged -- and, on
CPU, every compared pair bit-equal (README "Design decisions": the dump path runs
operator by operator, bit-identical to eager).

Two tests per model, so that a failure says which half broke: the verdicts of
the pairs compare made, and whether every tensor found its pair."""
import pytest

from opdump.analysis.compare import compare

from .models import MODELS

NAMES = sorted(MODELS)
_RESULTS = {}


def _compare(zoo, name):
    """compare(eager dump, graph dump), once per model for both tests."""
    if name not in _RESULTS:
        _RESULTS[name] = compare(zoo.get(name, "eager").root, zoo.get(name, "graph").root, progress=False, workers=1)
    return _RESULTS[name]


@pytest.mark.parametrize("name", NAMES)
def test_eager_vs_graph_none_diverged_values_bit_equal(zoo, name):
    r = _compare(zoo, name)
    t = r.table
    summary = r.summary()
    assert len(t), summary
    diverged = t[t["verdict"] == "diverged"]
    assert diverged.empty, f"{summary}\n" + diverged[["op", "op_b", "io", "slot", "reason"]].head(12).to_string()
    assert r.first_divergence is None and not r.diverged_parameters, summary
    compared = t[~t["verdict"].isin(["skipped", "unmatched"])]
    not_equal = compared[compared["max_abs_err"].fillna(0) != 0]
    assert not_equal.empty, not_equal[["op", "op_b", "io", "slot", "max_abs_err"]].head(12).to_string()


@pytest.mark.parametrize("name", NAMES)
def test_eager_vs_graph_every_tensor_matched(zoo, name):
    r = _compare(zoo, name)
    t = r.table
    unmatched = t[t["verdict"] == "unmatched"]
    assert not r.unmatched_a and not r.unmatched_b and unmatched.empty, (
        f"{r.summary()}\nonly in eager: {r.unmatched_a[:12]}\nonly in graph: {r.unmatched_b[:12]}")
