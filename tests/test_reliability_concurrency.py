"""Concurrent and repeated runs never merge (README, "Reliability"): the rank folder is
locked (flock) while a session writes; a second writer and a folder that already holds a
dump are refused unless ``opdump_settings.existing`` says otherwise; processes forked from
a dumping process (DataLoader workers) never write.  Real processes throughout."""
import os
import time

import pytest

import opdump
from conftest import write_config
from dumpfiles import tensor_files
from opdump.config import ConfigError
from reliability_helpers import files_under, manifest_of, opdump_popen, opdump_run, plain_output
from test_reliability_links import _train


def _wait_for(proc, needle, timeout=120):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"{needle!r} not printed: {seen!r} {proc.stderr.read() if proc.poll() is not None else ''}")


def test_second_writer_and_a_finished_dump_are_refused(tmp_path):
    cfg = write_config(tmp_path, common={"iteration": "0"})
    release = tmp_path / "release"
    first = opdump_popen(cfg, "--steps", "3", "--hold", str(release))
    try:
        _wait_for(first, "STEP 0")
        for width in ("16", "32"):                         # the same model, another model
            second = opdump_run(cfg, "--steps", "1", "--width", width)
            assert second.returncode == 2, second.stderr
            assert "another process is writing" in second.stderr and "common_dump_settings.path" in second.stderr
            assert "STEP" not in second.stdout
    finally:
        release.write_text("go")
        first.stdout.read()
        first.wait(timeout=300)
    assert first.returncode == 0, first.stderr.read()
    assert manifest_of(tmp_path / "dump")["complete"] is True
    before = files_under(tmp_path / "dump")
    third = opdump_run(cfg, "--steps", "1")
    assert third.returncode == 2 and "already holds a dump" in third.stderr, third.stderr
    assert "opdump_settings.existing" in third.stderr
    assert files_under(tmp_path / "dump") == before


def test_existing_new_folder_and_overwrite(tmp_path):
    cfg = write_config(tmp_path, common={"iteration": "0"})
    with opdump.Session(cfg) as s:
        _train(s, steps=1)
    first = files_under(tmp_path / "dump")
    with pytest.raises(ConfigError, match="already holds a dump"):
        opdump.Session(cfg)

    new = write_config(tmp_path, common={"iteration": "0"}, extra={"opdump_settings": {"existing": "new-folder"}},
                       name="new.json")
    with pytest.warns(UserWarning, match=r"dump-1/rank_0 \(opdump_settings.existing"):
        session = opdump.Session(new)
    with session:
        _train(session, steps=1)
    assert session.dump_root == str(tmp_path / "dump-1")
    assert files_under(tmp_path / "dump") == first              # the first dump is untouched
    assert len(files_under(tmp_path / "dump-1")) == len(first)

    over = write_config(tmp_path, common={"iteration": "0", "saved_data": "statistic"},
                        extra={"opdump_settings": {"existing": "overwrite"}}, name="over.json")
    (tmp_path / "dump" / "rank_0" / "stale.txt").write_text("old")
    with opdump.Session(over) as s:
        _train(s, steps=1)
    after = files_under(tmp_path / "dump")
    assert not [p for p in after if p.suffix == ".npy" or p.name == "stale.txt"]    # nothing of the old run
    assert manifest_of(tmp_path / "dump")["files_written"] == len(after)


def test_a_second_session_in_one_process_is_refused_while_the_first_writes(tmp_path):
    cfg = write_config(tmp_path, common={"iteration": "0"})
    first = opdump.Session(cfg)
    try:
        with pytest.raises(ConfigError, match="another process is writing"):
            opdump.Session(cfg)
    finally:
        first.close()


def _small_inputs(root):
    """Tensor files of the dataset's per-sample operators (8 elements: ``x * 2 + 1``)."""
    return [f for f in tensor_files(str(root)) if f.op_type in ("mul", "add") and f.load().shape == (8,)]


def test_a_forked_child_never_writes(tmp_path):
    """The child of a dumping process (what a DataLoader worker is) writes nothing, even
    when asked to directly, never blocks, and leaves the parent's dump and lock alone."""
    cfg = write_config(tmp_path, common={"iteration": "all"})
    with opdump.Session(cfg) as session:
        _train(session, steps=1)
        meta = session.layout.metadata_dir
        pid = os.fork()
        if pid == 0:                                            # the child
            code = 3
            try:
                if not session.is_dumping():
                    session.layout.write_small(os.path.join(meta, "child.txt"), b"x")
                    session.writer.submit(lambda: session.layout.write_small(os.path.join(meta, "child2.txt"), b"x"))
                    _train(session, steps=1)
                    session.close()
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with pytest.raises(ConfigError, match="another process is writing"):
            opdump.Session(cfg)                                 # the parent still holds the folder
        _train(session, steps=1)
    assert not [p for p in files_under(tmp_path / "dump") if p.name.startswith("child")]
    manifest = manifest_of(tmp_path / "dump")
    assert manifest["complete"] is True and manifest["dumped_iterations"] == "0-1"
    assert manifest["files_written"] == len(files_under(tmp_path / "dump"))


def _small_inputs(root):
    """Tensor files of the dataset's per-sample operators (8 elements: ``x * 2 + 1``)."""
    return [f for f in tensor_files(str(root)) if f.op_type in ("mul", "add") and f.load().shape == (8,)]


def test_dataloader_workers_under_opdump_run(tmp_path):
    """End to end: forked DataLoader workers under ``opdump run`` (eager capture of every
    operator): the training's output is its own, nothing from the workers is dumped, no
    warning, the manifest counts the files on disk."""
    args = ("--steps", "3", "--workers", "2")
    cfg = write_config(tmp_path, common={"iteration": "all"}, extra={"opdump_settings": {"eager_capture": "all"}})
    proc = opdump_run(cfg, *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == plain_output(*args)
    assert "opdump" not in proc.stderr, proc.stderr
    assert not _small_inputs(tmp_path / "dump")
    on_disk = files_under(tmp_path / "dump")
    manifest = manifest_of(tmp_path / "dump")
    assert manifest["complete"] is True and manifest["files_written"] == len(on_disk)
    assert not [p for p in on_disk if p.name.startswith(".opdump-tmp-")]
