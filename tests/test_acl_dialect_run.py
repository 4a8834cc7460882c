"""The ACL / torchair / TF-adapter dialects run and write the ACL/GE layout (README "Other dialects").

The seeds' example configs are used verbatim, only their paths changed (and, where a seed's
operator or model names cannot exist in a PyTorch model, a second run with the names a user
reads from the ``.ir`` listing).  Files are decoded with the bin codec and compared with an
independent capture (forward hooks); real sessions, real torch, a real gloo process group.
"""
import csv
import glob
import json
import os
import re
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist

import opdump
from opdump.capture.eager import EagerCapture
from opdump.config import ConfigError
from opdump.config import options as npu_device
from opdump.config.loader import load_config
from opdump.format import acl_layout as acl
from opdump.format import ascend_bin
from opdump.format.files import MAPPING_FILE, parse_mapping, parse_tensor_name
from reliability_helpers import mount_tmpfs, umount


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 5)
        self.fc2 = torch.nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _model():
    torch.manual_seed(0)
    return Tiny()


X = torch.linspace(-1, 1, 8).reshape(2, 4)


def _hooked(model):
    """Independent capture: each Linear's output (= its addmm's output)."""
    seen = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_hook(lambda m, a, out, name=name: seen.__setitem__(name, out.detach().clone()))
    return seen


def _rank_folders(dump_path):
    return sorted(p for p in glob.glob(os.path.join(dump_path, "**", "*"), recursive=True)
                  if os.path.isdir(p) and acl.DEVICE_RE.match(os.path.basename(p))
                  and acl.TIME_RE.match(os.path.basename(os.path.dirname(p))))


def _files(folder):
    return sorted(f for f in os.listdir(folder) if os.path.isfile(os.path.join(folder, f)))


def _csv(path):
    with open(path, newline="") as fh:
        return list(csv.reader(fh))


def _dumped(rank):
    """Tensor files and statistics below a rank folder's data folders."""
    return [f for d, _, fs in os.walk(rank) for f in fs
            if acl.parse_bin_name(f) or f.endswith(".npy") or f == acl.STATISTIC_FILE]


def _run_eager(cfg, steps=1, model=None):
    model = model or _model()
    with opdump.Session(cfg) as s, EagerCapture(s):
        for _ in range(steps):
            model(X)
            s.step()
    return model


def _acl_json(tmp_path, dump, name="acl.json"):
    f = tmp_path / name
    f.write_text(json.dumps(dump))
    return load_config(str(f))


# ---------------------------------------------------------------- ACL model dump (seed 004), compiled + eager
@pytest.fixture(scope="module")
def model_dump(tmp_path_factory):
    """Seed 004's model-dump example with the graph names a user reads from the listing:
    graph_0 (eager) whole, graph_1 (compiled) only its addmm operators."""
    tmp = tmp_path_factory.mktemp("acl_model")
    (tmp / "output").mkdir()
    text = ('{ "dump":{ "dump_list":[ { "model_name":"graph_0" }, { "model_name":"graph_1", "layer":[ '
            '"addmm" ] } ], "dump_path":"$HOME/output", "dump_mode":"output", "dump_op_switch":"off", '
            '"dump_data":"tensor" } }')
    (tmp / "acl.json").write_text(text)
    cfg = load_config(str(tmp / "acl.json"), env={"HOME": str(tmp)})
    model = _model()
    seen = _hooked(model)
    with opdump.Session(cfg) as s:
        with EagerCapture(s):
            model(X)
        eager_seen = dict(seen)
        s.step()
        compiled = torch.compile(model, backend=s.backend())
        with torch.no_grad():
            compiled(X)
    return tmp / "output", eager_seen


