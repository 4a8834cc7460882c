"""Pairs of dumps for the compare benchmark, written by opdump itself (eager capture).

Each shape is dumped three times with the same seeds and data:

* ``a``    -- the run under test (float32);
* ``b``    -- the reference: the same run with the first layer's weight scaled by
  ``1 + 1e-6`` at the start (so every activation and gradient downstream differs
  slightly, while the data input and untouched parameters stay byte-identical);
* ``same`` -- the run again, unchanged: two runs of one program on one device, byte-identical
  (compare's fast path: equal bytes need no metric).

Shapes (``--shapes``):

* ``alexnet`` -- the issue's dump: ``opdump.demo.models.AlexNet`` at batch 24, 3×227×227,
  ``iterations`` iterations (4: about 0.9 GB and 1,300 tensor pairs per side);
* ``small`` -- many small tensors: a 12-layer MLP of width 32, batch 8, many iterations
  (tens of thousands of files of a few hundred bytes to 4 KB);
* ``large`` -- few large tensors: an MLP 256→4096→4096→256 at batch 256 (a 64 MiB
  weight, 4 MiB ones), 1 iteration.

A statistics-only pair (``stats``) of the small MLP gives the 100,000-row compare.

``statsdiffer`` -- two statistics dumps whose operator sequences differ (issue 25's flagship
case): a tiny random ``transformers`` MobileBERT (no download), 40 training iterations, ``a``
under ``torch.autocast("cpu", bfloat16)`` (its casts are operators the other run lacks), ``b``
in float32; no ``same``.

Usage: ``python bench/compare_dumps.py --root /tmp/opdump-cmp [--shapes alexnet,small,large,stats]``.
A shape whose three folders exist is kept (``--force`` rewrites).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Callable, Dict, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

VARIANTS = ("a", "b", "same")


class DeepMLP(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class WideMLP(nn.Module):
    def __init__(self, d_in: int, width: int, d_out: int):
        super().__init__()
        self.fc1 = nn.Linear(d_in, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, d_out)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _alexnet() -> Tuple[nn.Module, torch.Tensor, torch.Tensor, nn.Parameter]:
    from opdump.demo.models import AlexNet
    m = AlexNet()
    x, y = torch.randn(24, 3, 227, 227), torch.randint(0, 10, (24,))
    return m, x, y, m.conv1.weight


def _small() -> Tuple[nn.Module, torch.Tensor, torch.Tensor, nn.Parameter]:
    m = DeepMLP(32, 12)
    x, y = torch.randn(8, 32), torch.randint(0, 32, (8,))
    return m, x, y, m.layers[0].weight


def _large() -> Tuple[nn.Module, torch.Tensor, torch.Tensor, nn.Parameter]:
    m = WideMLP(256, 4096, 256)
    x, y = torch.randn(256, 256), torch.randint(0, 256, (256,))
    return m, x, y, m.fc1.weight


def _mobilebert():
    """A tiny random MobileBERT for sequence classification: (model, ids, labels, word embeddings)."""
    from transformers import MobileBertConfig, MobileBertForSequenceClassification
    cfg = MobileBertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                           intermediate_size=32, embedding_size=16, intra_bottleneck_size=16,
                           true_hidden_size=16, max_position_embeddings=64, num_labels=4,
                           num_feedforward_networks=2)
    m = MobileBertForSequenceClassification(cfg)
    x, y = torch.randint(0, 100, (4, 16)), torch.randint(0, 4, (4,))
    return m, x, y, m.mobilebert.embeddings.word_embeddings.weight


#: shape -> (builder, iterations, saved_data)
SHAPES: Dict[str, Tuple[Callable, int, str]] = {
    "alexnet": (_alexnet, 4, "tensor"),
    "small": (_small, 60, "tensor"),
    "large": (_large, 1, "tensor"),
    "stats": (_small, 250, "statistic"),
    "statsdiffer": (_mobilebert, 40, "statistic"),
}

#: shapes whose pair is not A vs a perturbed B: shape -> {variant: autocast to bfloat16}
AUTOCAST = {"statsdiffer": {"a": True, "b": False}}


def variants(shape: str) -> Tuple[str, ...]:
    return tuple(AUTOCAST[shape]) if shape in AUTOCAST else VARIANTS


def dump_one(path: str, shape: str, variant: str, iterations: int) -> float:
    """Dump ``iterations`` training steps of ``shape`` into ``path``; seconds taken."""
    import opdump
    from opdump.capture.eager import EagerCapture
    from opdump.config.iteration import IterationSpec
    from opdump.config.model import DumpConfig
    build, _its, saved = SHAPES[shape]
    torch.manual_seed(0)
    model, x, y, first = build()
    bf16 = AUTOCAST.get(shape, {}).get(variant, False)
    if variant == "b" and shape not in AUTOCAST:
        with torch.no_grad():
            first.mul_(1 + 1e-6)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss = (lambda out, y: F.cross_entropy(out.logits.float(), y)) if shape in AUTOCAST else F.cross_entropy
    cfg = DumpConfig(path=path, iteration=IterationSpec(ranges=((0, iterations - 1),)), saved_data=saved)
    t0 = time.perf_counter()
    with opdump.Session(cfg) as s, EagerCapture(s):
        for _ in range(iterations):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = model(x)
            loss(out, y).backward()
            opt.step()
    return time.perf_counter() - t0


def folder(root: str, shape: str, variant: str) -> str:
    return os.path.join(root, shape, variant)


def ensure(root: str, shape: str, iterations: int = 0, force: bool = False, log=print) -> Dict[str, str]:
    """The dumps of ``shape`` under ``root`` (written when missing) -> {variant: path}."""
    its = iterations or SHAPES[shape][1]
    out = {}
    for v in variants(shape):
        p = folder(root, shape, v)
        done = os.path.join(p, ".bench_done")
        if force and os.path.isdir(p):
            shutil.rmtree(p)
        if not os.path.exists(done):
            if os.path.isdir(p):
                shutil.rmtree(p)
            s = dump_one(p, shape, v, its)
            with open(done, "w") as f:
                f.write(f"{its}\n")
            log(f"dumped {shape}/{v}: {its} iterations in {s:.1f} s")
        out[v] = p
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="/tmp/opdump-cmp")
    ap.add_argument("--shapes", default="alexnet,small,large,stats")
    ap.add_argument("--iterations", type=int, default=0, help="override the shape's iteration count")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    for shape in a.shapes.split(","):
        ensure(a.root, shape, a.iterations, a.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
