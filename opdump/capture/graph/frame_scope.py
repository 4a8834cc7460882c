"""Module scopes of a graph compiled from a frame other than the model's own ``forward``:
a graph break's resume function, or a sub-module's ``forward`` compiled on its own.

Why: Dynamo records each FX node's ``nn_module_stack`` relative to the frame it compiles.
After a graph break two things go wrong for naming (README, "Eager mode": scopes):

* a module already loaded on the value stack when the break happened
  (``self.head(self.moe(x))`` breaks inside ``self.moe``) reaches the resume function
  as an argument, and its entry reads ``L['___stack0']`` -- which, cleaned, looked like
  the root: ``Default/_MoeNet/addmm`` instead of ``Default/_MoeNet/head-Linear/addmm``;
* a break inside a sub-module's ``forward`` makes Dynamo compile that ``forward`` (and
  its resume function) as frames of their own, whose paths start at the sub-module
  (``L['self'].b``): the enclosing ``blk-Blk`` segment and the real root were lost.

Rule: at compile time (the backend call, while the frames are live) the user ``forward``
frames of modules on the Python stack, outermost first, plus the compiled frame's own
``self``, give the enclosing chain; the outermost is the root.  Every module of the root
is numbered by ``id`` → registered path (``named_modules``: first registration wins, as
eager names a shared module), each ``L['name']`` local of the compiled frame that is a
module of the root gets that path, and a stack entry ``L['name'].rest`` is renamed
``<path of name>.rest``.  The chain's modules below the root are put in front of every
stack, as eager mode has them on its scope stack.  Only strings are kept (the backward
graph is compiled lazily, at the first backward, from the same context).  Anything not
resolvable keeps Dynamo's own entry (the former behaviour); nothing here raises.  The
enclosing modules get no ``@k`` call counts (as in :mod:`opdump.capture.eager.skipped`:
those need the hooks' calls), so a break inside a block called twice in one ``forward``
names both calls' operators after the first.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Dict, List, Optional, Tuple

import torch

from ..naming import _GETATTR, class_name

_RESUME = re.compile(r"^torch_dynamo_resume_in_(.*)_at_\d+$")
_LOCAL = re.compile(r"^L\['([^']*)'\]")
_WRAPPED = re.compile(r"(^|\.)_orig_mod(?=\.|$)")


def _unwrap(path: str) -> str:
    """``getattr(L['self'].layers, '0')`` → ``L['self'].layers.0`` (Dynamo's spelling of an
    attribute that is not an identifier), so that the local it starts from can be read."""
    while True:
        m = _GETATTR.search(path)
        if not m:
            return path
        path = path[: m.start()] + f"{m.group(1)}.{m.group(2)}" + path[m.end():]


def _registered(name: str) -> str:
    """A ``named_modules`` path without the ``_orig_mod`` of a ``torch.compile`` wrapper: eager
    mode names the wrapped module where the wrapper is registered."""
    return _WRAPPED.sub("", name).lstrip(".")


class FrameScope:
    """How to rewrite the ``nn_module_stack`` of one compiled frame's nodes (see the module doc).

    ``root`` is the root class name (None: unknown); ``prefix`` the (key, (path, class))
    entries of the enclosing modules below the root; ``locals_`` maps a frame local's name
    to its root-relative module path."""

    def __init__(self, root: Optional[str] = None, prefix: Tuple = (), locals_: Optional[Dict[str, str]] = None):
        self.root = root
        self.prefix = tuple(prefix)
        self.locals_ = dict(locals_ or {})

    def stack(self, nn_module_stack) -> Dict:
        """``nn_module_stack`` with root-relative paths, the enclosing modules in front."""
        if not self.prefix and not self.locals_:
            return nn_module_stack
        out = dict(self.prefix)
        for key, value in (nn_module_stack or {}).items():
            try:
                path, cls = value
                raw = _unwrap(str(path))
                m = _LOCAL.match(raw)
                base = self.locals_.get(m.group(1)) if m else None
                if base is not None:
                    rest = raw[m.end():]
                    path = f"L['self']{'.' + base if base else ''}{rest}"
                out[key] = (path, cls)
            except Exception:  # noqa: BLE001 - an unexpected entry: keep Dynamo's own
                out[key] = value
        return out


def _enclosing_modules(tx) -> List[torch.nn.Module]:
    """Modules whose user ``forward`` is running (Python stack, outermost first), then the
    compiled frame's own ``self`` (a plain ``forward``; a resume function's caller is the
    original frame, already on the stack)."""
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    chain: List[torch.nn.Module] = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if (code.co_argcount and _RESUME.sub(r"\1", code.co_name) == "forward"
                and not code.co_filename.startswith((torch_dir, "<"))):
            first = frame.f_locals.get(code.co_varnames[0])
            if (isinstance(first, torch.nn.Module) and not isinstance(first, torch.fx.GraphModule)
                    and not any(first is c for c in chain)):
                chain.append(first)
        frame = frame.f_back
    chain.reverse()
    code = tx.f_code
    if code.co_argcount and code.co_name == "forward":
        first = tx.f_locals.get(code.co_varnames[0])
        if isinstance(first, torch.nn.Module) and not any(first is c for c in chain):
            chain.append(first)
    return chain


def frame_scope() -> FrameScope:
    """The :class:`FrameScope` of the frame Dynamo is compiling now (empty if unknown)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        tx = InstructionTranslator.current_tx()
        chain = _enclosing_modules(tx)
        if not chain:
            return FrameScope()
        root = chain[0]
        paths: Dict[int, str] = {}
        for name, module in root.named_modules(remove_duplicate=True):
            paths.setdefault(id(module), _registered(name))
        prefix = []
        for module in chain[1:]:
            path = paths.get(id(module))
            if path:                      # not registered under the root: no segment, as in eager
                prefix.append((str(id(module)), (f"L['self'].{path}", class_name(type(module)))))
        locals_ = {name: paths[id(v)] for name, v in tx.f_locals.items()
                   if isinstance(v, torch.nn.Module) and id(v) in paths}
        return FrameScope(class_name(type(root)), prefix, locals_)
    except Exception:  # noqa: BLE001 - Dynamo internals vary across versions: Dynamo's own stacks then
        return FrameScope()
