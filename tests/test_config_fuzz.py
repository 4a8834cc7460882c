"""Every config either loads or fails with ONE one-line ConfigError naming file, field, value and
what is allowed: random JSON, random mutations of valid configs of every dialect, and the
limits a hostile file reaches for (nesting depth, number size), fuzzed through the real loader
on real files (opdump/config/loader.py)."""
import json
import math
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opdump.config import ConfigError
from opdump.config.loader import load_config, load_config_dict
from opdump.config.options import from_options
from opdump.config.model import DumpConfig

FILE = "/cfg/data_dump.json"
ENV = {"HOME": "/home/u"}

MINDSPORE = {
    "common_dump_settings": {
        "op_debug_mode": 0, "dump_mode": 0, "path": "/tmp/opdump-fuzz/dump", "net_name": "Net",
        "iteration": "0|5-8", "saved_data": "statistic", "input_output": 0, "kernels": [],
        "support_device": [0, 1], "statistic_category": ["max", "min", "l2norm"],
    },
    "e2e_dump_settings": {"enable": True, "trans_flag": True, "stat_calc_mode": "device"},
    "opdump_settings": {"writer_queue_mb": 64, "writer_threads": 2},
}
ACL = {"dump": {"dump_list": [{"model_name": "m", "layer": ["a", "b"]}], "dump_path": "/tmp/opdump-fuzz/acl",
                "dump_mode": "all", "dump_step": "0|3", "dump_data": "stats"}}
VALID = [MINDSPORE, ACL]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20)
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=10 ** 17, max_value=10 ** 40)
           | st.floats() | st.text(max_size=20) | st.sampled_from(["all", "0|5-8", "9" * 40, "7-3", "", "0|", "max"])
           | st.lists(st.integers(), max_size=3) | st.lists(st.text(max_size=5), max_size=3))


def _check(data, file=FILE):
    """Loads, or one ConfigError whose message is one line naming the file; nothing else escapes."""
    try:
        cfg = load_config_dict(data, file=file, env=ENV)
    except ConfigError as err:
        message = str(err)
        assert message.startswith(file + ": ") and "\n" not in message, message
        assert len(message) < 2000
        return None
    assert isinstance(cfg, DumpConfig)
    return cfg


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _mutated(base, path, value, delete):
    data = json.loads(json.dumps(base))
    if not path:
        return value
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_random_json_loads_or_is_one_config_error(data):
    _check(data)
    _check({"common_dump_settings": data})
    _check({"dump": data})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.data(), SCALARS | JSON, st.booleans())
def test_mutations_of_valid_configs_load_or_are_one_config_error(base, data, value, delete):
    path = data.draw(st.sampled_from(list(_paths(base))))
    _check(_mutated(base, path, value, delete and bool(path)))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60), st.sampled_from(["dump_step", "dump_mode", "dump_data", "dump_layer", "dump_path"]))
def test_options_object_loads_or_is_one_config_error(text, option):
    try:
        from_options(env=ENV, **{option: text})
    except ConfigError as err:
        assert "\n" not in str(err)


def test_the_valid_bases_load():
    assert _check(MINDSPORE) is not None and _check(ACL) is not None


# ------------------------------------------------------------------ limits a hostile file reaches for
def _file_error(tmp_path, text: str) -> str:
    f = tmp_path / "data_dump.json"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(f), env=ENV)
    message = str(info.value)
    assert message.startswith(f"{f}: ") and "\n" not in message and len(message) < 2000, message
    return message


def test_deeply_nested_json_is_a_config_error(tmp_path):
    message = _file_error(tmp_path, "[" * 100_000 + "]" * 100_000)
    assert "nested" in message
    message = _file_error(tmp_path, '{"common_dump_settings": {"kernels": ' + "[" * 5000 + "]" * 5000 + "}}")
    assert "common_dump_settings.kernels" in message or "nested" in message


