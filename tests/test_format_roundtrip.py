"""The dump format (opdump.format) round-trips: whatever the writer can build, the reader
parses back to the same values (docs/design.md, "Names" and "File names").

Property tests (hypothesis) over operator full names (any unicode: ``:``, spaces, dots,
control characters, very long names that go through ``mapping.csv``), op types, slots,
io, dtypes and timestamps; cross-checked with the tests' independent reader
(tests/dumpfiles.py), which shares no code with opdump.
"""
import os
import tempfile
import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dumpfiles
from opdump.format import dtypes as fd
from opdump.format import files as ff
from opdump.format import layout as fl
from opdump.format import listing as flist
from opdump.format import names as fn
from opdump.format import sources as fs
from opdump.format import statistics as fstat
from opdump.write.layout import Layout

# any text but surrogates; op types are never empty and hold no "/" (ATen names)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
SEGMENT = st.one_of(TEXT, st.sampled_from(["enc:0", "a b", "x.y", "ä/ö", 'q*"<>|?', "\x00\x1f\x7f", "…"]))
OP_TYPE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/"), min_size=1, max_size=30)
SCOPE = st.lists(SEGMENT, min_size=0, max_size=6).map(lambda parts: "/".join(["Default", *parts]))
LONG_SCOPE = st.integers(min_value=40, max_value=200).map(lambda n: "Default/" + "/".join(["layer-Ünit"] * n))
DTYPE = st.sampled_from(sorted(fd.MINDSPORE_NAMES.values()))
UINT = st.integers(min_value=0, max_value=2 ** 63 - 1)


@settings(max_examples=300, deadline=None)
@given(scope=st.one_of(SCOPE, LONG_SCOPE), op_type=OP_TYPE, index=st.integers(0, 10 ** 6),
       task=UINT, stream=UINT, ts=UINT, io=st.sampled_from(ff.IO_KINDS), slot=st.integers(0, 10 ** 4),
       dtype=DTYPE)
def test_tensor_file_name_parses_back_to_the_values_it_was_built_from(scope, op_type, index, task, stream, ts,
                                                                      io, slot, dtype):
    full = fn.full_name(scope, op_type, index)
    assert fn.parse_full_name(full) == (scope, op_type, index)
    name = ff.operator_file_name(op_type, full, task, stream, ts, io, slot, dtype)
    with tempfile.TemporaryDirectory() as root:
        layout = Layout(root, 0, "Net")
        folder = layout.iteration_dir(0, 0)
        path = layout.place(folder, name)                 # a name over 255 bytes -> mapping.csv
        on_disk = os.path.basename(path)
        assert len(on_disk.encode()) <= ff.MAX_NAME_BYTES
        assert (on_disk != name) == ff.too_long(name)
        mapping = {}
        if os.path.exists(os.path.join(folder, ff.MAPPING_FILE)):
            with open(os.path.join(folder, ff.MAPPING_FILE), encoding="utf-8", newline="") as f:
                mapping = ff.parse_mapping(f.read())
        parsed = ff.resolve_mapped(on_disk, mapping)
        assert parsed == ff.TensorName(fn.sanitize(op_type), fn.sanitize(full), task, stream, ts, io, slot,
                                       ff.DEFAULT_FORMAT, dtype)
        # the reader maps the file back to the full name by sanitising the names it knows
        assert parsed.op_name == fn.sanitize(full)
        # the tests' independent reader agrees on every field (written with a real file)
        os.makedirs(folder, exist_ok=True)
        open(path, "wb").close()
        (indep,) = dumpfiles.tensor_files(root)
    assert (indep.op_type, indep.op_name, indep.task, indep.stream, indep.ts, indep.io, indep.slot, indep.fmt,
            indep.dtype) == (parsed.op_type, parsed.op_name, task, stream, ts, io, slot, ff.DEFAULT_FORMAT, dtype)
    assert dumpfiles.sanitize(full) == parsed.op_name


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_sanitize_is_the_documented_rule_and_leaves_no_separator(name):
    out = fn.sanitize(name)
    assert out == dumpfiles.sanitize(name)                # same rule as the independent reader
    assert out and not set(out) & set(fn.UNSAFE_CHARACTERS)
    assert len(out) == max(len(name), 1)
    assert all(a == b or a in fn.UNSAFE_CHARACTERS for a, b in zip(name, out))


