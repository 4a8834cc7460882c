"""What the graph's inputs and constants are called in the dump.

Guarantees: graph inputs that are parameters or buffers are named by their
module path (``features.0.weight``), other tensor inputs ``inputs0``,
``inputs1``… in order; lifted constants are ``data-0``, ``data-1``… in graph
order, paired with the real tensors the graph module holds (never a fake one).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from ...format.files import constant_name
from ..naming import _clean_path


def input_names(gm: fx.GraphModule, example_inputs: Sequence) -> List[Optional[str]]:
    """Dump names of Dynamo's graph inputs (None for a non-tensor input)."""
    names: List[Optional[str]] = []
    k = 0
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        value = example_inputs[i] if i < len(example_inputs) else None
        if not isinstance(value, torch.Tensor):
            names.append(None)
            continue
        source = getattr(node.meta.get("grapharg"), "source", None)
        text = ""
        if source is not None:
            text = source.name() if callable(getattr(source, "name", None)) else str(getattr(source, "name", ""))
        if "_parameters[" in text or "_buffers[" in text or isinstance(value, torch.nn.Parameter):
            names.append(_clean_path(text.replace("._parameters['", ".").replace("._buffers['", ".")) or node.name)
        else:
            names.append(f"inputs{k}")
            k += 1
    return names


def param_positions(gm: fx.GraphModule, names: Sequence[Optional[str]]) -> List[Tuple[int, str]]:
    """(placeholder position, name) of the AOT forward inputs that map to named Dynamo inputs."""
    out = []
    for pos, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        desc = node.meta.get("desc")
        idx = getattr(desc, "idx", pos) if desc is not None else pos
        if isinstance(idx, int) and 0 <= idx < len(names) and names[idx]:
            out.append((pos, names[idx]))
    return out


def lifted_constants(gm: fx.GraphModule) -> List[Tuple[str, torch.Tensor]]:
    """``(data-{n}, tensor)`` for the tensors an ATen graph reads by ``get_attr``.

    At compile time these are real tensors while a fake-tensor mode is active:
    they are only collected here, and copied out later, at a real call."""
    constants = []
    seen = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target not in seen:
            seen.add(node.target)
            value = getattr(gm, str(node.target), None)
            if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                constants.append((constant_name(len(constants)), value))
    return constants
