"""Reading watcher mode's results: the ``watcher.json`` of each dumped iteration (README,
"Debug dumps"), with the snapshot files each entry names.

Why: ``opdump watcher DUMP`` and ``opdump ls`` answer "which operator overwrote my
watched tensor, and where in my code" without the user opening JSON; the snapshot files
are found again from the entry's timestamp window (the recorder's clock is strictly
increasing, so the files of a snapshot are those of the watched operator's outputs whose
timestamps lie inside it).  Works on any folder below which watcher mode wrote (a dump
root, a rank folder, an iteration folder; either layout): the files are found by name.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..format.files import parse_tensor_name
from ..format.layout import WATCHER_JSON
from ..format.names import file_stem

#: folders deeper than this below the given path are not searched
MAX_DEPTH = 10


@dataclass
class WatcherIteration:
    """One ``watcher.json``: its folder and content, and each snapshot's files."""

    path: str                                # the watcher.json
    body: Dict[str, Any]
    snapshot_files: List[List[str]] = field(default_factory=list)   # aligned with body["snapshots"]

    @property
    def iteration(self) -> Optional[int]:
        return self.body.get("iteration")

    @property
    def first_change(self) -> Optional[Dict[str, Any]]:
        return self.body.get("first_change")


def find_watcher_files(root: str) -> List[str]:
    """Every ``watcher.json`` below ``root`` (sorted by folder, then iteration number)."""
    found = []
    root = os.path.abspath(root)
    base = root.count(os.sep)
    for folder, dirs, files in os.walk(root, followlinks=False):
        if folder.count(os.sep) - base >= MAX_DEPTH:
            dirs[:] = []
        if WATCHER_JSON in files:
            found.append(os.path.join(folder, WATCHER_JSON))
        dirs.sort()
    return sorted(found, key=lambda p: [int(t) if t.isdigit() else -1 for t in p.split(os.sep)] + [p])


def _timestamp(name: str, stem: str) -> int:
    """The timestamp of an output file of the operator ``stem`` names (``.npy``:
    ``{stem}.{task}.{stream}.{ts}.output.{slot}…``; Ascend bin: ``{stem}.{task}.{stream}.{ts}``,
    which holds outputs only in watcher mode); -1 when it is not one."""
    parsed = parse_tensor_name(name)
    if parsed is not None:
        return parsed.timestamp if parsed.io == "output" else -1
    rest = name[len(stem):].split(".")
    return int(rest[2]) if len(rest) == 3 and rest[2].isdigit() else -1


def _snapshot_files(folder: str, snapshots: List[Dict[str, Any]], types: Dict[str, str]) -> List[List[str]]:
    listed: Dict[str, List[str]] = {}
    out = []
    for snap in snapshots:
        where = os.path.normpath(os.path.join(folder, str(snap.get("folder") or ".")))
        if where not in listed:
            listed[where] = sorted(os.listdir(where)) if os.path.isdir(where) else []
        names = listed[where]
        stem = file_stem(types.get(snap.get("watched", ""), ""), snap.get("watched", "")) + "."
        lo, hi = (snap.get("timestamps") or [0, 0])[:2]
        hits = []
        for name in names:
            if name.startswith(stem) and lo < _timestamp(name, stem) < hi:
                hits.append(os.path.join(where, name))
        out.append(hits)
    return out


def load_watcher(root: str) -> List[WatcherIteration]:
    """Every watcher.json below ``root``, parsed, with its snapshots' files (unreadable
    JSON: an entry whose body says why, ``{"error": …}``)."""
    out = []
    for path in find_watcher_files(root):
        try:
            with open(path, encoding="utf-8") as f:
                body = json.load(f)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            out.append(WatcherIteration(path, {"error": f"{type(exc).__name__}: {exc}"}))
            continue
        types = {w.get("op", ""): w.get("op_type", "") for w in body.get("watched", []) if isinstance(w, dict)}
        for c in body.get("changes", []):
            types.setdefault(c.get("watched", ""), c.get("watched_type", ""))
        try:
            files = _snapshot_files(os.path.dirname(path), list(body.get("snapshots", [])), types)
        except OSError:
            files = []
        out.append(WatcherIteration(path, body, files))
    return out


def describe_change(change: Dict[str, Any]) -> str:
    """One line: which watched output changed after which operator, and where."""
    what = f"{change.get('watched')} output {change.get('slot')}"
    if change.get("after") is None:
        return (f"{what} changed before the iteration ended, after no operator the watcher saw "
                f"(witness {change.get('witness')}; give `layer` triggers to narrow it down)")
    where = f" at {change['source']}" if change.get("source") else ""
    code = f"  `{change['code']}`" if change.get("code") else ""
    return f"{what} changed after {change['after']}{where}{code} (witness {change.get('witness')})"


def ls_lines(root: str) -> List[str]:
    """Lines for ``opdump ls``: one per dumped iteration of watcher mode (none without it)."""
    lines = []
    for it in load_watcher(root):
        if "error" in it.body:
            lines.append(f"watcher: {it.path}: unreadable ({it.body['error']})")
            continue
        first = it.first_change
        state = describe_change(first) if first else "no watched output changed"
        lines.append(f"watcher: iteration {it.iteration}: {state}")
    return lines
