"""An exception dump (``op_debug_mode`` 4) in which no operator raised is a result, not an
empty folder (README "Debug dumps"; opdump/debug/exception.py ``ExceptionDump.attach``):
the run's metadata and a manifest saying it finished with ``exceptions`` 0, and ``opdump ls``
says "no operator raised" (exit 0).  The metadata is written when the session starts: a run
killed after a step, or SIGKILLed in its first iteration, says so ("did not finish");
a folder without a manifest is still a dump that never started (exit 2).  (Hold-out trial
5: a healthy run left an empty ``rank_0`` and ``opdump ls`` exited 2, "nothing to analyse".)"""
import json
import os
import subprocess
import sys
import textwrap

import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from conftest import write_config

OPDUMP = [sys.executable, "-m", "opdump"]


def _manifest(dump):
    with open(os.path.join(dump, "rank_0", ".dump_metadata", "manifest.json")) as f:
        return json.load(f)


def _ls(dump):
    return subprocess.run(OPDUMP + ["ls", dump], capture_output=True, text=True, timeout=120)


def _metadata_and_ls(dump):
    """The manifest and ``opdump ls``'s result, once the metadata files are asserted there."""
    meta = os.path.join(dump, "rank_0", ".dump_metadata")
    assert {"config.json", "data_dump.json", "manifest.json"} <= set(os.listdir(meta))
    out = _ls(dump)
    assert out.returncode == 0, out.stdout + out.stderr
    return _manifest(dump), out


def _run_script(tmp_path, body, env=None):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _train(cfg, bad_step=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2))
    with opdump.Session(cfg) as s, EagerCapture(s):
        for step in range(2):
            ids = torch.randint(0, 10, (2, 3)) if step != bad_step else torch.full((2, 3), 12)
            try:
                model(ids).sum().backward()
            except IndexError:
                pass
            s.step()


def test_a_healthy_exception_dump_says_no_operator_raised(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 4})
    _train(cfg)
    m, out = _metadata_and_ls(str(tmp_path / "dump"))
    assert m["complete"] is True and m["exceptions"] == 0 and m["error_count"] == 0, m
    assert "no operator raised" in out.stdout and "did not finish" not in out.stdout, out.stdout
    assert "no manifest" not in out.stdout and "nothing to analyse" not in out.stderr


def test_an_exception_is_counted_and_listed_not_called_clean(tmp_path):
    cfg = write_config(tmp_path, common={"op_debug_mode": 4})
    _train(cfg, bad_step=1)
    dump = str(tmp_path / "dump")
    assert _manifest(dump)["exceptions"] == 1
    out = _ls(dump)
    assert out.returncode == 0 and "raised IndexError" in out.stdout, out.stdout + out.stderr
    assert "no operator raised" not in out.stdout


def _killed_run(tmp_path, end):
    """A subprocess that runs a Linear forward and backward in an exception dump, then ``end``
    (the way it dies; indented as the ``with`` block's body) -> the dump folder."""
    cfg = write_config(tmp_path, common={"op_debug_mode": 4})
    r = _run_script(tmp_path, f"""
        import os, signal, torch, torch.nn as nn, opdump
        from opdump.capture.eager import EagerCapture
        model = nn.Linear(4, 2)
        s = opdump.Session({str(cfg)!r})
        with s, EagerCapture(s):
            model(torch.randn(3, 4)).sum().backward()
{end}
    """)
    return r, str(tmp_path / "dump")


def test_a_run_killed_after_a_step_did_not_finish(tmp_path):
    r, dump = _killed_run(tmp_path, "            s.step()\n            os._exit(0)     # killed: no close")
    assert r.returncode == 0, r.stderr
    assert _manifest(dump)["complete"] is False
    out = _ls(dump)
    assert "no operator raised so far (the run did not finish)" in out.stdout, out.stdout + out.stderr


def test_a_dump_that_never_started_is_still_nothing_to_analyse(tmp_path):
    os.makedirs(tmp_path / "dump" / "rank_0")
    out = _ls(str(tmp_path / "dump"))
    assert out.returncode == 2 and "no manifest" in out.stdout, out.stdout + out.stderr


def test_a_run_killed_in_its_first_iteration_did_not_finish(tmp_path):
    """SIGKILL in the first iteration, before any iteration end: the metadata and a manifest
    (complete false) were written when the session started (empty rank_0 before)."""
    r, dump = _killed_run(tmp_path, "            os.kill(os.getpid(), signal.SIGKILL)")
    assert r.returncode == -9, (r.returncode, r.stderr)
    m, out = _metadata_and_ls(dump)
    assert m["complete"] is False and m["exceptions"] == 0 and m["iteration_in_progress"] == 0, m
    assert "no operator raised so far (the run did not finish)" in out.stdout, out.stdout + out.stderr


def test_the_metadata_written_at_start_moves_to_the_rank_known_later(tmp_path):
    """Written at start under the start rank ($RANK 1); init_process_group then says rank 0:
    the dump is rank_0's (config.json says 0) and rank_1 is gone, as for the other modes."""
    cfg = write_config(tmp_path, common={"op_debug_mode": 4})
    r = _run_script(tmp_path, f"""
        import os, torch, torch.nn as nn, torch.distributed as dist, opdump
        from opdump.capture.eager import EagerCapture
        model = nn.Linear(4, 2)
        s = opdump.Session({str(cfg)!r})
        assert os.path.isfile(os.path.join({str(tmp_path / "dump")!r}, "rank_1", ".dump_metadata",
                                           "manifest.json"))
        dist.init_process_group("gloo", init_method="file://" + {str(tmp_path / "pg")!r}, rank=0, world_size=1)
        with s, EagerCapture(s):
            model(torch.randn(3, 4)).sum().backward()
            s.step()
        dist.destroy_process_group()
    """, env={"RANK": "1"})
    assert r.returncode == 0, r.stderr
    dump = tmp_path / "dump"
    assert sorted(os.listdir(dump)) == ["rank_0"]
    with open(dump / "rank_0" / ".dump_metadata" / "config.json") as f:
        assert json.load(f)["rank"] == 0
    m = _manifest(str(dump))
    assert m["complete"] is True and m["exceptions"] == 0, m
