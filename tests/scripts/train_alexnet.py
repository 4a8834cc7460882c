"""An unmodified training script: AlexNet-shaped CNN under torch.compile (used by launcher tests)."""
import argparse

import torch

from opdump.demo.models import AlexNet

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--backend", default="eager")
p.add_argument("--fail-at", type=int, default=-1)
a = p.parse_args()

torch.manual_seed(0)
model = AlexNet(width=4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
compiled = torch.compile(model, backend=a.backend)
for step in range(a.steps):
    x = torch.randn(2, 3, 227, 227)
    y = torch.randint(0, 10, (2,))
    loss = torch.nn.functional.cross_entropy(compiled(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step == a.fail_at:
        raise RuntimeError(f"deliberate failure at step {step}")
    print(f"step {step} loss {loss.item():.4f}")
