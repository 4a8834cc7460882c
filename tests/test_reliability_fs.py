"""A dump never breaks the training (README, "Reliability"): write errors on a real full
file system stop the dump with one warning, the training's output and exit status are
its own, the manifest is true; a path that cannot hold a dump is refused before step 0."""
import json
import os

import numpy as np
import pytest

import opdump
from conftest import write_config
from opdump.config import ConfigError
from reliability_helpers import files_under, manifest_of, mount_tmpfs, opdump_run, plain_output, umount

WIDE = ("--steps", "4", "--width", "131072")      # ~6 MB of parameters: 20 MB fill in step 0


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mount_tmpfs(mnt, "size=20m")
    yield mnt
    umount(mnt)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_full_disk_stops_the_dump_not_the_training(small_fs, tmp_path, graph):
    args = WIDE + (("--compile",) if graph else ())
    cfg = write_config(tmp_path, common={"path": str(small_fs / "dump"), "saved_data": "full"})
    proc = opdump_run(cfg, *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == plain_output(*args)                   # the training is unchanged
    assert proc.stderr.count("writing the dump failed") == 1, proc.stderr
    assert "No space left on device" in proc.stderr and "Traceback" not in proc.stderr
    manifest = manifest_of(small_fs / "dump")
    assert manifest["complete"] is False and manifest["error_count"] >= 1
    assert "No space left on device" in manifest["errors"][0]
    on_disk = files_under(small_fs / "dump")
    assert manifest["files_written"] == len(on_disk) > 0         # the true count
    assert manifest["bytes_written"] == sum(p.stat().st_size for p in on_disk if p.name != "manifest.json"
                                            ) + (small_fs / "dump/rank_0/.dump_metadata/manifest.json").stat().st_size
    assert not [p for p in on_disk if p.name.startswith(".opdump-tmp-")]
    for p in on_disk:
        if p.suffix == ".npy":
            np.load(p, allow_pickle=False)                     # whole files only


def test_script_exit_status_is_its_own_after_a_write_error(small_fs, tmp_path):
    """The script's own status (3 here) comes out, not a dump error's."""
    cfg = write_config(tmp_path, common={"path": str(small_fs / "dump"), "saved_data": "tensor"})
    proc = opdump_run(cfg, *WIDE, "--exit", "3")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("writing the dump failed") == 1 and "Traceback" not in proc.stderr


def _bad_paths(tmp_path):
    regular = tmp_path / "regular"
    regular.write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(outside, linked / "rank_0")
    return {
        "under a regular file": ({"path": str(regular / "dump")}, "common_dump_settings.path"),
        "a component over 255 bytes": ({"path": str(tmp_path / ("a" * 300) / "dump")}, "common_dump_settings.path"),
        "longer than 4096": ({"path": str(tmp_path) + "/abcdefgh" * 520}, "common_dump_settings.path"),
        "a 300-character net_name": ({"path": str(tmp_path / "d"), "net_name": "N" * 300},
                                     "common_dump_settings.net_name"),
        "rank folder is a link": ({"path": str(linked)}, "common_dump_settings.path"),
    }


def test_paths_that_cannot_hold_a_dump_are_config_errors(tmp_path):
    for case, (common, field) in _bad_paths(tmp_path).items():
        with pytest.raises(ConfigError) as err:
            opdump.Session(write_config(tmp_path, common=common))
        assert err.value.field == field, case
    assert os.listdir(tmp_path / "outside") == []


def test_read_only_mount_is_refused_before_the_script_runs(tmp_path):
    ro = tmp_path / "ro"
    mount_tmpfs(ro, "size=1m,ro")
    try:
        cfg = write_config(tmp_path, common={"path": str(ro / "dump")})
        proc = opdump_run(cfg, "--steps", "1")
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "common_dump_settings.path" in lines[0] and "Read-only" in lines[0], lines
        assert "STEP" not in proc.stdout                      # refused before the script ran
    finally:
        umount(ro)
