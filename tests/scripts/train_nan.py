"""A tiny deterministic training script for the triage tests (run under ``opdump run``).

``--nan-step N`` makes the ``scale`` module multiply by NaN at step N (a known origin:
the ``mul`` of ``Scale.forward``, line marked ``NAN-LINE``); ``--bias X`` shifts the first
layer's output by X (a second program for the reference-divergence test). Seeds are fixed and
``torch.use_deterministic_algorithms(True)`` is set, as ``opdump triage`` needs (README, triage).
Prints ``STEP {i} loss {value}``.
"""
import argparse
import os

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--nan-step", type=int, default=-1)
p.add_argument("--bias", type=float, default=0.0)
p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: the model and data in bfloat16")
p.add_argument("--compile", action="store_true", help="torch.compile the model (graph mode)")
p.add_argument("--random", action="store_true", help="inputs seeded from os.urandom (a non-deterministic script)")
a = p.parse_args()

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.factor = 1.0

    def forward(self, x):
        return x * self.factor  # NAN-LINE


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.scale = Scale()
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x) + a.bias)
        return self.fc2(self.scale(h))


model = Net().to(torch.bfloat16 if a.dtype == "bf16" else torch.float32)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
run = torch.compile(model, backend="eager") if a.compile else model
gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little") if a.random else 1)
for step in range(a.steps):
    model.scale.factor = float("nan") if step == a.nan_step else 1.0
    x = torch.randn(4, 8, generator=gen).to(next(model.parameters()).dtype)
    y = torch.arange(4) % 4
    loss = torch.nn.functional.cross_entropy(run(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"STEP {step} loss {loss.item():.6f}", flush=True)
