"""MindSpore dialect and the loader: files, env vars, every field good and bad."""
import json
import os

import pytest

from opdump.config import ALL_STATISTICS, ConfigError, DumpConfig, IterationSpec
from opdump.config.loader import load_config, load_config_dict

C, E, O = "common_dump_settings", "e2e_dump_settings", "opdump_settings"


def seed_cpu_gpu(path):
    """MindSpore's CPU/GPU example config, with a real path."""
    return {C: {"op_debug_mode": 0, "dump_mode": 0, "path": str(path), "net_name": "ResNet50",
                "iteration": "0|5-8|100-120", "saved_data": "tensor", "input_output": 0,
                "kernels": ["Default/Conv-op12"], "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
                "statistic_category": ["max", "min", "l2norm"]},
            E: {"enable": True, "trans_flag": True}}


def write(tmp_path, data, name="data_dump.json"):
    f = tmp_path / name
    f.write_text(data if isinstance(data, str) else json.dumps(data, indent=2))
    return str(f)


def with_field(tmp_path, section, key, value):
    data = {C: {"path": str(tmp_path)}}
    data.setdefault(section, {})[key] = value
    return data


def test_seed_cpu_gpu_example(tmp_path):
    f = write(tmp_path, seed_cpu_gpu(tmp_path / "dump"))
    cfg = load_config(f, env={})
    assert cfg == DumpConfig(path=str(tmp_path / "dump"), net_name="ResNet50",
                             iteration=IterationSpec(ranges=((0, 0), (5, 8), (100, 120))),
                             kernels=("Default/Conv-op12",), source_file=f)
    assert cfg.source_bytes == open(f, "rb").read()
    assert cfg.dialect == cfg.layout == "mindspore"
    assert cfg.dump_tensors and not cfg.dump_statistics and cfg.dump_inputs and cfg.dump_outputs


def test_seed_ascend_examples(tmp_path):
    o0 = seed_cpu_gpu(tmp_path)
    o0[E]["stat_calc_mode"] = "host"
    assert load_config_dict(o0, env={}).stat_calc_mode == "host"
    o2 = {C: dict(seed_cpu_gpu(tmp_path)[C], file_format="npy")}   # O2 has no e2e section
    cfg = load_config_dict(o2, env={})
    assert cfg.enable and cfg.file_format == "npy"


def test_source_bytes_are_verbatim(tmp_path):
    text = '\ufeff{ "common_dump_settings" : {"path": "%s"}  }\n\n' % tmp_path
    f = tmp_path / "c.json"
    f.write_bytes(text.encode("utf-8"))
    cfg = load_config(str(f), env={})
    assert cfg.source_bytes == text.encode("utf-8") and cfg.source_file == str(f)


def test_defaults_when_fields_missing(tmp_path):
    cfg = load_config_dict({C: {"path": str(tmp_path)}}, env={})
    assert cfg == DumpConfig(path=str(tmp_path))
    assert cfg.net_name == "Net" and cfg.iteration.all and cfg.statistic_category == ("max", "min", "l2norm")


def test_all_fields_set(tmp_path):
    data = {C: {"op_debug_mode": 0, "dump_mode": 1, "path": str(tmp_path) + "/a/../b/", "net_name": "my.net-1",
                "iteration": "all", "saved_data": "full", "input_output": 2, "kernels": ["conv", " name-regex(Default/.+) "],
                "support_device": [3, 4095], "statistic_category": ["md5", "finite max", "avg"],
                "overflow_number": 5, "file_format": "npy"},
            E: {"enable": False, "trans_flag": False, "stat_calc_mode": "device",
                "device_stat_precision_mode": "low", "sample_mode": 1, "sample_num": 7, "save_kernel_args": True},
            O: {"writer_queue_mb": 1, "writer_threads": 16, "eager_capture": "all"}}
    cfg = load_config_dict(data, env={})
    assert cfg.path == str(tmp_path / "b")
    assert (cfg.dump_mode, cfg.kernels, cfg.input_output) == (1, ("conv", "name-regex(Default/.+)"), 2)
    assert cfg.support_device == (3, 4095) and cfg.statistic_category == ("md5", "finite max", "avg")
    assert (cfg.enable, cfg.trans_flag, cfg.stat_calc_mode, cfg.device_stat_precision_mode) == (False, False, "device", "low")
    assert (cfg.sample_mode, cfg.save_kernel_args) == (1, True)
    assert (cfg.sample_num, cfg.overflow_number) == (7, 5)
    assert (cfg.writer_queue_mb, cfg.writer_threads, cfg.eager_capture, cfg.net_name) == (1, 16, "all", "my.net-1")


