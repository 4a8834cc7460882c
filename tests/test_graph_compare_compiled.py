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


def test_wrong_lowering_is_the_first_diverging_kernel(tmp_path, capfd):
    _register_wrong_lowering()
    torch.manual_seed(0)
    model, x = Wrong(), torch.randn(4, 8)
    report, out = _run(tmp_path, model, x, "Wrong")
    err = capfd.readouterr().err                         # the summary printed when the session closed
    summary = [line for line in err.splitlines() if line.startswith("opdump: compare_compiled:")]
    assert len(summary) == 1 and "first diverging kernel cpp_fused_" in summary[0] and "scale2" in summary[0]
    assert summary[0].endswith(f":{_line('WRONG-LINE')})")
    with open(tmp_path / "dump" / "rank_0" / "Wrong" / "0" / "0" / "compiled_vs_eager_graph_0.csv") as f:
        rows = [line.split(",") for line in f.read().splitlines()]
    assert rows[0][:7] == ["kernel_index", "kernel", "full_name", "slot", "buffer", "reference_node", "status"]
    assert [r[6] for r in rows[1:]] == ["equal", "diverged"]
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


class Drop(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        h = self.drop(torch.relu(self.fc1(x)))             # DROP-LINE
        torch._dynamo.graph_break()
        return self.fc2(h).square().sum()


def _train_drop(backend_of, cfg=None):
    torch.manual_seed(3)
    model = Drop()
    xs = [torch.randn(6, 8) for _ in range(3)]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, grads = [], []

    def steps(backend):
        compiled = torch.compile(model, backend=backend)
        for x in xs:
            loss = compiled(x)
            loss.backward()
            losses.append(loss.detach().clone())
            grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
            opt.zero_grad()

    torch._dynamo.reset()
    if cfg is None:
        steps("inductor")
    else:
        with opdump.Session(cfg) as session:
            steps(session.backend())
    torch._dynamo.reset()
    return losses, grads, [p.detach().clone() for p in model.parameters()]


def test_compare_keeps_training_bit_identical_with_dropout_and_graph_break(tmp_path):
    """The reference runs (eager and float64) draw random numbers too: the RNG state is restored
    before the compiled code runs, so a compared training (forward and backward, two graphs
    from a graph break, dropout) is bit-identical to the plain compiled one; dropout's kernels
    draw from inductor's generator: reported ``random``, and what follows from them is not
    named as a divergence."""
    cfg = write_config(tmp_path, common={"iteration": "0|1", "saved_data": "statistic", "net_name": "Drop"},
                       extra={"opdump_settings": {"graph_dump": "kernels", "compare_compiled": True}})
    compared = _train_drop(None, cfg)
    plain = _train_drop(None)
    for a, b in zip(compared[0], plain[0]):
        assert torch.equal(a, b)
    for step_a, step_b in zip(compared[1], plain[1]):
        assert all(torch.equal(a, b) for a, b in zip(step_a, step_b))
    assert all(torch.equal(a, b) for a, b in zip(compared[2], plain[2]))
    rank = tmp_path / "dump" / "rank_0" / "Drop"
    graphs = sorted(int(g) for g in os.listdir(rank))
    assert len(graphs) == 4                              # forward and backward of each side of the break
    reports = {g: [json.load(open(rank / str(g) / str(it) / f"compiled_vs_eager_graph_{g}.json")) for it in (0, 1)]
               for g in graphs}
    assert {r["kind"] for rs in reports.values() for r in rs} == {"forward", "backward"}
    forward = reports[graphs[0]][0]
    assert forward["kind"] == "forward" and forward["first_divergence"] is None, forward["first_divergence"]
    random = [k for k in forward["kernels"] if k["status"] == "random"]
    assert any(any("dropout" in name for name in k["fused_operators"])
               and any(s.endswith(f":{_line('DROP-LINE')}") for s in k["source"]) for k in random), forward
    assert all(r["first_divergence"] is None for rs in reports.values() for r in rs)


class WrongKeep(nn.Module):
    """The matmul's output is also a graph output, so the wrongly lowered kernel reads it
    instead of overwriting it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return torch.ops.opdump_test_k.scale2(torch.relu(h)) * 3.0, h


def test_tensors_saved_only_for_the_diverging_kernel_and_its_inputs(tmp_path):
    """saved_data "full" with compare_compiled: statistics for every kernel, tensor files only
    for the diverging kernel's outputs and the buffers it read."""
    from dumpfiles import tensor_files
    _register_wrong_lowering()
    torch.manual_seed(0)
    torch._dynamo.reset()
    cfg = write_config(tmp_path, common={"iteration": "0", "saved_data": "full", "net_name": "Keep"},
                       extra={"opdump_settings": {"graph_dump": "kernels", "compare_compiled": True}})
    with torch.no_grad(), opdump.Session(cfg) as session:
        torch.compile(WrongKeep(), backend=session.backend())(torch.randn(4, 8))
    torch._dynamo.reset()
    folder = tmp_path / "dump" / "rank_0" / "Keep" / "0" / "0"
    report = json.loads((folder / "compiled_vs_eager_graph_0.json").read_text())
    first = report["first_divergence"]
    assert first is not None and first["inputs"], first
    files = [f for f in tensor_files(str(tmp_path / "dump")) if not f.op_type.startswith("Parameter")]
    kinds = {(f.op_type, f.io) for f in files}
    assert kinds == {(first["kernel"], "output"), (first["kernel"], "input")}, kinds
    rows = (folder / "statistic.csv").read_text().splitlines()[1:]
    kernels_with_stats = {row.split(",")[0] for row in rows} - {"Parameter"}
    assert "addmm" in kernels_with_stats and first["kernel"] in kernels_with_stats
