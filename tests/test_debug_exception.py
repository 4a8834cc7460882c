"""Exception dump (``op_debug_mode`` 4; README "Debug dumps") on real runs of tiny models, eager
and compiled: the operator that raised is dumped (inputs, exception.json naming op, scope and
line, a repro script that raises the same error when run as a real subprocess), the user's
exception propagates unchanged, iterations without an exception write nothing, and neither a
dump failure nor ``opdump run`` changes what the user sees."""
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import traceback
import warnings

import pytest
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.config import ConfigError, load_config
from opdump.debug.repro import Arguments
from opdump.format.files import parse_tensor_name
from conftest import write_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIS = os.path.abspath(__file__)


class Net(nn.Module):
    """An embedding lookup by ``index_select`` (raises for an index out of range) and a Linear
    whose input width is wrong when ``wide`` is set."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(10, 4))
        self.fc = nn.Linear(4, 3)

    def forward(self, idx, wide=False):
        h = torch.index_select(self.table, 0, idx)          # LINE_SELECT
        if wide:
            h = torch.cat([h, h], dim=1)
        return self.fc(h).relu()                              # LINE_FC


def _line(marker):
    with open(THIS) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith("# " + marker):
                return n
    raise AssertionError(marker)


def _plain_error(fn):
    """The exception a call raises without opdump (what the user must still see)."""
    try:
        fn()
    except Exception as exc:      # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def _caught(fn):
    try:
        fn()
    except Exception as exc:      # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def _records(root):
    paths = sorted(root.rglob("exception.json"))
    out = []
    for p in paths:
        doc = json.loads(p.read_text())
        out += [dict(r, folder=str(p.parent), iteration=doc["iteration"], graph=doc["graph"])
                for r in doc["exceptions"]]
    return out


def _files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def _repro(record, *extra):
    """Run the record's repro script as a real subprocess, from another folder."""
    script = os.path.join(record["folder"], record["repro"])
    return subprocess.run([sys.executable, script, *extra], capture_output=True, text=True, cwd="/",
                          timeout=120)


def _last_line(stderr):
    return [ln for ln in stderr.strip().splitlines() if ln.strip()][-1]


def _same_exception(got, want):
    assert type(got) is type(want)
    assert str(got) == str(want) and got.args == want.args
    assert vars(got) == vars(want)                     # nothing added to the object (no notes)
    assert getattr(got, "__notes__", None) is None
    assert got.__cause__ is None and got.__context__ is None


def _last_user_frame(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == THIS]
    return frames[-1]


# --------------------------------------------------------------------------- eager
@pytest.fixture(scope="module")
def eager_run(tmp_path_factory):
    """Eager: step 0 fine, step 1 an index out of range, step 2 fine, step 3 a Linear shape
    mismatch (raised twice: the second is the same error and is not dumped again)."""
    tmp = tmp_path_factory.mktemp("eager")
    cfg = write_config(tmp, common={"op_debug_mode": 4})
    torch.manual_seed(0)
    model = Net()
    good, bad = torch.tensor([1, 2, 3]), torch.tensor([1, 12, 3])
    plain = {"select": _plain_error(lambda: model(bad)), "fc": _plain_error(lambda: model(good, wide=True))}
    caught = {}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session, EagerCapture(session):
            model(good).sum().backward()
            session.step()
            caught["select"] = _caught(lambda: model(bad))
            session.step()
            model(good).sum().backward()
            session.step()
            caught["fc"] = _caught(lambda: model(good, wide=True))
            caught["fc2"] = _caught(lambda: model(good, wide=True))
            session.step()
    return tmp / "dump", plain, caught, [str(w.message) for w in seen]


def test_eager_user_exception_unchanged(eager_run):
    _, plain, caught, _ = eager_run
    _same_exception(caught["select"], plain["select"])
    _same_exception(caught["fc"], plain["fc"])
    assert isinstance(caught["select"], IndexError)
    # the traceback's innermost frame of the user's code is the line that raised
    assert _last_user_frame(caught["select"]).lineno == _line("LINE_SELECT")
    assert _last_user_frame(caught["fc"]).lineno == _line("LINE_FC")