def test_model_dump_layout_and_bytes(model_dump):
    out, seen = model_dump
    (rank,) = _rank_folders(str(out))
    assert os.path.dirname(os.path.dirname(rank)) == str(out)          # {dump_path}/{time}/{device_id}
    names = sorted(os.listdir(rank))
    assert names == [".dump_metadata", "execution_order", "graph_0", "graph_1", "graphs"]
    eager = os.path.join(rank, "graph_0", "0", "0")                     # {model_name}/{model_id}/{data_index}
    files = [f for f in _files(eager) if acl.parse_bin_name(f)]
    ops = {acl.parse_bin_name(f).op_name: f for f in files}
    assert any("addmm" in n for n in ops) and any("relu" in n for n in ops)
    for f in files:
        assert acl.BIN_NAME_RE.match(f)
    for layer in ("fc1", "fc2"):
        (name,) = [n for n in ops if f"{layer}-Linear_addmm" in n]
        dump = ascend_bin.read_header(os.path.join(eager, ops[name]))
        assert dump.inputs == ()                                        # dump_mode "output"
        got = ascend_bin.load(dump.path, "output", 0)
        np.testing.assert_array_equal(got, seen[layer].numpy())
        assert dump.op_name.endswith("addmm-op" + name.rsplit("-op", 1)[1])
    # the compiled graph: model_id 1, iteration 1, only its addmm operators (the layer list)
    compiled = os.path.join(rank, "graph_1", "1", "1")
    kinds = {acl.parse_bin_name(f).op_type for f in _files(compiled) if acl.parse_bin_name(f)}
    assert kinds == {"addmm"}
    ir = open(os.path.join(rank, "graphs", "ms_output_trace_code_graph_1.ir")).read()
    assert "# IR entry: @graph_1" in ir                                  # where a user finds model_name


def test_seed_004_verbatim_model_names_select_no_graph(tmp_path):
    """The seed's own model names name no opdump graph: nothing is dumped, the listing is."""
    (tmp_path / "output").mkdir()
    text = ('{ "dump":{ "dump_list":[ { "model_name":"ResNet-101" }, { "model_name":"ResNet-50", "layer":[ '
            '"conv1conv1_relu", "res2a_branch2ares2a_branch2a_relu", "res2a_branch1", "pool1" ] } ], '
            '"dump_path":"$HOME/output", "dump_mode":"output", "dump_op_switch":"off", "dump_data":"tensor" } }')
    (tmp_path / "acl.json").write_text(text)
    _run_eager(load_config(str(tmp_path / "acl.json"), env={"HOME": str(tmp_path)}))
    (rank,) = _rank_folders(str(tmp_path / "output"))
    assert not _dumped(rank)
    assert os.listdir(os.path.join(rank, "graphs"))


# ---------------------------------------------------------------- single-operator dump (seed 004 / 003)
def test_single_operator_dump_is_flat(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "output").mkdir()
    cfg = _acl_json(tmp_path, json.loads('{ "dump":{ "dump_path":"output", "dump_list":[], "dump_op_switch":"on", '
                                         '"dump_data":"tensor" } }'))
    model = _model()
    seen = _hooked(model)
    _run_eager(cfg, steps=2, model=model)
    (rank,) = _rank_folders(str(tmp_path / "output"))
    files = [f for f in _files(rank) if acl.parse_bin_name(f)]         # {dump_path}/{time}/{device_id}/{file}
    assert not [d for d in os.listdir(rank) if d.startswith("graph_")]
    fc2 = sorted(f for f in files if "fc2-Linear_addmm" in f)
    assert len(fc2) == 2                                               # one per iteration, told apart by timestamp
    got = ascend_bin.load(os.path.join(rank, fc2[-1]), "output", 0)
    np.testing.assert_array_equal(got, seen["fc2"].numpy())


# ---------------------------------------------------------------- TF adapter options (seed 001)
def _tf_options(path):
    npu = types.SimpleNamespace(device=npu_device)
    npu_device.global_options().dump_config = npu_device.DumpOptions(flavor="tf_adapter")
    # the seed's lines, dump_path changed
    npu_device.global_options().dump_config.enable_dump = True
    npu_device.global_options().dump_config.dump_path = path
    npu_device.global_options().dump_config.dump_step = "0|5|10"
    npu_device.global_options().dump_config.dump_mode = "all"
    npu.device.global_options().dump_config.dump_data = "stats"
    npu.device.global_options().dump_config.dump_layer = "nodename1 nodename2 nodename3"
    return npu_device.global_options().dump_config


