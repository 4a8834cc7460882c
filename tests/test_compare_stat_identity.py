"""Same-dtype identity of statistics-only pairs (``first difference``) measures each
statistic's difference against the tensors' magnitude, as the tensor rule measures against
max|B| (compare/verdict.py, stat_columns.py: both paths).

Found by the CI machine of 2026-11-24 (test_compare_kernel_dump.test_statistics_only_dumps):
an inductor kernel's reordered ``sum`` against eager's moved its ``min`` from -0.009556308 to
-0.009556323 -- 1.57e-6 of itself, 1e-7 of max|B| (0.153) -- and was named the first
difference although its tensor compare calls the same pair identical.  Fails before: the
statistic was measured against its own magnitude only.
"""
import numpy as np
import pytest

from opdump.analysis.compare import stat_columns, verdict

TH = verdict.Thresholds()
EAGER = {"max": 0.15292418, "min": -0.009556308, "l2norm": 0.1755938766899613}
KERNEL = {"max": 0.15292418, "min": -0.009556323, "l2norm": 0.1755938829351621}


def _per_row(ra, rb):
    _, _, extra = verdict.stats_verdict(ra, rb, TH)
    return verdict._stats_identical(ra, rb, extra, "Float32", TH, None, None), extra


def _columns(ra, rb):
    out = stat_columns.judge_columns(lambda k: stat_columns._column([ra], k), lambda k: stat_columns._column([rb], k),
                                     1, [None], [None], [True], [True], ["Float32"], TH,
                                     lambda dtype: verdict.same_dtype_tolerance(dtype, TH))
    return out[3][0], out[2][0]


@pytest.mark.parametrize("judge", [_per_row, _columns], ids=["per-row", "columns"])
def test_a_reordered_reduction_is_identical(judge):
    identical, extra = judge(KERNEL, EAGER)
    assert identical is True
    assert extra["stat_rel_diff_all"] == pytest.approx(1.5e-8 / 0.15292418, rel=0.05)


@pytest.mark.parametrize("judge", [_per_row, _columns], ids=["per-row", "columns"])
def test_a_difference_beyond_the_tolerance_of_the_magnitude_is_not(judge):
    moved = dict(EAGER, min=EAGER["min"] - 3e-7)        # 2e-6 of max|B|
    assert judge(moved, EAGER)[0] is False
    scaled = dict(EAGER, l2norm=EAGER["l2norm"] * (1 + 3e-6))
    assert judge(scaled, EAGER)[0] is False


@pytest.mark.parametrize("judge", [_per_row, _columns], ids=["per-row", "columns"])
def test_the_verdict_keeps_its_own_rule(judge):
    """Only identity changed: the pass/warning/diverged thresholds still measure max/min
    against their own magnitude (README: > 1 % diverged, > 0.1 % warning)."""
    far = dict(EAGER, min=EAGER["min"] * 1.05)           # 5 % of itself, 0.3 % of max|B|
    v, _, extra = verdict.stats_verdict(far, EAGER, TH)
    assert v == "diverged" and extra["stat_max_rel_diff"] == pytest.approx(0.05 / 1.05, rel=1e-3)
    assert judge(far, EAGER)[0] is False
    assert np.isfinite(extra["stat_rel_diff_all"])
