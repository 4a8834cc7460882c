"""The scope of an operator run eagerly inside a compiled model, in a sub-module whose frame
Dynamo skipped (README, "Eager mode": scopes).

Why: under ``torch.compile(model)`` the module hooks of ``model``'s sub-modules run while
Dynamo traces (and do nothing then); when a sub-module's ``forward`` cannot be compiled (a
data-dependent ``continue`` in an MoE expert loop) its frame runs eagerly, with no hook
telling the tracker it was entered, so its operators got the root's scope
(``Default/_MoeNet/addmm-op12`` instead of ``Default/_MoeNet/moe-_Moe/experts.1-Linear/addmm-op12``).

Rule: only when the top of the tracker's stack is a compiled root (an ``OptimizedModule``:
the common eager path pays one ``isinstance``), the Python stack is walked up to the
wrapped module's own ``forward``; the ``forward`` frames of modules met on the way (their
``self``), outermost first, are named below it as :class:`.scopes.ScopeTracker` names them
(registered path, class; a module not registered under its caller adds no segment).  No
``@k`` call counts (they need the hooks' calls).  Found nothing: None (the root's scope).
"""
from __future__ import annotations

import sys
from typing import Optional

from .scopes import Frame, display_class, is_compiled_wrapper

__all__ = ["skipped_frame"]


def skipped_frame(top: Frame, tracker) -> Optional[Frame]:
    """The :class:`.scopes.Frame` of the innermost sub-module running eagerly below the
    compiled root ``top``, or None (``top`` no compiled root, or no such frame)."""
    if not is_compiled_wrapper(top.module):
        return None
    root = getattr(top.module, "_orig_mod", None)
    if root is None:
        return None
    import torch.nn as nn
    chain = []
    f = sys._getframe(1)
    while f is not None:
        if "self" in f.f_code.co_varnames[:1]:
            s = f.f_locals.get("self")
            if s is root or s is top.module:
                break
            if isinstance(s, nn.Module) and f.f_code.co_name == "forward" and (not chain or chain[-1] is not s):
                chain.append(s)
        f = f.f_back
    if f is None or not chain:
        return None                     # the wrapped module's frame not found: not below it
    parent, path, pairs, ids = root, top.path, top.pairs, top.ids
    for module in reversed(chain):
        ids = ids + (str(id(module)),)
        name = tracker._name_in(parent, module)
        if name is None:
            continue
        path = f"{path}.{name}" if path else name
        pairs = pairs + ((path, display_class(module)),)
        parent = module
    return Frame(chain[0], path, pairs, ids, top.root, False)
