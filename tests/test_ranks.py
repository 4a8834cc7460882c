"""``opdump compare --ranks``: a real 2-process DDP job (gloo, file rendezvous), each rank an
``opdump run`` subprocess of tests/scripts/train_ddp.py, in which DDP does not broadcast
buffers, so the model's running-mean buffer drifts apart from step 1 on while the
parameters stay identical (gradients all-reduced)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "scripts" / "train_ddp.py"


def _env(**kw):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **kw)
    env.pop("OPDUMP_CONFIG", None)
    return env


@pytest.fixture(scope="session")
def ddp_dump(tmp_path_factory):
    base = tmp_path_factory.mktemp("ranks")
    cfg = base / "data_dump.json"
    cfg.write_text(json.dumps({"common_dump_settings": {"path": str(base / "dump"), "net_name": "Net",
                                                        "iteration": "all", "saved_data": "tensor"},
                               "e2e_dump_settings": {"enable": True}}))
    procs = [subprocess.Popen([sys.executable, "-m", "opdump", "run", "--config", str(cfg), str(SCRIPT),
                               "--store", str(base / "store"), "--steps", "3", "--no-broadcast-buffers"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=_env(RANK=str(r), WORLD_SIZE="2"), cwd=str(base)) for r in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    return base / "dump"


def _compare(*args):
    return subprocess.run([sys.executable, "-m", "opdump", "compare", *args, "-q"], capture_output=True, text=True,
                          env=_env(), timeout=300)


def test_out_of_sync_buffer_is_named_with_the_first_rank_pair(ddp_dump):
    assert sorted(p.name for p in ddp_dump.iterdir()) == ["rank_0", "rank_1"]
    r = _compare("--ranks", str(ddp_dump))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "first rank pair that differs: 0 and 1, iteration 1, Parameter.module_running output.0" in r.stdout
    r = _compare("--ranks", str(ddp_dump), "--json")
    doc = json.loads(r.stdout)
    assert doc["first_pair"] == [0, 1] and doc["names"] == ["Parameter.module_running"]
    assert [(d["iteration"], d["op"]) for d in doc["differences"]] == [(1, "Parameter.module_running"),
                                                                       (2, "Parameter.module_running")]
    # the parameters, the all-reduced gradients the optimizer reads and its updates agree
    assert doc["compared"] > 40 and not doc["missing"]
    # ...and so do DDP's all-reduced gradient buckets (one per iteration) and broadcasts (collectives.json)
    assert doc["collectives"] >= 3


def test_iteration_before_the_drift_is_consistent(ddp_dump):
    r = _compare("--ranks", str(ddp_dump), "--iterations", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "consistent: every replicated tensor is identical across ranks" in r.stdout


def test_activations_differ_but_are_not_judged(ddp_dump):
    """Each rank saw its own batch: the forward operators differ, and are left out."""
    from opdump.analysis.compare import compare
    from opdump.analysis.ranks import check_ranks, is_replicated
    res = compare(ddp_dump, ddp_dump, rank=0, rank_b=1, iterations=[0], progress=False)
    diff = res.table[res.table["identical"] == False]          # noqa: E712 - a pandas mask
    assert len(diff) and not any(is_replicated(o, k) for o, k in zip(diff["op"], diff["kind"]))
    assert check_ranks(ddp_dump, iterations=[0], progress=False).consistent


def test_one_rank_is_an_error(ddp_dump):
    r = _compare("--ranks", str(ddp_dump / "rank_0"))
    assert r.returncode == 2 and "needs two or more" in r.stderr
    r = _compare(str(ddp_dump))
    assert r.returncode == 2 and "or --ranks DUMP" in r.stderr
