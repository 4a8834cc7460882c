"""compare: matching rules, metrics, verdicts, first divergence, CSV, HTML report."""
import math
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from analysis_fixtures import LINES, MS_SAMPLE, make_dump
from opdump.analysis.compare import Thresholds, compare, load_mapping, verdict_for_metrics
from opdump.analysis.metrics import tensor_metrics

needs_sample = pytest.mark.skipif(not MS_SAMPLE.is_dir(), reason=f"MindSpore sample dump not found at {MS_SAMPLE}")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    make_dump(root / "ref", iterations=(0, 1))
    make_dump(root / "same", iterations=(0, 1))
    make_dump(root / "fc2", iterations=(0, 1), weight_delta={"fc2.weight": 0.4}, dropout_seed=3)
    return root


def test_identical_runs_do_not_diverge(dumps):
    r = compare(dumps / "same", dumps / "ref", progress=False)
    assert r.first_divergence is None and not r.diverged
    c = r.counts
    assert c.get("diverged", 0) == 0 and c["pass"] > 50
    # empty_like output / fill_ destination are skipped even though the garbage differs run to run
    assert c["skipped"] == 4
    assert not r.unmatched_a and not r.unmatched_b


def test_perturbed_layer_is_the_first_divergence(dumps, tmp_path):
    r = compare(dumps / "fc2", dumps / "ref", progress=False)
    fd = r.first_divergence
    assert fd["op"] == "Default/Net/fc2-Linear/t-op6" and fd["iteration"] == 0
    assert (fd["io"], fd["slot"]) == ("input", 0)
    assert fd["source"].endswith(f"model.py:{LINES['fc2']}")
    assert "input" in fd["cause"]
    assert "Parameter.fc2_weight" in r.diverged_parameters
    # the dropout differs (other seed): nondeterministic, never the divergence
    t = r.table
    drop = t[t["op"].fillna("").str.contains("native_dropout") & (t["io"] == "output")]
    assert set(drop["verdict"]) == {"nondeterministic"}
    assert r.nondeterministic_before == ["Default/Net/drop-Dropout/native_dropout-op5"]
    # everything before the fc2 layer matches
    first_row = t[(t["op"] == fd["op"]) & (t["verdict"] == "diverged")].index[0]
    before = t.loc[: first_row - 1]
    assert set(before["verdict"]) <= {"pass", "skipped", "nondeterministic"}
    # CSV holds the full table
    r.to_csv(tmp_path / "t.csv")
    back = pd.read_csv(tmp_path / "t.csv")
    assert len(back) == len(t) and {"cosine", "max_abs_err", "max_rel_err", "rmse", "euclidean", "within_1e-3",
                                    "within_5e-3", "verdict", "source"} <= set(back.columns)


def test_parallel_matches_serial(dumps):
    s = compare(dumps / "fc2", dumps / "ref", progress=False, workers=1)
    p = compare(dumps / "fc2", dumps / "ref", progress=False, workers=2, parallel_min=1)
    cols = ["op", "io", "slot", "iteration", "verdict", "cosine", "max_abs_err"]
    pd.testing.assert_frame_equal(s.table[cols], p.table[cols])
    assert s.first_divergence["op"] == p.first_divergence["op"]


def test_scope_type_order_matching_after_renumbering(tmp_path):
    make_dump(tmp_path / "ref", iterations=(0,))
    make_dump(tmp_path / "extra", iterations=(0,), extra_op=True)      # one more op shifts every -opN after it
    r = compare(tmp_path / "extra", tmp_path / "ref", progress=False)
    t = r.table
    assert "aligned order" in set(t["match"])
    row = t[(t["op"] == "Default/Net/fc2-Linear/addmm-op8") & (t["io"] == "output")].iloc[0]
    assert row["op_b"] == "Default/Net/fc2-Linear/addmm-op7" and row["verdict"] == "pass"
    # a clone only A runs computes nothing new: listed as a front-end operator (compare/frontend.py)
    assert r.front_end_a == ["Default/Net/clone-op3"] and not r.unmatched_a and r.unmatched_b == []
    assert r.first_divergence is None