def test_seed_001_tf_adapter_statistics(tmp_path):
    opts = _tf_options(str(tmp_path))
    with pytest.warns(UserWarning, match="matched no operator"):
        _run_eager(opts.to_config())                                    # the seed's layer names exist nowhere
    (rank,) = _rank_folders(str(tmp_path))
    assert not _dumped(rank)
    # the same with the names the listing shows (README: how to find them)
    other = tmp_path / "named"
    other.mkdir()
    opts = _tf_options(str(other))
    opts.dump_layer = "addmm relu"
    model = _model()
    seen = _hooked(model)
    _run_eager(opts.to_config(), steps=2, model=model)
    (rank,) = _rank_folders(str(other))
    assert sorted(os.listdir(os.path.join(rank, "graph_0", "0"))) == ["0"]       # dump_step 0|5|10: only 0
    header, *rows = _csv(os.path.join(rank, "graph_0", "0", "0", acl.STATISTIC_FILE))
    assert header[:10] == ["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size",
                           "Data Type", "Shape"]
    assert {r[0] for r in rows} == {"addmm", "relu"}
    (fc2,) = [r for r in rows if "fc2-Linear/addmm" in r[1] and r[5] == "output"]
    assert float(fc2[header.index("Max Value")]) == pytest.approx(float(seen["fc2"].max()), rel=1e-6)


