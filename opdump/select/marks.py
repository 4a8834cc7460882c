"""``opdump.set_dump(module, enabled)``: the marks behind ``dump_mode: 2``.

A mark applies to the module and everything inside it; a mark on an inner module
overrides its parent's (``enabled=False`` excludes a sub-module).  Marks are kept
by module id (weakly: a dead module's mark goes with it), and read from the
module stack of each operator, innermost first.
"""
from __future__ import annotations

import weakref
from typing import Dict, Iterable, Optional

import torch

_marks: Dict[int, bool] = {}


def set_dump(module: torch.nn.Module, enabled: bool = True) -> None:
    """Mark ``module`` (and its sub-modules) to be dumped (or not) under ``dump_mode`` 2."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"set_dump expects a torch.nn.Module, got {type(module).__name__}")
    key = id(module)
    _marks[key] = bool(enabled)
    weakref.finalize(module, _marks.pop, key, None)


def marked(module_ids: Iterable[str]) -> Optional[bool]:
    """The innermost mark among ``module_ids`` (outermost first), or None."""
    result = None
    for key in module_ids:
        try:   # Dynamo tags a module's later calls as "<id>@<k>"
            value = _marks.get(int(str(key).split("@", 1)[0]))
        except (TypeError, ValueError):
            continue
        if value is not None:
            result = value
    return result
