"""Which model Dynamo is compiling: the root class of operator scopes.

Dynamo hands the backend a graph, not the module it came from; the root class
(``Default/<RootClass>/…``) is read from the frame being compiled.  A graph
break resumes in a frame whose ``self`` may be missing: the root last seen for
the same code is used then.  Dynamo internals vary across versions, so every
lookup here degrades to "no root" instead of failing.
"""
from __future__ import annotations

import re
import sys
from typing import Dict, Optional

import torch

#: frame key → root class last seen there (strings only: keeps nothing alive)
_last_root: Dict[str, str] = {}


def _current_tx():
    from torch._dynamo.symbolic_convert import InstructionTranslator
    return InstructionTranslator.current_tx()


def _root_class() -> Optional[str]:
    """The class of ``self`` in the frame Dynamo is compiling (the model's root), if any."""
    try:
        tx = _current_tx()
        code = tx.f_code
        if code.co_argcount:
            first = tx.f_locals.get(code.co_varnames[0])
            if isinstance(first, torch.nn.Module):
                return type(first).__name__
    except Exception:  # noqa: BLE001 - Dynamo internals vary across versions: the scope simply omits the root
        return None
    return None


def _caller_root() -> Optional[str]:
    """The class of the innermost module whose ``forward`` (outside torch) is running below
    the frame being compiled: a function compiled on its own after a graph break
    (transformers' ``loss_function`` called from ``GPT2LMHeadModel.forward``) runs inside
    that forward, where eager mode scopes its operators (other methods add no scope in
    eager either, so a ``training_step`` of a module is not taken)."""
    try:
        import os
        torch_dir = os.path.dirname(torch.__file__) + os.sep
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            if (code.co_argcount and re.sub(r"^torch_dynamo_resume_in_(.*)_at_\d+$", r"\1", code.co_name) == "forward"
                    and not code.co_filename.startswith((torch_dir, "<"))):   # "<eval_with_key>": fx code
                first = frame.f_locals.get(code.co_varnames[0])
                if isinstance(first, torch.nn.Module) and not isinstance(first, torch.fx.GraphModule):
                    return type(first).__name__
            frame = frame.f_back
    except Exception:  # noqa: BLE001 - best effort: the scope simply omits the root
        return None
    return None


def frame_key() -> Optional[str]:
    """``file:function`` of the frame being compiled (a resume function maps to its origin)."""
    try:
        code = _current_tx().f_code
        name = re.sub(r"^torch_dynamo_resume_in_(.*)_at_\d+$", r"\1", code.co_name)
        return f"{code.co_filename}:{name}"
    except Exception:  # noqa: BLE001
        return None


def frame_entry() -> Optional[tuple]:
    """Dynamo's id of the frame being compiled, the same for every recompile of one code
    object (and different for a graph break's resume function): what counts iterations
    when nothing else does (:meth:`opdump.session.Session.enter_forward`), so that a
    recompiled model -- a new graph of the same frame -- starts the next iteration as a
    second call of the same graph does.  None when Dynamo gives no id."""
    try:
        from torch._guards import CompileContext
        cid = CompileContext.current_compile_id()
        if cid is None or cid.frame_id is None:
            return None
        return ("frame", cid.compiled_autograd_id, cid.frame_id)
    except Exception:  # noqa: BLE001 - an internal API: without it, graphs are counted
        return None


def root_class(key: Optional[str]) -> Optional[str]:
    """The root class for the frame ``key`` being compiled now (remembered for later graph breaks)."""
    root = _root_class() or (key and _last_root.get(key)) or _caller_root()
    if key and root:
        _last_root[key] = root
    return root or None
