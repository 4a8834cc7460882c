"""Which operators are the same computation under two front ends, and which exist on one
side only because of the front end (README, "Analysis": compare).

Eager mode dumps the ATen operators PyTorch runs; graph mode dumps those of the graph
AOTAutograd hands the backend, after functionalization. The same step then differs in
ways that compute nothing different:

* **twins** -- an in-place operator and its functional form (``add_``/``add``,
  ``mul_``/``mul``: any ``<op>_`` against ``<op>``), functionalization's replacements
  (``_native_batch_norm_legit_functional`` for ``native_batch_norm``, ``lift_fresh_copy``
  for ``lift_fresh``, ``_unsafe_view`` for ``view``). :func:`canonical_type` maps both to
  one name, so the matcher pairs them; a twin's extra outputs (the new running statistics
  a functional batch norm returns, which eager writes in place) take no part in its
  signature.
* **front-end operators** -- present on one side only by the nature of the front end,
  value-preserving or allocating: ``clone`` (a dropout with p=0 in AOT's graph,
  functionalization's copies), ``copy_`` (functionalization writing a mutated buffer
  back), ``detach``/``alias`` (autograd's own), ``empty*``/``zeros*`` allocations
  (eager's backward materialising a zero gradient, eager batch norm's empty reserve);
  graph inputs that are not parameters (``Parameter.inputsK``: the batch, which eager
  sees as the first operators' inputs) and lifted constants (``constants/…``: eager reads
  them through ``lift_fresh``); a twin's extra outputs; a parameter or buffer only one
  dump holds (graph mode dumps what the compiled graph reads, eager mode every parameter
  and buffer of the root); and a sum that adds nothing -- an ``add`` whose output file
  holds exactly the bytes of one of its inputs (AOTAutograd adding the zero tangent of a
  returned output that the loss does not use: eager autograd never sums it). When they
  are left unpaired, compare reports them as front-end (rule ``front-end``), not as
  unmatched operators.

Guarantees: an operator that computes something (``arange``, ``where``, an ``add`` that
changes a bit…) is never front-end: left unpaired it stays unmatched; twins are equal
only through this table, never through a guess.
"""
from __future__ import annotations

import os
from operator import itemgetter
from typing import Dict

__all__ = ["RULE_FRONT_END", "canonical_type", "canonical_signature", "is_front_end", "adds_nothing", "TWINS",
           "FRONT_END_OPS"]

RULE_FRONT_END = "front-end"

#: functional replacements introduced by functionalization / AOTAutograd -> the eager operator
TWINS: Dict[str, str] = {
    "_native_batch_norm_legit_functional": "native_batch_norm",
    "_native_batch_norm_legit": "native_batch_norm",
    "lift_fresh_copy": "lift_fresh",
    "_unsafe_view": "view",
}

#: outputs a twin has beyond its eager form (first slot not shared): not part of its signature
EXTRA_OUTPUTS: Dict[str, int] = {"_native_batch_norm_legit_functional": 3}

#: value-preserving or allocating operators that one front end runs and the other does not
FRONT_END_OPS = frozenset({
    "clone", "copy_", "copy", "detach", "alias", "lift_fresh", "lift_fresh_copy",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "zeros", "zeros_like", "new_zeros",
})

def canonical_type(op_type: str) -> str:
    """The name both front ends' forms of one computation share (lower case, no overload)."""
    t = TWINS.get(op_type, op_type)
    if t.endswith("_") and not t.endswith("__") and len(t) > 1:
        return t[:-1]
    return t


_IO_SLOT = itemgetter(0, 1)


def canonical_signature(call, ios: frozenset) -> tuple:
    """An :class:`~.pairs.OpCall`'s signature with its type made canonical and a twin's
    extra outputs left out."""
    base = call.base_type
    cut = EXTRA_OUTPUTS.get(base)
    if cut is None:
        sigs = [t.signature() for t in call.tensors if t.io in ios]
    else:
        sigs = [t.signature() for t in call.tensors if t.io in ios and not (t.io == "output" and t.slot >= cut)]
    sigs.sort(key=_IO_SLOT)                         # by (io, slot), stable: sorted(..., key=lambda s: (s[0], s[1]))
    return (canonical_type(base),) + tuple(sigs)


def is_front_end(tensor, call_paired: bool) -> bool:
    """Is this unpaired tensor on its side only because of the front end? ``call_paired``:
    other tensors of its operator call were paired."""
    if tensor.kind == "constant":
        return True
    if tensor.kind != "op":
        return True                 # a graph input, or a parameter/buffer only one front end dumps
    from ..common import base_op_type
    base = base_op_type(tensor.op_type)
    if base in FRONT_END_OPS or TWINS.get(base) in FRONT_END_OPS:
        return True
    cut = EXTRA_OUTPUTS.get(base)
    return call_paired and cut is not None and tensor.io == "output" and tensor.slot >= cut


def _same_bytes(x: str, y: str) -> bool:
    try:
        if os.path.getsize(x) != os.path.getsize(y):
            return False
        with open(x, "rb") as fx, open(y, "rb") as fy:
            while True:
                bx, by = fx.read(1 << 20), fy.read(1 << 20)
                if bx != by:
                    return False
                if not bx:
                    return True
    except OSError:
        return False


def adds_nothing(tensors) -> bool:
    """Is this one-sided call an ``add`` whose output holds the very bytes of one of its
    inputs (same dtype and shape: the files are equal), i.e. a sum with zero?"""
    from ..common import base_op_type
    if not tensors or base_op_type(tensors[0].op_type) not in ("add", "add_"):
        return False
    out = [t for t in tensors if t.io == "output" and t.slot == 0 and t.path]
    ins = [t for t in tensors if t.io == "input" and t.path]
    return bool(out) and any(_same_bytes(out[0].path, t.path) for t in ins)
