"""opdump tried as a new user would, on models that are not in the zoo or the bench (README
"Quick start", "Eager mode", "Debug dumps", "Analysis"): small random ``transformers`` models
(T5, BART, Mistral, Qwen2, Gemma, DistilBERT, ConvNeXt, Wav2Vec2, Whisper, built from configs)
and hand-written models with known faults. What broke, each with its regression test here:

* A module called at top level (``model.attn(x)`` for a check, outside the model's forward)
  and then again inside the model in the same iteration got ``@1`` in the model's scope
  (``Default/Net/attn@1-Attn``): the call counts of top-level calls and of the root's
  children shared one key (parent path ``""``), so one iteration's names differed from the
  others' and compare/``kernels`` filters missed them.
* A parametrized attribute read outside the model (``conv.weight`` of a ``weight_norm``
  conv: transformers' weight initialisation of Wav2Vec2/HuBERT, a script logging a weight)
  runs a ``ParametrizationList`` module at top level, which eager capture took for a model
  call: before the first optimizer step every such read started a new iteration, so under
  ``opdump run`` iterations 0-2 of a Wav2Vec2 dump held one ``_weight_norm_interface``
  operator each and no operator of the model (now set aside: a depth counter in mode.py).
* ``opdump compare`` of two statistics dumps, graph against eager, raised "boolean value of NA
  is ambiguous": a compiled graph's lifted constants have statistics rows with no iteration.
* ``opdump ls`` printed ``saved_data=?`` for a config that leaves ``saved_data`` out.
* ``opdump run -m pkg.train`` through the ``opdump`` command could not import a package of the
  current folder (``python -m`` puts the current folder first on ``sys.path``).
* Kernel-level graph dump (``graph_dump: "kernels"``): a kernel that writes in place into the
  buffer of the extern call before it (DistilBERT's ``pre_classifier`` then ReLU: inductor's
  ``buf26 = buf25  # reuse``) was dumped with that buffer's earlier values (the recorder's
  same-tensor shortcut: a C++ kernel writes memory without bumping the version counter), and
  ``opdump compare`` of that dump against an eager one reported a false divergence at the ReLU.
* The eager overflow watch wrote an ``overflow.json`` for the iteration the last optimizer step
  opens, in which nothing runs (now: a summary only for an iteration in which an operator ran).
"""
import csv
import os

import pytest
import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from conftest import write_config


def _order(dump, iteration, graph=0):
    """The full names of one eager iteration, from its own execution-order CSV."""
    path = os.path.join(str(dump), "rank_0", "Net", str(graph), str(iteration), f"ms_execution_order_graph_{graph}.csv")
    with open(path, newline="") as f:
        rows = [r[0] for r in csv.reader(f)]
    return rows[1:]


class _Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.sub, self.out = nn.Linear(4, 4), _Sub(), nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.sub(self.inp(x)))


def test_top_level_call_of_a_submodule_does_not_rename_the_models_operators(tmp_path):
    torch.manual_seed(0)
    cfg = write_config(tmp_path, common={"saved_data": "statistic", "iteration": "0|1"})
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(cfg) as s, EagerCapture(s):
        for step in range(2):
            x = torch.randn(3, 4)
            if step == 1:
                with torch.no_grad():
                    model.sub(model.inp(x))          # a check outside the model's forward
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    first = [n for n in _order(tmp_path / "dump", 0) if n.startswith("Default/_Net/")]
    second = [n for n in _order(tmp_path / "dump", 1) if n.startswith("Default/_Net/")]
    assert any("/sub-_Sub/" in n for n in first)
    without_number = lambda names: [n.rsplit("-op", 1)[0] for n in names]     # the check's 5 operators shift N
    assert without_number(second) == without_number(first), [n for n in second if "@" in n]


class _WeightNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 4, 3, padding=1), dim=2)

    def forward(self, x):
        return self.conv(self.fc(x).transpose(1, 2)).sum()


def test_parametrized_weight_read_outside_the_model_is_not_an_iteration(tmp_path):
    torch.manual_seed(0)
    cfg = write_config(tmp_path, common={"saved_data": "statistic", "iteration": "0"})
    with opdump.Session(cfg) as s, EagerCapture(s):       # as under `opdump run`: capture on before the model exists
        model = _WeightNormed()
        for _ in range(3):
            model.conv.weight.norm()                         # what transformers' init (Wav2Vec2) or a logger does
        assert s.iteration == 0
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 5, 4)).backward()
        opt.step()
    names = _order(tmp_path / "dump", 0)
    assert any(n.endswith(tuple(f"/convolution-op{i}" for i in range(100))) for n in names), names
    assert any("/fc-Linear/addmm-op" in n for n in names), names


