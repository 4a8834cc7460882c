"""A tiny unmodified training script for the reliability tests (run under ``opdump run``).

Prints ``STEP {i} loss {value}`` after each optimizer step (flushed), so a test can
compare the training's output with and without a dump, and know which steps had
finished when it killed the process.
"""
import argparse
import os
import sys
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--width", type=int, default=16)
p.add_argument("--compile", action="store_true", help="torch.compile the model (graph mode)")
p.add_argument("--hostile", action="store_true", help="module names with a newline, a NUL, a comma and a quote")
p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (forked)")
p.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep after each step")
p.add_argument("--hold", default="", help="after step 0, wait until this file exists")
p.add_argument("--exit", type=int, default=0, help="the script's own exit status")
a = p.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, a.width), torch.nn.ReLU(), torch.nn.Linear(a.width, 4))
if a.hostile:
    model.add_module('odd\nname\x00,"x"', torch.nn.Tanh())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
run = torch.compile(model, backend="eager") if a.compile else model


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return a.steps * 2

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x * 2 + 1, torch.tensor(i % 4)          # torch work inside the worker process


loader = torch.utils.data.DataLoader(Data(), batch_size=2, num_workers=a.workers,
                                     multiprocessing_context="fork" if a.workers else None)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(run(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"STEP {step} loss {loss.item():.6f}", flush=True)
    if a.sleep:
        time.sleep(a.sleep)
    while step == 0 and a.hold and not os.path.exists(a.hold):
        time.sleep(0.02)
sys.exit(a.exit)