GOOD = [
    (C, "op_debug_mode", 3, 3), (C, "op_debug_mode", 0, 0),
    (C, "dump_mode", 2, 2), (C, "dump_mode", 0, 0),
    (C, "saved_data", "statistic", "statistic"), (C, "saved_data", "full", "full"),
    (C, "input_output", 1, 1),
    (C, "support_device", [], ()), (C, "support_device", [0], (0,)),
    (C, "statistic_category", list(ALL_STATISTICS), ALL_STATISTICS),
    (C, "statistic_category", ["finite min"], ("finite min",)),
    (C, "overflow_number", 0, 0), (C, "overflow_number", 10**6, 10**6),
    (C, "file_format", "bin", "bin"),
    (C, "kernels", [], ()), (C, "kernels", ["Default/AlexNet/conv3-Conv2d/convolution-op12"],
                             ("Default/AlexNet/conv3-Conv2d/convolution-op12",)),
    (C, "net_name", "A_b-9", "A_b-9"),
    (C, "iteration", "8 | 9", IterationSpec(ranges=((8, 9),))),
    (E, "enable", False, False), (E, "trans_flag", False, False), (E, "save_kernel_args", True, True),
    (E, "stat_calc_mode", "device", "device"), (E, "device_stat_precision_mode", "low", "low"),
    (E, "sample_mode", 1, 1), (E, "sample_num", 1, 1),
    (O, "writer_queue_mb", 4096, 4096), (O, "writer_threads", 1, 1), (O, "eager_capture", "model", "model"),
]


@pytest.mark.parametrize("section, key, value, expected", GOOD)
def test_good_values(tmp_path, section, key, value, expected):
    cfg = load_config_dict(with_field(tmp_path, section, key, value), env={})
    assert getattr(cfg, key, None) == expected          # None: accepted, checked, not kept


