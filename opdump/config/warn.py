"""Config warnings that point at the user's line, not at opdump's.

Why: a warning about a config field (a field that is ignored in some combination) is
read beside the line that started the dump -- ``opdump.start(...)``, ``DumpOptions.to_config()``
or a script run by ``opdump run``.  A fixed ``stacklevel`` lands in whichever opdump module
happened to call the rule (``config/acl.py``, ``config/mindspore.py``…), which names
nothing the user wrote.  :func:`warn_config` attributes the warning to the first frame
outside the opdump package (and outside the interpreter's own import/run machinery), as
Python 3.12's ``skip_file_prefixes`` would.
"""
from __future__ import annotations

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_MACHINERY = ("<frozen ", os.path.dirname(os.__file__) + os.sep + "runpy.py")


def _outside(filename: str) -> bool:
    if filename.startswith(_MACHINERY):
        return False
    return not os.path.abspath(filename).startswith(_PACKAGE)


def user_stacklevel() -> int:
    """The ``stacklevel`` for :func:`warnings.warn` called by this function's caller that
    names the first frame outside opdump (the caller's own frame is level 1)."""
    frame = sys._getframe(2)          # the caller of our caller: level 2 from the warn call
    level = 2
    while frame is not None and not _outside(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 2


def warn_config(message: str) -> None:
    """``warnings.warn(message, UserWarning)`` attributed to the user's line."""
    warnings.warn(message, UserWarning, stacklevel=user_stacklevel())
