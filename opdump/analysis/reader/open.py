"""Opening a dump: finding its ``rank_N`` folders from whatever path is given (the root, a
rank, a folder inside a rank, a bare folder of dump files) or else the ACL/GE layout, then
building the :class:`~.dump.Dump` (:func:`open_dump`, :func:`load_statistics`) and
warning about unconverted or incomplete dumps.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import List, Tuple

from ...format.files import NPY, STATISTIC_FILE
from ...format.layout import RANK_RE as _RANK_RE
from .acl import find_acl_ranks
from .bins import is_bin_name
from .dump import Dump


class DumpError(Exception):
    """The path is not a readable dump."""


def _is_dump_file(name: str) -> bool:
    return name.endswith("." + NPY) or name == STATISTIC_FILE or is_bin_name(name)


def _find_rank_dirs(p: Path) -> Tuple[List[Tuple[int, Path]], bool]:
    m = _RANK_RE.match(p.name)
    if m and p.is_dir():
        return [(int(m.group(1)), p)], False
    ranks = []
    if p.is_dir():
        for e in os.scandir(p):
            mm = _RANK_RE.match(e.name)
            if mm and e.is_dir():
                ranks.append((int(mm.group(1)), Path(e.path)))
    if ranks:
        return sorted(ranks), False
    # a folder inside a rank (net/graph/iteration): climb to the rank
    for parent in p.parents:
        mm = _RANK_RE.match(parent.name)
        if mm:
            return [(int(mm.group(1)), parent)], False
    # a bare folder of dump files
    if p.is_dir() and any(_is_dump_file(e.name) for e in os.scandir(p)):
        return [(0, p)], True
    return [], False


def open_dump(path: os.PathLike) -> Dump:
    """Open a dump: its root (holding ``rank_*``), a ``rank_N`` folder, a folder inside a
    rank (the whole rank is read), a bare folder of dump files (read as rank 0, graph 0,
    iteration 0), or an ACL/GE-layout dump (:mod:`.acl`; tensors in bin or ``.npy`` files)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DumpError(f"{p}: no such file or directory")
    if not p.is_dir():
        raise DumpError(f"{p}: not a folder (give the dump root or a rank_N folder)")
    rank_dirs, loose = _find_rank_dirs(p.resolve())
    acl = None
    if not rank_dirs or loose:          # the ACL/GE layout (acl.py) before a bare folder of files
        acl = find_acl_ranks(p.resolve()) or None
        if acl:
            rank_dirs, loose = [], False
        elif not rank_dirs:
            raise DumpError(f"{p}: not a dump (no rank_N folders, no ACL {{time}}/{{device}}/{{model}}/{{id}}/"
                            "{iteration} folders, no .npy files, no statistic.csv)")
    d = Dump(p, rank_dirs, loose=loose, acl=acl)
    raw = sum(len(it.raw_files) for r in d.ranks.values() for it in r.iterations)
    if raw:
        warnings.warn(f"{p}: {raw} Ascend protobuf (bin) dump files are malformed and not read "
                      "(`opdump convert` names the reason)", stacklevel=2)
    if d.complete is False:
        warnings.warn(f"{p}: the dump is marked incomplete in its manifest (the run was interrupted "
                      "or is still running); reading what is there", stacklevel=2)
    return d


def load_statistics(path: os.PathLike):
    """All ``statistic.csv`` of a dump as one DataFrame (rank, graph, iteration, op, io, slot, …)."""
    return open_dump(path).statistics()
