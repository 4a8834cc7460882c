"""locate (script line <-> operators) and overflow (first NaN/Inf origin)."""
import numpy as np
import pytest

from analysis_fixtures import LINES, MS_SAMPLE, file_of, make_dump
from opdump.analysis.locate import locate, parse_location
from opdump.analysis.overflow import find_overflow
from opdump.analysis.reader import open_dump

needs_sample = pytest.mark.skipif(not MS_SAMPLE.is_dir(), reason=f"MindSpore sample dump not found at {MS_SAMPLE}")


@needs_sample
def test_locate_mindspore_sample_line():
    d = open_dump(MS_SAMPLE)
    hits = locate(d, "train.py:67")
    names = [h.full_name for h in hits]
    assert len(hits) == 11 and all(h.match == "innermost" for h in hits)
    assert any(n.startswith("Gradients/") for n in names) and any(n.startswith("Default/") for n in names)
    mm = next(h for h in hits if h.full_name.endswith("fc1-Dense/MatMul-op0"))
    assert sorted(mm.files) == [0, 1] and len(mm.files[0]) == 5
    # the def line of construct: no op has it as its statement, the stack search finds none either
    assert locate(d, "train.py:66") == [] or all(h.match == "stack" for h in locate(d, "train.py:66"))
    # a library line, reached through the stacks
    lib = locate(d, "cell_wrapper.py:122")
    assert lib and all(h.match == "stack" for h in lib)
    # reverse: an op name -> its line and files
    rev = locate(d, "Default/network-WithLossCell/_backbone-TinyMLP/fc2-Dense/BiasAdd-op0")
    assert len(rev) == 1 and rev[0].frame.line == 67 and len(rev[0].files[1]) == 4


@pytest.mark.parametrize("style", ["json", "ir", "ir_seed"])
def test_locate_synthetic_graph_files(tmp_path, style):
    make_dump(tmp_path / "d", graph_files=(style,), iterations=(0, 1))
    d = open_dump(tmp_path / "d")
    hits = locate(d, f"model.py:{LINES['fc2']}")
    names = sorted(h.full_name for h in hits)
    assert names == ["Default/Net/fc2-Linear/addmm-op7", "Default/Net/fc2-Linear/t-op6",
                     "Gradients/Default/Net/fc2-Linear/mm-op1"]
    assert all(sorted(h.files) == [0, 1] for h in hits)
    # path-suffix matching is strict about the file name
    assert locate(d, f"othermodel.py:{LINES['fc2']}") == []
    # by dump file name
    f = file_of(tmp_path / "d", "Default/Net/exp-op9", "output", 0)
    rev = locate(d, f.name)
    assert [h.full_name for h in rev] == ["Default/Net/exp-op9"] and rev[0].frame.line == LINES["exp"]


def test_parse_location():
    assert parse_location("train.py:175") == ("train.py", 175)
    assert parse_location("./src/train.py(175)") == ("./src/train.py", 175)
    assert parse_location("Default/Net/conv-op3") is None


@pytest.mark.parametrize("saved,stats", [("tensor", ()), ("statistic", ("max", "min", "l2norm")),
                                         ("statistic", ("count", "nan count", "positive inf count",
                                                        "negative inf count"))])
def test_overflow_origin_not_victims(tmp_path, saved, stats):
    make_dump(tmp_path / "d", iterations=(0, 1, 2, 3), overflow_at=2, saved_data=saved,
              stats=stats or ("max", "min", "l2norm"), graph_files=("ir",))
    rep = find_overflow(open_dump(tmp_path / "d"), progress=False)
    assert rep.found
    o = rep.origin
    assert (o.op, o.iteration, o.kind) == ("Default/Net/exp-op9", 2, "operator")
    assert o.source.endswith(f"model.py:{LINES['exp']}")
    assert [e.op for e in rep.affected][:1] == ["Default/Net/sum-op10"]
    # the garbage of empty_like / the fill_ destination (NaN and Inf by construction) is never reported
    assert all("empty_like" not in e.op and "fill_" not in e.op for e in [o] + rep.affected)
    assert rep.method == ("tensor" if saved == "tensor" else "statistics")


def test_overflow_clean_dump_and_input_origin(tmp_path):
    make_dump(tmp_path / "clean", iterations=(0, 1))
    rep = find_overflow(open_dump(tmp_path / "clean"), progress=False)
    assert not rep.found and rep.scanned_tensors > 50
    make_dump(tmp_path / "w", iterations=(0, 1, 2), nan_weight_at=1)
    rep = find_overflow(open_dump(tmp_path / "w"), progress=False)
    assert rep.origin.kind == "input" and rep.origin.iteration == 1
    assert rep.origin.op == "Default/Net/fc2-Linear/t-op6"        # the first op reading the NaN weight
    rep2 = find_overflow(open_dump(tmp_path / "w"), iterations=[0], progress=False)
    assert not rep2.found
