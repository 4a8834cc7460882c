"""Graph mode end to end: the seed's AlexNet shape under torch.compile, dumped at
iterations 0 and 2, every file read back, tensors checked against an
independent eager capture (forward hooks, autograd)."""
import copy
import json
import os
import re

import numpy as np
import pytest
import torch

import opdump
from opdump.demo.models import AlexNet
from dumpfiles import execution_order, find, sanitize, tensor_files
from conftest import write_config

STEPS = 3


@pytest.fixture(scope="module")
def alexnet_run(tmp_path_factory):
    """Train a compiled AlexNet 3 steps with dump on iterations 0|2; record what plain eager sees."""
    torch._dynamo.reset()
    tmp = tmp_path_factory.mktemp("alexnet")
    cfg = write_config(tmp, common={"iteration": "0|2", "net_name": "AlexNet"})
    torch.manual_seed(0)
    model = AlexNet(width=4)
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs = [torch.randn(2, 3, 227, 227) for _ in range(STEPS)]
    ys = [torch.randint(0, 10, (2,)) for _ in range(STEPS)]
    with opdump.Session(cfg) as session:
        compiled = torch.compile(model, backend=session.backend("eager"))
        for x, y in zip(xs, ys):
            torch.nn.functional.cross_entropy(compiled(x), y).backward()
            opt.step()
            opt.zero_grad()
        iterations_seen = session.iteration
    # independent capture of iteration 0: forward hooks + autograd on an untouched copy
    seen = {}
    hooks = [m.register_forward_hook(lambda mod, inp, out, name=name: seen.__setitem__(name, (inp[0].detach().clone(), out.detach().clone())))
             for name, m in reference.named_children()]
    torch.nn.functional.cross_entropy(reference(xs[0]), ys[0]).backward()
    for h in hooks:
        h.remove()
    torch._dynamo.reset()
    return {"root": str(tmp / "dump"), "config": cfg, "seen": seen, "reference": reference,
            "files": tensor_files(str(tmp / "dump")), "xs": xs, "iterations": iterations_seen}


def test_layout_and_metadata(alexnet_run):
    root = alexnet_run["root"]
    rank = os.path.join(root, "rank_0")
    assert sorted(os.listdir(rank)) == [".dump_metadata", "AlexNet", "execution_order", "graphs"]
    meta = os.path.join(rank, ".dump_metadata")
    with open(meta + "/data_dump.json", "rb") as f, open(alexnet_run["config"], "rb") as g:
        assert f.read() == g.read(), "data_dump.json must be byte-identical to the config"
    config = json.load(open(meta + "/config.json"))
    assert config["device_target"] == "CPU" and config["torch_version"] == torch.__version__
    assert json.load(open(meta + "/manifest.json"))["complete"] is True
    # forward graph 0 and backward graph 1, iterations 0 and 2 only
    assert sorted(os.listdir(os.path.join(rank, "AlexNet"))) == ["0", "1"]
    for g in ("0", "1"):
        assert sorted(os.listdir(os.path.join(rank, "AlexNet", g))) == ["0", "2"]
        assert os.path.exists(os.path.join(rank, "graphs", f"ms_output_trace_code_graph_{g}.ir"))
        assert os.path.exists(os.path.join(rank, "graphs", f"ms_output_trace_code_graph_{g}.json"))
    assert alexnet_run["iterations"] == STEPS
    glob = open(os.path.join(rank, "execution_order", "ms_global_execution_order_graph_0.csv")).read().split()
    assert glob == ["0", "1", "2"]


def test_every_file_parses_and_matches_execution_order(alexnet_run):
    files = alexnet_run["files"]
    assert files, "no tensor files"
    root = alexnet_run["root"]
    for graph in (0, 1):
        order = execution_order(root, graph)
        assert len(order) == len(set(order)), "full names must be unique in a graph"
        names = {sanitize(n) for n in order}
        dumped = {f.op_name for f in files if f.graph == graph and f.op_type != "Parameter"}
        assert dumped <= names
        for it in (0, 2):
            ops_it = {f.op_name for f in files if f.graph == graph and f.iteration == it and f.op_type != "Parameter"}
            assert ops_it == names, "every operator of the graph is dumped in every selected iteration"
    for f in files:
        assert (f.task, f.stream, f.fmt) == (0, 0, "DefaultFormat")
        arr = f.load()
        assert f.dtype in ("Float32", "Int64", "Bool"), f.dtype
        assert arr.dtype == {"Float32": np.float32, "Int64": np.int64, "Bool": np.bool_}[f.dtype]
    timestamps = [f.ts for f in files]
    assert len(set(timestamps)) == len(timestamps), "timestamps are unique per file"


