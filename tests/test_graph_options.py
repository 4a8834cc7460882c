"""Graph mode: each selection/config field, graph breaks, dynamic shapes, odd names."""
import json
import os

import numpy as np
import pytest
import torch
from torch import nn

import opdump
from dumpfiles import execution_order, sanitize, tensor_files
from conftest import write_config


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.LayerNorm(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = self.norm(y.permute(0, 2, 3, 1))
        return self.fc(y.mean(dim=(1, 2)))


def train(cfg, model=None, steps=2, compile_kwargs=None, make_input=None, real="eager"):
    torch.manual_seed(0)
    model = model or Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(cfg) as session:
        compiled = torch.compile(model, backend=session.backend(real), **(compile_kwargs or {}))
        for step in range(steps):
            x = make_input(step) if make_input else torch.randn(2, 3, 6, 6)
            compiled(x).sum().backward()
            opt.step()
            opt.zero_grad()
    return session


def dump_root(cfg):
    return json.load(open(cfg))["common_dump_settings"]["path"]


def test_kernels_by_type_regex_and_exact_name(config_file):
    cfg = config_file(common={"dump_mode": 1, "iteration": "0",
                              "kernels": ["Conv", "name-regex(Default/Small/fc-Linear/.*)", "relu-op1", "nomatch_xyz"]})
    with pytest.warns(UserWarning, match="nomatch_xyz"):
        train(cfg, steps=1)
    files = tensor_files(dump_root(cfg))
    types = {f.op_type for f in files if f.op_type != "Parameter"}
    assert "convolution" in types and "convolution_backward" in types      # type match, case-insensitive
    assert "addmm" in types                                                 # regex on the fc scope
    names = {f.op_name for f in files}
    assert sanitize("Default/Small/relu-op1") in names or any(n.endswith("_relu-op1") for n in names)
    assert "native_layer_norm" not in types and "mean" not in types


def _parameter_names(cfg):
    return {f.op_name for f in tensor_files(dump_root(cfg)) if f.op_type == "Parameter"}


def test_parameters_follow_the_kernels_filter(config_file):
    """A MindSpore dump with a kernels filter writes only the Parameter files it names."""
    cfg = config_file(common={"dump_mode": 1, "iteration": "0", "kernels": ["conv"]})
    train(cfg, steps=1)
    files = tensor_files(dump_root(cfg))
    assert {f.op_type for f in files} == {"convolution", "convolution_backward"}, "no Parameter file"
    base = dump_root(cfg)
    for n, (kernels, expected) in enumerate([
            (["conv", "Parameter"], {"conv_weight", "conv_bias", "norm_weight", "norm_bias",
                                     "fc_weight", "fc_bias", "inputs0"}),
            (["conv", "name-regex(fc\\..*)"], {"fc_weight", "fc_bias"}),         # the name as given
            (["conv", "name-regex(norm_.*)", "conv.bias"], {"norm_weight", "norm_bias", "conv_bias"}),
            (["conv", "Parameter.inputs0"], {"inputs0"})]):
        cfg = config_file(common={"dump_mode": 1, "iteration": "0", "kernels": kernels,
                                  "path": f"{base}_{n}"})
        train(cfg, steps=1)
        assert _parameter_names(cfg) == expected, kernels


def test_input_output_selection(config_file):
    for mode, expected in ((1, {"input"}), (2, {"output"})):
        cfg = config_file(common={"input_output": mode, "iteration": "0", "path": f"{dump_root(config_file())}_{mode}"})
        train(cfg, steps=1)
        ios = {f.io for f in tensor_files(dump_root(cfg)) if f.op_type != "Parameter"}
        assert ios == expected


def test_iteration_selection_and_net_name(config_file):
    cfg = config_file(common={"iteration": "1-2", "net_name": "MyNet"})
    session = train(cfg, steps=4)
    assert session.iteration == 4
    iters = {(f.net, f.iteration) for f in tensor_files(dump_root(cfg))}
    assert iters == {("MyNet", 1), ("MyNet", 2)}


def test_inductor_real_backend_results_unchanged(config_file):
    cfg = config_file(common={"iteration": "1"})
    torch.manual_seed(0)
    plain = Small()
    dumped = Small()
    dumped.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 6, 6)
    with opdump.Session(cfg) as session:
        compiled = torch.compile(dumped, backend=session.backend("inductor"))
        out0 = compiled(x)          # iteration 0: inductor
        session.step()
        out1 = compiled(x)          # iteration 1: dumped op by op
    expected = plain(x)
    torch.testing.assert_close(out0, expected)
    torch.testing.assert_close(out1, expected)
    assert {f.iteration for f in tensor_files(dump_root(cfg))} == {1}


