"""ACL/torchair ``{"dump": ...}`` dialect and the options object (README "Other dialects")."""
import json

import pytest

from opdump.config import ConfigError, DumpConfig, IterationSpec
from opdump.config.loader import load_config, load_config_dict
from opdump.config.options import DumpOptions, from_options


def load(dump, **top):
    return load_config_dict({"dump": dump, **top}, file="/cfg/acl.json", env={"HOME": "/home/u"})


def error(dump, **top):
    with pytest.raises(ConfigError) as info:
        load(dump, **top)
    assert str(info.value).startswith("/cfg/acl.json: ")
    return info.value


def test_seed_model_dump_example(tmp_path):
    text = ('{ "dump":{ "dump_list":[ { "model_name":"ResNet-101" }, { "model_name":"ResNet-50", "layer":[ '
            '"conv1conv1_relu", "res2a_branch2ares2a_branch2a_relu", "res2a_branch1", "pool1" ] } ], '
            '"dump_path":"$HOME/output", "dump_mode":"output", "dump_op_switch":"off", "dump_data":"tensor" } }')
    f = tmp_path / "acl.json"
    f.write_text(text)
    cfg = load_config(str(f), env={"HOME": str(tmp_path)})
    assert cfg == DumpConfig(path=str(tmp_path / "output"), input_output=2, file_format="bin",
                             model_filter=(("ResNet-101", ()), ("ResNet-50", ("conv1conv1_relu",
                                           "res2a_branch2ares2a_branch2a_relu", "res2a_branch1", "pool1"))),
                             layout="acl", dialect="acl", source_file=str(f))
    assert cfg.dump_mode == 0          # ResNet-101 is dumped whole, so no kernel filter
    assert cfg.source_bytes == text.encode()


def test_layers_become_kernels_when_every_entry_has_them():
    cfg = load({"dump_path": "/o", "dump_list": [{"model_name": "m", "layer": ["a", "b"]}, {"layer": ["b", "c"]}]})
    assert (cfg.dump_mode, cfg.kernels) == (1, ("a", "b", "c"))


def test_single_operator_examples():
    for dump in ({"dump_path": "/o", "dump_list": [], "dump_op_switch": "on", "dump_data": "tensor"},
                 {"dump_path": "/o", "dump_list": [], "dump_data": "tensor"}):
        cfg = load(dump)
        assert (cfg.dump_mode, cfg.kernels, cfg.saved_data, cfg.path) == (0, (), "tensor", "/o")


def test_overflow_example_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load({"dump_path": "output", "dump_debug": "on"})
    assert (cfg.op_debug_mode, cfg.input_output, cfg.path) == (3, 0, str(tmp_path / "output"))


def test_watcher_example():
    cfg = load({"dump_list": [{"layer": ["A", "B"], "watcher_nodes": ["C", "D"]}], "dump_path": "/home/",
                "dump_mode": "output", "dump_scene": "watcher"})
    assert (cfg.dump_scene, cfg.dump_mode, cfg.path) == ("watcher", 0, "/home")


def test_watcher_without_layer_watches_after_every_operator():
    cfg = load({"dump_list": [{"watcher_nodes": ["C"]}], "dump_path": "/o", "dump_scene": "watcher"})
    assert cfg.dump_scene == "watcher" and cfg.kernels == ()


@pytest.mark.parametrize("mode, io", [("input", 1), ("output", 2), ("all", 0)])
def test_dump_mode(mode, io):
    assert load({"dump_path": "/o", "dump_mode": mode}).input_output == io


def test_defaults_and_step():
    cfg = load({"dump_path": "/o", "dump_step": "0|5-8", "dump_data": "stats"})
    assert (cfg.input_output, cfg.saved_data, cfg.iteration) == (2, "statistic", IterationSpec(ranges=((0, 0), (5, 8))))
    assert cfg.dump_statistics and not cfg.dump_tensors


