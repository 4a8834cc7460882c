"""The arguments of an operator that raised, written twice: as JSON (``exception.json``) and as
the Python source of a standalone script (``repro_<op>.py``) that calls the operator again.

Why here, on its own: the exception dump (:mod:`.exception`) must describe the call
faithfully enough that the script raises the same error from the saved inputs, and the
JSON and the script must agree.  One walk (:class:`Arguments`) numbers the tensors in the
order the input files are numbered (README, Output layout: *slot*: arguments in order,
nested lists flattened) and renders every other value.

Faithful values: ``int``, ``bool``, ``None``, ``str``, ``float`` (``inf``/``-inf``/``nan``
included), ``complex``, lists and tuples (kept apart), ``torch.dtype``, ``torch.device``,
``torch.memory_format``, ``torch.layout``, and anything whose ``repr`` evaluates back to an
equal value with only ``torch`` and ``math`` in scope.  Anything else is rendered as a call
of ``UNSUPPORTED(<repr>)``, which makes the script stop with a message naming it, and the
record says ``"repro_exact": false``.

Nothing here touches torch's state or the files: it returns text.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

_TORCH_ENUMS = (torch.dtype, torch.memory_format, torch.layout)


def _float_source(x: float) -> str:
    if x != x:
        return "math.nan"
    if x in (math.inf, -math.inf):
        return "math.inf" if x > 0 else "-math.inf"
    return repr(x)


def _float_json(x: float):
    if x != x:
        return {"float": "nan"}
    if x in (math.inf, -math.inf):
        return {"float": "inf" if x > 0 else "-inf"}
    return x


def _evaluates_back(value) -> bool:
    try:
        return eval(repr(value), {"torch": torch, "math": math, "__builtins__": {}}) == value  # noqa: S307
    except Exception:  # noqa: BLE001 - not a literal: unsupported
        return False


class Arguments:
    """One operator call's ``args``/``kwargs``: its tensors in slot order, the JSON form and
    the source form of both (tensors appear as ``T[slot]`` in the source, ``{"tensor": slot}``
    in the JSON)."""

    def __init__(self, args: Sequence[Any], kwargs: Dict[str, Any]):
        self.tensors: List[torch.Tensor] = []
        self.unsupported: List[str] = []
        # the same order as the capture's flat_tensors: args first, then kwargs values
        self.args_json = [self._json(a) for a in args]
        self.kwargs_json = {k: self._json(v) for k, v in kwargs.items()}
        self._slot = 0
        self.args_source = self._tuple_source(list(args))
        self.kwargs_source = "{" + ", ".join(f"{k!r}: {self._source(v)}" for k, v in kwargs.items()) + "}"

    @property
    def exact(self) -> bool:
        return not self.unsupported

    # ------------------------------------------------------------------ JSON
    def _json(self, v):
        if isinstance(v, torch.Tensor):
            self.tensors.append(v)
            return {"tensor": len(self.tensors) - 1}
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return _float_json(v)
        if isinstance(v, complex):
            return {"complex": [_float_json(v.real), _float_json(v.imag)]}
        if isinstance(v, tuple):
            return {"tuple": [self._json(x) for x in v]}
        if isinstance(v, list):
            return [self._json(x) for x in v]
        if isinstance(v, torch.dtype):
            return {"dtype": str(v).replace("torch.", "")}
        if isinstance(v, torch.device):
            return {"device": str(v)}
        if isinstance(v, _TORCH_ENUMS):
            return {"torch": str(v).replace("torch.", "")}
        return {"repr": repr(v)}

    # ------------------------------------------------------------------ source
    def _tuple_source(self, items: List[Any]) -> str:
        inner = ", ".join(self._source(x) for x in items)
        return f"({inner},)" if len(items) == 1 else f"({inner})"

    def _source(self, v) -> str:
        if isinstance(v, torch.Tensor):
            slot, self._slot = self._slot, self._slot + 1
            return f"T[{slot}]"
        if v is None or isinstance(v, (bool, int, str)):
            return repr(v)
        if isinstance(v, float):
            return _float_source(v)
        if isinstance(v, complex):
            return f"complex({_float_source(v.real)}, {_float_source(v.imag)})"
        if isinstance(v, tuple):
            return self._tuple_source(list(v))
        if isinstance(v, list):
            return "[" + ", ".join(self._source(x) for x in v) + "]"
        if isinstance(v, torch.device):
            return f"torch.device({str(v)!r})"
        if isinstance(v, _TORCH_ENUMS) or _evaluates_back(v):
            return repr(v)
        self.unsupported.append(repr(v))
        return f"UNSUPPORTED({repr(v)!r})"


def non_tensor_arguments(func, args: Sequence[Any], kwargs: Dict[str, Any], encoded: "Arguments") -> Dict[str, Any]:
    """The JSON form of the arguments that hold no tensor, by schema name (``arg<i>`` without a schema)."""
    schema = getattr(func, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    out: Dict[str, Any] = {}
    for i, (value, coded) in enumerate(zip(args, encoded.args_json)):
        if not _holds_tensor(value):
            out[names[i] if i < len(names) else f"arg{i}"] = coded
    for k, v in kwargs.items():
        if not _holds_tensor(v):
            out[k] = encoded.kwargs_json[k]
    return out


def _holds_tensor(v) -> bool:
    if isinstance(v, torch.Tensor):
        return True
    return isinstance(v, (list, tuple)) and any(_holds_tensor(x) for x in v)


def qualified_op(func) -> Tuple[str, str, str]:
    """(namespace, name, overload) of an ``OpOverload``: ``torch.ops.<ns>.<name>.<overload>``."""
    schema_name = func._schema.name                      # "aten::index_select"
    namespace, _, name = schema_name.partition("::")
    return namespace, name, func._overloadname or "default"


# ---------------------------------------------------------------------- the script
_TEMPLATE = '''#!/usr/bin/env python3
"""Calls {call} again with the inputs it had when it raised (opdump exception dump).

