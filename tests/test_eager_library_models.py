"""Eager and graph capture on a model built like a third-party library's (issue 17):
output slots identical in both modes, source lines that point into the library, operators
of a forward hook in their module's scope, Inf made on purpose (attention masks) that is
never an overflow origin, and a listing that covers operators of later iterations.

The "library" is a real module file written into a temporary ``site-packages`` folder
and imported from there, as ``transformers`` would be: no mocks, real torch, real files.
"""
import importlib
import json
import os
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.analysis.locate import locate
from opdump.analysis.overflow import find_overflow
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec
from dumpfiles import tensor_files

THIS_FILE = os.path.abspath(__file__)

LIBRARY = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Mlp(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.up = nn.Linear(d, 2 * d)
            self.down = nn.Linear(2 * d, d)

        def forward(self, x):
            h = torch.tanh(self.up(x))          # LIBRARY_TANH_LINE
            return self.down(h)


    def causal_scores(q):
        t = q.shape[-2]
        mask = torch.full((t, t), float("-inf")).triu(1)      # LIBRARY_MASK_LINE
        scores = q @ q.transpose(-1, -2) + mask
        return torch.softmax(scores, dim=-1) @ q
''')


def _line_of(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if marker in line)


@pytest.fixture(scope="module")
def fakelib(tmp_path_factory):
    """``fakelib_h4`` imported from ``<tmp>/lib/python3/site-packages/fakelib_h4/__init__.py``."""
    site = tmp_path_factory.mktemp("venv") / "lib" / "python3.11" / "site-packages"
    pkg = site / "fakelib_h4"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(LIBRARY)
    sys.path.insert(0, str(site))
    try:
        module = importlib.import_module("fakelib_h4")
    finally:
        sys.path.remove(str(site))
    return {"module": module, "file": str(pkg / "__init__.py"),
            "tanh_line": _line_of(LIBRARY, "LIBRARY_TANH_LINE"), "mask_line": _line_of(LIBRARY, "LIBRARY_MASK_LINE")}


class Net(nn.Module):
    """A convolution and a LayerNorm on the raw input (their backward has no input gradient:
    a ``None`` first output), the library's MLP and its masked attention."""

    def __init__(self, lib):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.ln = nn.LayerNorm(8)
        self.mlp = lib.Mlp(8)
        self.attend = lib.causal_scores

    def forward(self, x):
        a = self.conv(x).flatten(1)                    # (2, 144)
        b = self.mlp(self.ln(x))                       # (2, 3, 8, 8)
        c = self.attend(b.flatten(2))                  # (2, 3, 64) -> scores over 3 positions
        return a.sum(1) + c.sum((1, 2))


def _config(root, first=0, last=0, **kw):
    return DumpConfig(path=str(root), iteration=IterationSpec(ranges=((first, last),)), **kw)


def _train(model, steps, session_cfg, compiled=False, hook=None):
    torch.manual_seed(1)
    xs = [torch.randn(2, 3, 8, 8) for _ in range(steps)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with opdump.Session(session_cfg) as session:
        if compiled:
            run = torch.compile(model, backend=session.backend("eager"))
            cap = None
        else:
            run = model
            cap = EagerCapture(session).start()
        for x in xs:
            loss = run(x).sum()                        # USER_CALL_LINE
            loss.backward()
            opt.step()
            opt.zero_grad()
        if cap is not None:
            cap.stop()
    torch._dynamo.reset()


USER_CALL_LINE = _line_of(open(THIS_FILE).read(), "# USER_CALL_" + "LINE")


def _listing(root, graph=None):
    folder = os.path.join(str(root), "rank_0", "graphs")
    docs = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            docs[int(name.rsplit("_", 1)[1].split(".")[0])] = json.load(open(os.path.join(folder, name)))
    return docs if graph is None else docs[graph]


def _output_slots(root, op_type):
    files = [f for f in tensor_files(str(root)) if f.op_type == op_type and f.io == "output"]
    assert files, f"no {op_type} outputs dumped"
    return sorted({f.slot for f in files}), files


@pytest.fixture(scope="module")
def runs(fakelib, tmp_path_factory):
    """One step of the same model and data, dumped in eager mode and in graph mode."""
    torch.manual_seed(0)
    model = Net(fakelib["module"])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    eager_root = tmp_path_factory.mktemp("eager")
    _train(model, 1, _config(eager_root))
    model.load_state_dict(state)
    graph_root = tmp_path_factory.mktemp("graph")
    _train(model, 1, _config(graph_root), compiled=True)
    return {"eager": eager_root, "graph": graph_root}


# ---------------------------------------------------------------------- 17.2: None output slots
@pytest.mark.parametrize("op_type", ["convolution_backward", "native_layer_norm_backward"])
def test_none_outputs_keep_their_slot_in_both_modes(runs, op_type):
    eager_slots, eager_files = _output_slots(runs["eager"], op_type)
    graph_slots, graph_files = _output_slots(runs["graph"], op_type)
    # the input needs no gradient: output.0 is None, the weight gradient is output.1 in both
    assert eager_slots == graph_slots == [1, 2]
    for slot in (1, 2):
        a = next(f for f in eager_files if f.slot == slot).load()
        b = next(f for f in graph_files if f.slot == slot).load()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- 17.5: library source lines
def _op(doc, op_type, kind="forward"):
    for op in doc["ops"]:
        if op["op_type"] == op_type and op["full_name"].startswith("Gradients/") == (kind == "backward"):
            return op
    raise AssertionError(f"no {kind} {op_type} in the listing")


def _frames_are_visible(op):
    for s in op["source"]:
        assert f"{os.sep}torch{os.sep}" not in s["file"], s
        assert not s["file"].startswith(os.path.dirname(opdump.__file__) + os.sep), s
        assert os.path.basename(s["file"]) != "opdump", s


def test_eager_source_is_the_library_line_and_keeps_the_users_stack(runs, fakelib):
    doc = _listing(runs["eager"], 0)
    tanh = _op(doc, "tanh")
    assert (tanh["source"][-1]["file"], tanh["source"][-1]["line"]) == (fakelib["file"], fakelib["tanh_line"])
    assert (THIS_FILE, USER_CALL_LINE) in [(s["file"], s["line"]) for s in tanh["source"]]
    backward = _op(doc, "tanh_backward", "backward")
    assert backward["source"] == tanh["source"]
    for op in doc["ops"]:
        _frames_are_visible(op)


def test_graph_source_is_the_library_line(runs, fakelib):
    docs = _listing(runs["graph"])
    forward = next(d for d in docs.values() if any(o["op_type"] == "tanh" for o in d["ops"]))
    tanh = _op(forward, "tanh")
    assert (tanh["source"][-1]["file"], tanh["source"][-1]["line"]) == (fakelib["file"], fakelib["tanh_line"])
    for doc in docs.values():
        for op in doc["ops"]:
            _frames_are_visible(op)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_locate_finds_operators_by_the_library_line(runs, fakelib, mode):
    dump = opdump.load(str(runs[mode]))
    hits = locate(dump, f"fakelib_h4/__init__.py:{fakelib['tanh_line']}")
    types = {(h.op.op_type, h.op.full_name.startswith("Gradients/")) for h in hits}
    assert ("tanh", False) in types and ("tanh_backward", True) in types
    assert all(h.match == "innermost" for h in hits if h.op.op_type.startswith("tanh"))


def test_locate_finds_operators_by_the_users_line_too(runs, fakelib):
    dump = opdump.load(str(runs["eager"]))
    hits = locate(dump, f"{os.path.basename(THIS_FILE)}:{USER_CALL_LINE}")
    assert {"tanh", "convolution", "_softmax"} <= {h.op.op_type for h in hits}
    assert all(h.match == "stack" for h in hits if h.op.op_type == "tanh")


# ---------------------------------------------------------------------- 17.6: Inf made on purpose
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_attention_mask_inf_is_not_an_overflow(runs, mode):
    report = find_overflow(opdump.load(str(runs[mode])), progress=False)
    assert not report.found, report.origin
    # the mask's full(-inf) is flagged in the listing, and nothing else of this model
    doc_ops = [o for d in _listing(runs[mode]).values() for o in d["ops"]]
    flagged = [o for o in doc_ops if o.get("nonfinite_args")]
    assert flagged and all(o["op_type"] in ("full", "scalar_tensor", "masked_fill", "where", "fill")
                           for o in flagged), [o["op_type"] for o in flagged]


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _inject(module, args, out):
    if module.poison:
        return out + float("nan")                      # HOOK_LINE
    return out * 1.0


HOOK_LINE = _line_of(open(THIS_FILE).read(), "# HOOK_" + "LINE")


def test_forward_hook_ops_carry_the_module_scope_and_overflow_names_the_hook(tmp_path):
    torch.manual_seed(0)
    model = Hooked()
    model.fc1.poison = False
    model.fc1.register_forward_hook(_inject)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(_config(tmp_path, 0, 1)) as session, EagerCapture(session):
        for step in range(2):
            model.fc1.poison = step == 1
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    doc = _listing(tmp_path, 0)
    names = [o["full_name"] for o in doc["ops"] if o["op_type"] in ("mul", "add")
             and not o["full_name"].startswith(("Gradients/", "Default/optimizer"))]
    assert names and all(n.startswith("Default/Hooked/fc1-Linear/") for n in names), names
    report = find_overflow(opdump.load(str(tmp_path)), progress=False)
    assert report.found
    origin = report.origin
    assert origin.iteration == 1 and origin.kind == "argument"
    assert origin.op.startswith("Default/Hooked/fc1-Linear/add")
    assert origin.source == f"{THIS_FILE}:{HOOK_LINE}"


# ---------------------------------------------------------------------- 17.4: later iterations
class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.late = False

    def forward(self, x):
        x = self.fc(x)
        if self.late:
            x = torch.sigmoid(x)                        # LATE_LINE
        return x


LATE_LINE = _line_of(open(THIS_FILE).read(), "# LATE_" + "LINE")


def test_listing_covers_operators_of_later_iterations(tmp_path):
    torch.manual_seed(0)
    model = Branchy()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # (step 2's growth of the listing is written by the writer thread, step 3 adds nothing)
    with opdump.Session(_config(tmp_path, 0, 3)) as session, EagerCapture(session):
        for step in range(4):
            model.late = step == 2
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    doc = _listing(tmp_path, 0)
    sig = [o for o in doc["ops"] if o["op_type"] == "sigmoid"]
    assert len(sig) == 1 and (sig[0]["source"][-1]["file"], sig[0]["source"][-1]["line"]) == (THIS_FILE, LATE_LINE)
    assert any(o["op_type"] == "sigmoid_backward" for o in doc["ops"])
    # each iteration keeps its own execution order
    orders = {}
    for it in ("0", "1", "2", "3"):
        with open(os.path.join(str(tmp_path), "rank_0", "Net", "0", it, "ms_execution_order_graph_0.csv")) as f:
            orders[it] = f.read().splitlines()[1:]
    assert not any("sigmoid" in n for n in orders["0"] + orders["1"] + orders["3"])
    assert any("sigmoid" in n for n in orders["2"])
    hits = locate(opdump.load(str(tmp_path)), f"{os.path.basename(THIS_FILE)}:{LATE_LINE}")
    assert {h.op.op_type for h in hits} >= {"sigmoid", "sigmoid_backward"}
    assert all(h.match == "innermost" for h in hits)


def test_graph_stack_trace_keeps_library_frames_and_drops_torch():
    from opdump.capture.naming import parse_stack_trace
    site = "/venv/lib/python3.11/site-packages"
    trace = (f'  File "/home/u/train.py", line 40, in <module>\n    loss = model(**batch).loss\n'
             f'  File "{site}/torch/nn/modules/module.py", line 1775, in _call_impl\n    return forward_call(*args)\n'
             f'  File "{site}/transformers/models/llama/modeling_llama.py", line 120, in forward\n'
             f'    down_proj = self.down_proj(self.act_fn(self.gate_proj(x)))\n'
             f'  File "{site}/torch/nn/modules/linear.py", line 134, in forward\n    return F.linear(x, w, b)\n')
    frames = parse_stack_trace(trace)
    assert [(f.file, f.line) for f in frames] == [
        ("/home/u/train.py", 40), (f"{site}/transformers/models/llama/modeling_llama.py", 120)]


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_gradient_accumulation_of_a_compiled_model_is_scoped_as_eager_hooks_scope_it(tmp_path):
    """Under ``opdump run`` a compiled model's AccumulateGrad operators are caught by the eager
    capture, which never saw its modules: their scope must still be the one eager mode gives
    (``layers.0-Linear``: a ModuleList is never called, so it adds no segment)."""
    torch.manual_seed(0)
    model = Stack()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(_config(tmp_path)) as session, EagerCapture(session):
        run = torch.compile(model, backend=session.backend("eager"))
        run(torch.randn(2, 4)).sum().backward()
        opt.step()
    torch._dynamo.reset()
    eager_names = [o["full_name"] for o in _listing(tmp_path, 0)["ops"]]
    accumulate = [n for n in eager_names if n.startswith("Gradients/") and "/detach-op" in n]
    assert accumulate, eager_names
    assert all(n.startswith(("Gradients/Default/Stack/layers.0-Linear/", "Gradients/Default/Stack/layers.1-Linear/"))
               for n in accumulate), accumulate
