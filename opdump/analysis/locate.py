"""Script line <-> operators (README, Analysis: locate).

``locate(dump, "train.py:175")``: the operators whose source stack holds that line --
forward and backward -- with their full names and dumped files per iteration.
``locate(dump, "Default/Net/conv3-Conv2d/convolution-op12")``: the reverse, an
operator (full name, file-name form, a dump file name or a unique substring) ->
its source line(s) and files.

An operator's stack is the frames a user sees as code (their own and libraries
such as ``transformers``; not torch, MindSpore, the standard library or opdump).
A line matches an operator when *any* frame of its stack is that line: the
library line where the operator is made (``modeling_llama.py(…)``), the model
call in the user's script, or a helper in between.  A hit says ``match="innermost"``
when the frame is the operator's own line (its innermost frame), ``"stack"``
otherwise.  File names match by path suffix (``train.py`` matches
``/home/u/proj/train.py``; ``src/train.py`` is more specific). A ``def`` frame
(MindSpore writes the whole enclosing function's range) only stands for its first
line.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .reader import Dump, OpInfo, SourceFrame, parse_tensor_filename, sanitize

__all__ = ["LocateHit", "locate", "locate_line", "locate_op", "parse_location"]

_LOC_RE = re.compile(r"^(?P<file>.+?)[:(](?P<line>\d+)\)?$")


@dataclass
class LocateHit:
    op: OpInfo
    frame: Optional[SourceFrame]               # the frame that matched (or the user frame)
    match: str                                 # innermost | stack | name
    files: Dict[Optional[int], List[str]] = field(default_factory=dict)   # iteration -> paths
    stats: Dict[Optional[int], int] = field(default_factory=dict)         # iteration -> statistic rows

    @property
    def full_name(self) -> str:
        return self.op.full_name

    def to_dict(self) -> dict:
        return {
            "rank": self.op.rank, "graph": self.op.graph, "full_name": self.op.full_name,
            "op_type": self.op.op_type, "kind": self.op.kind, "match": self.match,
            "source": str(self.frame) if self.frame else "", "code": self.frame.code if self.frame else "",
            "frames": [str(f) for f in self.op.sources],
            "files": {str(k): v for k, v in self.files.items()},
        }


def parse_location(text: str) -> Optional[Tuple[str, int]]:
    """``train.py:175`` / ``train.py(175)`` -> (``train.py``, 175); None if not a location."""
    m = _LOC_RE.match(text.strip())
    if not m:
        return None
    return m.group("file"), int(m.group("line"))


def _norm(p: str) -> str:
    p = p.replace("\\", "/")
    while p.startswith("./"):
        p = p[2:]
    return p


def _file_matches(query: str, frame_file: str) -> bool:
    q, f = _norm(query), _norm(frame_file)
    if q == f:
        return True
    if os.path.isabs(query):
        try:
            return os.path.realpath(query) == os.path.realpath(frame_file)
        except OSError:
            return False
    return f.endswith("/" + q) or (not f.startswith("/") and f.endswith(q) and f[: -len(q)] in ("", "/"))


class _FileIndex:
    """(rank, graph, op_file) -> files per iteration and statistic rows per iteration."""

    def __init__(self, dump: Dump):
        import pandas as pd
        self.map: Dict[Tuple[int, int, str], Tuple[Dict, Dict]] = {}
        rec = dump.records()
        if rec.empty:
            return
        for rk, g, of, it, p, st in zip(rec["rank"], rec["graph"], rec["op_file"], rec["iteration"],
                                         rec["path"], rec["stat_row"]):
            key = None if pd.isna(it) else int(it)
            files, stats = self.map.setdefault((int(rk), int(g), of), ({}, {}))
            if isinstance(p, str):
                files.setdefault(key, []).append(p)
            if st is True:
                stats[key] = stats.get(key, 0) + 1

    def get(self, op: OpInfo) -> Tuple[Dict, Dict]:
        return self.map.get((op.rank, op.graph, op.file_name), ({}, {}))


def locate_line(dump: Dump, file: str, line: int, rank: Optional[int] = None,
                any_frame: bool = False) -> List[LocateHit]:
    """Operators whose source stack holds ``file:line`` (see module doc for the matching
    rules).  ``any_frame`` is kept for callers of earlier versions: every frame is searched."""
    hits: List[LocateHit] = []
    for op in dump.op_infos(rank):
        own = op.user_frame
        for fr in reversed(op.sources):
            if _file_matches(file, fr.file) and fr.covers(line):
                hits.append(LocateHit(op, fr, "innermost" if fr is own else "stack"))
                break
    index = _FileIndex(dump)
    for h in hits:
        h.files, h.stats = index.get(h.op)
    return hits


def locate_op(dump: Dump, name: str, rank: Optional[int] = None) -> List[LocateHit]:
    """An operator -> its source and files. ``name``: full name, its file-name form, a dump
    file name, or a (case-insensitive) substring of full names."""
    base = os.path.basename(name)
    parsed = parse_tensor_filename(base) if base.endswith(".npy") else None
    if parsed is not None:
        name = parsed["op_file"]
    ops = list(dump.op_infos(rank))
    found = [o for o in ops if o.full_name == name or o.file_name == name or o.file_name == sanitize(name)]
    if not found:
        low = name.lower()
        found = [o for o in ops if low in o.full_name.lower() or low in o.file_name.lower()]
    hits = []
    index = _FileIndex(dump)
    for o in found:
        h = LocateHit(o, o.user_frame, "name")
        h.files, h.stats = index.get(o)
        hits.append(h)
    if not found:
        # operators known only from their files (no graph files in the dump)
        import pandas as pd
        rec = dump.records()
        if rank is not None and not rec.empty:
            rec = rec[rec["rank"] == rank]
        if not rec.empty:
            low = name.lower()
            sel = rec[(rec["op"] == name) | (rec["op_file"] == sanitize(name))
                      | rec["op"].astype(str).str.lower().str.contains(low, regex=False)]
            for (rk, g, op_name, op_type), grp in sel.groupby(["rank", "graph", "op", "op_type"], sort=False):
                info = OpInfo(int(rk), int(g), op_name, op_type, op_name.rsplit("/", 1)[0] if "/" in op_name else "")
                h = LocateHit(info, None, "name")
                for it, p in zip(grp["iteration"], grp["path"]):
                    if isinstance(p, str):
                        h.files.setdefault(None if it is pd.NA or pd.isna(it) else int(it), []).append(p)
                hits.append(h)
    return hits


def locate(dump: Dump, query: str, rank: Optional[int] = None, any_frame: bool = False) -> List[LocateHit]:
    """``file:line`` -> operators of that line; anything else -> :func:`locate_op`."""
    loc = parse_location(query)
    if loc is not None and not query.endswith(".npy"):
        return locate_line(dump, loc[0], loc[1], rank=rank, any_frame=any_frame)
    return locate_op(dump, query, rank=rank)
