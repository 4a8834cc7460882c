"""``opdump compare`` of a kernel-level graph dump against an operator or eager dump
(README, "Kernel-level graph dump"; :mod:`opdump.analysis.compare.kernels`).

The same tiny model, same seed and batches, is run three times (one compiled run each,
module-scoped: every inductor compile costs tens of seconds here): ``graph_dump:
"kernels"``, ``graph_dump: "operators"`` and eager.  ``opdump compare`` runs as a real
subprocess: every kernel buffer that stores an operator output (``kernels.json``) is paired
with that operator's output and passes; buffers holding no operator output are reported
as kernel temporaries, not unmatched.  A custom operator given a deliberately wrong inductor
lowering (x * 2.5 where it computes x * 2) makes the compare name the kernel that fuses it,
the operator it is matched with and the source line."""
import copy
from collections import Counter
import csv
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import opdump
from conftest import write_config
from opdump.capture.eager import EagerCapture

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DUMPED = 1


class CNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.ln = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x)) * 2 + 1
        h = self.ln(h)
        return self.fc2(h).square().mean()


def _line(marker):
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if marker in text and "_line(" not in text)


def _run(tmp, mode):
    """Two SGD steps of CNet (iteration 1 dumped, tensors and statistics); mode: kernels | operators | eager."""
    torch._dynamo.reset()
    extra = {"opdump_settings": {"graph_dump": mode}} if mode != "eager" else None
    cfg = write_config(tmp, common={"iteration": str(DUMPED), "saved_data": "full"}, extra=extra)
    torch.manual_seed(0)
    model = CNet()
    xs = [torch.randn(5, 8) for _ in range(2)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(cfg) as session:
        if mode == "eager":
            with EagerCapture(session):
                for x in xs:
                    model(x).backward()
                    opt.step()
                    opt.zero_grad()
        else:
            compiled = torch.compile(model, backend=session.backend())
            for x in xs:
                compiled(x).backward()
                opt.step()
                opt.zero_grad()
    torch._dynamo.reset()
    return str(tmp / "dump")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    return {mode: _run(tmp_path_factory.mktemp(mode), mode) for mode in ("kernels", "operators", "eager")}


def _compare(a, b, tmp):
    """``opdump compare A B --json`` as a subprocess → (exit code, summary, table rows)."""
    out = os.path.join(str(tmp), f"cmp_{len(os.listdir(str(tmp)))}.csv")
    proc = subprocess.run([sys.executable, "-m", "opdump", "compare", a, b, "--json", "--csv", out, "-q"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    with open(out, newline="") as f:
        return proc.returncode, json.loads(proc.stdout), list(csv.DictReader(f))


def _stored_buffers(dump):
    """(kernel full name, slot) of every kernel buffer that stores an operator output, and of the
    buffers that hold none, from the dump's kernels.json files."""
    stored, temporary = set(), set()
    graphs = os.path.join(dump, "rank_0", "graphs")
    for name in sorted(os.listdir(graphs)):
        if not name.endswith(".kernels.json"):
            continue
        with open(os.path.join(graphs, name)) as f:
            for k in json.load(f)["kernels"]:
                for slot, buf in enumerate(k["outputs"]):
                    holds = buf["stores"] and buf.get("stores_output") is not False
                    (stored if holds else temporary).add((k["full_name"], slot))
    return stored, temporary


@pytest.mark.parametrize("reference", ["operators", "eager"])
def test_kernel_dump_against_operator_dump(dumps, reference, tmp_path):
    code, summary, rows = _compare(dumps["kernels"], dumps[reference], tmp_path)
    stored, temporary = _stored_buffers(dumps["kernels"])
    assert len(stored) >= 10 and temporary            # the LayerNorm kernels keep temporaries
    paired = {(r["op"], int(r["slot"])): r for r in rows if r["match"] == "kernel buffer"}
    assert set(paired) == stored                      # every buffer that stores an operator output
    assert {r["verdict"] for r in paired.values()} == {"pass"}
    assert all(r["op_b"] and "cpp_fused" not in r["op_b"] for r in paired.values())
    ln = [r for k, r in paired.items() if "native_layer_norm_relu" in k[0]]
    assert {r["op_b"].rsplit("/", 1)[1].split("-op")[0] for r in ln} == {"native_layer_norm"}
    temps = {(r["op"], int(r["slot"])) for r in rows if r["match"] == "kernel temporary"}
    assert temps == temporary
    assert summary["unmatched_a"] == []               # nothing of the kernel dump is noise
    assert summary["kernel_only_a"] and summary["kernel_only_b"]
    # only the eager optimizer's operators (outside the compiled graphs) stay unmatched in B
    assert all("optimizer" in name for name in summary["unmatched_b"]), summary["unmatched_b"]
    assert summary["first_divergence"] is None and summary["first_difference"] is None
    assert code == 0


def test_statistics_only_dumps(dumps, tmp_path):
    """``saved_data: "statistic"`` dumps (here: the dumps with their tensor files removed, which
    leaves what a statistics-only run writes): the same pairs, judged on statistics, and the
    slots of equal shape (``native_layer_norm``'s mean and rstd) told apart by their statistics."""
    copies = {}
    for mode in ("kernels", "operators"):
        copies[mode] = str(tmp_path / mode)
        shutil.copytree(dumps[mode], copies[mode])
        for folder, _, files in os.walk(copies[mode]):
            for name in files:
                if name.endswith(".npy"):
                    os.remove(os.path.join(folder, name))
    out = tmp_path / "out"
    out.mkdir()
    code, summary, rows = _compare(copies["kernels"], copies["operators"], out)
    stored, _ = _stored_buffers(dumps["kernels"])
    paired = {(r["op"], int(r["slot"])): r for r in rows if r["match"] == "kernel buffer"}
    assert set(paired) == stored
    assert {r["mode"] for r in paired.values()} == {"statistics"}
    assert {r["verdict"] for r in paired.values()} == {"pass"}, [r for r in paired.values() if r["verdict"] != "pass"]
    assert code == 0


def test_operator_dump_against_kernel_dump(dumps, tmp_path):
    """The kernel dump as the reference (B): the same pairs, from the other side."""
    code, summary, rows = _compare(dumps["operators"], dumps["kernels"], tmp_path)
    stored, _ = _stored_buffers(dumps["kernels"])
    # the table's slot is A's: count B's buffers per kernel
    paired = Counter(r["op_b"] for r in rows if r["match"] == "kernel buffer")
    assert paired == Counter(name for name, _ in stored)
    assert summary["unmatched_b"] == [] and summary["first_divergence"] is None and code == 0


def test_two_kernel_dumps_compare_kernel_by_kernel(dumps, tmp_path):
    """Kernel dump against kernel dump: kernels pair with kernels by name, nothing is labelled."""
    code, summary, rows = _compare(dumps["kernels"], dumps["kernels"], tmp_path)
    assert {r["match"] for r in rows} == {"name"} and {r["verdict"] for r in rows} == {"pass"}
    assert not summary["kernel_only_a"] and not summary["kernel_only_b"] and code == 0


# ---------------------------------------------------------------- a wrong lowering
_lib = torch.library.Library("opdump_test_kc", "DEF")
_lib.define("scale2(Tensor x) -> Tensor")
_lib.impl("scale2", lambda x: x * 2, "CompositeExplicitAutograd")
_lib.impl("scale2", lambda x: torch.empty_like(x), "Meta")


def _register_wrong_lowering():
    from torch._inductor.lowering import lowerings, register_lowering

    @register_lowering(torch.ops.opdump_test_kc.scale2.default)
    def _wrong(x):
        return lowerings[torch.ops.aten.mul.Tensor](x, 2.5)          # the operator computes x * 2


class Wrong(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.fc(x)) + 1.0
        return torch.ops.opdump_test_kc.scale2(h) * 3.0      # WRONG-LINE


def _inference(tmp, mode, model, x):
    torch._dynamo.reset()
    cfg = write_config(tmp, common={"iteration": "0", "saved_data": "full", "net_name": "Wrong"},
                       extra={"opdump_settings": {"graph_dump": mode}})
    with torch.no_grad(), opdump.Session(cfg) as session:
        torch.compile(model, backend=session.backend())(x)
    torch._dynamo.reset()
    return str(tmp / "dump")


def test_wrong_lowering_names_the_kernel_and_operator(tmp_path_factory, tmp_path):
    _register_wrong_lowering()
    torch.manual_seed(0)
    model, x = Wrong(), torch.randn(4, 8)
    kernels = _inference(tmp_path_factory.mktemp("wk"), "kernels", copy.deepcopy(model), x)
    operators = _inference(tmp_path_factory.mktemp("wo"), "operators", copy.deepcopy(model), x)
    code, summary, rows = _compare(kernels, operators, tmp_path)
    assert code == 1
    first = summary["first_divergence"]
    assert first is not None and "cpp_fused_" in first["op"], summary
    assert first["op_b"].rsplit("/", 1)[1].startswith("mul-op")        # the operator its buffer stores
    assert first["source"].endswith(f"{os.path.basename(__file__)}:{_line('WRONG-LINE')}")
    with open(os.path.join(kernels, "rank_0", "graphs", "ms_output_trace_code_graph_0.kernels.json")) as f:
        listing = {k["full_name"]: k for k in json.load(f)["kernels"]}
    fused = [op["full_name"] for op in listing[first["op"]]["fused_operators"]]
    assert any("/scale2-op" in name for name in fused)
    matmul = [r for r in rows if r["match"] == "kernel buffer" and r["op"].endswith("addmm-op0")]
    assert [r["verdict"] for r in matmul] == ["pass"]                  # the kernel before it matches
