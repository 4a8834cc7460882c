"""An independent reader for the tests: parses dump file names with the documented
grammar (README "Output layout", docs/design.md "File names") and loads arrays without
pickle.  Deliberately shares no code with opdump (neither ``opdump.write`` nor
``opdump.format``) so that a bug in the shared format cannot hide itself; it is itself
checked against a real MindSpore dump (tests/test_format_dumpfiles.py)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, List

import numpy as np

NAME = re.compile(
    r"^(?P<op_type>[^.]+)\.(?P<op_name>[^.]+)\.(?P<task>\d+)\.(?P<stream>\d+)\.(?P<ts>\d+)\."
    r"(?P<io>input|output)\.(?P<slot>\d+)\.(?P<fmt>[A-Za-z0-9]+)\.(?P<dtype>[A-Za-z0-9]+)\.npy$")


@dataclass
class DumpFile:
    path: str
    rank: int
    net: str
    graph: int
    iteration: int
    op_type: str
    op_name: str
    task: int
    stream: int
    ts: int
    io: str
    slot: int
    fmt: str
    dtype: str

    def load(self) -> np.ndarray:
        return np.load(self.path, allow_pickle=False)


def sanitize(name: str) -> str:
    """The documented rule: ``. / \\ space : * ? " < > |`` and control characters -> ``_``;
    an empty name -> ``_``."""
    return re.sub(r'[./\\ :*?"<>|\x00-\x1f\x7f]', "_", name) or "_"


def _mapping(folder: str) -> Dict[str, str]:
    """``mapping.csv``: ``{short name},{original name}`` per line (originals may hold commas)."""
    path = os.path.join(folder, "mapping.csv")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8", newline="") as f:
        pairs = [line.split(",", 1) for line in f.read().split("\n") if "," in line]
    return {short: original for short, original in pairs}


def tensor_files(root: str, folder: str = "iterations") -> List[DumpFile]:
    """Every tensor file of the iteration folders under ``root`` (the dump path), or with
    ``folder="constants"`` of the graphs' ``constants/`` folders (iteration -1); fails on
    any unparsable name."""
    out = []
    for dirpath, _, files in os.walk(root):
        rel = os.path.relpath(dirpath, root).split(os.sep)
        if len(rel) != 4 or not rel[0].startswith("rank_"):
            continue
        if folder == "constants":
            if rel[3] != "constants":
                continue
            rel[3] = "-1"
        elif not rel[3].isdigit():
            continue
        mapping = _mapping(dirpath)
        for f in files:
            if not f.endswith(".npy"):
                continue
            m = NAME.match(mapping.get(f, f))
            assert m, f"unparsable dump file name: {mapping.get(f, f)}"
            out.append(DumpFile(os.path.join(dirpath, f), int(rel[0][5:]), rel[1], int(rel[2]), int(rel[3]),
                                m["op_type"], m["op_name"], int(m["task"]), int(m["stream"]), int(m["ts"]),
                                m["io"], int(m["slot"]), m["fmt"], m["dtype"]))
    return out


def by_op(files: List[DumpFile]) -> Dict[str, List[DumpFile]]:
    out: Dict[str, List[DumpFile]] = {}
    for f in files:
        out.setdefault(f.op_name, []).append(f)
    return out


def execution_order(root: str, graph: int, rank: int = 0) -> List[str]:
    path = os.path.join(root, f"rank_{rank}", "execution_order", f"ms_execution_order_graph_{graph}.csv")
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0] == "NodeExecutionOrder-FullNameWithScope"
    return lines[1:]


def find(files: List[DumpFile], full_name: str, io: str, slot: int = 0, iteration: int = None) -> DumpFile:
    hits = [f for f in files if f.op_name == sanitize(full_name) and f.io == io and f.slot == slot
            and (iteration is None or f.iteration == iteration)]
    assert len(hits) == 1, f"expected one {io}.{slot} file for {full_name}, got {len(hits)}"
    return hits[0]