@settings(max_examples=200, deadline=None)
@given(name=TEXT, ts=UINT, dtype=DTYPE)
def test_parameter_file_name_parses_back(name, ts, dtype):
    parsed = ff.parse_tensor_name(ff.parameter_file_name(name, ts, dtype))
    assert parsed == ff.TensorName(ff.PARAMETER_TYPE, fn.sanitize(name), 0, 0, ts, "output", 0,
                                   ff.DEFAULT_FORMAT, dtype)
    assert parsed.is_parameter


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.text(st.characters(whitelist_categories=("Nd",)), min_size=1, max_size=36),
                          st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"),
                                  max_size=80)),
                unique_by=lambda p: p[0], max_size=8))
def test_mapping_csv_keeps_every_original_name(pairs):
    """Originals may hold commas, quotes and unicode line separators: split on the first comma
    and on "\\n" only."""
    text = "".join(ff.mapping_line(mapped, original) for mapped, original in pairs)
    assert ff.parse_mapping(text) == dict(pairs)


FULL_NAME_LINE = st.builds(fn.full_name, SCOPE.filter(lambda s: "\n" not in s and "\r" not in s),
                           OP_TYPE.filter(lambda s: "\n" not in s and "\r" not in s), st.integers(0, 999))


@settings(max_examples=200, deadline=None)
@given(st.lists(FULL_NAME_LINE, max_size=20))
def test_execution_order_csv_round_trips(names):
    assert fl.parse_execution_order(fl.render_execution_order(names)) == [n.strip() for n in names]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10 ** 9), unique=True, max_size=20))
def test_global_execution_order_round_trips(iterations):
    assert fl.parse_global_execution_order(fl.render_global_execution_order(iterations)) == sorted(iterations)


@pytest.mark.parametrize("graph_id", [0, 7, 123456])
def test_layout_names_match_their_patterns(graph_id):
    assert fl.RANK_RE.match(fl.rank_dir_name(graph_id)).group(1) == str(graph_id)
    for ext in ("ir", "json"):
        m = fl.GRAPH_FILE_RE.match(fl.graph_file_name(graph_id, ext))
        assert (int(m.group(1)), m.group(2)) == (graph_id, ext)
    assert int(fl.EXECUTION_ORDER_RE.match(fl.execution_order_file_name(graph_id)).group(1)) == graph_id
    assert int(fl.GLOBAL_EXECUTION_ORDER_RE.match(fl.global_execution_order_file_name(graph_id)).group(1)) == graph_id
    assert fl.parse_iteration_dir(fl.iteration_dir_name(graph_id)) == graph_id
    assert fl.parse_iteration_dir(fl.iteration_dir_name(None)) is None


def test_every_torch_dtype_has_a_name_that_maps_back_and_a_storable_dtype():
    import numpy as np

    from opdump.write.dtypes import to_numpy
    dtypes = [v for v in vars(torch).values() if isinstance(v, torch.dtype)]
    assert len(dtypes) > 20
    for dt in dtypes:
        name = fd.dtype_name(dt)
        assert name.isalnum(), (dt, name)                 # a file-name field: no dot
        if name in fd.MINDSPORE_NAMES.values():
            assert getattr(torch, fd.torch_name(name)) == dt
        try:
            t = torch.zeros(3, dtype=dt)
        except (NotImplementedError, RuntimeError):      # quantized dtypes: no plain tensors
            continue
        arr = to_numpy(t)                                 # every tensor torch can make is storable
        viewed = str(dt)[6:] in fd.VIEWED_AS
        assert arr.nbytes == t.numel() * t.element_size() if viewed else arr.size == 3, (dt, arr)
        assert str(arr.dtype) == fd.stored_as(dt), (dt, arr.dtype)
    four = torch.tensor([-8, 7, 0], dtype=torch.int8).view(torch.int4)
    assert to_numpy(four).tolist() == [-8, 7, 0]          # sub-byte integers keep their values
    assert fd.dtype_name(torch.bfloat16) == "BFloat16" and fd.stored_as(torch.bfloat16) == "float32"