def test_graph_break_gives_several_graphs(config_file):
    class Broken(Small):
        def forward(self, x):
            y = torch.relu(self.conv(x))
            torch._dynamo.graph_break()
            return self.fc(self.norm(y.permute(0, 2, 3, 1)).mean(dim=(1, 2)))

    cfg = config_file(common={"iteration": "0"})
    train(cfg, model=Broken(), steps=1)
    files = tensor_files(dump_root(cfg))
    graphs = {f.graph for f in files}
    assert len(graphs) == 4, graphs        # two forward graphs, two backward graphs
    assert any("convolution" == f.op_type for f in files) and any("addmm" == f.op_type for f in files)


def test_call_counted_iterations_without_optimizer(config_file):
    cfg = config_file(common={"iteration": "2"})
    model = Small()
    with torch.no_grad(), opdump.Session(cfg) as session:
        compiled = torch.compile(model, backend=session.backend("eager"))
        for _ in range(4):
            compiled(torch.randn(2, 3, 6, 6))
    assert session.iteration == 3
    assert {f.iteration for f in tensor_files(dump_root(cfg))} == {2}


def test_dynamic_shapes(config_file):
    cfg = config_file(common={"iteration": "all"})
    train(cfg, steps=2, compile_kwargs={"dynamic": True},
          make_input=lambda step: torch.randn(2 + step, 3, 5 + step, 5 + step))
    files = tensor_files(dump_root(cfg))
    conv_out = [f for f in files if f.op_type == "convolution" and f.io == "output"]
    assert sorted(f.load().shape for f in conv_out) == [(2, 4, 5, 5), (3, 4, 6, 6)]


def test_trans_flag_false_keeps_channels_last(config_file):
    class CL(nn.Module):
        def forward(self, x):
            return x * 2
    for flag, fmt in ((True, "DefaultFormat"), (False, "NHWC")):
        cfg = config_file(common={"path": f"{dump_root(config_file())}_{flag}"}, e2e={"trans_flag": flag})
        x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5).to(memory_format=torch.channels_last)
        with opdump.Session(cfg) as session:
            torch.compile(CL(), backend=session.backend("eager"))(x)
        mul_in = [f for f in tensor_files(dump_root(cfg)) if f.op_type == "mul" and f.io == "input"][0]
        assert mul_in.fmt == fmt
        expected = x.numpy() if flag else x.permute(0, 2, 3, 1).contiguous().numpy()
        np.testing.assert_array_equal(mul_in.load(), expected)


def test_save_kernel_args(config_file):
    cfg = config_file(common={"iteration": "0"}, e2e={"save_kernel_args": True})
    train(cfg, steps=1)
    folder = os.path.join(dump_root(cfg), "rank_0", "Net", "0", "0")
    conv_json = [f for f in os.listdir(folder) if f.startswith("convolution.") and f.endswith(".json")]
    assert len(conv_json) == 1
    args = json.load(open(os.path.join(folder, conv_json[0])))
    assert args["stride"] == "[1, 1]" and args["padding"] == "[1, 1]" and args["transposed"] == "False"


