"""Batch norm's undeclared writes: ``native_batch_norm`` updates ``running_mean`` and
``running_var`` in place although its schema does not mark them ``(a!)`` and no version
counter moves.  The eager capture must not hand a later reader of those buffers (the
backward, the next step's forward) the copy it took before the update.

Found by the model zoo (ResNet eager vs graph compare): the stale copy was reused only
while its host buffer was still alive, so the symptom came and went with timing."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import opdump
from opdump.capture.eager import EagerCapture
from opdump.capture.eager.schema import facts_of
from opdump.config import DumpConfig, IterationSpec
from dumpfiles import tensor_files


def test_batch_norm_schemas_declare_their_buffer_writes():
    for op in (torch.ops.aten.native_batch_norm.default, torch.ops.aten.cudnn_batch_norm.default,
               torch.ops.aten.miopen_batch_norm.default):
        facts = facts_of(op)
        assert facts.writes and {(3, "running_mean"), (4, "running_var")} <= set(facts.written), op
        assert facts.mutated == ()            # it returns tensors: those are its outputs
    assert not facts_of(torch.ops.aten.native_batch_norm_backward.default).writes


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(self.conv(x)).sum()


def test_backward_reads_the_updated_running_stats(tmp_path):
    """Every dumped read of ``bn.running_mean``/``running_var`` equals an independent
    capture: the forward's input is the buffer before its update, the backward's the
    buffer after it (written while the forward's copy is still queued: a writer that
    lags keeps that copy alive, the case that went wrong)."""
    torch.manual_seed(0)
    model = Net()
    xs = [torch.randn(2, 2, 6, 6) for _ in range(3)]
    before, after = [], []
    model.bn.register_forward_pre_hook(
        lambda m, a: before.append((m.running_mean.clone(), m.running_var.clone())))
    model.bn.register_forward_hook(
        lambda m, a, o: after.append((m.running_mean.clone(), m.running_var.clone())))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = DumpConfig(path=str(tmp_path), iteration=IterationSpec(ranges=((0, 2),)))
    with opdump.Session(cfg):
        with EagerCapture(opdump.current_session()):
            for x in xs:
                model(x).backward()
                opt.step()
                opt.zero_grad()
    files = tensor_files(str(tmp_path))
    checked = 0
    for f in files:
        if f.io != "input" or f.slot not in (3, 4) or "bn-BatchNorm2d" not in f.op_name:
            continue
        if f.op_type not in ("native_batch_norm", "native_batch_norm_backward"):
            continue
        ref = (before if f.op_type == "native_batch_norm" else after)[f.iteration][f.slot - 3]
        np.testing.assert_array_equal(f.load(), ref.numpy(), err_msg=f"{f.op_type} {f.slot} it {f.iteration}")
        checked += 1
    assert checked == 12                      # 3 iterations x 2 ops x 2 buffers