def test_statistics_table_is_the_one_the_config_and_the_engine_use():
    from opdump.config import validate
    from opdump.config.model import ALL_STATISTICS, DEFAULT_STATISTICS
    from opdump.stats import categories
    assert validate.VALID_STATISTICS is fstat.VALID_STATISTICS
    assert ALL_STATISTICS is fstat.ALL_STATISTICS and DEFAULT_STATISTICS is fstat.DEFAULT_STATISTICS
    assert list(categories.CATEGORIES) == list(fstat.CATEGORIES)
    for name, c in fstat.CATEGORIES.items():
        bound = categories.lookup(name)
        assert (bound.column, bound.kind) == (c.column, c.kind)
        assert fstat.HEADER_KEYS[c.column] == c.key
    assert fstat.statistic_header(["max", "md5"])[-2:] == ["Max Value", "MD5"]
    with pytest.raises(ValueError, match="did you mean 'nan count'"):
        fstat.lookup("nan cout")


@settings(max_examples=100, deadline=None)
@given(file=st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=40)
       .filter(lambda s: s.strip() == s and "(" not in s and ":" not in s),
       line=st.integers(1, 10 ** 6),
       code=st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=40)
       .filter(lambda s: not s.endswith("/")))
def test_source_line_round_trips(file, line, code):
    fr = fs.parse_source_line(fs.render_source_line(file, line, code))
    assert (fr.file, fr.line, fr.code) == (file, line, code.strip())


def _op(index, scope, op_type, source=()):
    return types.SimpleNamespace(
        index=index, node_name=f"n{index}", op_type=op_type, overload="default", arg_text="%0",
        args={"dim": 1}, input_meta=[((2, 3), "Float32")], output_meta=[((2,), "BFloat16")],
        full_name=fn.full_name(scope, op_type, index), scope=scope, selected=True,
        source=[types.SimpleNamespace(file=f, line=n, code=c, function="forward") for f, n, c in source])


def test_listing_ir_and_json_parse_back():
    ops = [_op(0, "Default/Net/enc:0-Linear", "addmm", [("/p/train.py", 12, "y = self.enc(x)")]),
           _op(1, "Gradients/Default/Net/a b-ReLU", "threshold_backward")]
    params = [("fc.weight", ((3, 2), "Float32")), ("step", None)]
    parsed = flist.parse_ir(flist.render_ir(0, "forward", ops, params))
    assert [o["full_name"] for o in parsed] == [o.full_name for o in ops]
    assert parsed[0]["sources"] == [fs.SourceFrame("/p/train.py", 12, code="y = self.enc(x)")]
    assert parsed[0]["inputs"] == [{"dtype": "Float32", "shape": [2, 3]}]
    assert parsed[0]["outputs"] == [{"dtype": "BFloat16", "shape": [2]}]
    import json
    kind, jops = flist.parse_graph_json(json.loads(flist.render_graph_json(0, "forward", ops, params)))
    assert kind == "forward"
    assert [(o["full_name"], o["op_type"], o["scope"]) for o in jops] == [(o.full_name, o.op_type, o.scope)
                                                                           for o in ops]
    assert jops[0]["sources"][0].line == 12 and jops[0]["args"] == {"dim": "1"}


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_escaped_names_stay_on_one_line_of_every_text_file(name):
    escaped = fn.escape_controls(name)
    assert len(escaped.splitlines()) <= 1 and "\x00" not in escaped
    if escaped == name:
        assert not any(ch in name for ch in "\n\r\x00\u2028")
    full = fn.full_name("Default/" + escaped, "add", 1)
    assert fl.parse_execution_order(fl.render_execution_order([full])) == [full.strip()]
