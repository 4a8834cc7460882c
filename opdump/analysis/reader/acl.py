"""Finding and scanning a dump in the ACL/GE layout (README, "Analysis"):
``{dump_path}/[worldsize{N}_global_rank{r}/]{time}/{device_id}/`` is a rank folder, below
it ``{model_name}/{model_id}/{data_index}/`` data folders as the MindSpore layout's
``{net}/{graph}/{iteration}`` (scanned by :func:`.scan.scan_rank`), or, in single-operator
mode, the files straight in the rank folder. Names and patterns are
:mod:`opdump.format.acl_layout`'s, the writer's.

Which rank a folder is: ``r`` of its ``worldsize{N}_global_rank{r}`` folder, else its
``device_id``. Several ``{time}`` folders holding the same rank (runs into one dump_path):
the newest is read, with a warning naming the others (open one of them to read it).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Dict, List, Tuple

from ...format import acl_layout as al
from ...format.files import MAPPING_FILE, NPY, STATISTIC_FILE
from .containers import Graph, Iteration, Rank
from .scan import finish_rank, scan_iteration, scan_rank


def _subdirs(p: Path, pattern) -> List[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(p) if pattern.match(e.name) and e.is_dir())
    except OSError:
        return []


def _is_rank_folder(q: Path) -> bool:
    return bool(al.DEVICE_RE.match(q.name) and al.TIME_RE.match(q.parent.name)) and q.is_dir()


def _rank_id(q: Path) -> int:
    world = al.parse_world_dir(q.parent.parent.name)
    return world[1] if world is not None else int(q.name)


def find_acl_ranks(p: Path) -> List[Tuple[int, Path]]:
    """``[(rank, rank folder)]`` of the ACL/GE layout at or around ``p``: a rank folder, a
    folder inside one, a ``{time}`` folder, a ``worldsize…`` folder or the dump_path."""
    p = Path(p)
    if _is_rank_folder(p):
        return [(_rank_id(p), p)]
    for parent in p.parents:
        if _is_rank_folder(parent):
            return [(_rank_id(parent), parent)]
    if al.TIME_RE.match(p.name):
        times = [p]
    else:
        times = _subdirs(p, al.TIME_RE) + [t for w in _subdirs(p, al.WORLD_RE) for t in _subdirs(w, al.TIME_RE)]
    found: Dict[int, List[Path]] = {}
    for t in times:
        for dev in _subdirs(t, al.DEVICE_RE):
            found.setdefault(_rank_id(dev), []).append(dev)
    out = []
    for rid, folders in sorted(found.items()):
        folders.sort(key=lambda q: q.parent.name)
        if len(folders) > 1:
            warnings.warn(f"rank {rid} was dumped {len(folders)} times; reading the newest, {folders[-1]} "
                          f"(open {', '.join(map(str, folders[:-1]))} to read an older one)", stacklevel=3)
        out.append((rid, folders[-1]))
    return out


def _has_dump_files(p: Path) -> bool:
    try:
        names = [e.name for e in os.scandir(p) if e.is_file()]
    except OSError:
        return False
    return any(n.endswith("." + NPY) or n == STATISTIC_FILE or al.parse_bin_name(n) for n in names) or (
        MAPPING_FILE in names)


def scan_acl_rank(rid: int, rp: Path) -> Rank:
    """A rank folder of the ACL/GE layout: its data folders, and in single-operator mode the
    files in the folder itself (one iteration, 0, of the rank's only graph, else graph 0:
    that mode keeps no iteration folders; calls are told apart by timestamp)."""
    rank = scan_rank(rid, rp)
    if _has_dump_files(rp):
        gid = min(rank.graphs) if len(rank.graphs) == 1 else 0
        it = Iteration(rid, "", gid, 0, rp)
        scan_iteration(it)
        if it.files or it.stats or it.raw_files:
            rank.graphs.setdefault(gid, Graph(rid, gid))
            rank.iterations.append(it)
            finish_rank(rank)
    return rank
