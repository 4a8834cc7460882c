"""The user's mapping file: explicit ``A_name,B_name`` pairs that win over every other rule.

Format (README, "Analysis" > compare): text, one pair per line ``A_name,B_name`` (``#``
starts a comment, an optional ``a,b`` header line); names are full names or their
file-name form.  Append ``:input.N`` / ``:output.N`` to both names to pair single tensors
(useful across frameworks whose operators take their inputs in another order).  A JSON
object ``{"A_name": "B_name"}`` is accepted as well.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional, Tuple, Union

__all__ = ["load_mapping", "split_tensor_ref"]


def load_mapping(path: Union[str, os.PathLike]) -> List[Tuple[str, str]]:
    """Read a mapping file: ``[(A name, B name)]``. Raises ValueError naming the bad line."""
    text = Path(path).read_text(encoding="utf-8")
    s = text.lstrip()
    if s.startswith("{"):
        data = json.loads(s)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a JSON mapping must be an object {{\"A_name\": \"B_name\"}}")
        return [(str(k), str(v)) for k, v in data.items()]
    pairs: List[Tuple[str, str]] = []
    for ln in text.splitlines():
        ln = ln.split("#", 1)[0].strip()
        if not ln:
            continue
        parts = [p.strip() for p in ln.split(",")]
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"{path}: bad mapping line {ln!r} (expected 'A_name,B_name')")
        if (parts[0].lower(), parts[1].lower()) == ("a", "b"):
            continue
        pairs.append((parts[0], parts[1]))
    return pairs


def split_tensor_ref(name: str) -> Tuple[str, Optional[str], Optional[int]]:
    """``op:output.0`` -> (op, "output", 0); ``op`` -> (op, None, None)."""
    if ":" in name:
        head, tail = name.rsplit(":", 1)
        parts = tail.split(".")
        if len(parts) == 2 and parts[0] in ("input", "output") and parts[1].isdigit():
            return head, parts[0], int(parts[1])
    return name, None, None