def test_hostile_module_names_stay_inside_the_dump(config_file, tmp_path):
    long = "x" * 300
    HOSTILE = "a/\\b c\x00/"

    class Evil(nn.Module):
        def __init__(self):
            super().__init__()
            self.add_module(HOSTILE, nn.Linear(3, 3))
            self.add_module(long, nn.Linear(3, 3))

        def forward(self, x):
            return getattr(self, long)(getattr(self, HOSTILE)(x))

    Evil.__name__ = "../../Evil"            # a class name that looks like a path
    cfg = config_file(common={"iteration": "0"})
    with opdump.Session(cfg) as session:
        torch.compile(Evil(), backend=session.backend("eager"))(torch.randn(2, 3))
    root = dump_root(cfg)
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and not str(p).startswith(root) and p.name != "data_dump.json"]
    assert outside == []
    folder = os.path.join(root, "rank_0", "Net", "0", "0")
    mapping = open(os.path.join(folder, "mapping.csv")).read().splitlines()
    assert mapping and all(len(line.split(",", 1)[0]) < 255 for line in mapping)
    for line in mapping:
        mapped, original = line.split(",", 1)
        assert os.path.exists(os.path.join(folder, mapped)) and len(original.encode()) > 255
    assert all(len(name.encode()) <= 255 for name in os.listdir(folder))


def test_support_device_is_accepted_on_cpu(config_file):
    cfg = config_file(common={"support_device": [3], "iteration": "0"})
    train(cfg, steps=1)
    assert tensor_files(dump_root(cfg))


def test_enable_false_dumps_nothing(config_file):
    cfg = config_file(e2e={"enable": False})
    train(cfg, steps=1)
    assert not os.path.exists(os.path.join(dump_root(cfg), "rank_0", "Net"))


def test_set_dump_in_graph_mode_covers_repeated_calls(config_file):
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(3, 3)
            self.other = nn.Linear(3, 3)

        def forward(self, x):
            return self.other(self.inner(self.inner(x)))

    model = Twice()
    opdump.set_dump(model.inner)
    cfg = config_file(common={"dump_mode": 2, "iteration": "0"})
    with opdump.Session(cfg) as session:
        torch.compile(model, backend=session.backend("eager"))(torch.randn(2, 3))
    outs = [f for f in tensor_files(dump_root(cfg)) if f.op_type == "addmm" and f.io == "output"]
    assert len(outs) == 2, "both calls of the marked module, not the unmarked one"
    assert all("inner" in f.op_name for f in outs)
    assert sorted(f.op_name.split("_addmm")[0] for f in outs) == ["Default_Twice_inner-Linear", "Default_Twice_inner@1-Linear"]


def test_dtypes_zero_dim_and_empty_tensors(config_file):
    class Odd(nn.Module):
        def forward(self, x):
            mask = x > 0                                   # Bool
            idx = x.argmax(dim=1)                          # Int64
            total = (x * mask).sum()                       # 0-dim
            empty = x[:0] * 2                              # empty
            half = x.to(torch.bfloat16) * 3                # BFloat16 → saved as float32
            f16 = x.to(torch.float16) + 1
            return total, idx, empty, half, f16

    cfg = config_file(common={"iteration": "0"})
    x = torch.randn(3, 4)
    with opdump.Session(cfg) as session:
        outs = torch.compile(Odd(), backend=session.backend("eager"))(x)
    files = tensor_files(dump_root(cfg))
    by = {}
    for f in files:
        if f.io == "output" and f.op_type != "Parameter":
            by.setdefault(f.op_type, []).append(f)
    assert by["gt"][0].dtype == "Bool" and by["gt"][0].load().dtype == np.bool_
    assert by["argmax"][0].dtype == "Int64"
    np.testing.assert_array_equal(by["argmax"][0].load(), outs[1].numpy())
    total = by["sum"][0].load()
    assert total.shape == () and total == outs[0].item()
    mul_shapes = {f.load().shape: f for f in by["mul"]}
    assert (0, 4) in mul_shapes
    bf16 = [f for f in by["mul"] if f.dtype == "BFloat16"]
    assert bf16 and bf16[0].load().dtype == np.float32
    np.testing.assert_array_equal(bf16[0].load(), outs[3].float().numpy())
    f16 = by["add"][0]
    assert f16.dtype == "Float16" and f16.load().dtype == np.float16
    np.testing.assert_array_equal(f16.load(), outs[4].numpy())
