"""File-name rules of the MindSpore layout (SPEC F14).

``.``, ``/``, ``\\`` and spaces become ``_``.  Everything else that could escape
the dump folder or break a file system (NUL, control characters, a leading
``..``) is also replaced, so a name taken from a model can never write outside
the dump root (SPEC F40).
"""
from __future__ import annotations

import functools
import re

MAX_NAME_BYTES = 255
_SEPARATORS = re.compile(r"[./\\ ]")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f:*?\"<>|]")


def sanitize(name: str) -> str:
    """A name as it appears inside a dump file name."""
    name = _UNSAFE.sub("_", _SEPARATORS.sub("_", name))
    return name or "_"


def tensor_file_name(stem: str, task_id: int, stream_id: int, timestamp: int,
                     io: str, slot: int, fmt: str, dtype: str, ext: str = "npy") -> str:
    """``{stem}.{task}.{stream}.{ts}.{io}.{slot}.{format}.{dtype}.npy``; ``stem`` is
    ``{op_type}.{op_name}`` already sanitized (see :func:`file_stem`)."""
    return f"{stem}.{task_id}.{stream_id}.{timestamp}.{io}.{slot}.{fmt}.{dtype}.{ext}"


@functools.lru_cache(maxsize=65536)
def file_stem(op_type: str, op_name: str) -> str:
    """``{op_type}.{op_name}`` sanitized; memoized (eager mode asks again on every call of an operator)."""
    return f"{sanitize(op_type)}.{sanitize(op_name)}"


def parameter_file_name(name: str, timestamp: int, dtype: str, ext: str = "npy") -> str:
    """``Parameter.{name}.0.0.{ts}.output.0.DefaultFormat.{dtype}.npy`` as MindSpore writes it."""
    return f"Parameter.{sanitize(name)}.0.0.{timestamp}.output.0.DefaultFormat.{dtype}.{ext}"


def too_long(file_name: str) -> bool:
    return len(file_name.encode("utf-8")) > MAX_NAME_BYTES