# ---------------------------------------------------------------- eager vs graph statistics, compare
class _WithConstant(nn.Module):
    """T5-like: a constant made in ``forward`` (lifted into the compiled graph as
    ``constants/Parameter.data-0``, a statistics row with no iteration)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return (self.fc(x) * torch.tensor([1.0, 2.0, 3.0, 4.0])).relu().sum()


def _stat_run(tmp_path, name, compiled):
    torch.manual_seed(0)
    cfg = write_config(tmp_path, common={"path": str(tmp_path / name), "saved_data": "statistic", "iteration": "0",
                                         "statistic_category": ["max", "min", "avg", "l2norm"]}, name=name + ".json")
    model = _WithConstant()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with opdump.Session(cfg) as s:
        if compiled:
            run = torch.compile(model, backend=s.backend("eager"))
            run(x).backward()
        else:
            with EagerCapture(s):
                model(x).backward()
        opt.step()
    return opdump.load(str(tmp_path / name))


def test_statistics_compare_graph_with_constants_against_eager(tmp_path):
    """Was: TypeError "boolean value of NA is ambiguous" (the constants' rows have no iteration)."""
    from opdump.analysis import compare
    graph, eager = _stat_run(tmp_path, "graph", True), _stat_run(tmp_path, "eager", False)
    assert graph.statistics().iteration.isna().any()          # the lifted constant's row
    result = compare(graph, eager)
    assert result.first_divergence is None
    assert (result.table.verdict == "pass").sum() > 10


def test_ls_shows_the_default_saved_data_of_a_config_that_leaves_it_out(tmp_path):
    """Was ``saved_data=?`` (the README's debug-mode configs leave the field out; its default is tensor)."""
    import json
    import subprocess
    import sys
    cfg = tmp_path / "data_dump.json"
    cfg.write_text(json.dumps({"common_dump_settings": {"path": str(tmp_path / "dump"), "iteration": "0"}}))
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    with opdump.Session(str(cfg)) as s, EagerCapture(s):
        model(torch.randn(2, 3)).sum().backward()
    out = subprocess.run([sys.executable, "-m", "opdump", "ls", str(tmp_path / "dump")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "saved_data=tensor;" in out.stdout, out.stdout


def test_launcher_runs_a_module_of_the_current_folder_like_python_m(tmp_path):
    """``opdump run -m pkg.train`` from the folder holding ``pkg`` (the README's launcher line):
    was ModuleNotFoundError through the ``opdump`` command, whose sys.path[0] is its bin folder;
    ``python -m`` puts the current folder first, and so does the launcher now."""
    import json
    import subprocess
    import sys
    command = os.path.join(os.path.dirname(sys.executable), "opdump")
    if not os.path.exists(command):
        pytest.skip("the opdump console script is not installed beside this Python (pip install -e .)")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(
        "import torch\nm = torch.nn.Linear(3, 2)\nm(torch.randn(2, 3)).sum().backward()\nprint('trained')\n")
    cfg = tmp_path / "data_dump.json"
    cfg.write_text(json.dumps({"common_dump_settings": {"path": str(tmp_path / "dump"), "iteration": "0"}}))
    out = subprocess.run([command, "run", "--config", str(cfg), "-m", "pkg.train"], cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "trained" in out.stdout
    assert os.path.isdir(tmp_path / "dump" / "rank_0" / "Net" / "0" / "0")


def test_overflow_watch_writes_no_summary_for_an_iteration_without_operators(tmp_path):
    """Two training steps are two iterations: ``opdump overflow`` said "3 iteration folder(s)"."""
    torch.manual_seed(0)
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opdump.Session(cfg) as s, EagerCapture(s):
        for _ in range(2):
            model(torch.randn(2, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
    folder = tmp_path / "dump" / "rank_0" / "Net" / "0"
    assert (folder / "1" / "overflow.json").exists()
    assert sorted(os.listdir(folder)) == ["0", "1"]


# ---------------------------------------------------------------- kernel-level graph dump
class _LinearRelu(nn.Module):
    """DistilBERT's classifier head: inductor runs the ReLU in place on the addmm's output
    buffer (``buf26 = buf25; del buf25  # reuse`` then ``cpp_fused_relu_3(buf26)``)."""

    def __init__(self):
        super().__init__()
        self.pre, self.out = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.out(torch.relu(self.pre(x))).sum()


def test_kernel_dump_of_an_in_place_kernel_holds_its_result_not_the_buffer_before(tmp_path):
    """Was: the ReLU kernel's output file and statistics row held the addmm's values (negative
    numbers): the recorder took the buffer for the tensor it had just recorded, unmodified
    (a C++ kernel writes memory without bumping the version counter)."""
    import glob
    import numpy as np
    torch.manual_seed(0)
    cfg = write_config(tmp_path, common={"saved_data": "full", "iteration": "0"},
                       extra={"opdump_settings": {"graph_dump": "kernels"}})
    model = _LinearRelu()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = torch.relu(model.pre(x)).numpy()
    with opdump.Session(cfg) as s:
        torch.compile(model, backend=s.backend())(x).backward()
    folder = tmp_path / "dump" / "rank_0" / "Net" / "0" / "0"
    relu = [f for f in glob.glob(str(folder / "cpp_fused_*relu*output.0.*.npy"))]
    assert len(relu) == 1, sorted(os.listdir(folder))
    np.testing.assert_array_equal(np.load(relu[0]), want)
    stats = opdump.load(str(tmp_path / "dump")).statistics()
    row = stats[stats.op.str.contains("cpp_fused_") & stats.op.str.contains("relu") & (stats.io == "output")
                & (stats.graph == 0)]
    assert len(row) == 1 and float(row["min"].iloc[0]) >= 0.0, row[["op", "min", "max"]]