def test_mapping_file(tmp_path):
    make_dump(tmp_path / "ref", iterations=(0,))
    make_dump(tmp_path / "extra", iterations=(0,), extra_op=True)
    m = tmp_path / "map.csv"
    m.write_text("# A,B\na,b\nDefault/Net/clone-op3:output.0,Default/Net/relu-op2:output.0\n"
                 "Default/Net/exp-op10,Default/Net/exp-op9\n")
    assert load_mapping(m)[0] == ("Default/Net/clone-op3:output.0", "Default/Net/relu-op2:output.0")
    r = compare(tmp_path / "extra", tmp_path / "ref", mapping=m, progress=False)
    t = r.table
    clone = t[t["op"] == "Default/Net/clone-op3"]
    assert list(clone[clone["io"] == "output"]["match"]) == ["mapping"]
    assert list(clone[clone["io"] == "output"]["verdict"]) == ["pass"]
    assert set(t[t["op"] == "Default/Net/exp-op10"]["match"]) == {"mapping"}
    (tmp_path / "bad.csv").write_text("only_one_name\n")
    with pytest.raises(ValueError, match="bad mapping line"):
        load_mapping(tmp_path / "bad.csv")


def test_statistics_only_compare(tmp_path):
    make_dump(tmp_path / "ref", iterations=(0,), saved_data="statistic", stats=["max", "min", "avg", "l2norm"])
    make_dump(tmp_path / "p", iterations=(0,), saved_data="statistic", stats=["max", "min", "avg", "l2norm"],
              weight_delta={"fc1.weight": 0.5})
    r = compare(tmp_path / "p", tmp_path / "ref", progress=False)
    assert set(r.table["mode"]) - {""} == {"statistics"}
    assert r.first_divergence["op"] == "Default/Net/fc1-Linear/t-op0"
    r2 = compare(tmp_path / "ref", tmp_path / "ref", progress=False)
    assert r2.first_divergence is None


def test_precision_difference_is_not_a_divergence(tmp_path):
    make_dump(tmp_path / "fp32", iterations=(0,))
    make_dump(tmp_path / "fp16", iterations=(0,), dtype=np.float16)
    r = compare(tmp_path / "fp16", tmp_path / "fp32", progress=False)
    assert r.first_divergence is None, r.first_divergence
    assert r.counts.get("warning", 0) > 0 and r.counts.get("warning", 0) + r.counts.get("pass", 0) > 35


def test_verdict_rules():
    th = Thresholds()
    assert verdict_for_metrics({"n": 10, "cosine": 0.95, "max_abs_err": 0.01, "max_abs_ref": 1.0}, th)[0] == "diverged"
    assert verdict_for_metrics({"n": 10, "cosine": 0.95, "max_abs_err": 1e-4, "max_abs_ref": 1.0}, th)[0] == "warning"
    assert verdict_for_metrics({"n": 10, "cosine": 0.5, "max_abs_err": 1e-7, "max_abs_ref": 1e-7}, th)[0] == "pass"
    # abs > 1 on large values is scaled: 2 on 1e4 is fine, 2 on 10 is not
    assert verdict_for_metrics({"n": 10, "cosine": 0.99999, "max_abs_err": 2.0, "max_abs_ref": 1e4}, th)[0] != "diverged"
    assert verdict_for_metrics({"n": 10, "cosine": 0.99999, "max_abs_err": 2.0, "max_abs_ref": 10}, th)[0] == "diverged"
    assert verdict_for_metrics({"n": 10, "nonfinite_mismatch": 1}, th)[0] == "diverged"


def test_metrics_values():
    a = np.array([1.0, 2.0, 0.0, np.nan, np.inf], dtype=np.float32)
    b = np.array([1.0, 2.002, 0.0, np.nan, np.inf], dtype=np.float64)
    m = tensor_metrics(a, b, chunk=2)
    assert m["n"] == 3 and m["nonfinite_mismatch"] == 0
    assert m["max_abs_err"] == pytest.approx(0.002, rel=1e-3)
    assert m["max_rel_err"] == pytest.approx(0.002 / 2.002, rel=1e-3)
    assert m["within_1e-3"] == pytest.approx(1.0) and m["within_5e-3"] == pytest.approx(1.0)
    assert m["rmse"] == pytest.approx(math.sqrt(0.002 ** 2 / 3), rel=1e-3)
    assert m["cosine"] == pytest.approx(1.0, abs=1e-5)
    z = tensor_metrics(np.zeros(4), np.zeros(4))
    assert z["cosine"] == 1.0 and z["max_abs_err"] == 0
    assert math.isnan(tensor_metrics(np.zeros(4), np.ones(4))["cosine"])
    assert tensor_metrics(np.array([np.nan]), np.array([1.0]))["nonfinite_mismatch"] == 1
    assert "error" in tensor_metrics(np.zeros(3), np.zeros(4))


