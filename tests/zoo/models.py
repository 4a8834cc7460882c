"""The model zoo: small, randomly initialised models a user would debug with opdump.

Third-party models are built from ``transformers`` config objects (no download,
no weights): a Llama-style decoder, GPT-2, BERT, ViT and a ResNet, one layer and
tiny widths each.  Next to them, small models written to exercise what broke on
real models (issue 17): a lifted tensor constant in ``forward``, a ``ModuleDict``
key holding ``:``, forward hooks, a branch taken only at step 1, bf16 autocast.

Every model computes its loss inside its own ``forward`` (so eager capture's
default ``"model"`` scope sees it), is deterministic (dropout probabilities are
0, data comes from a seeded generator), and names

* ``nan_module``: the dotted path of a sub-module returning a tensor, where the
  zoo's NaN-injecting forward hook (:func:`nan_hook`) is registered;
* ``line``: a ``(file suffix, line)`` inside that model's own source (the
  ``transformers`` file for library models) whose operators ``locate`` must list.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2
SEQ = 8
VOCAB = 64


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry: how to build it, feed it, and where to poke it."""

    name: str
    build: Callable[[], nn.Module]                      # called under torch.manual_seed(0)
    batch: Callable[[torch.Generator], Dict[str, torch.Tensor]]
    nan_module: str                                     # dotted path of the module whose output turns NaN
    line: Callable[[], Tuple[str, int]]                 # (file suffix, line) to locate
    autocast: bool = False                              # run the step under CPU bf16 autocast
    step_attr: bool = False                             # the model reads ``model.zoo_step`` (set before each step)
    line_steps: Tuple[int, ...] = (0, 1)                # the steps in which ``line`` runs


# ---------------------------------------------------------------- the NaN hook
class NanSwitch:
    """Whether :func:`nan_hook` injects: a plain bool, so a compiled graph guards on it."""

    on = False


def nan_hook(module, args, output):
    """Forward hook: at the step the test chooses, the module's output becomes NaN.

    ``(o - o) / (o - o)`` is 0/0: a ``div`` whose inputs are finite and whose output
    is NaN, i.e. the origin that ``overflow`` must name (a NaN scalar argument would
    not be an origin, README "Analysis")."""
    if not NanSwitch.on:
        return None
    return output + (output - output) / (output - output)          # NAN_HOOK_LINE


def nan_hook_line() -> Tuple[str, int]:
    return _line_of(nan_hook, "NAN_HOOK_LINE")


def _line_of(func, marker: str) -> Tuple[str, int]:
    """(absolute file, line) of the source line of ``func`` that contains ``marker``."""
    lines, start = inspect.getsourcelines(func)
    for i, text in enumerate(lines):
        if marker in text:
            return inspect.getsourcefile(func), start + i
    raise AssertionError(f"{marker!r} not in {func.__qualname__}")


def _library_line(cls, marker: str) -> Tuple[str, int]:
    """A line of a ``transformers`` class's forward, as ``models/<m>/modeling_<m>.py`` + line."""
    path, line = _line_of(cls.forward, marker)
    return "/".join(path.replace("\\", "/").split("/")[-3:]), line


# ---------------------------------------------------------------- data
def _token_batch(gen: torch.Generator) -> Dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return {"input_ids": ids, "labels": ids.clone()}


def _class_batch(gen: torch.Generator) -> Dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long),
            "labels": torch.randint(0, 3, (BATCH,), generator=gen)}


def _image_batch(size: int) -> Callable[[torch.Generator], Dict[str, torch.Tensor]]:
    def make(gen: torch.Generator) -> Dict[str, torch.Tensor]:
        return {"pixel_values": torch.randn(BATCH, 3, size, size, generator=gen),
                "labels": torch.randint(0, 3, (BATCH,), generator=gen)}
    return make


def _vector_batch(gen: torch.Generator) -> Dict[str, torch.Tensor]:
    return {"x": torch.randn(BATCH, 4, generator=gen), "y": torch.randn(BATCH, 3, generator=gen)}


# ---------------------------------------------------------------- transformers models
def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=SEQ * 2, attention_dropout=0.0))


def _llama_line():
    from transformers.models.llama.modeling_llama import LlamaMLP
    return _library_line(LlamaMLP, "down_proj")


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ * 2, n_embd=16, n_layer=1, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _gpt2_line():
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    return _library_line(GPT2MLP, "self.c_fc(")


def bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification
    return BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=SEQ * 2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        num_labels=3))


def _bert_line():
    from transformers.models.bert.modeling_bert import BertIntermediate
    return _library_line(BertIntermediate, "self.dense(")


def vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification
    return ViTForImageClassification(ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3))


def _vit_line():
    from transformers.models.vit.modeling_vit import ViTMLP
    return _library_line(ViTMLP, "self.fc1(")


def resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification
    return ResNetForImageClassification(ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
        num_labels=3))


def _resnet_line():
    from transformers.models.resnet.modeling_resnet import ResNetConvLayer
    return _library_line(ResNetConvLayer, "self.convolution(")


# ---------------------------------------------------------------- models for what broke
class ConstNet(nn.Module):
    """A tensor constant created in ``forward``: Dynamo lifts it into the graph."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.out = nn.Linear(3, 3)

    def forward(self, x, y):
        h = self.fc(x) * torch.tensor([1.0, 2.0, 3.0])          # CONST_LINE
        return F.mse_loss(self.out(torch.tanh(h)), y)


class ColonNet(nn.Module):
    """``ModuleDict`` keys holding ``:`` (a character the dump's file names replace)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({"enc:0": nn.Linear(4, 8), "enc:1": nn.Linear(8, 3)})

    def forward(self, x, y):
        h = torch.relu(self.layers["enc:0"](x))                 # COLON_LINE
        return F.mse_loss(self.layers["enc:1"](h), y)


def _halve(module, args, output):
    return output * 0.5                                         # HALVE_LINE


def _shift(module, args):
    return (args[0] + 1.0,)


class HookNet(nn.Module):
    """Forward hooks and forward pre-hooks that change what the layers see and return."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)
        self.fc1.register_forward_hook(_halve)
        self.fc2.register_forward_pre_hook(_shift)

    def forward(self, x, y):
        h = torch.sigmoid(self.fc1(x))                           # HOOK_LINE
        return F.mse_loss(self.fc2(h), y)


class BranchNet(nn.Module):
    """A branch taken only at step 1: eager's operator sequence differs between steps."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.extra = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)
        self.zoo_step = 0

    def forward(self, x, y):
        h = torch.relu(self.fc(x))
        if self.zoo_step == 1:
            h = h + torch.tanh(self.extra(h))                     # BRANCH_LINE
        return F.mse_loss(self.head(h), y)


class Bf16Net(nn.Module):
    """An MLP trained under CPU bf16 autocast (the step runs inside ``torch.autocast``)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x, y):
        h = F.gelu(self.fc1(x))                                   # BF16_LINE
        return F.mse_loss(self.fc2(h).float(), y)


MODELS: Dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("llama", llama, _token_batch, "model.layers.0.mlp", _llama_line),
    ZooModel("gpt2", gpt2, _token_batch, "transformer.h.0.mlp", _gpt2_line),
    ZooModel("bert", bert, _class_batch, "bert.encoder.layer.0.intermediate", _bert_line),
    ZooModel("vit", vit, _image_batch(8), "vit.layers.0.mlp", _vit_line),
    ZooModel("resnet", resnet, _image_batch(16), "resnet.embedder", _resnet_line),
    ZooModel("const", ConstNet, _vector_batch, "fc", lambda: _line_of(ConstNet.forward, "CONST_LINE")),
    ZooModel("colon", ColonNet, _vector_batch, "layers.enc:0", lambda: _line_of(ColonNet.forward, "COLON_LINE")),
    ZooModel("hooks", HookNet, _vector_batch, "fc2", lambda: _line_of(HookNet.forward, "HOOK_LINE")),
    ZooModel("branch", BranchNet, _vector_batch, "extra", lambda: _line_of(BranchNet.forward, "BRANCH_LINE"),
             step_attr=True, line_steps=(1,)),
    ZooModel("bf16", Bf16Net, _vector_batch, "fc1", lambda: _line_of(Bf16Net.forward, "BF16_LINE"),
             autocast=True),
)}


def module_scope(model: nn.Module, path: str) -> str:
    """The scope segment opdump gives the module at ``path``: ``<last name>-<Class>``.

    (Containers that are never called, such as ``ModuleList``/``ModuleDict``, fold
    into the child's name: ``layers.0-LlamaDecoderLayer``; only the innermost
    segment is returned, which is what the checks need.)"""
    module = model.get_submodule(path)
    parts = path.split(".")
    parent = model.get_submodule(".".join(parts[:-1])) if len(parts) > 1 else model
    name = parts[-1]
    if isinstance(parent, (nn.ModuleList, nn.ModuleDict)) and len(parts) > 1:
        name = f"{parts[-2]}.{parts[-1]}"
    return f"{name}-{type(module).__name__}"
