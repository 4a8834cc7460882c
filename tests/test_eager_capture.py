"""Eager capture (README, Eager mode; dump_mode 2): a TorchDispatchMode front-end.

Every dumped tensor is checked against an independent capture of the same
computation run outside opdump (forward hooks and ``retain_grad`` on a deep
copy), files are read back with numpy (no pickle) through the tests' own
file-name parser.
"""
import copy
import json
import os

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import opdump
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec
from dumpfiles import execution_order, find, sanitize, tensor_files

THIS_FILE = os.path.abspath(__file__)


def config(tmp_path, dumped=(1, 1), **kw):
    return DumpConfig(path=str(tmp_path), iteration=IterationSpec(ranges=(dumped,)), **kw)


def iteration_dirs(root, graph=0):
    path = os.path.join(root, "rank_0", "Net", str(graph))
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def ir_text(root, graph=0):
    with open(os.path.join(root, "rank_0", "graphs", f"ms_output_trace_code_graph_{graph}.ir")) as f:
        return f.read()


def first(names, prefix, op_type):
    """The first full name in ``names`` under ``prefix`` with operator type ``op_type``."""
    hits = [n for n in names if n.startswith(prefix) and n.rsplit("/", 1)[1].rsplit("-op", 1)[0] == op_type]
    assert hits, f"no {op_type} under {prefix}"
    return hits[0]


def load(files, full_name, io, slot=0, iteration=1):
    return find(files, full_name, io, slot, iteration).load()


# ---------------------------------------------------------------------- models
class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(36, 5)

    def forward(self, x):
        y = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.head(y.flatten(1))


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y).float()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = Attention(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln(x))
        return x + self.mlp(x)


