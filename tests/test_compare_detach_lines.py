"""``compare`` leaves a ``detach`` pair unpaired (two front-end operators) when the two
operators come from different source lines (opdump/analysis/compare/detach_lines.py: the
compiled backward's detach of a saved ``exp`` against eager autograd's detach of an
accumulated gradient), on the column-wise and the per-row paths; the same line keeps the pair."""
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.analysis import compare
from opdump.capture.eager import EagerCapture
from conftest import write_config


class _Net(nn.Module):
    def __init__(self, other):
        super().__init__()
        self.other = other

    def forward(self, x):
        h = x * 2.0
        if self.other:
            kept = torch.detach(h)      # the same computation, written on another line
        else:
            kept = h.detach()
        return kept * 3.0 + h


def _dump(root, name, model):
    folder = root / name
    folder.mkdir()
    cfg = write_config(folder, common={"saved_data": "statistic", "statistic_category": ["max", "min", "l2norm"]})
    with opdump.Session(cfg) as s, EagerCapture(s):
        model(torch.ones(2, 4, requires_grad=True)).sum().backward()
        s.step()
    return str(folder / "dump")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("detach")
    return {n: _dump(root, n, m) for n, m in (("here", _Net(False)), ("here2", _Net(False)),
                                                   ("there", _Net(True)))}


@pytest.mark.parametrize("fast", ["1", "0"])
def test_detach_of_another_line_is_not_paired(dumps, fast, monkeypatch):
    monkeypatch.setenv("OPDUMP_COMPARE_FAST", fast)
    t = compare(opdump.load(dumps["here"]), opdump.load(dumps["there"]), progress=False).table
    det = t[(t.op_type == "detach") & (t.kind == "op") & ~t.op.fillna(t.op_b).str.startswith("Gradients")]
    assert len(det) == 4 and set(det.verdict) == {"unmatched"}, det[["op", "op_b", "verdict"]]
    assert set(det.reason) == {"only in A (front-end operator)", "only in B (front-end operator)"}
    t = compare(opdump.load(dumps["here"]), opdump.load(dumps["here2"]), progress=False).table
    det = t[(t.op_type == "detach") & (t.kind == "op")]
    assert len(det) and set(det.verdict) == {"pass"}
