"""A closed session leaves nothing behind (README, "Reliability"): its optimizer hook,
the eager capture's module and optimizer hooks and warnings filter, the exit hook of a
session opened from the environment, the lock on its folder; nothing keeps it alive."""
import atexit
import gc
import warnings
import weakref

import torch
import torch.nn as nn
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

import opdump
from conftest import write_config
from opdump import active
from opdump.capture.eager import EagerCapture
from test_reliability_links import _train


def _global_state():
    return (len(optim_module._global_optimizer_post_hooks), len(optim_module._global_optimizer_pre_hooks),
            len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks),
            list(warnings.filters))


def test_closed_eager_session_is_collected_and_leaves_no_hook(tmp_path):
    before = _global_state()
    session = opdump.Session(write_config(tmp_path, common={"iteration": "0"}))
    with session:
        _train(session, steps=2)                # starts and stops an EagerCapture
    assert _global_state() == before
    assert active.current(create=False) is None
    ref = weakref.ref(session)
    del session
    gc.collect()
    assert ref() is None
    # the folder is free again: a new session may take it over
    cfg = write_config(tmp_path, common={"iteration": "0"}, extra={"opdump_settings": {"existing": "overwrite"}},
                       name="again.json")
    opdump.Session(cfg).close()


def test_session_hooks_can_be_removed(tmp_path):
    seen = []
    with opdump.Session(write_config(tmp_path)) as session:
        handle = session.on_iteration_end(seen.append)
        session.step()
        handle.remove()
        handle.remove()                          # twice: harmless
        session.step()
    assert seen == [0]


def test_session_from_the_environment_is_collected_after_close(tmp_path, monkeypatch):
    """Its exit hook holds it weakly and is unregistered by close (atexit cannot be
    counted on 3.11: unregistering leaves an empty slot)."""
    monkeypatch.setenv("OPDUMP_CONFIG", write_config(tmp_path, common={"iteration": "0"}))
    session = opdump.current_session()
    assert session is not None and session._atexit_hook is not None
    capture = EagerCapture(session).start()
    torch.manual_seed(0)
    nn.Linear(4, 2)(torch.randn(2, 4)).sum().backward()
    capture.stop()
    session.close()
    assert session._atexit_hook is None and active.current(create=False) is None
    ref = weakref.ref(session)
    del session, capture
    gc.collect()
    assert ref() is None
