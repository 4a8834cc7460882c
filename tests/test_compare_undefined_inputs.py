"""``compare`` skips inputs whose contents are undefined, decided from the graph listing
(opdump/analysis/undefined.py): the destinations of ``out=`` calls (single- and
multi-output overloads) and the output of ``empty_like`` before anything wrote it -- on
every compare path (statistics and tensor files, the column-wise stages and the per-row
ones, ``OPDUMP_COMPARE_FAST=0``), while the other inputs of those operators are still
compared.  Also the listing's ``producers`` field, written and read on one definition."""
import glob
import json
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.analysis import compare
from opdump.analysis.undefined import is_out_overload
from opdump.capture.eager import EagerCapture
from opdump.format import listing
from conftest import write_config


class _Net(nn.Module):
    """``out=`` into attributes holding ``fill`` (not buffers: not dumped as parameters), and
    ``empty_like`` written by ``index_put_`` (transformers' MoE code)."""

    def __init__(self, fill):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.buf = torch.full((2, 4), float(fill))
        self.v, self.i = torch.full((2,), float(fill)), torch.full((2,), int(fill), dtype=torch.long)

    def forward(self, x):
        h = self.fc(x)
        with torch.no_grad():
            torch.mul(h, 0.5, out=self.buf)                 # mul.out: input 1 the destination
            torch.max(h, 1, out=(self.v, self.i))           # max.dim_max: inputs 1 and 2
        perm = torch.tensor([2, 0, 3, 1])
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(4)                         # index_put_: input 0 uninitialised
        return (h[:, inv] * self.buf * self.v[:, None]).sum()


def _dump(root, name, fill, saved):
    folder = root / name
    folder.mkdir()
    cfg = write_config(folder, common={"saved_data": saved, "statistic_category": ["max", "min", "l2norm"]})
    torch.manual_seed(0)
    model = _Net(fill)
    with opdump.Session(cfg) as s, EagerCapture(s):
        model(torch.randn(2, 4, generator=torch.Generator().manual_seed(0))).backward()
        s.step()
    return str(folder / "dump")


def _scramble_empty(dump, saved):
    """What another run's uninitialised memory would hold: index_put_'s input 0 (and the
    empty_like output: already skipped before) set to other values."""
    (folder,) = glob.glob(os.path.join(dump, "rank_0", "Net", "*", "0"))
    if saved == "statistic":
        import csv
        path = os.path.join(folder, "statistic.csv")
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        h = rows[0]
        name, io, slot = h.index("Op Name"), h.index("IO"), h.index("Slot")
        for r in rows[1:]:
            if "index_put_" in r[name] and r[io] == "input" and r[slot] == "0":
                for c in ("Max Value", "Min Value", "L2Norm Value"):
                    r[h.index(c)] = "987654"
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    else:
        (path,) = glob.glob(os.path.join(folder, "index_put_.*.input.0.*.npy"))
        np.save(path, np.full_like(np.load(path), 987654))


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("undef")
    out = {}
    for saved in ("statistic", "tensor"):
        a = _dump(root, f"{saved}_a", 0.0, saved)
        b = _dump(root, f"{saved}_b", 7.0, saved)
        _scramble_empty(b, saved)
        out[saved] = (a, b)
    return out


@pytest.mark.parametrize("saved", ["statistic", "tensor"])
@pytest.mark.parametrize("fast", ["1", "0"])
def test_undefined_inputs_are_skipped_and_the_rest_compared(dumps, saved, fast, monkeypatch):
    monkeypatch.setenv("OPDUMP_COMPARE_FAST", fast)
    a, b = dumps[saved]
    res = compare(opdump.load(a), opdump.load(b), progress=False)
    assert res.first_difference is None and res.first_divergence is None, (res.first_difference,
                                                                           res.first_divergence)
    t = res.table
    names = {o.op_type: o.full_name for o in opdump.load(a).op_infos()
             if o.overload in ("out", "dim_max") or o.op_type == "index_put_"}
    assert len(names) == 3, names

    def verdict(op_type, io, slot):
        (v,) = t[(t.op == names[op_type]) & (t.io == io) & (t.slot == slot)].verdict.tolist()
        return v
    assert verdict("mul", "input", 1) == "skipped"          # mul.out's destination
    assert verdict("max", "input", 1) == verdict("max", "input", 2) == "skipped"    # dim_max's two
    assert verdict("index_put_", "input", 0) == "skipped"   # empty_like's output, unwritten
    for op_type, slot in (("max", 0), ("index_put_", 1), ("index_put_", 2)):
        assert verdict(op_type, "input", slot) == "pass", (op_type, slot)   # still compared
    assert verdict("max", "output", 0) == "pass"


def test_listing_producers_round_trip():
    """The writer's ``producers`` (from each operator's ``.ir`` references, in input order)
    are what the reader parses; references it cannot tell apart give None."""
    def op(i, name, refs, n_in, node=None):
        return SimpleNamespace(index=i, full_name=name, op_type=name.split("/")[-1].split("-")[0],
                               overload="default", scope="Default", selected=True, args={},
                               input_meta=[((2,), "Float32")] * n_in, output_meta=[((2,), "Float32")],
                               source=[], arg_text=refs, node_name=node or "x", nonfinite_args=False)
    ops = [op(0, "Default/empty_like-op0", "%input", 1), op(1, "Default/max-op1", "%0, 1", 1),
           op(2, "Default/add-op2", "%1[1], %para1_w.b, alpha=2", 2),
           op(3, "Default/cat-op3", "[%0, %2], 'a%b'", 2)]          # a '%' in a string: ambiguous
    kind, parsed = listing.parse_graph_json(json.loads(listing.render_graph_json(0, "eager", ops, [])))
    got = [o["producers"] for o in parsed]
    assert got == [[None], [("Default/empty_like-op0", 0)], [("Default/max-op1", 1), None], None]
    assert [o["overload"] for o in parsed] == ["default"] * 4


def test_out_overloads():
    assert is_out_overload("mul", "out") and is_out_overload("max", "dim_max")
    assert is_out_overload("sort", "values_stable") and is_out_overload("geqrf", "a")
    assert not is_out_overload("mul", "Tensor") and not is_out_overload("mT", "a")
    assert not is_out_overload("mul", None) and not is_out_overload("Mul", "")