class TinyLM(nn.Module):
    def __init__(self, vocab=11, d=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Reuse(nn.Module):
    """A module called twice, a functional op, a module not registered anywhere."""

    def __init__(self):
        super().__init__()
        self.blk = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        self.out = nn.Linear(3, 1)
        self.loose = [nn.Linear(3, 3)]

    def forward(self, x):
        x = self.blk(self.blk(x))
        x = self.loose[0](x) * 2
        return self.out(x).sum()


# ---------------------------------------------------------------------- CNN: values
@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    """3 SGD steps of a CNN, iteration 1 dumped; the same steps on a deep copy, observed by hooks."""
    torch.manual_seed(0)
    model = CNN()
    reference = copy.deepcopy(model)
    xs = [torch.randn(2, 3, 8, 8) for _ in range(3)]
    ys = [torch.randint(0, 5, (2,)) for _ in range(3)]
    root = str(tmp_path_factory.mktemp("cnn"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(config(root)) as session:
        with EagerCapture(session) as cap:
            for x, y in zip(xs, ys):
                F.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
        graph_id, iterations = cap.graph_id, session.iteration
    # independent capture of iteration 1
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    seen = {}

    def keep(name):
        def hook(mod, inp, out):
            if out.requires_grad:
                out.retain_grad()
            seen[name] = (inp[0].detach().clone(), out)
        return hook

    for i, (x, y) in enumerate(zip(xs, ys)):
        hooks = []
        if i == 1:
            seen["params"] = {k: v.detach().clone() for k, v in reference.state_dict().items()}
            hooks = [getattr(reference, n).register_forward_hook(keep(n)) for n in ("conv", "bn", "head")]
        F.cross_entropy(reference(x), y).backward()
        if i == 1:
            seen["grads"] = {k: p.grad.clone() for k, p in reference.named_parameters()}
            seen = {k: (v if k in ("params", "grads") else (v[0], v[1].detach().clone(), v[1].grad.clone()))
                    for k, v in seen.items()}
        for h in hooks:
            h.remove()
        ref_opt.step()
        ref_opt.zero_grad()
    return {"root": root, "graph": graph_id, "iterations": iterations, "seen": seen,
            "files": tensor_files(root), "order": execution_order(root, graph_id)}


def test_cnn_only_selected_iteration_dumped(cnn_run):
    assert cnn_run["graph"] == 0 and cnn_run["iterations"] == 3
    assert iteration_dirs(cnn_run["root"]) == ["1"]
    assert {f.iteration for f in cnn_run["files"]} == {1}
    with open(os.path.join(cnn_run["root"], "rank_0", "execution_order",
                           "ms_global_execution_order_graph_0.csv")) as f:
        assert f.read().split() == ["0", "1", "2"]


def test_cnn_names_forward_backward_optimizer(cnn_run):
    order = cnn_run["order"]
    assert order[0] == "Default/CNN/conv-Conv2d/convolution-op0"
    assert [int(n.rsplit("-op", 1)[1]) for n in order] == list(range(len(order)))
    assert first(order, "Default/CNN/bn-BatchNorm2d/", "native_batch_norm")
    assert first(order, "Default/CNN/", "relu") == next(n for n in order if "/relu-op" in n)
    assert first(order, "Default/CNN/head-Linear/", "addmm")
    assert first(order, "Gradients/Default/CNN/conv-Conv2d/", "convolution_backward")
    assert first(order, "Gradients/Default/CNN/bn-BatchNorm2d/", "native_batch_norm_backward")
    assert first(order, "Gradients/Default/CNN/", "threshold_backward")
    assert first(order, "Default/optimizer-SGD/", "add_")
    # the loss is a plain function outside any module: not captured (eager_capture "model"),
    # its backward is, with no forward scope
    assert not any("nll_loss_forward" in n or "log_softmax-op" in n for n in order)
    assert first(order, "Gradients/Default/", "nll_loss_backward")
    # backward after forward, optimizer after backward
    kinds = [0 if n.startswith("Default/CNN") else 1 if n.startswith("Gradients/") else 2 for n in order]
    assert kinds == sorted(kinds)
    # per-iteration copy of the order in the iteration folder
    with open(os.path.join(cnn_run["root"], "rank_0", "Net", "0", "1", "ms_execution_order_graph_0.csv")) as f:
        assert f.read().splitlines()[1:] == order


def test_cnn_tensors_match_independent_capture(cnn_run):
    files, order, seen = cnn_run["files"], cnn_run["order"], cnn_run["seen"]
    conv = first(order, "Default/CNN/conv-Conv2d/", "convolution")
    np.testing.assert_array_equal(load(files, conv, "input", 0), seen["conv"][0].numpy())
    np.testing.assert_array_equal(load(files, conv, "output"), seen["conv"][1].numpy())
    head = first(order, "Default/CNN/head-Linear/", "addmm")
    np.testing.assert_array_equal(load(files, head, "output"), seen["head"][1].numpy())
    # backward: grad_output of the conv (retain_grad) and the weight gradient
    conv_bw = first(order, "Gradients/Default/CNN/conv-Conv2d/", "convolution_backward")
    np.testing.assert_array_equal(load(files, conv_bw, "input", 0), seen["conv"][2].numpy())
    # the input needs no gradient: outputs are (None, weight grad, bias grad); the None keeps
    # its slot, as in graph mode (README, Output layout: slot)
    assert sorted(f.slot for f in files if f.op_name == sanitize(conv_bw) and f.io == "output") == [1, 2]
    np.testing.assert_array_equal(load(files, conv_bw, "output", 1), seen["grads"]["conv.weight"].numpy())
    np.testing.assert_array_equal(load(files, conv_bw, "output", 2), seen["grads"]["conv.bias"].numpy())
    # parameters: the values iteration 1's forward used
    for name in ("conv.weight", "bn.running_mean", "head.bias"):
        hits = [f for f in os.listdir(os.path.join(cnn_run["root"], "rank_0", "Net", "0", "1"))
                if f.startswith(f"Parameter.{sanitize(name)}.0.0.")]
        assert len(hits) == 1
        array = np.load(os.path.join(cnn_run["root"], "rank_0", "Net", "0", "1", hits[0]), allow_pickle=False)
        np.testing.assert_array_equal(array, seen["params"][name].numpy())
    # the optimizer update: param.add_(grad, alpha=-lr), input 0 before, output after
    upd = [n for n in order if n.startswith("Default/optimizer-SGD/add_-op")]
    assert len(upd) == 6
    np.testing.assert_array_equal(load(files, upd[0], "input", 0), seen["params"]["conv.weight"].numpy())
    np.testing.assert_array_equal(load(files, upd[0], "input", 1), seen["grads"]["conv.weight"].numpy())


def test_cnn_ir_listing_with_source_lines(cnn_run):
    text = ir_text(cnn_run["root"])
    assert "# Graph kind: eager" in text
    assert "%para1_conv.weight: <Tensor[Float32], (4, 3, 3)>".replace("(4, 3, 3)", "(4, 3, 3, 3)") in text
    assert "full_name_with_scope: (Default/CNN/conv-Conv2d/convolution-op0)" in text
    # the user's lines, in the .ir's form
    assert f"# In file {THIS_FILE}(" in text
    assert "/ y = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)/" in text
    with open(os.path.join(cnn_run["root"], "rank_0", "graphs", "ms_output_trace_code_graph_0.json")) as f:
        doc = json.load(f)
    assert doc["kind"] == "eager" and [op["full_name"] for op in doc["ops"]] == cnn_run["order"]
    conv = doc["ops"][0]
    assert conv["inputs"][0] == {"shape": [2, 3, 8, 8], "dtype": "Float32"}
    assert conv["args"]["stride"] == "[1, 1]"


# ---------------------------------------------------------------------- transformer, autocast, AdamW
def test_tiny_transformer_autocast_adamw(tmp_path):
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    tokens = [torch.randint(0, 11, (2, 5)) for _ in range(3)]
    seen = {}
    with opdump.Session(config(tmp_path)) as session, EagerCapture(session):
        for i, t in enumerate(tokens):
            h = None
            if i == 1:
                h = model.blocks[0].attn.proj.register_forward_hook(
                    lambda m, inp, out: seen.update(proj_in=inp[0].detach().float().clone()))
            logits = model(t)
            if h is not None:
                h.remove()
            F.cross_entropy(logits.flatten(0, 1), t.flatten()).backward()
            opt.step()
            opt.zero_grad()
    root = str(tmp_path)
    order = execution_order(root, 0)
    files = tensor_files(root)
    assert iteration_dirs(root) == ["1"]
    attn = "Default/TinyLM/blocks.0-Block/attn-Attention/"
    assert first(order, attn, "_safe_softmax") and first(order, attn, "bmm")       # attention, as CPU runs it
    assert first(order, "Default/TinyLM/blocks.1-Block/mlp-Sequential/1-GELU/", "gelu")
    assert first(order, "Gradients/" + attn + "proj-Linear/", "mm")
    assert any(n.startswith("Gradients/Default/TinyLM/emb-Embedding/embedding_dense_backward") for n in order)
    assert first(order, "Default/optimizer-AdamW/", "_foreach_mul_")
    # bf16 tensors: dtype field BFloat16, data float32, values exact
    proj = first(order, attn + "proj-Linear/", "addmm")
    f = find(files, proj, "input", 1, 1)
    assert f.dtype == "BFloat16"
    array = f.load()
    assert array.dtype == np.float32
    np.testing.assert_array_equal(array.reshape(seen["proj_in"].shape), seen["proj_in"].numpy())
    assert {x.dtype for x in files if x.op_name.startswith(sanitize(attn))} >= {"BFloat16", "Float32"}
    # an in-place foreach update returns nothing: its mutated arguments are its outputs
    update = first(order, "Default/optimizer-AdamW/", "_foreach_mul_")
    outs = [x for x in files if x.op_name == sanitize(update) and x.io == "output"]
    assert len(outs) == len(list(model.parameters()))


# ---------------------------------------------------------------------- scopes
def test_nested_and_reused_modules(tmp_path):
    torch.manual_seed(0)
    model = Reuse()
    with opdump.Session(config(tmp_path, dumped=(0, 0))) as session, EagerCapture(session):
        model(torch.randn(2, 3)).backward()
    order = execution_order(str(tmp_path), 0)
    fwd = [n for n in order if n.startswith("Default/")]
    assert fwd[:3] == ["Default/Reuse/blk-Sequential/0-Linear/t-op0",
                       "Default/Reuse/blk-Sequential/0-Linear/addmm-op1",
                       "Default/Reuse/blk-Sequential/1-Tanh/tanh-op2"]
    # no detach after tanh: autograd saving tanh's output is not an operator (the mode's own
    # detach call is left out, tests/test_eager_observed_ops.py)
    assert fwd[3:6] == ["Default/Reuse/blk@1-Sequential/0-Linear/t-op3",
                        "Default/Reuse/blk@1-Sequential/0-Linear/addmm-op4",
                        "Default/Reuse/blk@1-Sequential/1-Tanh/tanh-op5"]
    # a module kept in a plain list adds no segment; the functional mul is the root's
    assert fwd[6:9] == ["Default/Reuse/t-op6", "Default/Reuse/addmm-op7", "Default/Reuse/mul-op8"]
    assert first(fwd, "Default/Reuse/out-Linear/", "addmm")
    # backward ops carry the scope of the forward call that created them, second call first
    tanh_bw = [n for n in order if "tanh_backward" in n]
    assert tanh_bw == [f"Gradients/Default/Reuse/blk@1-Sequential/1-Tanh/{tanh_bw[0].rsplit('/', 1)[1]}",
                       f"Gradients/Default/Reuse/blk-Sequential/1-Tanh/{tanh_bw[1].rsplit('/', 1)[1]}"]


def _train_reuse(root):
    torch.manual_seed(0)
    model = Reuse()
    opt = torch.optim.Adam(model.parameters())
    with opdump.Session(config(root)) as session, EagerCapture(session):
        for _ in range(2):
            torch.randn(3)                       # code outside the model does not shift the names
            model(torch.randn(2, 3)).backward()
            opt.step()
            opt.zero_grad()
    files = tensor_files(root)
    return execution_order(root, 0), sorted((f.op_type, f.op_name, f.io, f.slot, f.dtype) for f in files)


def test_names_identical_across_two_runs(tmp_path):
    a = _train_reuse(str(tmp_path / "a"))
    b = _train_reuse(str(tmp_path / "b"))
    assert a == b and len(a[0]) > 30


# ---------------------------------------------------------------------- set_dump (dump_mode 2)
class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Inner()
        self.b = Inner()
        self.c = nn.Linear(3, 1)

    def forward(self, x):
        return self.c(self.b(self.a(x))).sum()


def test_set_dump_submodule(tmp_path):
    torch.manual_seed(0)
    model = Outer()
    opdump.set_dump(model.a)
    opdump.set_dump(model.b)
    opdump.set_dump(model.b.lin, enabled=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(config(tmp_path, dump_mode=2)) as session, EagerCapture(session):
        for _ in range(2):
            model(torch.randn(2, 3)).backward()
            opt.step()
            opt.zero_grad()
    root = str(tmp_path)
    order = execution_order(root, 0)
    dumped = {f.op_name for f in tensor_files(root) if f.op_type != "Parameter"}   # parameters: as graph mode
    marked = {sanitize(n) for n in order
              if "/a-Inner/" in n or ("/b-Inner/" in n and "/lin-Linear/" not in n)}
    assert dumped == marked
    assert any(n.startswith("Gradients_Default_Outer_a-Inner_lin-Linear_") for n in dumped)
    assert any(n.startswith("Default_Outer_b-Inner_relu") for n in dumped)
    assert first(order, "Default/Outer/c-Linear/", "addmm")      # listed, not dumped
    with open(os.path.join(root, "rank_0", "graphs", "ms_output_trace_code_graph_0.json")) as f:
        selected = {op["full_name"]: op["selected"] for op in json.load(f)["ops"]}
    assert {sanitize(n) for n, s in selected.items() if s} == marked


# ---------------------------------------------------------------------- in-place, no_grad, inference, random
class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        y = x * 2
        y.add_(1)
        noise = torch.randn_like(y)
        return self.drop(y) + noise, noise


def test_inplace_no_grad_inference_random(tmp_path):
    torch.manual_seed(0)
    model = InPlace()
    x = torch.randn(4, 4)
    outs = []
    with opdump.Session(config(tmp_path, dumped=(1, 2))) as session, EagerCapture(session):
        outs.append(model(x))                  # iteration 0: not dumped
        with torch.no_grad():
            outs.append(model(x))              # iteration 1 (each top-level call is one)
        with torch.inference_mode():
            outs.append(model(x))              # iteration 2
        assert session.iteration == 2
    root = str(tmp_path)
    assert iteration_dirs(root) == ["1", "2"]
    files = tensor_files(root)
    for it in (1, 2):
        names = [n for n in _order_of(root, it)]
        add_ = first(names, "Default/InPlace/", "add_")
        np.testing.assert_array_equal(load(files, add_, "input", 0, it), (x * 2).numpy())
        np.testing.assert_array_equal(load(files, add_, "output", 0, it), (x * 2 + 1).numpy())
        rnd = first(names, "Default/InPlace/", "randn_like")
        np.testing.assert_array_equal(load(files, rnd, "output", 0, it), outs[it][1].numpy())
        last = [n for n in names if n.startswith("Default/InPlace/")][-1]
        np.testing.assert_array_equal(load(files, last, "output", 0, it), outs[it][0].numpy())
        assert any("/drop-Dropout/" in n for n in names)


def _order_of(root, iteration):
    with open(os.path.join(root, "rank_0", "Net", "0", str(iteration), "ms_execution_order_graph_0.csv")) as f:
        return f.read().splitlines()[1:]


# ---------------------------------------------------------------------- iterations, capture scope
def test_call_counted_iterations_with_loss_module_and_capture_all(tmp_path):
    torch.manual_seed(0)
    model, loss_fn = nn.Linear(3, 2), nn.MSELoss()
    with opdump.Session(config(tmp_path, dumped=(1, 1), eager_capture="all")) as session, EagerCapture(session):
        for _ in range(3):
            x = torch.randn(4, 3)
            loss_fn(model(x), torch.zeros(4, 2)).backward()
        assert session.iteration == 2              # model + loss module per step: one iteration
    order = execution_order(str(tmp_path), 0)
    assert order[:2] == ["Default/Linear/t-op0", "Default/Linear/addmm-op1"]
    assert order[2] == "Default/zeros-op2"          # "all": code outside modules too
    assert first(order, "Default/MSELoss/", "mse_loss")
    assert first(order, "Gradients/Default/MSELoss/", "mse_loss_backward")
    assert first(order, "Gradients/Default/Linear/", "mm")
    assert iteration_dirs(str(tmp_path)) == ["1"]


def test_not_dumping_iterations_write_nothing(tmp_path):
    model = nn.Linear(3, 2)
    with opdump.Session(config(tmp_path, dumped=(5, 5))) as session:
        cap = EagerCapture(session).start()
        for _ in range(3):
            model(torch.randn(1, 3)).sum().backward()
        assert cap._state is None and not cap._dumping
        cap.stop()
        cap.stop()                                  # idempotent
    assert iteration_dirs(str(tmp_path)) == []
    assert torch._C._len_torch_dispatch_stack() == 0


def test_root_modules_limit_the_model(tmp_path):
    torch.manual_seed(0)
    model, loss_fn = nn.Linear(3, 2), nn.MSELoss()
    with opdump.Session(config(tmp_path, dumped=(1, 1))) as session:
        with EagerCapture(session, root_modules=model):
            for _ in range(3):
                loss_fn(model(torch.randn(4, 3)), torch.zeros(4, 2)).backward()
            assert session.iteration == 2
    order = execution_order(str(tmp_path), 0)
    assert order[:2] == ["Default/Linear/t-op0", "Default/Linear/addmm-op1"]
    assert not any("MSELoss" in n or n.startswith("Default/mse_loss") for n in order)
    assert first(order, "Gradients/Default/Linear/", "mm")