def test_eager_records_name_op_scope_line_and_args(eager_run):
    root, plain, _, messages = eager_run
    recs = _records(root)
    assert [(r["iteration"], r["op_type"]) for r in recs] == [(1, "index_select"), (3, "addmm")]
    sel, fc = recs
    assert sel["op"] == "Default/Net/index_select-op0"
    assert fc["op"].startswith("Default/Net/fc-Linear/addmm-op")
    assert sel["source"] == f"{THIS}:{_line('LINE_SELECT')}" and "index_select" in sel["code"]
    assert fc["source"] == f"{THIS}:{_line('LINE_FC')}"
    assert sel["exception_type"] == "IndexError" and sel["message"] == str(plain["select"])
    assert fc["exception_type"] == "RuntimeError" and fc["message"] == str(plain["fc"])
    assert sel["call"] == "torch.ops.aten.index_select.default"
    assert sel["args"] == [{"tensor": 0}, 0, {"tensor": 1}] and sel["non_tensor_args"] == {"dim": 0}
    assert all(i["saved"] for r in recs for i in r["inputs"])
    assert [i["shape"] for i in sel["inputs"]] == [[10, 4], [3]]
    assert sum("raised IndexError" in m for m in messages) == 1      # one line saying where it went


def test_eager_inputs_are_layout_files_of_the_values(eager_run):
    root, _, _, _ = eager_run
    sel = _records(root)[0]
    import numpy as np
    for entry in sel["inputs"]:
        name = parse_tensor_name(entry["file"])
        assert name is not None and name.io == "input" and name.slot == entry["slot"]
        assert name.op_name == "Default_Net_index_select-op0" and name.op_type == "index_select"
    idx = np.load(os.path.join(sel["folder"], sel["inputs"][1]["file"]))
    assert idx.tolist() == [1, 12, 3]


def test_eager_only_raising_iterations_write(eager_run):
    root, _, _, _ = eager_run
    net = root / "rank_0" / "Net" / "0"
    assert sorted(p.name for p in net.iterdir()) == ["1", "3"]     # iterations 0 and 2: nothing
    assert len(list((net / "3").glob("repro_*.py"))) == 1         # the repeated error: dumped once
    assert not (root / "rank_0" / "graphs").exists()              # no listing, no parameters
    assert not list(root.rglob("Parameter.*"))


@pytest.mark.parametrize("which", [0, 1])
def test_eager_repro_script_reraises(eager_run, which):
    root, plain, _, _ = eager_run
    rec = _records(root)[which]
    want = plain["select" if which == 0 else "fc"]
    done = _repro(rec)
    assert done.returncode == 1, done.stderr
    assert _last_line(done.stderr) == f"{type(want).__name__}: {want}"
    with open(os.path.join(rec["folder"], rec["repro"])) as f:
        assert "opdump" not in "".join(ln for ln in f if ln.startswith(("import", "from")))