@needs_sample
def test_mindspore_sample_against_itself_and_a_modified_copy(tmp_path):
    import shutil
    r = compare(MS_SAMPLE, MS_SAMPLE, progress=False)
    assert r.first_divergence is None and set(r.table["verdict"]) == {"pass"}
    assert len(r.table) == 180
    copy = tmp_path / "ms"
    shutil.copytree(MS_SAMPLE, copy)
    it0 = copy / "rank_0" / "MLP" / "0" / "0"
    out = next(it0.glob("MatMul.Default_network-WithLossCell__backbone-TinyMLP_fc2-Dense_MatMul-op0.*.output.0.*.npy"))
    arr = np.load(out)
    arr[0, 0] += 5.0
    np.save(out, arr)
    r = compare(copy, MS_SAMPLE, progress=False)
    fd = r.first_divergence
    assert fd["op"] == "Default/network-WithLossCell/_backbone-TinyMLP/fc2-Dense/MatMul-op0" and fd["io"] == "output"
    assert fd["cause"].startswith("inputs match") and fd["source"] == "/home/user/ms/train.py:67"


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []
        self.rows = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "tr" and "class" in a:
            self.rows.append(a)


def test_html_report_content(dumps, tmp_path):
    r = compare(dumps / "fc2", dumps / "ref", progress=False)
    out = tmp_path / "report.html"
    r.to_html(out)
    text = out.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
    p = _Collect()
    p.feed(text)
    svgs = [a for t, a in p.tags if t == "svg"]
    assert {a.get("id") for a in svgs} >= {"plot-cosine", "plot-error"}
    assert sum(1 for t, a in p.tags if t == "polyline") >= 2
    marks = [a for t, a in p.tags if t == "line" and a.get("class") == "first-divergence"]
    assert len(marks) == 2
    assert sum(1 for t, a in p.tags if t == "circle" and "pt-diverged" in a.get("class", "")) > 10
    assert len(p.rows) == len(r.table)
    assert sum(1 for a in p.rows if a.get("id") == "first-divergence") == 1
    assert "Default/Net/fc2-Linear/t-op6" in text


def test_mapping_of_different_element_counts_is_unmatched_not_diverged(tmp_path):
    make_dump(tmp_path / "ref", iterations=(0,))
    m = tmp_path / "map.csv"      # fc1's weight (16x8) paired by hand with fc2's (4x16)
    m.write_text("Default/Net/fc1-Linear/t-op0:input.0,Default/Net/fc2-Linear/t-op6:input.0\n")
    r = compare(tmp_path / "ref", tmp_path / "ref", mapping=m, progress=False)
    t = r.table
    row = t[(t["op"] == "Default/Net/fc1-Linear/t-op0") & (t["io"] == "input")].iloc[0]
    assert row["match"] == "mapping" and row["verdict"] == "unmatched"
    assert "element count differs: 128 vs 64" in row["reason"]
    assert "diverged" not in r.counts and r.first_divergence is None


def test_matchers_are_pluggable(tmp_path):
    from opdump.analysis.compare import NameMatcher
    make_dump(tmp_path / "ref", iterations=(0,))
    make_dump(tmp_path / "extra", iterations=(0,), extra_op=True)
    by_name = compare(tmp_path / "extra", tmp_path / "ref", progress=False, matchers=[NameMatcher()])
    aligned = compare(tmp_path / "extra", tmp_path / "ref", progress=False)
    # names alone: every operator after the inserted clone is renumbered, so unmatched
    assert set(by_name.matched_by) == {"name"} and len(by_name.unmatched_a) > 5
    assert aligned.front_end_a == ["Default/Net/clone-op3"] and aligned.matched_by["aligned order"] > 10


def test_align_keeps_order_and_skips_insertions():
    from opdump.analysis.compare.match import align
    a = ["t", "mm", "X", "t", "mm", "sum", "Y", "view"]
    b = ["t", "mm", "t", "mm", "sum", "view", "Z"]
    pairs = align(a, b)
    assert all(a[i] == b[j] for i, j in pairs) and len(pairs) == 6
    assert [i for i, _ in pairs] == sorted(i for i, _ in pairs) and [j for _, j in pairs] == sorted(j for _, j in pairs)
