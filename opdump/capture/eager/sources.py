"""Where an eager operator came from: the user's source lines, and whether it runs
inside a compiled region.

Both answers come from one walk of the Python stack, outward from the dispatch
mode, done only for operators of a dumped iteration:

* *user frames* are frames whose file is neither torch, site-packages, the
  standard library nor opdump itself (the same rule as
  :meth:`OpInfo.user_source`); the walk stops at the first one unless the
  caller asks for several (the ``.ir`` listing shows up to :data:`MAX_FRAMES`);
* an operator is *compiled* when, between it and the first user frame, there is
  code of a compiled artifact: AOTAutograd's runtime (``torch/_functorch/_aot_autograd``,
  which is how opdump's own ``torch.compile`` backend runs its dump path),
  Inductor's generated code (``torchinductor``/``torch/_inductor``), or an FX
  graph (``<eval_with_key>``) called by Dynamo.  Those operators belong to the
  graph front-end (or to a compiler that fused them away) and the eager
  front-end leaves them alone.  A user's own ``torch.fx.symbolic_trace`` model
  run eagerly is not compiled: its ``<eval_with_key>`` frames are not under Dynamo.
"""
from __future__ import annotations

import linecache
import os
import sys
from typing import Dict, List, Optional, Tuple

from ..op_info import SourceLine, _is_library

MAX_FRAMES = 3          # user frames kept per operator for the .ir listing (innermost ones)
_MAX_DEPTH = 200        # frames walked at most

_OPDUMP_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_COMPILED_MARKERS = ("_aot_autograd", "torchinductor", os.sep + "_inductor" + os.sep)
_FX_CODE = "<eval_with_key>"
_DYNAMO = os.sep + "_dynamo" + os.sep

# file name → "user" (True) / "library" (False) / "compiled artifact" (None); names are few
_kind_cache: Dict[str, Optional[bool]] = {}
_line_cache: Dict[Tuple[str, int], str] = {}


_UNKNOWN = object()


def _kind(filename: str) -> Optional[bool]:
    kind = _kind_cache.get(filename, _UNKNOWN)
    if kind is _UNKNOWN:            # (not ``== 0``: False == 0, and library files would never be cached)
        if any(m in filename for m in _COMPILED_MARKERS):
            kind = None
        elif filename.startswith(_OPDUMP_DIR) or filename.startswith("<frozen"):
            kind = False
        elif filename.startswith("<"):
            kind = False if filename.startswith(_FX_CODE) else True
        else:
            kind = not _is_library(filename)
        _kind_cache[filename] = kind
    return kind


def _code_line(filename: str, line: int) -> str:
    key = (filename, line)
    code = _line_cache.get(key)
    if code is None:
        code = _line_cache[key] = linecache.getline(filename, line).strip()
    return code


def walk(depth: int, want_sources: bool) -> Tuple[bool, Tuple[SourceLine, ...]]:
    """(compiled?, user source lines outermost first) for the code that called the operator.

    ``depth`` is the number of frames to skip (the dispatch mode's own).  Without
    ``want_sources`` the walk stops at the first user frame.
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
        kind = known(filename, _UNKNOWN)
        if kind is _UNKNOWN:
            kind = _kind(filename)
        if kind is None:
            if not sources:
                return True, ()
        elif kind:
            if not sources and seen_fx is None:
                return True, ()
            if not want_sources:
                return False, ()
            sources.append(SourceLine(filename, frame.f_lineno, _code_line(filename, frame.f_lineno), code.co_name))
            if len(sources) >= MAX_FRAMES:
                break
        elif not sources:
            if filename.startswith(_FX_CODE):
                seen_fx = True
            elif seen_fx is True and _DYNAMO in filename:
                seen_fx = None          # an FX graph that Dynamo calls: compiled code
        frame = frame.f_back
        n += 1
    return False, tuple(reversed(sources))
