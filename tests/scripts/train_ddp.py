"""A tiny data-parallel (DDP, gloo) training script for the rank-consistency tests, one process
per rank, run under ``opdump run`` with ``RANK``/``WORLD_SIZE`` set.

The model keeps a buffer ``running`` (a running mean of its input, like BatchNorm's).
With ``--no-broadcast-buffers`` DDP does not copy rank 0's buffers to the others before
each forward, so from step 1 on every rank holds its own buffer: the classic unsynchronised
buffer that ``opdump compare --ranks`` must name. Parameters stay identical (gradients are
all-reduced). Each rank sees its own data. Prints ``RANK r STEP i loss v``.
"""
import argparse
import atexit
import os

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--store", required=True, help="file for the file:// rendezvous")
p.add_argument("--steps", type=int, default=3)
p.add_argument("--no-broadcast-buffers", action="store_true")
a = p.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"file://{a.store}", rank=rank, world_size=world)
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)
        self.register_buffer("running", torch.zeros(4))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.running.mul_(0.9).add_(0.1 * x.mean(0))
        return self.fc2(torch.relu(self.fc1(x - self.running)))


model = torch.nn.parallel.DistributedDataParallel(Net(), broadcast_buffers=not a.no_broadcast_buffers)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(100 + rank)          # each rank its own batch
for step in range(a.steps):
    loss = model(torch.randn(3, 4, generator=data)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"RANK {rank} STEP {step} loss {loss.item():.6f}", flush=True)
dist.barrier()
dist.destroy_process_group()
# Leave without C++ static teardown, where torch/gloo sometimes abort a rank (see
# tests/test_distributed.py). An atexit handler runs after the launcher has closed the dump
# session (every file written) and before that teardown.
atexit.register(os._exit, 0)
