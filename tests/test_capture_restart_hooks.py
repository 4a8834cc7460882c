"""A stopped eager capture leaves no hook on its session (README, "Reliability"), so a capture
stopped and started again -- the bench's toggles around each dumped block
(bench/modes.EagerToggle), or a new capture after an old one -- runs its iteration-end work
once per iteration, not once per start so far (an every-step overflow watch measured with
~30 restarts paid ~0.4 ms a step for it on AlexNet).  And a session hook may remove itself
while the session calls its hooks without the next one being skipped."""
import torch
import torch.nn as nn

import opdump
from conftest import write_config
from opdump.capture.eager import EagerCapture


def _step(model, opt):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()


def test_restarted_capture_keeps_one_iteration_end_hook(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with opdump.Session(write_config(tmp_path, common={"iteration": "all", "op_debug_mode": 3})) as session:
        before = (len(session._iteration_end_hooks), len(session._close_hooks))
        cap = EagerCapture(session)
        for _ in range(4):          # as EagerToggle restarts one capture
            cap._started = False
            cap.start()
            _step(model, opt)
            assert len(session._iteration_end_hooks) == before[0] + 1
            assert len(session._close_hooks) == before[1] + 1
            cap.stop()
            assert (len(session._iteration_end_hooks), len(session._close_hooks)) == before
        other = EagerCapture(session).start()      # a new capture after the old one
        _step(model, opt)
        assert len(session._iteration_end_hooks) == before[0] + 1
    assert other._active is False                  # the session's close still stopped it


def test_a_hook_removing_itself_does_not_skip_the_next(tmp_path):
    seen = []
    with opdump.Session(write_config(tmp_path)) as session:
        handle = None

        def once(it):
            seen.append(("once", it))
            handle.remove()

        handle = session.on_iteration_end(once)
        session.on_iteration_end(lambda it: seen.append(("every", it)))
        session.step()
        session.step()
    assert seen[:3] == [("once", 0), ("every", 0), ("every", 1)]
