"""Config warnings name the user's line (opdump/config/warn.py), not opdump's own modules."""
import subprocess
import sys
import textwrap
import warnings

import pytest

from opdump.config import DumpOptions
from opdump.config.loader import load_config_dict

C, E = "common_dump_settings", "e2e_dump_settings"


@pytest.mark.parametrize("common, says", [
    ({"op_debug_mode": 3, "dump_mode": 1, "kernels": ["conv"]}, "dump_mode 1 is ignored"),
    ({"op_debug_mode": 4, "dump_mode": 1, "kernels": ["conv"]}, "dump_mode 1 is ignored"),
    ({"op_debug_mode": 4, "iteration": "3|5"}, "iteration \"3|5\" is ignored"),
])
def test_rule_warnings_point_at_the_caller(tmp_path, common, says):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        load_config_dict({C: dict(common, path=str(tmp_path))}, env={})
    mine = [w for w in seen if says in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in seen]
    assert mine[0].filename == __file__


def test_options_warning_points_at_the_caller(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"common_dump_settings": {"path": "%s"}}' % tmp_path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        DumpOptions(enable_dump=True, dump_config_path=str(cfg), dump_path=str(tmp_path)).to_config(env={})
    mine = [w for w in seen if "dump_config_path" in str(w.message)]
    assert len(mine) == 1 and mine[0].filename == __file__


def test_a_script_sees_its_own_line(tmp_path):
    """A user's script loading a config file: the warning's location is the script's line."""
    (tmp_path / "c.json").write_text(
        '{"common_dump_settings": {"path": "%s", "op_debug_mode": 3, "dump_mode": 1, "kernels": ["x"]}}'
        % (tmp_path / "out"))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import warnings
        warnings.simplefilter("always")
        from opdump.config import load_config
        load_config(%r)
        """ % str(tmp_path / "c.json")))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"{script}:4: UserWarning: opdump: common_dump_settings.dump_mode 1 is ignored" in run.stderr