# ---------------------------------------------------------------- torchair options (seed 003), world-size folder
def test_seed_003_torchair_world_folder(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        config = npu_device.CompilerConfig()
        config.dump_config.enable_dump = True
        config.dump_config.dump_mode = "all"
        config.dump_config.dump_path = str(tmp_path)
        config.dump_config.quant_dumpable = True
        config.dump_config.dump_step = "0|1"
        config.dump_config.dump_layer = "addmm relu"          # the seed's "Add_1Mul_1 Add2", our model's names
        model = _model()
        seen = _hooked(model)
        _run_eager(config.dump_config.to_config(), steps=3, model=model)
    finally:
        dist.destroy_process_group()
    (rank,) = _rank_folders(str(tmp_path))
    assert os.path.relpath(rank, tmp_path).split(os.sep)[0] == "worldsize1_global_rank0"
    assert sorted(os.listdir(os.path.join(rank, "graph_0", "0"))) == ["0", "1"]
    folder = os.path.join(rank, "graph_0", "0", "1")
    (fc1,) = [f for f in _files(folder) if "fc1-Linear_addmm" in f]
    dump = ascend_bin.read_header(os.path.join(folder, fc1))
    assert len(dump.inputs) == 3 and len(dump.outputs) == 1             # dump_mode "all": one file, both sides
    np.testing.assert_array_equal(ascend_bin.load(dump.path, "input", 1), X.numpy())
    np.testing.assert_array_equal(ascend_bin.load(dump.path, "output", 0), seen["fc1"].numpy())


def test_seed_003_dump_config_path_with_other_options_does_not_take_effect(tmp_path):
    """torchair: with other options set, the JSON file "does not take effect" (warned, options used)."""
    config = npu_device.CompilerConfig()
    config.dump_config.enable_dump = True
    config.dump_config.dump_mode = "all"
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.dump_config_path = str(tmp_path / "dump_config.json")
    with pytest.warns(UserWarning, match=r"is ignored: dump_config\.dump_path is set too"):   # the first one
        cfg = config.dump_config.to_config()
    assert cfg.path == str(tmp_path) and cfg.input_output == 0


# ---------------------------------------------------------------- npy in the ACL folders, long names, stats
def test_npy_file_format_in_acl_folders(tmp_path):
    model = _model()
    seen = _hooked(model)
    _run_eager(_acl_json(tmp_path, {"dump": {"dump_path": str(tmp_path), "dump_mode": "output",
                                             "file_format": "npy"}}), model=model)
    (rank,) = _rank_folders(str(tmp_path))
    folder = os.path.join(rank, "graph_0", "0", "0")
    names = [parse_tensor_name(f) for f in _files(folder) if f.endswith(".npy")]
    (fc1,) = [n for n in names if "fc1-Linear_addmm" in n.op_name]
    np.testing.assert_array_equal(np.load(os.path.join(folder, fc1.build())), seen["fc1"].numpy())


class _Deep(torch.nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.inner = _Deep(depth - 1) if depth else torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.inner(x)


def test_long_names_are_mapped(tmp_path):
    model = torch.nn.Sequential()
    model.add_module("a" * 240, _Deep(2))
    _run_eager(_acl_json(tmp_path, {"dump": {"dump_path": str(tmp_path), "dump_mode": "all"}}), model=model)
    (rank,) = _rank_folders(str(tmp_path))
    folder = os.path.join(rank, "graph_0", "0", "0")
    mapping = parse_mapping(open(os.path.join(folder, MAPPING_FILE)).read())
    assert mapping
    for mapped, original in mapping.items():
        assert re.fullmatch(r"\d{36}", mapped) and len(original.encode()) > 255
        parsed = acl.parse_bin_name(original)
        assert parsed is not None and ascend_bin.read_header(os.path.join(folder, mapped)).outputs
    assert all(len(f.encode()) <= 255 for f in _files(folder))


def test_acl_stats_csv(tmp_path):
    model = _model()
    seen = _hooked(model)
    _run_eager(_acl_json(tmp_path, {"dump": {"dump_path": str(tmp_path), "dump_mode": "output",
                                             "dump_data": "stats"}}), model=model)
    (rank,) = _rank_folders(str(tmp_path))
    folder = os.path.join(rank, "graph_0", "0", "0")
    assert _files(folder).count(acl.STATISTIC_FILE) == 1
    assert not [f for f in _files(folder) if acl.parse_bin_name(f) or f.endswith(".npy")]
    header, *rows = _csv(os.path.join(folder, acl.STATISTIC_FILE))
    (row,) = [r for r in rows if "fc1-Linear/addmm" in r[1]]
    assert float(row[header.index("Min Value")]) == pytest.approx(float(seen["fc1"].min()), rel=1e-6)


def test_mindspore_layout_bin_files(config_file, tmp_path):
    cfg = load_config(config_file(common={"file_format": "bin", "input_output": 2}))
    model = _model()
    seen = _hooked(model)
    _run_eager(cfg, model=model)
    folder = tmp_path / "dump" / "rank_0" / "Net" / "0" / "0"
    (fc2,) = [f for f in _files(folder) if "fc2-Linear_addmm" in f]
    np.testing.assert_array_equal(ascend_bin.load(str(folder / fc2), "output", 0), seen["fc2"].numpy())


# ---------------------------------------------------------------- forbidden combinations
def _field_of(make):
    with pytest.raises(ConfigError) as info:
        make()
    return info.value.field


def test_forbidden_combinations_name_the_field(tmp_path, config_file):
    missing = str(tmp_path / "absent")
    assert _field_of(lambda: opdump.Session(_acl_json(tmp_path, {"dump": {"dump_path": missing}}))) == \
        "dump.dump_path"
    assert _field_of(lambda: opdump.Session(npu_device.from_options(enable_dump=True, dump_path=missing))) == \
        "dump_config.dump_path"
    assert _field_of(lambda: _acl_json(tmp_path, {"dump": {"dump_path": str(tmp_path), "dump_data": "stats",
                                                           "file_format": "bin"}})) == "dump.dump_data"
    assert _field_of(lambda: _acl_json(tmp_path, {"dump": {"dump_path": str(tmp_path),
                                                           "file_format": "pb"}})) == "dump.file_format"
    assert _field_of(lambda: npu_device.from_options(enable_dump=True, dump_path=str(tmp_path),
                                                     file_format="raw")) == "dump_config.file_format"
    assert _field_of(lambda: npu_device.from_options(enable_dump=True, flavor="mxnet")) == "dump_config.flavor"
    assert _field_of(lambda: _acl_json(tmp_path, {"dump": {"dump_path": str(tmp_path), "dump_list": [
        {"model_name": "graph_0", "layer": ["name-regex(()"]}]}})) == "dump.dump_list[0].layer"
    cfg = load_config(config_file(common={"file_format": "bin"}, e2e={"sample_mode": 1}))
    assert _field_of(lambda: opdump.Session(cfg)) == "e2e_dump_settings.sample_mode"


def test_read_only_dump_path_is_refused(tmp_path):
    """A read-only mount (refused even for root, who ignores permission bits)."""
    ro = tmp_path / "ro"
    mount_tmpfs(ro, "size=1m,ro")
    try:
        assert _field_of(lambda: opdump.Session(_acl_json(tmp_path, {"dump": {"dump_path": str(ro)}}))) == \
            "dump.dump_path"
        assert os.listdir(ro) == []
    finally:
        umount(ro)