class _BadGrad(torch.autograd.Function):
    """Its backward reshapes the gradient to a wrong size: an operator raising in autograd's backward."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad.view(7, 7)                                 # LINE_BACKWARD


class Block(nn.Module):
    def forward(self, x):
        return _BadGrad.apply(x)


def test_eager_backward_operator_dumped(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 4})
    x = torch.randn(3, 4, requires_grad=True)
    plain = _plain_error(lambda: Block()(x).sum().backward())
    with opdump.Session(cfg) as session, EagerCapture(session):
        got = _caught(lambda: Block()(x).sum().backward())
    _same_exception(got, plain)
    (rec,) = _records(tmp_path / "dump")
    assert rec["op_type"] == "view" and rec["op"].startswith("Gradients/Default/Block/view-op")
    assert rec["source"] == f"{THIS}:{_line('LINE_BACKWARD')}"
    assert rec["non_tensor_args"] == {"size": [7, 7]}
    done = _repro(rec)
    assert done.returncode == 1 and _last_line(done.stderr) == f"RuntimeError: {plain}", done.stderr


def test_nothing_written_without_exception(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 4})
    model = Net()
    with opdump.Session(cfg) as session, EagerCapture(session):
        for _ in range(3):
            model(torch.tensor([0, 1])).sum().backward()
            session.step()
    # no tensor, record or listing: only the run's metadata (a clean run is told from one that
    # never started, tests/test_debug_exception_clean.py) and the run's global execution order
    assert _files(tmp_path / "dump") == [os.path.join("rank_0", ".dump_metadata", f)
                                         for f in ("config.json", "data_dump.json", "manifest.json")] + [
        os.path.join("rank_0", "execution_order", "ms_global_execution_order_graph_0.csv")]


def test_arguments_faithful_and_factory_op_reproduced(tmp_path):
    """Non-tensor arguments (dtypes, devices, memory formats, inf) round-trip through the
    script: ``aten.empty`` refusing channels_last for a 2-d shape, and ``aten.full`` with an
    inf fill for an int64 tensor (an operator outside any module: watched too)."""
    cfg = write_config(tmp_path, common={"op_debug_mode": 4})
    with opdump.Session(cfg) as session, EagerCapture(session):
        e1 = _caught(lambda: torch.empty(2, 3, memory_format=torch.channels_last))
        e2 = _caught(lambda: torch.full((2,), math.inf, dtype=torch.int64))
    recs = _records(tmp_path / "dump")
    assert [r["op_type"] for r in recs] == ["empty", "full"]
    assert recs[0]["kwargs"]["memory_format"] == {"torch": "channels_last"}
    assert recs[1]["non_tensor_args"]["fill_value"] == {"float": "inf"}
    assert recs[1]["kwargs"]["dtype"] == {"dtype": "int64"}
    for rec, exc in zip(recs, (e1, e2)):
        done = _repro(rec)
        assert done.returncode == 1 and _last_line(done.stderr) == f"{type(exc).__name__}: {exc}", done.stderr


def test_repro_inputs_keep_dtype_strides_and_values(tmp_path):
    """bf16 (stored as float32 in its .npy) and a transposed input: the script's loader gives
    back the very tensor the operator got (dtype, shape, strides, values)."""
    cfg = write_config(tmp_path, common={"op_debug_mode": 4})
    a = torch.randn(3, 2, dtype=torch.bfloat16).t()
    b = torch.randn(4, 5, dtype=torch.bfloat16)
    with opdump.Session(cfg) as session, EagerCapture(session):
        _caught(lambda: torch.mm(a, b))
    (rec,) = _records(tmp_path / "dump")
    path = os.path.join(rec["folder"], rec["repro"])
    with open(path) as f:
        source = f.read().replace('if __name__ == "__main__":', "if False:")
    scope = {"__file__": path, "__name__": "repro"}
    exec(compile(source, path, "exec"), scope)                   # the script's own loader, not run
    for slot, want in enumerate((a, b)):
        got = scope["load"](slot)
        assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got, want)


def test_argument_source_round_trip():
    values = [1, -0.5, math.inf, -math.inf, math.nan, True, None, "reflect", [1, 2], (3, (4,)),
              torch.float16, torch.bfloat16, torch.device("cpu"), torch.device("cuda", 1), torch.channels_last,
              torch.strided, complex(1.5, -math.inf)]
    enc = Arguments(values, {"k": [torch.preserve_format, 2.5]})
    scope = {"torch": torch, "math": math, "T": []}
    args, kwargs = eval(enc.args_source, scope), eval(enc.kwargs_source, scope)
    assert enc.exact and len(args) == len(values)
    for got, want in zip(args, values):
        assert type(got) is type(want)
        if isinstance(want, float) and math.isnan(want):
            assert math.isnan(got)
        else:
            assert got == want
    assert kwargs == {"k": [torch.preserve_format, 2.5]}
    odd = Arguments([object()], {})
    assert not odd.exact and "UNSUPPORTED" in odd.args_source


def test_dump_failure_warns_and_user_exception_still_propagates(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 4})
    model = Net()
    bad = torch.tensor([12])
    plain = _plain_error(lambda: model(bad))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session, EagerCapture(session):
            model(torch.tensor([1]))
            shutil.rmtree(tmp_path / "dump" / "rank_0")     # the dump folder is gone under the session
            got = _caught(lambda: model(bad))
    _same_exception(got, plain)
    assert _last_user_frame(got).lineno == _line("LINE_SELECT")
    said = [str(w.message) for w in seen if "opdump" in str(w.message)]
    assert len(said) == 1 and "writing the dump failed" in said[0], said


# --------------------------------------------------------------------------- graph mode
@pytest.fixture(scope="module")
def graph_run(tmp_path_factory):
    """torch.compile through opdump's backend: step 0 fine (forward and backward), step 1 an
    index out of range inside the compiled graph, step 2 fine again."""
    tmp = tmp_path_factory.mktemp("graph")
    torch._dynamo.reset()
    cfg = write_config(tmp, common={"op_debug_mode": 4})
    torch.manual_seed(0)
    model = Net()
    good, bad = torch.tensor([1, 2, 3]), torch.tensor([1, 12, 3])
    plain = _plain_error(lambda: model(bad))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session:
            compiled = torch.compile(model, backend=session.backend("eager"))
            compiled(good).sum().backward()
            session.step()
            got = _caught(lambda: compiled(bad))
            session.step()
            after = compiled(good)
            session.step()
    torch._dynamo.reset()
    return tmp / "dump", plain, got, after, model(good), [str(w.message) for w in seen]


def test_graph_exception_dumped_and_unchanged(graph_run):
    root, plain, got, after, want_after, messages = graph_run
    _same_exception(got, plain)
    assert any(f.filename == THIS for f in traceback.extract_tb(got.__traceback__))
    recs = _records(root)
    assert len(recs) == 1
    rec = recs[0]
    assert rec["iteration"] == 1 and rec["op"] == "Default/Net/index_select-op0"
    assert rec["source"] == f"{THIS}:{_line('LINE_SELECT')}"
    assert rec["non_tensor_args"] == {"dim": 0}
    # the capture did not take the user's error for a failure of the dump: it still runs, same values
    assert not any("no longer dumped" in m for m in messages)
    assert torch.equal(after, want_after)
    net = root / "rank_0" / "Net"
    assert [p.name for p in net.iterdir()] == ["0"] and [p.name for p in (net / "0").iterdir()] == ["1"]
    done = _repro(rec)
    assert done.returncode == 1 and _last_line(done.stderr) == f"IndexError: {plain}", done.stderr


def test_graph_call_off_the_operator_path_names_the_graph(tmp_path):
    """A graph whose dump path failed runs compiled: an operator error inside it cannot be
    dumped, and one warning names the graph; the user's exception is unchanged."""
    from opdump.capture.graph import faults
    cfg = write_config(tmp_path, common={"op_debug_mode": 4})
    model = Net()
    bad = torch.tensor([12])
    plain = _plain_error(lambda: model(bad))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session, faults.inject("compile:forward"):
            got = _caught(lambda: torch.compile(model, backend=session.backend("eager"))(bad))
    _same_exception(got, plain)
    said = [str(w.message) for w in seen if "IndexError raised inside" in str(w.message)]
    assert len(said) == 1 and "the graph of Net" in said[0] and "dump path failed earlier" in said[0], said
    assert _records(tmp_path / "dump") == []


