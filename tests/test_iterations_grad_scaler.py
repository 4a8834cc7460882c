"""A training step whose ``GradScaler.step(optimizer)`` skips ``optimizer.step()`` (Inf/NaN
gradients) is an iteration all the same (README "Iterations": one iteration per training
step).  Hold-out trial 6, B1: the skipped step and the next one shared an iteration folder
and every later step was numbered one lower (opdump/step_driver.py ``watch_scaler_steps``)."""
import os

import pytest
import torch

import opdump
from opdump.capture.eager import EagerCapture
from conftest import write_config


def _iterations(tmp_path, steps=4, skip=(1,), enabled=True, fused=False):
    """Train a Linear ``steps`` steps under a CPU GradScaler, Inf in the input at the steps in
    ``skip`` -> (the iteration folders of the statistics dump, optimizer steps that ran)."""
    cfg = write_config(tmp_path, common={"saved_data": "statistic"})
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.Adam(model.parameters(), lr=0.1, fused=True) if fused else \
        torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, enabled=enabled)
    ran = []
    opt.register_step_post_hook(lambda *a: ran.append(1))
    with opdump.Session(cfg) as s, EagerCapture(s):
        for step in range(steps):
            x = torch.randn(2, 4) * (float("inf") if step in skip else 1.0)
            scaler.scale(model(x).square().mean()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    graph = os.path.join(str(tmp_path / "dump"), "rank_0", "Net", "0")
    return sorted(int(i) for i in os.listdir(graph) if i.isdigit()), len(ran)


def test_a_step_the_scaler_skips_is_an_iteration(tmp_path):
    its, ran = _iterations(tmp_path)
    assert ran == 3                     # the scaler did skip one optimizer step
    assert its == [0, 1, 2, 3]


def test_steps_the_scaler_runs_count_once(tmp_path):
    its, ran = _iterations(tmp_path, skip=())
    assert ran == 4 and its == [0, 1, 2, 3]


def test_a_disabled_scaler_counts_once(tmp_path):
    its, ran = _iterations(tmp_path, skip=(), enabled=False)
    assert ran == 4 and its == [0, 1, 2, 3]


def test_an_optimizer_that_takes_the_inf_flag_counts_once(tmp_path):
    """A fused optimizer's step runs on every scaler step (it is handed found_inf itself)."""
    its, ran = _iterations(tmp_path, fused=True)
    assert ran == 4 and its == [0, 1, 2, 3]


def test_no_wrapper_is_left_after_close(tmp_path):
    original = torch.amp.GradScaler.step
    _iterations(tmp_path, steps=1, skip=())
    assert torch.amp.GradScaler.step is original
