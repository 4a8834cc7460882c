"""Kernel-level graph dump (``opdump_settings.graph_dump: "kernels"``, README "Kernel-level
graph dump"): inductor's real compiled code runs in the dumped iteration, each kernel's output
buffers are dumped under the kernel's name, the listing maps kernels to the ATen operators they
fuse (with source lines) and to the generated code, and training is bit-identical to the same
steps compiled without dump.  One compiled training run (plus one plain run, mostly from
inductor's cache) is shared by the module: each inductor compile costs tens of seconds here."""
import copy
import json
import os
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from conftest import write_config
from dumpfiles import execution_order, sanitize, tensor_files
from opdump.capture.graph import faults
from opdump.capture.kernels.wrapper import TAP, instrument_wrapper

STEPS = 3
DUMPED = 1


class KNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.ln = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x)) * 2 + 1       # KERNEL-LINE-A
        h = self.ln(h)                            # KERNEL-LINE-B
        return self.fc2(h).square().mean()


def _line(marker):
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if marker in text and "_line(" not in text)


def _train(model, backend, xs):
    """STEPS SGD steps; losses, the gradients of each step and the final parameters."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend=backend)
    losses, grads = [], []
    for x in xs:
        loss = compiled(x)
        loss.backward()
        losses.append(loss.detach().clone())
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return losses, grads, [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def kernel_run(tmp_path_factory):
    torch._dynamo.reset()
    tmp = tmp_path_factory.mktemp("kernels")
    cfg = write_config(tmp, common={"iteration": str(DUMPED), "saved_data": "full"},
                       extra={"opdump_settings": {"graph_dump": "kernels"}})
    torch.manual_seed(0)
    model = KNet()
    plain_model = copy.deepcopy(model)
    start = copy.deepcopy(model)
    xs = [torch.randn(5, 8) for _ in range(STEPS)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session:
            dumped = _train(model, session.backend(), xs)
    torch._dynamo.reset()
    plain = _train(plain_model, "inductor", xs)
    torch._dynamo.reset()
    # parameters as they were when the dumped iteration started (for value checks)
    ref = copy.deepcopy(start)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for x in xs[:DUMPED]:
        ref(x).backward()
        opt.step()
        opt.zero_grad()
    root = str(tmp / "dump")
    rank = os.path.join(root, "rank_0")
    return {"root": root, "rank": rank, "dumped": dumped, "plain": plain, "ref": ref, "xs": xs,
            "files": tensor_files(root),
            "warnings": [str(w.message) for w in caught if "opdump" in str(w.message)]}


def _kernels(run, graph):
    with open(os.path.join(run["rank"], "graphs", f"ms_output_trace_code_graph_{graph}.kernels.json")) as f:
        return json.load(f)


def test_bit_identical_to_undumped_compiled_run(kernel_run):
    d_losses, d_grads, d_params = kernel_run["dumped"]
    p_losses, p_grads, p_params = kernel_run["plain"]
    assert kernel_run["warnings"] == []
    for a, b in zip(d_losses, p_losses):
        assert torch.equal(a, b)
    for step_d, step_p in zip(d_grads, p_grads):        # the dumped step's gradients included
        for a, b in zip(step_d, step_p):
            assert torch.equal(a, b)
    for a, b in zip(d_params, p_params):
        assert torch.equal(a, b)


def test_files_per_kernel_forward_and_backward(kernel_run):
    files = kernel_run["files"]
    assert {f.iteration for f in files} == {DUMPED}, "only the dumped iteration has files"
    for graph, kind in ((0, "forward"), (1, "backward")):
        doc = _kernels(kernel_run, graph)
        assert doc["kind"] == kind
        order = execution_order(kernel_run["root"], graph)
        assert order == [k["full_name"] for k in doc["kernels"]]
        names = {f.op_name for f in files if f.graph == graph and not f.op_type.startswith("Parameter")}
        with_outputs = [k for k in doc["kernels"] if k["outputs"]]
        assert with_outputs and {sanitize(k["full_name"]) for k in with_outputs} == names
        for k in with_outputs:                           # each output buffer a file at its slot
            slots = sorted(f.slot for f in files if f.op_name == sanitize(k["full_name"]) and f.io == "output")
            assert slots == list(range(len(k["outputs"]))), k
    kinds = {f.op_type for f in files}
    assert any(t.startswith("cpp_fused_") for t in kinds) and "addmm" in kinds and "mm" in kinds


def test_listing_maps_kernels_to_fused_operators_and_source(kernel_run):
    doc = _kernels(kernel_run, 0)
    fused = next(k for k in doc["kernels"] if "relu" in k["kernel"])
    types = [op["op_type"] for op in fused["fused_operators"]]
    assert {"relu", "mul", "add", "native_layer_norm"} <= set(types), types
    lines = {(os.path.basename(s["file"]), s["line"]) for op in fused["fused_operators"] for s in op["source"]}
    here = os.path.basename(__file__)
    assert (here, _line("KERNEL-LINE-A")) in lines and (here, _line("KERNEL-LINE-B")) in lines
    ln = next(op for op in fused["fused_operators"] if op["op_type"] == "native_layer_norm")
    assert ln["full_name"].startswith("Default/KNet/ln-LayerNorm/native_layer_norm-op")
    addmm = [k for k in doc["kernels"] if k["kernel"] == "extern_kernels.addmm"]
    assert [k["full_name"].split("/")[2] for k in addmm] == ["fc1-Linear", "fc2-Linear"]
    # each output buffer: the operator whose output it stores (for matching against an operator
    # dump), its shape and dtype
    out = addmm[0]["outputs"][0]
    assert out["stores"] == addmm[0]["fused_operators"][0]["full_name"]
    assert out["stores"].startswith("Default/KNet/fc1-Linear/addmm-op")
    assert (out["shape"], out["dtype"]) == ([5, 16], "Float32")
    assert ln["full_name"] in [o["stores"] for o in fused["outputs"]]
    # the generated code exists, holds the kernel and a tap after its call
    path = doc["generated_code"]
    code = open(path).read()
    assert fused["kernel"] in code and f"{TAP}({fused['index']}," in code
    assert code.splitlines()[fused["generated_code_line"] - 1].strip().startswith(fused["kernel"])
    # the .ir lists the same, with the source lines
    ir = open(os.path.join(kernel_run["rank"], "graphs", "ms_output_trace_code_graph_0.ir")).read()
    assert fused["full_name"] in ir and "native_layer_norm" in ir and path in ir
    assert ir.split(f"({addmm[0]['full_name']})")[0].splitlines()[-2].endswith("-> (<Tensor[Float32], (5, 16)>)")
    assert f"({_line('KERNEL-LINE-B')})/ h = self.ln(h)" in ir
    assert "%para1_fc1.weight: <Tensor[Float32], (16, 8)>" in ir     # the parameters, as in operator mode


def test_dumped_values_are_the_compiled_values(kernel_run):
    files = kernel_run["files"]
    ref, x = kernel_run["ref"], kernel_run["xs"][DUMPED]
    fc1 = next(f for f in files if f.op_type == "addmm" and "fc1-Linear" in f.op_name)
    np.testing.assert_allclose(np.load(fc1.path), (x @ ref.fc1.weight.T + ref.fc1.bias).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    loss = kernel_run["dumped"][0][DUMPED]
    last = [f for f in files if f.graph == 0 and f.op_type.startswith("cpp_fused") and f.dtype == "Float32"
            and np.load(f.path).shape == ()]
    assert any(np.load(f.path) == loss.numpy() for f in last), "the loss kernel's output is the loss, bit for bit"
    grads = kernel_run["dumped"][1][DUMPED]
    w1 = next(f for f in files if f.graph == 1 and f.op_type == "mm" and "fc1-Linear" in f.op_name)
    assert np.array_equal(np.load(w1.path), grads[0].numpy())


def test_wrapper_taps_every_call_form():
    """The rewriting on inductor's wrapper forms (no compile): out=, allocating calls, C++ and
    Triton kernels by their signatures, unmarked lines untouched."""
    source = '''
cpp_fused_a_0 = async_compile.cpp_pybinding(['const float*', 'float*', 'float*', 'const int64_t'], r"""x""")
cpp_fused_c_2 = async_compile.cpp_pybinding(['at::BFloat16*', 'const float*'], r"""
extern "C"  void  kernel(at::BFloat16* in_out_ptr0,
                       const float* in_ptr0)
{}
""")
triton_poi_b_1 = async_compile.triton('triton_poi_b_1', """
def triton_poi_b_1(in_ptr0, in_out_ptr0, out_ptr1, xnumel, XBLOCK : tl.constexpr):
    pass
