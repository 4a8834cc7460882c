"""A closed session leaves nothing behind from graph capture: its compiled graphs
drop their references to it (no module-level registry of graph runtimes), and a
compiled model used after the session closed still runs, dumping nothing."""
import gc
import weakref

import torch
from torch import nn

import opdump
from conftest import write_config
from dumpfiles import tensor_files


def _session_refs(session):
    return [weakref.ref(session), weakref.ref(session.writer), weakref.ref(session.recorder)]


def _compiled_step(tmp_path, model):
    cfg = write_config(tmp_path, common={"iteration": "0"})
    with opdump.Session(cfg) as session:
        compiled = torch.compile(model, backend=session.backend("eager"))
        compiled(torch.ones(2, 4)).sum().backward()
        session.step()
    return compiled, _session_refs(session)


def test_three_closed_sessions_are_collected_after_dynamo_reset(tmp_path):
    refs = []
    for k in range(3):
        (tmp_path / str(k)).mkdir()
        compiled, session_refs = _compiled_step(tmp_path / str(k), nn.Linear(4, 3))
        assert tensor_files(str(tmp_path / str(k) / "dump")), "the step was dumped"
        refs += session_refs
        del compiled
    torch._dynamo.reset()
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_a_compiled_model_outlives_its_session(tmp_path):
    model = nn.Linear(4, 3)
    compiled, refs = _compiled_step(tmp_path, model)
    gc.collect()
    assert [r for r in refs if r() is not None] == [], "the live compiled model keeps the closed session"
    before = len(tensor_files(str(tmp_path / "dump")))
    out = compiled(torch.ones(2, 4))
    out.sum().backward()
    torch.testing.assert_close(out, model(torch.ones(2, 4)), rtol=0, atol=0)
    assert len(tensor_files(str(tmp_path / "dump"))) == before, "nothing is dumped after close"


def test_an_open_session_does_not_keep_dropped_graphs(tmp_path):
    """torch._dynamo.reset() during a session releases the compiled graphs (and their runtimes)."""
    from opdump.capture.graph.capture import GraphCapture
    cfg = write_config(tmp_path, common={"iteration": "0"})
    # captures of earlier tests in this process may be held by a test's stored traceback
    # (a test that expects its model to raise): only this test's capture counts
    before = {id(o) for o in gc.get_objects() if type(o) is GraphCapture}
    with opdump.Session(cfg) as session:
        compiled = torch.compile(nn.Linear(4, 3), backend=session.backend("eager"))
        compiled(torch.ones(2, 4)).sum().backward()
        captures = [weakref.ref(o) for o in gc.get_objects() if type(o) is GraphCapture and id(o) not in before]
        assert captures
        del compiled
        torch._dynamo.reset()
        gc.collect()
        assert [r for r in captures if r() is not None] == []