def test_opdump_settings_beside_dump():
    cfg = load({"dump_path": "/o"}, opdump_settings={"writer_threads": 4})
    assert cfg.writer_threads == 4


@pytest.mark.parametrize("dump, field, hint", [
    ({"dump_path": "/o", "dump_mod": "all"}, "dump.dump_mod", 'did you mean "dump_mode"?'),
    ({"dump_path": "/o", "dump_list": [{"model_nam": "m"}]}, "dump.dump_list[0].model_nam", 'did you mean "model_name"?'),
    ({"dump_path": "/o", "dump_list": [{"layers": ["a"]}]}, "dump.dump_list[0].layers", 'did you mean "layer"?'),
    ({"dump_path": "/o", "dump_mode": "both"}, "dump.dump_mode", 'must be "input", "output" or "all"'),
    ({"dump_path": "/o", "dump_data": "statistic"}, "dump.dump_data", 'must be "tensor" or "stats"'),
    ({"dump_path": "/o", "dump_debug": True}, "dump.dump_debug", 'must be "on" or "off"'),
    ({"dump_path": "/o", "dump_op_switch": "yes"}, "dump.dump_op_switch", 'must be "on" or "off"'),
    ({"dump_path": "/o", "dump_scene": "lite"}, "dump.dump_scene", 'must be "watcher"'),
    ({"dump_path": "/o", "dump_step": "3-1"}, "dump.dump_step", "range start 3 is after end 1"),
    ({"dump_path": "/o", "dump_list": {}}, "dump.dump_list", "must be a list of objects"),
    ({"dump_path": "/o", "dump_list": ["m"]}, "dump.dump_list[0]", "must be a JSON object"),
    ({"dump_path": "/o", "dump_list": [{"model_name": ""}]}, "dump.dump_list[0].model_name", "non-empty string"),
    ({"dump_path": "/o", "dump_list": [{"layer": "a"}]}, "dump.dump_list[0].layer", "must be a list of non-empty strings"),
    ({"dump_path": "/o", "dump_list": [{"layer": ["a", "a"]}]}, "dump.dump_list[0].layer", "lists 'a' twice"),
    ({"dump_path": "/o", "dump_list": [{"watcher_nodes": ["C"]}]}, "dump.dump_list[0].watcher_nodes",
     'only used with "dump_scene": "watcher"'),
    ({"dump_mode": "all"}, "dump.dump_path", "required"),
    ({"dump_path": ""}, "dump.dump_path", "required"),
    ({"dump_path": 3}, "dump.dump_path", "must be a string"),
    ({"dump_path": "/o p"}, "dump.dump_path", "character ' ' is not allowed"),
    ({"dump_path": "$NOPE/x"}, "dump.dump_path", "refers to $NOPE, which is not set"),
    # watcher restrictions (torchair's)
    ({"dump_path": "/o", "dump_scene": "watcher", "dump_debug": "on", "dump_list": [{"watcher_nodes": ["C"]}]},
     "dump.dump_debug", 'cannot be combined with "dump_scene": "watcher"'),
    ({"dump_path": "/o", "dump_scene": "watcher", "dump_op_switch": "on", "dump_list": [{"watcher_nodes": ["C"]}]},
     "dump.dump_op_switch", "cannot be combined"),
    ({"dump_path": "/o", "dump_scene": "watcher", "dump_mode": "all", "dump_list": [{"watcher_nodes": ["C"]}]},
     "dump.dump_mode", 'must be "output" with "dump_scene": "watcher"'),
    ({"dump_path": "/o", "dump_scene": "watcher", "dump_list": [{"model_name": "m", "watcher_nodes": ["C"]}]},
     "dump.dump_list[0].model_name", "is not supported"),
    ({"dump_path": "/o", "dump_scene": "watcher", "dump_list": [{"layer": ["A"]}]}, "dump.dump_list",
     "needs at least one entry with \"watcher_nodes\""),
])
def test_acl_errors(dump, field, hint):
    err = error(dump)
    assert err.field == field and hint in err.allowed


