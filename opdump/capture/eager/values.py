"""The arguments and results of one eager operator call, as the dump sees them.

Guarantees (README, Output layout: *slot*): input slots number the tensors among the
operator's arguments, in order, nested lists flattened, ``None`` skipped -- as graph mode
numbers its tensor inputs; output slots are positions in the operator's result tuple, so
a ``None`` output keeps its slot (``convolution_backward``'s output.1 is always the weight
gradient), exactly as graph mode numbers them.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils import _pytree as pytree

from ..op_info import is_nonfinite_scalar
from ...format.dtypes import dtype_name
from .schema import Positions


def flat_tensors(values, out: List[torch.Tensor]) -> List[torch.Tensor]:
    """The tensors in ``values`` (nested lists/tuples flattened), appended to ``out``."""
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            flat_tensors(v, out)
    return out


def output_slots(value) -> List[Optional[torch.Tensor]]:
    """An operator's result as slots: a tensor is slot 0; a tuple/list of tensors and
    ``None`` keeps every position; anything else is flattened (the graph front-end's rule)."""
    if type(value) is torch.Tensor or isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and all(v is None or isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def tensors_at(args, kwargs, positions: Positions) -> List[torch.Tensor]:
    """The tensors of the arguments at ``positions`` (passed positionally or by name)."""
    return flat_tensors([args[i] if i < len(args) else kwargs.get(name) for i, name in positions], [])


def has_nonfinite_arg(args, kwargs) -> bool:
    """Is a non-tensor argument Inf/NaN (or a float type's extreme)?  See
    :func:`opdump.capture.op_info.is_nonfinite_scalar`."""
    for v in args:
        if (type(v) is float or type(v) in (list, tuple)) and is_nonfinite_scalar(v):
            return True
    if kwargs:
        for v in kwargs.values():
            if is_nonfinite_scalar(v):
                return True
    return False


def _has_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v) for v in value)
    return False


def non_tensor_args(func, args, kwargs) -> Dict[str, Any]:
    """The arguments that are not tensors, by schema name (``save_kernel_args``, the listing)."""
    schema = getattr(func, "_schema", None)
    named: Dict[str, Any] = {}
    if schema is not None:
        for arg, value in zip(schema.arguments, args):
            named[arg.name] = value
    else:
        named.update({f"arg{i}": v for i, v in enumerate(args)})
    named.update(kwargs)
    return {k: v for k, v in named.items() if not _has_tensor(v)}


def meta(t: torch.Tensor) -> Tuple[Tuple[int, ...], str]:
    """(shape, dtype name) of a tensor, as the listing shows it."""
    return tuple(t.shape), dtype_name(t.dtype)


def arg_text(value, producers) -> str:
    """An argument as written in the ``.ir`` line: ``%N`` for a tensor a listed operator
    produced (``%input`` otherwise), lists in brackets, anything else its ``repr``."""
    if isinstance(value, torch.Tensor):
        return producers.get(value, "%input")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(arg_text(v, producers) for v in value) + "]"
    return repr(value)