# --------------------------------------------------------------------------- opdump run, ls, config
_SCRIPT = textwrap.dedent("""
    import sys, torch
    emb = torch.nn.Embedding(5, 2)
    emb(torch.tensor([0, 1]))
    if len(sys.argv) > 1:
        try:
            emb(torch.tensor([9]))
        except IndexError:
            sys.exit(7)
    emb(torch.tensor([9]))        # raises IndexError
""")


def test_opdump_run_keeps_the_script_status_and_ls_shows_the_record(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT)
    runs = {}
    for name, extra, status in (("raise", [], 1), ("exit7", ["x"], 7)):   # python's own status, sys.exit's
        cfg = write_config(tmp_path, common={"op_debug_mode": 4, "path": str(tmp_path / f"dump_{name}")},
                           name=f"{name}.json")
        dumped = subprocess.run([sys.executable, "-m", "opdump", "run", "--config", cfg, str(script), *extra],
                                capture_output=True, text=True, env=env, timeout=300)
        assert dumped.returncode == status, dumped.stderr
        runs[name] = dumped
    assert _last_line(runs["raise"].stderr) == "IndexError: index out of range in self"
    assert f'File "{script}", line 10, in <module>' in runs["raise"].stderr     # the script's own frame
    for name in runs:
        recs = _records(tmp_path / f"dump_{name}")
        assert [r["op_type"] for r in recs] == ["embedding"], name
    ls = subprocess.run([sys.executable, "-m", "opdump", "ls", str(tmp_path / "dump_raise")],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ls.returncode == 0, ls.stderr
    rec = _records(tmp_path / "dump_raise")[0]
    assert (f"exception: iteration {rec['iteration']}, graph 0: {rec['op']} raised IndexError: index out of "
            f"range in self at {script}:10; repro: {rec['folder']}/{rec['repro']}") in ls.stdout


@pytest.mark.parametrize("common, e2e, extra, field", [
    ({"saved_data": "statistic"}, {}, None, "saved_data"),
    ({"saved_data": "full"}, {}, None, "saved_data"),
    ({}, {"sample_mode": 1}, None, "sample_mode"),
    ({"input_output": 2}, {}, None, "input_output"),
    ({}, {}, {"opdump_settings": {"graph_dump": "kernels"}}, "graph_dump"),
])
def test_forbidden_combinations(tmp_path, common, e2e, extra, field):
    cfg = write_config(tmp_path, common={"op_debug_mode": 4, **common}, e2e=e2e, extra=extra)
    with pytest.raises(ConfigError) as info:
        opdump.Session(cfg)
    assert info.value.field.endswith(field) and "4" in str(info.value)


def test_iteration_ignored_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="every iteration is watched"):
        cfg = load_config(write_config(tmp_path, common={"op_debug_mode": 4, "iteration": "0|5"}))
    assert cfg.iteration.all