operator:  {full_name}
raised:    {exc_line}
source:    {source}
iteration: {iteration}, graph {graph}

Usage: python {script} [--device DEVICE]

Loads the operator's inputs (the .npy files named below, beside this script), calls the
operator with the recorded arguments and lets its exception propagate (exit status 1 and
its traceback: reproduced).  Exit status 3: the operator ran without raising.  Needs numpy
and torch only.{notes}
"""
import argparse
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OP = {op!r}
EXPECTED = {expected!r}
#: per input slot: (file or None, torch dtype, how the .npy holds it, shape, stride, device)
INPUTS = [
{inputs}]


def UNSUPPORTED(text):
    sys.exit(f"this argument could not be recorded faithfully: {{text}}")


def load(slot, device=None):
    """Input ``slot`` as the operator got it: dtype, shape, strides (when they can be made) and device."""
    file, dtype, stored, shape, stride, recorded = INPUTS[slot]
    if file is None:
        sys.exit(f"input {{slot}} was not saved (see exception.json); cannot reproduce")
    t = torch.from_numpy(np.load(os.path.join(HERE, file), allow_pickle=False))
    want = getattr(torch, dtype)
    if stored == "view":
        t = t.view(want)
    elif t.dtype != want:
        t = t.to(want)
    t = t.reshape(shape)
    if tuple(stride) != tuple(t.stride()):
        try:
            t = torch.empty_strided(shape, stride, dtype=want).copy_(t)
        except RuntimeError:
            pass                 # overlapping strides (an expanded tensor): kept contiguous
    target = device or recorded
    if target.startswith("cuda") and not torch.cuda.is_available():
        print(f"input {{slot}} was on {{target}}; no CUDA here: running on cpu", file=sys.stderr)
        target = "cpu"
    return t.to(target)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="load the inputs on this device instead of the recorded one (e.g. cpu)")
    options = parser.parse_args()
    T = [load(k, options.device) for k in range(len(INPUTS))]
    args = {args}
    kwargs = {kwargs}
    op = getattr(getattr(getattr(torch.ops, OP[0]), OP[1]), OP[2])
    print(f"calling torch.ops.{{'.'.join(OP)}}; it raised {{EXPECTED}}", file=sys.stderr)
    op(*args, **kwargs)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()          # a device-side assert surfaces here
    print("the operator ran without raising: not reproduced", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
'''


def render_script(*, script: str, op: Tuple[str, str, str], full_name: str, exc_type: str, message: str,
                  source: str, iteration: int, graph: int, inputs: Sequence[Tuple], encoded: Arguments,
                  notes: Sequence[str] = ()) -> str:
    """The text of ``repro_<op>.py``.  ``inputs``: per slot ``(file or None, torch dtype name,
    "view"/"to"/"same", shape, stride, device)``."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    exc_line = f"{exc_type}: {first}"
    rows = "".join(f"    {tuple(row)!r},\n" for row in inputs)
    note_text = "".join(f"\n\nNote: {n}" for n in notes)
    return _TEMPLATE.format(
        call="torch.ops." + ".".join(op), full_name=_doc_safe(full_name), exc_line=_doc_safe(exc_line[:300]),
        source=_doc_safe(source or "unknown"), iteration=iteration, graph=graph, script=script,
        notes=_doc_safe(note_text), op=tuple(op), expected=exc_line[:300], inputs=rows,
        args=encoded.args_source, kwargs=encoded.kwargs_source)


def _doc_safe(text: str) -> str:
    """Text that cannot end the script's docstring or smuggle in an escape."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def stored_kind(dtype: torch.dtype) -> str:
    """How the ``.npy`` holds a tensor of ``dtype`` (:mod:`opdump.format.dtypes`): ``"view"``
    (its bits, one byte per element), ``"to"`` (converted exactly) or ``"same"``."""
    from ..format.dtypes import STORED_AS, VIEWED_AS
    name = str(dtype).replace("torch.", "")
    if name in VIEWED_AS:
        return "view"
    return "to" if name in STORED_AS else "same"


def source_of(sources: Sequence) -> Tuple[Optional[object], str]:
    """(innermost visible frame, ``"file:line"``) of an operator's source lines."""
    if not sources:
        return None, ""
    src = sources[-1]
    return src, f"{src.file}:{src.line}"
