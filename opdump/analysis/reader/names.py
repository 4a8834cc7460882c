"""Names: the file-name form of operator names (:func:`sanitize`), an operator's type,
scope and kind from its full name, and dtype-name helpers (float, complex, and whether a
file-name token looks like a dtype). No I/O; every other module of the reader builds on it.
"""
from __future__ import annotations

import re
from typing import Optional

_SANITIZE_RE = re.compile(r"[./\\ ]")


def sanitize(name: str) -> str:
    """The file-name form of an operator/parameter name (F14): ``. / \\ space`` -> ``_``."""
    return _SANITIZE_RE.sub("_", name)


_OPID_RE = re.compile(r"^(?P<type>.+?)-op(?P<id>\d+)$")


def op_type_of(full_name: str) -> str:
    """``Default/Net/conv3-Conv2d/convolution-op12`` -> ``convolution``."""
    last = full_name.rsplit("/", 1)[-1]
    m = _OPID_RE.match(last)
    return m.group("type") if m else last


def scope_of(full_name: str) -> str:
    """``Default/Net/conv3-Conv2d/convolution-op12`` -> ``Default/Net/conv3-Conv2d``."""
    return full_name.rsplit("/", 1)[0] if "/" in full_name else ""


def kind_of_name(full_name: str, graph_kind: Optional[str] = None) -> str:
    """forward | backward | optimizer (| inference, as the graph says)."""
    if full_name.startswith("Gradients/"):
        return "backward"
    if "/optimizer-" in full_name or full_name.startswith("optimizer-"):
        return "optimizer"
    if graph_kind in ("backward", "inference"):
        return graph_kind
    return "forward"


# MindSpore type names (and the lower-case/older spellings) -> kind
def is_float_dtype(name: Optional[str]) -> bool:
    """True for floating dtype names (``Float32``, ``BFloat16``, ``float16``, ``Float8E4M3FN`` ...)."""
    if not name or not isinstance(name, str):
        return False
    n = name.lower().replace("_", "")
    return n.startswith(("float", "bfloat", "half", "double", "hifloat")) or n in ("f16", "f32", "f64", "bf16")


def is_complex_dtype(name: Optional[str]) -> bool:
    return bool(name) and isinstance(name, str) and name.lower().startswith("complex")


_KNOWN_DTYPES = {
    "float16", "float32", "float64", "bfloat16", "int4", "int8", "int16", "int32", "int64",
    "uint1", "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128",
    "float8e4m3fn", "float8e5m2", "float8e4m3fnuz", "float8e5m2fnuz", "float8e8m0fnu",
    "hifloat8", "double", "half", "int", "uint", "float", "complex32", "string", "int2", "uint2",
    "float4e2m1fnx2", "qint8", "quint8", "qint32", "quint4x2",
}


def _looks_like_dtype(tok: str) -> bool:
    t = tok.lower()
    return t in _KNOWN_DTYPES or bool(re.match(r"^(b?float|u?int|complex)\d", t))
