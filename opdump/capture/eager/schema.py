"""What the eager capture needs to know about an operator overload, read once from its
schema: its op type, whether it is an operator at all, and which arguments it writes.

One cache, keyed by ``id(func)``: ``OpOverload`` objects live for the whole process, and
their Python-level ``__hash__`` costs more than the lookup itself.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ..aten_ops import NOT_OPERATORS
from ..naming import op_type_of
from .collectives import written_by

Positions = Tuple[Tuple[int, str], ...]        # (position, name) of arguments

#: Operators that write arguments their schema does not mark ``(a!)``: the batch-norm kernels
#: update ``running_mean``/``running_var`` in place in training mode (functionalization uses
#: ``_native_batch_norm_legit_functional`` for this reason).  No version bump witnesses such a
#: write, so without this table a later reader of the buffer (``native_batch_norm_backward``)
#: could be handed the recorder's copy taken before the update.
UNDECLARED_WRITES: Dict[str, Positions] = {
    name: ((3, "running_mean"), (4, "running_var"))
    for name in ("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm")
}


class OpFacts:
    """Schema facts of one operator overload.

    ``types`` is ``(op type, overload)``, or None for what is not dumped as an operator
    (not an ``OpOverload``, or a symbolic-size query).  ``writes``: the operator writes to
    an argument (in-place / ``out=``); ``written``: those arguments; ``writes_list``: one
    of them is a tensor list (``_foreach_*_``); ``mutated``: the written arguments when
    the operator returns nothing (they are dumped as its outputs); ``collective``: a
    ``c10d`` collective, whose outputs (``mutated``: the argument it writes) are recorded
    when its work completes (:mod:`.collectives`)."""

    __slots__ = ("types", "writes", "written", "writes_list", "mutated", "collective")

    def __init__(self, func):
        types: Optional[Tuple[str, str]] = None
        if isinstance(func, torch._ops.OpOverload):
            types = op_type_of(func)
            if types[0] in NOT_OPERATORS:
                types = None
        self.types = types
        schema = getattr(func, "_schema", None)
        written_args = ([(i, a) for i, a in enumerate(schema.arguments)
                         if a.alias_info is not None and a.alias_info.is_write] if schema is not None else [])
        self.writes = bool(schema is not None and schema.is_mutable)
        self.written: Positions = tuple((i, a.name) for i, a in written_args)
        undeclared = UNDECLARED_WRITES.get(types[0]) if types is not None else None
        if undeclared:
            self.writes, self.written = True, self.written + undeclared
        self.writes_list = any(isinstance(a.type, torch.ListType) for _, a in written_args)
        self.mutated: Positions = self.written if schema is not None and not schema.returns else ()
        collective = written_by(func)
        self.collective = collective is not None
        if collective is not None:     # writes its schema does not mark; returns a Work handle
            self.mutated = collective


_FACTS: Dict[int, OpFacts] = {}


def facts_of(func) -> OpFacts:
    """The (cached) :class:`OpFacts` of ``func``."""
    facts = _FACTS.get(id(func))
    if facts is None:
        facts = _FACTS[id(func)] = OpFacts(func)
    return facts