BAD = [
    (C, "op_debug_mode", 1, "must be an integer 0, 3 or 4"),
    (C, "op_debug_mode", "0", "must be an integer 0, 3 or 4"),
    (C, "dump_mode", 3, "must be an integer 0, 1 or 2"),
    (C, "dump_mode", 1.0, "must be an integer 0, 1 or 2"),
    (C, "input_output", "2", "must be an integer 0, 1 or 2"),
    (C, "input_output", True, "must be an integer 0, 1 or 2"),
    (C, "input_output", -1, "must be an integer 0, 1 or 2"),
    (C, "saved_data", "tensors", 'must be "tensor", "statistic" or "full"'),
    (C, "saved_data", None, 'must be "tensor", "statistic" or "full"'),
    (C, "file_format", "NPY", 'must be "npy" or "bin"'),
    (C, "overflow_number", -1, "must be an integer >= 0"),
    (C, "overflow_number", False, "must be an integer >= 0"),
    (C, "kernels", "Default/Conv-op12", "must be a list of non-empty strings"),
    (C, "kernels", ["a", ""], "entry '' is not a non-empty string"),
    (C, "kernels", ["a", "  "], "is not a non-empty string"),
    (C, "kernels", [1], "entry 1 is not a non-empty string"),
    (C, "kernels", ["a", "a"], "lists 'a' twice"),
    (C, "kernels", ["name-regex(Default/(.+)"], "invalid regular expression: missing ), unterminated subpattern"),
    (C, "support_device", [0, 4096], "entry 4096 is not a device id (an integer from 0 to 4095)"),
    (C, "support_device", [-1], "is not a device id"),
    (C, "support_device", [True], "is not a device id"),
    (C, "support_device", [1, 1], "lists 1 twice"),
    (C, "support_device", 0, "must be a list of device ids"),
    (C, "statistic_category", ["max", "mean"], "'mean' is not a statistic; valid: \"max\", \"min\", \"avg\""),
    (C, "statistic_category", ["max", "max"], "lists 'max' twice"),
    (C, "statistic_category", [], "must name at least one statistic"),
    (C, "statistic_category", "max", "must be a list of statistic names"),
    (C, "net_name", "", "must be a non-empty string"),
    (C, "net_name", "..", "must name a directory"),
    (C, "net_name", "a/b", "character '/' is not allowed; use only letters, digits, '_', '-' and '.'"),
    (C, "net_name", "a b", "character ' ' is not allowed"),
    (C, "net_name", 5, "must be a non-empty string"),
    (C, "iteration", "5-3", "range start 5 is after end 3"),
    (C, "iteration", 5, "must be a string"),
    (C, "path", "relative/dir", "must be an absolute path"),
    (C, "path", "/tmp/a b", "character ' ' is not allowed in a dump path; use only letters, digits, '_', '-', '.' and '/'"),
    (C, "path", "/tmp/a\nb", "character '\\n' is not allowed"),
    (C, "path", "/tmp/a\x00b", "character '\\x00' is not allowed"),
    (C, "path", "/tmp/d\u00e9j\u00e0", "is not allowed"),
    (C, "path", "/tmp/$HOME", "character '$' is not allowed"),
    (C, "path", 7, "must be a string"),
    (E, "enable", 1, "must be true or false"),
    (E, "enable", "true", "must be true or false"),
    (E, "trans_flag", None, "must be true or false"),
    (E, "save_kernel_args", 0, "must be true or false"),
    (E, "stat_calc_mode", "cpu", 'must be "host" or "device"'),
    (E, "device_stat_precision_mode", "medium", 'must be "high" or "low"'),
    (E, "sample_mode", 2, "must be an integer 0 or 1"),
    (E, "sample_num", 0, "must be an integer >= 1"),
    (O, "writer_queue_mb", 0, "must be an integer from 1 to 1048576"),
    (O, "writer_threads", 17, "must be an integer from 1 to 16"),
    (O, "eager_capture", "everything", 'must be "model" or "all"'),
]


@pytest.mark.parametrize("section, key, value, allowed", BAD)
def test_bad_values_name_file_field_value_allowed(tmp_path, section, key, value, allowed):
    f = write(tmp_path, with_field(tmp_path, section, key, value))
    with pytest.raises(ConfigError) as info:
        load_config(f, env={})
    err = info.value
    assert (err.field, err.value, err.file) == (f"{section}.{key}", value, f)
    assert str(err) == f"{f}: {section}.{key}: {value!r}: {err.allowed}"
    assert allowed in err.allowed


@pytest.mark.parametrize("section, key, hint", [
    (C, "iteraton", 'did you mean "iteration"?'),
    (C, "kernel", 'did you mean "kernels"?'),
    (E, "enabled", 'did you mean "enable"?'),
    (E, "sample_nums", 'did you mean "sample_num"?'),
    (O, "writer_thread", 'did you mean "writer_threads"?'),
    (C, "zzz", "known: op_debug_mode, dump_mode, path"),
])
def test_unknown_field_suggests(tmp_path, section, key, hint):
    f = write(tmp_path, with_field(tmp_path, section, key, "0"))
    with pytest.raises(ConfigError) as info:
        load_config(f, env={})
    msg = str(info.value)
    assert msg.startswith(f"{f}: {section}.{key}: '0': unknown field; ")
    assert hint in msg