@pytest.mark.parametrize("field", ["dump_mode", "iteration", "net_name"])
def test_a_5000_digit_number_is_a_config_error(tmp_path, field):
    text = json.dumps(MINDSPORE).replace('"dump_mode": 0', f'"{field}": {"9" * 5000}', 1)
    if field != "dump_mode":
        text = text.replace('"dump_mode": 0,', f'"dump_mode": 0, "{field}": {"9" * 5000},', 1)
        text = text.replace(f'"{field}": "0|5-8", ', "").replace(f'"{field}": "Net", ', "")
    message = _file_error(tmp_path, text)
    assert "number" in message


def test_iterations_beyond_int64_are_refused():
    big = "9" * 40
    for spelling in (big, f"0|{big}", f"3-{big}"):
        cfg = dict(MINDSPORE, common_dump_settings=dict(MINDSPORE["common_dump_settings"], iteration=spelling))
        with pytest.raises(ConfigError, match="iteration"):
            load_config_dict(cfg, file=FILE, env=ENV)
    with pytest.raises(ConfigError, match="dump_step"):
        from_options(env=ENV, dump_step="1-" + "9" * 5000)
    cfg = dict(MINDSPORE, common_dump_settings=dict(MINDSPORE["common_dump_settings"],
                                                    iteration="0" * 5000 + "7|" + "0" * 6000))
    assert load_config_dict(cfg, file=FILE, env=ENV).iteration.ranges == ((0, 0), (7, 7))
    cfg = dict(MINDSPORE, common_dump_settings=dict(MINDSPORE["common_dump_settings"], iteration=str(2 ** 63 - 1)))
    assert load_config_dict(cfg, file=FILE, env=ENV).iteration.ranges == ((2 ** 63 - 1, 2 ** 63 - 1),)


@pytest.mark.parametrize("field,value", [("writer_queue_mb", 10 ** 30), ("writer_queue_mb", 2 ** 40),
                                         ("writer_threads", 10 ** 30)])
def test_absurd_sizes_are_refused(field, value):
    cfg = dict(MINDSPORE, opdump_settings={field: value})
    with pytest.raises(ConfigError, match=field):
        load_config_dict(cfg, file=FILE, env=ENV)


def test_huge_values_are_shown_short():
    cfg = dict(MINDSPORE, common_dump_settings=dict(MINDSPORE["common_dump_settings"], net_name=10 ** 5000))
    message = str(pytest.raises(ConfigError, load_config_dict, cfg, file=FILE, env=ENV).value)
    assert "net_name" in message and len(message) < 500
    deep = []
    for _ in range(50_000):
        deep = [deep]
    cfg = dict(MINDSPORE, common_dump_settings=dict(MINDSPORE["common_dump_settings"], kernels=deep))
    message = str(pytest.raises(ConfigError, load_config_dict, cfg, file=FILE, env=ENV).value)
    assert "kernels" in message and len(message) < 500


def test_opdump_run_prints_one_line_for_a_hostile_config(tmp_path):
    f = tmp_path / "data_dump.json"
    f.write_text("[" * 100_000 + "]" * 100_000)
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    proc = subprocess.run([sys.executable, "-m", "opdump", "run", "--config", str(f), str(script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "ran" not in proc.stdout and "Traceback" not in proc.stderr
    assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) == 1, proc.stderr


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"[0-9|\- \tal]{0,40}", fullmatch=True) | st.text(max_size=30)
       | st.lists(st.integers(min_value=0, max_value=10 ** 25), min_size=1, max_size=4).map(
           lambda xs: "|".join(map(str, xs))))
def test_any_iteration_text_parses_or_is_one_config_error(text):
    from opdump.config.iteration import parse_iteration
    try:
        spec = parse_iteration(text)
    except ConfigError as err:
        assert "\n" not in str(err)
        return
    assert spec.all or all(0 <= lo <= hi <= 2 ** 63 - 1 for lo, hi in spec.ranges)
    assert parse_iteration(str(spec)) == spec