def test_acl_top_level_keys():
    err = error({"dump_path": "/o"}, opdump_setings={})
    assert err.field == "opdump_setings" and 'did you mean "opdump_settings"?' in err.allowed
    assert error([1]).field == "dump"


def test_acl_message_shape(tmp_path):
    f = tmp_path / "acl.json"
    f.write_text(json.dumps({"dump": {"dump_path": "/o", "dump_mode": "both"}}))
    with pytest.raises(ConfigError) as info:
        load_config(str(f), env={})
    assert str(info.value) == f'{f}: dump.dump_mode: \'both\': must be "input", "output" or "all"'


# ---------------------------------------------------------------- options object
def test_seed_001_options():
    cfg = from_options(enable_dump=True, dump_path="/home/HwHiAiUser/output", dump_step="0|5|10", dump_mode="all",
                       dump_data="stats", dump_layer="nodename1 nodename2  nodename3", env={})
    assert cfg == DumpConfig(path="/home/HwHiAiUser/output", iteration=IterationSpec(ranges=((0, 0), (5, 5), (10, 10))),
                             input_output=0, saved_data="statistic", dump_mode=1,
                             kernels=("nodename1", "nodename2", "nodename3"), layout="acl", dialect="options")


def test_options_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = DumpOptions().to_config(env={})
    assert (cfg.enable, cfg.path, cfg.input_output, cfg.saved_data, cfg.iteration.all) == (
        False, str(tmp_path), 2, "tensor", True)
    assert from_options(enable_dump=True, dump_path="out", env={}).path == str(tmp_path / "out")
    assert from_options(enable_dump=True, quant_dumpable=True, env={}).enable


def test_options_dump_config_path(tmp_path):
    f = tmp_path / "dump.json"
    f.write_text(json.dumps({"dump": {"dump_path": str(tmp_path), "dump_mode": "input"}}))
    cfg = from_options(dump_config_path=str(f), env={})
    assert cfg.enable and cfg.input_output == 1 and cfg.source_file == str(f) and cfg.dialect == "acl"
    assert not from_options(dump_config_path=str(f), enable_dump=False, env={}).enable
    ms = tmp_path / "ms.json"
    ms.write_text(json.dumps({"common_dump_settings": {"path": str(tmp_path)}}))
    assert from_options(enable_dump=True, dump_config_path=str(ms), env={}).dialect == "mindspore"


@pytest.mark.parametrize("kwargs, field, hint", [
    ({"dump_stpe": "1"}, "dump_config.dump_stpe", 'did you mean "dump_step"?'),
    ({"enable_dump": "yes"}, "dump_config.enable_dump", "must be true or false"),
    ({"dump_mode": "inputs"}, "dump_config.dump_mode", 'must be "input", "output" or "all"'),
    ({"dump_data": "tensors"}, "dump_config.dump_data", 'must be "tensor" or "stats"'),
    ({"dump_step": "1-"}, "dump_config.dump_step", "numbers on both sides"),
    ({"dump_layer": ["a"]}, "dump_config.dump_layer", "separated by spaces"),
    ({"dump_layer": "a a"}, "dump_config.dump_layer", "lists 'a' twice"),
    ({"dump_path": "/a b"}, "dump_config.dump_path", "is not allowed"),
    ({"dump_path": 5}, "dump_config.dump_path", "must be a string"),
])
def test_options_errors(kwargs, field, hint):
    with pytest.raises(ConfigError) as info:
        from_options(env={}, **kwargs)
    assert info.value.field == field and hint in str(info.value)


def test_options_config_path_errors_name_the_file(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text('{"dump": {"dump_path": "/o", "dump_mode": 1}}')
    with pytest.raises(ConfigError) as info:
        from_options(dump_config_path=str(f), env={})
    assert str(info.value).startswith(f"{f}: dump.dump_mode: 1: ")