@pytest.mark.parametrize("data, field, hint", [
    ({"common_dump_setting": {}}, "common_dump_setting", 'did you mean "common_dump_settings"?'),
    ({C: {}, "e2e_dump_setings": {}}, "e2e_dump_setings", 'did you mean "e2e_dump_settings"?'),
    ({E: {"enable": True}}, C, "required section"),
    ({C: []}, C, "must be a JSON object"),
    ({C: {}, E: 1}, E, "must be a JSON object"),
    ({"foo": 1}, "(top level)", '{"common_dump_settings": {...}, "e2e_dump_settings": {...}}'),
    ({}, "(top level)", '{"dump": {...}}'),
    ([1], "(top level)", "must be a JSON object"),
])
def test_shape_errors(tmp_path, data, field, hint):
    with pytest.raises(ConfigError) as info:
        load_config_dict(data, file="/x/c.json", env={"OPDUMP_DIAGNOSTIC_DATA_PATH": str(tmp_path)})
    assert info.value.field == field and hint in str(info.value) and str(info.value).startswith("/x/c.json: ")


# ---------------------------------------------------------------- combinations
@pytest.mark.parametrize("common, e2e, field, hint", [
    ({"saved_data": "statistic", "file_format": "bin"}, {}, "saved_data", 'need common_dump_settings.file_format "npy"'),
    ({"saved_data": "full", "file_format": "bin"}, {}, "saved_data", '"bin"'),
    ({"op_debug_mode": 3, "input_output": 1}, {}, "input_output", "must be 0 when common_dump_settings.op_debug_mode is 3"),
    ({"op_debug_mode": 4, "saved_data": "full"}, {}, "saved_data", 'must be "tensor" when'),
    ({"op_debug_mode": 4, "input_output": 2}, {}, "input_output", "exception dump saves only inputs"),
    ({"op_debug_mode": 3}, {"sample_mode": 1}, "sample_mode", "must be 0 when"),
    ({"dump_mode": 1}, {}, "kernels", "must name at least one kernel when common_dump_settings.dump_mode is 1"),
    ({"dump_mode": 1, "kernels": []}, {}, "kernels", "must name at least one kernel"),
])
def test_forbidden_combinations(tmp_path, common, e2e, field, hint):
    data = {C: dict(common, path=str(tmp_path)), E: e2e}
    with pytest.raises(ConfigError) as info:
        load_config_dict(data, file="c.json", env={})
    section = E if field == "sample_mode" else C
    assert info.value.field == f"{section}.{field}" and hint in str(info.value)


def test_op_debug_mode_4_normalises(tmp_path):
    cfg = load_config_dict({C: {"path": str(tmp_path), "op_debug_mode": 4, "input_output": 0, "dump_mode": 1,
                                "kernels": ["conv"], "iteration": "3|5"}}, env={})
    assert (cfg.input_output, cfg.dump_mode, cfg.iteration) == (1, 0, IterationSpec(all=True))
    assert cfg.dump_inputs and not cfg.dump_outputs


def test_op_debug_mode_3_ignores_dump_mode_and_keeps_iteration(tmp_path):
    cfg = load_config_dict({C: {"path": str(tmp_path), "op_debug_mode": 3, "dump_mode": 1,
                                "iteration": "2", "overflow_number": 3}}, env={})
    assert (cfg.dump_mode, cfg.iteration) == (0, IterationSpec(ranges=((2, 2),)))


def test_tensor_with_bin_is_fine(tmp_path):
    assert load_config_dict({C: {"path": str(tmp_path), "file_format": "bin"}}, env={}).file_format == "bin"


# ---------------------------------------------------------------- path fallback
@pytest.mark.parametrize("common", [{}, {"path": ""}])
@pytest.mark.parametrize("var", ["OPDUMP_DIAGNOSTIC_DATA_PATH", "MS_DIAGNOSTIC_DATA_PATH"])
def test_path_from_diagnostic_env(tmp_path, common, var):
    cfg = load_config_dict({C: common}, env={var: str(tmp_path) + "/"})
    assert cfg.path == str(tmp_path / "debug_dump")


def test_opdump_diagnostic_wins_over_alias(tmp_path):
    env = {"OPDUMP_DIAGNOSTIC_DATA_PATH": "/a", "MS_DIAGNOSTIC_DATA_PATH": "/b"}
    assert load_config_dict({C: {}}, env=env).path == "/a/debug_dump"
    assert load_config_dict({C: {"path": "/c"}}, env=env).path == "/c"


