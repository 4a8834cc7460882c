"""The benchmark models: a training step (forward, loss, backward, optimizer) per model.

* ``alexnet``: the seed's AlexNet shape (``opdump.demo.models.AlexNet``), batch 8,
  3×227×227, SGD;
* ``transformer``: ``nn.TransformerEncoder`` of ``layers`` × ``nn.TransformerEncoderLayer``
  (d_model 256, 4 heads, PyTorch's defaults otherwise: dim_feedforward 2048,
  dropout 0.1, post-norm), seq 128, batch 8, mean pooling + a linear head, AdamW;
* ``mlp``: a wide MLP (1024 → width → width → 1024, ReLU), batch 256, SGD — large
  tensors (a 4096×4096 float32 weight is 64 MiB) for write throughput;
* ``decoder``: a Llama-style decoder with small kernels (``transformers``
  ``LlamaForCausalLM`` built from a config, random weights, no download): 2 layers,
  hidden 64, 4 heads, 2 KV heads, MLP 128, vocab 512, seq 64, batch 4, next-token
  cross-entropy, AdamW — about a thousand small operators per step, where the host's
  Python per operator, not the kernels, sets the step time (issue 24 item 5).

Every builder takes ``quick`` (smaller sizes for the smoke run) and seeds the
initialisation, so two instances built with the same arguments are identical.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch
from torch import nn
import torch.nn.functional as F


@dataclass
class Workload:
    name: str
    describe: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    loss_fn: Callable
    run_model: Optional[Callable] = None     # the (possibly compiled) callable; default: model
    extra: Dict = field(default_factory=dict)

    def step(self) -> None:
        fn = self.run_model if self.run_model is not None else self.model
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(fn(self.x), self.y)
        loss.backward()
        self.optimizer.step()


class Encoder(nn.Module):
    """``nn.TransformerEncoder`` + mean pooling + a linear classifier."""

    def __init__(self, layers: int, d_model: int, heads: int, classes: int = 10, ffn: int = 2048):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=ffn, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


class WideMLP(nn.Module):
    def __init__(self, d_in: int, width: int, classes: int):
        super().__init__()
        self.fc1 = nn.Linear(d_in, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, classes)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))


def _repo_on_path() -> None:
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)


def alexnet(quick: bool = False, seed: int = 0) -> Workload:
    _repo_on_path()
    from opdump.demo.models import AlexNet
    torch.manual_seed(seed)
    batch, side = (4, 227) if quick else (8, 227)
    model = AlexNet()
    x = torch.randn(batch, 3, side, side)
    y = torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return Workload("alexnet", f"AlexNet (opdump.demo.models), batch {batch}, 3×{side}×{side}, SGD",
                    model, opt, x, y, F.cross_entropy)


def transformer(quick: bool = False, layers: Optional[int] = None, seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    if quick:
        d_model, heads, seq, batch, nl, ffn = 32, 4, 16, 4, layers or 2, 64
    else:
        d_model, heads, seq, batch, nl, ffn = 256, 4, 128, 8, layers or 4, 2048
    model = Encoder(nl, d_model, heads, ffn=ffn)
    x = torch.randn(batch, seq, d_model)
    y = torch.randint(0, 10, (batch,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return Workload(f"transformer-{nl}L" if layers else "transformer",
                    f"nn.TransformerEncoder, {nl} layers, d_model {d_model}, {heads} heads, "
                    f"ffn {ffn}, seq {seq}, batch {batch}, AdamW",
                    model, opt, x, y, F.cross_entropy, extra={"layers": nl})


def mlp(quick: bool = False, width: Optional[int] = None, seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    d_in, classes = (256, 256) if quick else (1024, 1024)
    w = width or (512 if quick else 4096)
    batch = 64 if quick else 256
    model = WideMLP(d_in, w, classes)
    x = torch.randn(batch, d_in)
    y = torch.randint(0, classes, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return Workload(f"mlp-{w}" if width else "mlp",
                    f"MLP {d_in}→{w}→{w}→{classes}, batch {batch}, SGD",
                    model, opt, x, y, F.cross_entropy, extra={"width": w})


def _lm_loss(out, y):
    """Next-token cross-entropy over every position: ``out`` is the model's output
    (``.logits`` of a ``transformers`` causal LM, batch × seq × vocab), ``y`` the targets."""
    logits = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def decoder(quick: bool = False, seed: int = 0) -> Workload:
    """The Llama-style small-kernel decoder (needs ``transformers``, the test extra)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    if quick:
        layers, hidden, heads, kv, ffn, vocab, seq, batch = 1, 32, 4, 2, 64, 128, 16, 2
    else:
        layers, hidden, heads, kv, ffn, vocab, seq, batch = 2, 64, 4, 2, 128, 512, 64, 4
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2 * seq,
                         attention_dropout=0.0, use_cache=False)
    model = LlamaForCausalLM(config)
    tokens = torch.randint(0, vocab, (batch, seq + 1))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return Workload("decoder", f"Llama-style decoder (transformers LlamaForCausalLM), {layers} layer{'s' * (layers > 1)}, hidden {hidden}, "
                    f"{heads} heads, {kv} KV heads, MLP {ffn}, vocab {vocab}, seq {seq}, batch {batch}, AdamW",
                    model, opt, x, y, _lm_loss, extra={"layers": layers})


BUILDERS = {"alexnet": alexnet, "transformer": transformer, "mlp": mlp, "decoder": decoder}