""", device_str='cuda')
def call(args):
    a, b = args
    buf0 = empty_strided_cpu((2, ), (1, ), torch.float32)
    # [Provenance debug handles] extern_kernels.mm:1
    extern_kernels.mm(a, b, out=buf0)
    # [Provenance debug handles] cpp_fused_a_0:2
    cpp_fused_a_0(buf0, buf1, buf2, 3)
    del buf0
    # [Provenance debug handles] torch.ops.aten.convolution_backward.default:3
    buf6 = torch.ops.aten.convolution_backward.default(
        buf1, a, b, [2], (1,), (0,), (1,), False, (0,), 1, [True, True, True])
    # [Provenance debug handles] triton_poi_b_1:4
    triton_poi_b_1.run(buf1, buf2, buf7, 16, stream=stream0)
    buf9 = reinterpret_tensor(buf7, (2, ), (1, ), 0); del buf7  # reuse
    # [Provenance debug handles] cpp_fused_c_2:5
    cpp_fused_c_2(buf9, buf6)
    return (buf6, )
'''
    text, calls = instrument_wrapper(source, tag="t")
    assert [c.outputs for c in calls] == [["buf0"], ["buf1", "buf2"], ["buf6"], ["buf2", "buf7"], ["buf9"]]
    # what each call reads: in_out_ptr arguments as the buffer they reuse (buf9 is buf7's memory)
    assert [c.inputs for c in calls] == [[], ["buf0"], ["buf1"], ["buf1", "buf2"], ["buf6", "buf7"]]
    assert [(c.kernel, c.handle) for c in calls][2] == ("torch.ops.aten.convolution_backward.default", 3)
    lines = text.splitlines()
    assert lines[0] == "# t"
    for c in calls:
        assert not lines[c.line - 1].lstrip().startswith("#")
    taps = [line.strip() for line in lines if TAP in line]
    # outputs, then the buffers the call read that are its own arguments (buf7 was reused: gone)
    assert taps == [f"{TAP}(0, (buf0,), ())", f"{TAP}(1, (buf1, buf2,), (buf0,))", f"{TAP}(2, (buf6,), (buf1,))",
                    f"{TAP}(3, (buf2, buf7,), (buf1,))", f"{TAP}(4, (buf9,), (buf6,))"]
    # the multi-line call stays whole, its tap after its last line
    i = next(n for n, line in enumerate(lines) if "convolution_backward.default(" in line)
    assert lines[i + 2].strip() == f"{TAP}(2, (buf6,), (buf1,))"
    untouched = [line for line in lines[1:] if TAP not in line]
    assert untouched == source.splitlines()


def test_other_backend_falls_back_to_operators_with_one_warning(tmp_path):
    """kernels mode with a backend whose kernels cannot be observed: operator dump, one warning."""
    torch._dynamo.reset()
    cfg = write_config(tmp_path, extra={"opdump_settings": {"graph_dump": "kernels"}})
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session:
            compiled = torch.compile(model, backend=session.backend("aot_eager"))
            for _ in range(2):
                compiled(torch.randn(2, 4)).sum().backward()
    torch._dynamo.reset()
    msgs = [str(w.message) for w in caught if "graph_dump" in str(w.message)]
    assert len(msgs) <= 1        # once per backend name per process (another test may have warned)
    files = tensor_files(str(tmp_path / "dump"))
    assert any(f.op_type == "addmm" for f in files) and any(f.op_type == "relu" for f in files)


def test_failure_while_instrumenting_keeps_training_unchanged(tmp_path):
    """A fault after the kernels were compiled: one warning naming the graph, the compiled
    code runs unmarked, the loss is the plain compiled loss."""
    torch._dynamo.reset()
    cfg = write_config(tmp_path, extra={"opdump_settings": {"graph_dump": "kernels"}})
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh())
    plain_model = copy.deepcopy(model)
    x = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdump.Session(cfg) as session, faults.inject("compile:forward"):
            out = torch.compile(model, backend=session.backend())(x)
    torch._dynamo.reset()
    msgs = [str(w.message) for w in caught if "no longer dumped" in str(w.message)]
    assert len(msgs) == 1 and "instrumenting the forward graph's kernels" in msgs[0]
    assert torch.equal(out, torch.compile(plain_model, backend="inductor")(x))
    torch._dynamo.reset()


def test_user_inductor_options_are_kept_in_the_dumped_variant(tmp_path):
    """``torch.compile(mode=..., options=...)`` reaches opdump as torch's inductor wrapper (under
    ``opdump run``): its config patches shape the observed kernels too (here the kernel names)."""
    class Soft(nn.Module):
        def forward(self, x):
            return torch.relu(x).softmax(-1) * 3

    torch._dynamo.reset()
    cfg = write_config(tmp_path, extra={"opdump_settings": {"graph_dump": "kernels"}})
    real = torch._TorchCompileInductorWrapper(None, {"cpp.descriptive_names": "inductor_node"}, None)
    with torch.no_grad(), opdump.Session(cfg) as session:
        torch.compile(Soft(), backend=session.backend(real))(torch.randn(4, 8))
    torch._dynamo.reset()
    with open(tmp_path / "dump" / "rank_0" / "graphs" / "ms_output_trace_code_graph_0.kernels.json") as f:
        names = [k["kernel"] for k in json.load(f)["kernels"]]
    # inductor_node names list FX node names (amax, exp, sum_1…), the default lists ATen ops (_softmax)
    assert len(names) == 1 and "amax" in names[0] and "_softmax" not in names[0], names


def test_fused_operators_match_the_operator_dump(kernel_run, tmp_path):
    """A fused operator is found in an operator-level dump of the same model by scope, type,
    innermost source line and occurrence (README, "Kernel-level graph dump"): all of the
    forward's; in the backward all but the forward operators inductor's partitioner
    recomputes there."""
    import collections
    torch._dynamo.reset()
    cfg = write_config(tmp_path, common={"iteration": "0"})
    with opdump.Session(cfg) as session:
        torch.compile(KNet(), backend=session.backend("aot_eager"))(torch.randn(5, 8)).backward()
    torch._dynamo.reset()
    forward_types = set()
    for graph in (0, 1):
        with open(tmp_path / "dump" / "rank_0" / "graphs" / f"ms_output_trace_code_graph_{graph}.json") as f:
            operators = json.load(f)["ops"]
        def line(op):
            return (op["source"][-1]["file"], op["source"][-1]["line"]) if op["source"] else None

        seen, count = {}, collections.Counter()
        for op in operators:
            key = (op["scope"], op["op_type"], line(op))
            seen[key + (count[key],)] = op
            count[key] += 1
        fused = {f["full_name"]: f for k in _kernels(kernel_run, graph)["kernels"] for f in k["fused_operators"]}
        unmatched = set()
        for f in fused.values():
            if (f["scope"], f["op_type"], line(f), f["occurrence"]) not in seen:
                unmatched.add(f["op_type"])
        if graph == 0:
            assert unmatched == set() and len(fused) >= 8
            forward_types = {f["op_type"] for f in fused.values()}
        else:
            assert unmatched <= forward_types, unmatched     # recomputed in the backward by inductor
            assert len(fused) - len(unmatched) >= 8
