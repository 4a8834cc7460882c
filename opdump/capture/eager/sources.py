"""Where an eager operator came from: its source lines, and whether it runs inside a
compiled region.

Both answers come from one walk of the Python stack, outward from the dispatch
mode, done only for operators of a dumped iteration:

* *visible frames* (:func:`opdump.capture.op_info.frame_kind`) are the user's
  code and libraries such as ``transformers``; torch, the standard library and
  opdump are hidden, and nothing outward of opdump's own code is kept (that is
  its launcher, which runs the user's script).  The innermost visible frame is
  the operator's line (README, Eager mode); the walk stops at the first visible
  frame unless the caller asks for the stack (up to :data:`MAX_FRAMES`
  innermost frames);
* an operator is *compiled* when, between it and the first visible frame, there
  is code of a compiled artifact: AOTAutograd's runtime
  (``torch/_functorch/_aot_autograd``, which is how opdump's own
  ``torch.compile`` backend runs its dump path), Inductor's generated code
  (``torchinductor``/``torch/_inductor``), or an FX graph (``<eval_with_key>``)
  called by Dynamo.  Those operators belong to the graph front-end (or to a
  compiler that fused them away) and the eager front-end leaves them alone.  A
  user's own ``torch.fx.symbolic_trace`` model run eagerly is not compiled: its
  ``<eval_with_key>`` frames are not under Dynamo.
"""
from __future__ import annotations

import linecache
import os
import sys
from typing import Dict, List, Tuple

from ..op_info import HIDDEN, OPDUMP, VISIBLE, SourceLine, frame_kind

MAX_FRAMES = 64         # visible frames kept per operator for the listing (innermost ones)
_MAX_DEPTH = 400        # frames walked at most

_COMPILED = -1
_COMPILED_MARKERS = ("_aot_autograd", "torchinductor", os.sep + "_inductor" + os.sep)
_FX_CODE = "<eval_with_key>"
_DYNAMO = os.sep + "_dynamo" + os.sep

# file name -> VISIBLE / HIDDEN / OPDUMP / _COMPILED; file names are few
_kind_cache: Dict[str, int] = {}
_line_cache: Dict[Tuple[str, int, str], SourceLine] = {}


def _kind(filename: str) -> int:
    kind = _kind_cache.get(filename)
    if kind is None:
        kind = _COMPILED if any(m in filename for m in _COMPILED_MARKERS) else frame_kind(filename)
        _kind_cache[filename] = kind
    return kind


def _source_line(filename: str, line: int, function: str) -> SourceLine:
    """One shared :class:`SourceLine` per (file, line, function): a listing holds the whole
    stack of every operator, and most operators share most frames."""
    key = (filename, line, function)
    src = _line_cache.get(key)
    if src is None:
        if len(_line_cache) > 200_000:
            _line_cache.clear()
        src = _line_cache[key] = SourceLine(filename, line, linecache.getline(filename, line).strip(), function)
    return src


def walk(depth: int, want_sources: bool) -> Tuple[bool, Tuple[SourceLine, ...]]:
    """(compiled?, visible source lines outermost first) for the code that called the operator.

    ``depth`` is the number of frames to skip (the dispatch mode's own).  Without
    ``want_sources`` the walk stops at the first visible frame.
    """
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return False, ()
    sources: List[SourceLine] = []
    seen_fx = False
    n = 0
    known = _kind_cache.get
    while frame is not None and n < _MAX_DEPTH:
        code = frame.f_code
        filename = code.co_filename
        kind = known(filename)
        if kind is None:
            kind = _kind(filename)
        if kind == VISIBLE:
            if not sources and seen_fx is None:
                return True, ()
            if not want_sources:
                return False, ()
            sources.append(_source_line(filename, frame.f_lineno, code.co_name))
            if len(sources) >= MAX_FRAMES:
                break
        elif sources:
            if kind == OPDUMP:
                break                   # opdump's launcher: everything outward is not the user's
        elif kind == _COMPILED:
            return True, ()
        elif kind == HIDDEN:
            if filename.startswith(_FX_CODE):
                seen_fx = True
            elif seen_fx is True and _DYNAMO in filename:
                seen_fx = None          # an FX graph that Dynamo calls: compiled code
        frame = frame.f_back
        n += 1
    return False, tuple(reversed(sources))