def test_path_missing_without_env(tmp_path):
    f = write(tmp_path, {C: {"net_name": "x"}})
    with pytest.raises(ConfigError) as info:
        load_config(f, env={"OPDUMP_DIAGNOSTIC_DATA_PATH": ""})
    msg = str(info.value)
    assert msg.startswith(f"{f}: common_dump_settings.path: ''")
    assert "OPDUMP_DIAGNOSTIC_DATA_PATH" in msg and "MS_DIAGNOSTIC_DATA_PATH" in msg


def test_relative_diagnostic_env_rejected():
    with pytest.raises(ConfigError, match=r"MS_DIAGNOSTIC_DATA_PATH: 'rel/debug_dump': must be an absolute path"):
        load_config_dict({C: {}}, env={"MS_DIAGNOSTIC_DATA_PATH": "rel"})


# ---------------------------------------------------------------- loader: env vars, files, JSON
@pytest.mark.parametrize("var", ["OPDUMP_CONFIG", "MINDSPORE_DUMP_CONFIG"])
def test_config_path_from_env(tmp_path, var):
    f = write(tmp_path, seed_cpu_gpu(tmp_path))
    cfg = load_config(env={var: f})
    assert cfg.source_file == f and cfg.net_name == "ResNet50"


def test_opdump_config_wins_over_alias(tmp_path):
    a = write(tmp_path, {C: {"path": str(tmp_path), "net_name": "A"}}, "a.json")
    b = write(tmp_path, {C: {"path": str(tmp_path), "net_name": "B"}}, "b.json")
    assert load_config(env={"OPDUMP_CONFIG": a, "MINDSPORE_DUMP_CONFIG": b}).net_name == "A"


def test_os_environ_is_the_default(tmp_path, monkeypatch):
    f = write(tmp_path, seed_cpu_gpu(tmp_path))
    monkeypatch.setenv("OPDUMP_CONFIG", f)
    assert load_config().source_file == f


def test_no_config_env():
    with pytest.raises(ConfigError) as info:
        load_config(env={"MINDSPORE_DUMP_CONFIG": ""})
    assert info.value.field == "OPDUMP_CONFIG" and "MINDSPORE_DUMP_CONFIG" in str(info.value)


def test_missing_file(tmp_path):
    f = str(tmp_path / "nope.json")
    with pytest.raises(ConfigError) as info:
        load_config(env={"OPDUMP_CONFIG": f})
    assert str(info.value) == f"{f}: OPDUMP_CONFIG: {f!r}: no such file"


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(str(tmp_path), env={})


def test_relative_config_path_is_made_absolute(tmp_path, monkeypatch):
    write(tmp_path, seed_cpu_gpu(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert load_config("data_dump.json", env={}).source_file == str(tmp_path / "data_dump.json")


def test_invalid_json_line_and_column(tmp_path):
    f = write(tmp_path, '{\n  "common_dump_settings": {\n    "path": "/x"\n    "net_name": "y"\n  }\n}')
    with pytest.raises(ConfigError) as info:
        load_config(f, env={})
    assert str(info.value) == f"{f}: (json): <line 4, column 5>: invalid JSON: Expecting ',' delimiter"


def test_not_utf8(tmp_path):
    f = tmp_path / "c.json"
    f.write_bytes(b'{"common_dump_settings": {"net_name": "\xff"}}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(str(f), env={})


def test_duplicate_key(tmp_path):
    f = write(tmp_path, '{"common_dump_settings": {"path": "/a", "path": "/b"}}')
    with pytest.raises(ConfigError) as info:
        load_config(f, env={})
    assert str(info.value).startswith(f"{f}: path: '/b': appears twice")


def test_load_config_dict_without_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config_dict({C: {"path": str(tmp_path), "dump_mode": 9}}, env={})
    assert str(info.value) == "common_dump_settings.dump_mode: 9: must be an integer 0, 1 or 2"
    assert load_config_dict({C: {"path": str(tmp_path)}}, env={}).source_file is None


def test_package_level_load_config(tmp_path):
    import opdump.config
    f = write(tmp_path, seed_cpu_gpu(tmp_path))
    assert opdump.config.load_config(f, env={}) == load_config(f, env={})
    assert os.path.isabs(load_config(f, env={}).path)