def test_names_follow_module_scopes(alexnet_run):
    fwd = execution_order(alexnet_run["root"], 0)
    bwd = execution_order(alexnet_run["root"], 1)
    assert any(re.fullmatch(r"Default/AlexNet/conv3-Conv2d/convolution-op\d+", n) for n in fwd), fwd
    assert any(re.fullmatch(r"Default/AlexNet/fc1-Linear/addmm-op\d+", n) for n in fwd), fwd
    assert any(re.fullmatch(r"Default/AlexNet/max_pool2d-MaxPool2d/max_pool2d_with_indices-op\d+", n) for n in fwd)
    assert all(n.startswith("Gradients/Default/AlexNet") for n in bwd)
    assert any(re.fullmatch(r"Gradients/Default/AlexNet/conv1-Conv2d/convolution_backward-op\d+", n) for n in bwd)


def test_ir_maps_script_line_to_operators(alexnet_run):
    ir = open(os.path.join(alexnet_run["root"], "rank_0", "graphs", "ms_output_trace_code_graph_0.ir")).read()
    import opdump.demo.models as models
    line = next(i for i, text in enumerate(open(models.__file__).read().splitlines(), 1) if "x = self.conv3(x)" in text)
    marker = f"# In file {models.__file__}({line})/ x = self.conv3(x)/"
    assert marker in ir
    block = ir[: ir.index(marker)].rsplit("  %", 1)[1]
    assert "convolution" in block and "full_name_with_scope: (Default/AlexNet/conv3-Conv2d/convolution-op" in block
    assert "-> (<Tensor[Float32], (2, 12, 13, 13)>)" in block


def test_forward_tensors_equal_eager_capture(alexnet_run):
    files, seen = alexnet_run["files"], alexnet_run["seen"]
    order = execution_order(alexnet_run["root"], 0)
    for layer in ("conv1", "conv3", "fc1", "fc3"):
        op = next(n for n in order if f"/{layer}-" in n and ("convolution-op" in n or "addmm-op" in n))
        expected_in, expected_out = seen[layer]
        out = find(files, op, "output", 0, iteration=0).load()
        np.testing.assert_array_equal(out, expected_out.numpy())
        if layer.startswith("conv"):
            np.testing.assert_array_equal(find(files, op, "input", 0, iteration=0).load(), expected_in.numpy())


def test_backward_tensors_equal_autograd(alexnet_run):
    files, ref = alexnet_run["files"], alexnet_run["reference"]
    order = execution_order(alexnet_run["root"], 1)
    op = next(n for n in order if "/conv1-Conv2d/convolution_backward-op" in n)
    grad_weight = find(files, op, "output", 1, iteration=0).load()
    np.testing.assert_array_equal(grad_weight, ref.conv1.weight.grad.numpy())


def test_parameters_are_forward_values(alexnet_run):
    files = alexnet_run["files"]
    ref = alexnet_run["reference"]
    params = {f.op_name: f for f in files if f.op_type == "Parameter" and f.iteration == 0}
    assert {"conv1_weight", "fc3_bias", "inputs0"} <= set(params)
    np.testing.assert_array_equal(params["conv1_weight"].load(), ref.conv1.weight.detach().numpy())
    np.testing.assert_array_equal(params["inputs0"].load(), alexnet_run["xs"][0].numpy())
    later = {f.op_name: f for f in files if f.op_type == "Parameter" and f.iteration == 2}
    assert not np.array_equal(later["conv1_weight"].load(), params["conv1_weight"].load()), "SGD updated it"


def test_values_written_later_are_the_values_produced(tmp_path):
    """Files are written in the background, later: in-place writes after the graph ran (by
    the user, the optimizer, gradient zeroing) must never reach them."""
    torch._dynamo.reset()
    cfg = write_config(tmp_path, common={"iteration": "0|1", "input_output": 0})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x = torch.randn(128, 64)
    expected = {}
    with opdump.Session(cfg) as session:
        compiled = torch.compile(model, backend=session.backend("eager"))
        for step in range(2):
            out = compiled(x)
            expected[step] = (out.detach().clone(), model[0].weight.detach().clone())
            out.sum().backward()
            out.detach().mul_(0).add_(7)        # the user overwrites the output in place
            opt.step()                           # the optimizer overwrites weights and grads
            opt.zero_grad(set_to_none=False)     # grads zeroed in place
    files = tensor_files(str(tmp_path / "dump"))
    for step in range(2):
        out_file = [f for f in files if f.iteration == step and f.graph == 0 and f.op_type == "addmm"
                    and f.io == "output" and "2-Linear" in f.op_name][0]
        np.testing.assert_array_equal(out_file.load(), expected[step][0].numpy())
        weight = [f for f in files if f.iteration == step and f.op_name == "0_weight"][0]
        np.testing.assert_array_equal(weight.load(), expected[step][1].numpy())
        relu_out = [f for f in files if f.iteration == step and f.op_type == "relu" and f.io == "output"][0].load()
        relu_in_next = [f for f in files if f.iteration == step and f.op_type == "addmm" and f.io == "input"
                        and "2-Linear" in f.op_name and f.slot == 1][0].load()
        np.testing.assert_array_equal(relu_out, relu_in_next)
        grads = [f for f in files if f.iteration == step and f.graph == 1 and f.io == "output"]
        assert grads and all(np.isfinite(g.load()).all() and g.load().any() for g in grads if g.load().size)
