import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


def pytest_sessionstart(session):
    """Build opdump's native module once, before any test starts a subprocess that needs it
    (a no-op when scripts/setup.sh already built it)."""
    from opdump.stats import native
    native.module()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles afresh: Dynamo's cache must not hand a graph to an old session's backend."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def write_config(tmp_path, common=None, e2e=None, extra=None, name="data_dump.json"):
    """A MindSpore data_dump.json in tmp_path (the seed's CPU/GPU example, path set) → its path."""
    cfg = {
        "common_dump_settings": {
            "op_debug_mode": 0, "dump_mode": 0, "path": str(tmp_path / "dump"), "net_name": "Net",
            "iteration": "all", "saved_data": "tensor", "input_output": 0, "kernels": [],
            "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
        },
        "e2e_dump_settings": {"enable": True, "trans_flag": True},
    }
    cfg["common_dump_settings"].update(common or {})
    cfg["e2e_dump_settings"].update(e2e or {})
    if extra:
        cfg.update(extra)
    path = tmp_path / name
    path.write_text(json.dumps(cfg, indent=2))
    return str(path)


@pytest.fixture
def config_file(tmp_path):
    def make(**kw):
        return write_config(tmp_path, **kw)
    return make
