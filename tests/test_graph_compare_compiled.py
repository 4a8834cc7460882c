"""``compare_compiled`` (README, "Kernel-level graph dump"): in a dumped iteration the
operator reference runs on the same inputs, each kernel's output buffers are compared with
it, and the report names the first kernel where compiled and eager numerics part.

Two models whose compiled numerics differ from eager by construction:
* a bf16 chain of pointwise operators that inductor fuses into one C++ kernel (computed in
  fp32, rounded once; eager rounds after every operator): named as the first difference,
  classified ``fusion_precision`` (closer to the float64 reference), no real divergence;
* a custom operator given a deliberately wrong inductor lowering (x * 2.5 where the
  operator computes x * 2), after a matmul that matches: the first diverging kernel is
  the one that fuses it, with the operator's source line.
Each is one inference compile (forward only) in its own session."""
import json
import os

import pytest
import torch
import torch.nn as nn

import opdump
from conftest import write_config


def _line(marker):
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if marker in text and "_line(" not in text)


class Chain(nn.Module):
    def forward(self, x):
        y = torch.sin(x) * 1.7 + torch.exp(x) / 3.0          # CHAIN-LINE
        return torch.tanh(y * 0.9 - x) * 2.3 + y * y


_lib = torch.library.Library("opdump_test_k", "DEF")
_lib.define("scale2(Tensor x) -> Tensor")
_lib.impl("scale2", lambda x: x * 2, "CompositeExplicitAutograd")
_lib.impl("scale2", lambda x: torch.empty_like(x), "Meta")


def _register_wrong_lowering():
    from torch._inductor.lowering import lowerings, register_lowering

    @register_lowering(torch.ops.opdump_test_k.scale2.default)
    def _wrong(x):
        return lowerings[torch.ops.aten.mul.Tensor](x, 2.5)          # the operator computes x * 2


class Wrong(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.fc(x)) + 1.0
        return torch.ops.opdump_test_k.scale2(h) * 3.0      # WRONG-LINE


def _run(tmp, model, x, name):
    torch._dynamo.reset()
    cfg = write_config(tmp, common={"iteration": "0", "saved_data": "statistic", "net_name": name},
                       extra={"opdump_settings": {"graph_dump": "kernels", "compare_compiled": True}})
    with torch.no_grad(), opdump.Session(cfg) as session:
        out = torch.compile(model, backend=session.backend())(x)
    torch._dynamo.reset()
    folder = os.path.join(str(tmp / "dump"), "rank_0", name, "0", "0")
    with open(os.path.join(folder, "compiled_vs_eager_graph_0.json")) as f:
        return json.load(f), out


@pytest.fixture(scope="module")
def chain_report(tmp_path_factory):
    torch.manual_seed(0)
    x = torch.randn(64, 33).bfloat16()
    report, out = _run(tmp_path_factory.mktemp("chain"), Chain(), x, "Chain")
    return report, out, x


def test_bf16_fusion_is_expected_precision(chain_report):
    report, out, x = chain_report
    assert report["float64_reference"] is True
    first = report["first_difference"]
    assert first is not None and first["kernel"].startswith("cpp_fused_")
    fused = " ".join(first["fused_operators"])
    for op in ("sin", "exp", "tanh", "mul"):
        assert f"/{op}-op" in fused
    assert f"{os.path.basename(__file__)}:{_line('CHAIN-LINE')}" in " ".join(
        os.path.basename(s.split(":")[0]) + ":" + s.split(":")[1] for s in first["source"])
    assert first["status"] == "fusion_precision"
    metrics = first["outputs"][0]["metrics"][0]
    assert metrics["compiled_error_vs_float64"] <= metrics["eager_error_vs_float64"]
    assert metrics["max_abs"] > 0                       # the bf16 chain really differs from eager
    assert report["first_divergence"] is None           # nothing real to report
    assert torch.equal(out, torch.compile(Chain(), backend="inductor")(x))   # training keeps compiled values
    torch._dynamo.reset()


def test_wrong_lowering_is_the_first_diverging_kernel(tmp_path):
    _register_wrong_lowering()
    torch.manual_seed(0)
    model, x = Wrong(), torch.randn(4, 8)
    report, out = _run(tmp_path, model, x, "Wrong")
    first = report["first_divergence"]
    assert first is not None, report
    assert any("/scale2-op" in name for name in first["fused_operators"]), first
    assert any(s.endswith(f":{_line('WRONG-LINE')}") for s in first["source"])
    assert first["status"] == "diverged"
    mm = report["kernels"][0]                            # the matmul before it matches
    assert mm["kernel"] == "extern_kernels.addmm" and mm["status"] == "equal"
    assert first["index"] > mm["index"]
    # its input (the matmul's buffer, written in place by the fused kernel) matched the reference
    assert first["input_status"] and set(first["input_status"].values()) == {"equal"}
    with torch.no_grad():
        assert torch.allclose(out, (torch.relu(model.fc(x)) + 1.0) * 2.5 * 3.0)    # compiled values kept
