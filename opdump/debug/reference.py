"""The reference dump of the online compare, read lazily (README, "Online compare").

Why lazily: a reference of a long run holds thousands of iterations; the online compare
needs one at a time, when the run reaches it.  :class:`Reference` reads, once, the small
per-rank files (metadata, graph listings, execution orders: the operators' source lines),
and each iteration's folders (``statistic.csv``, the tensor files' names and ``.npy``
headers) only when that iteration is first asked for; it keeps the last iteration only.
Tensor data is never read here: the compare loads a file when it needs it.

The records are built by the analysis reader and :func:`opdump.analysis.compare.run.
tensors_of_records`, exactly as ``opdump compare`` builds them, so the online and the
offline compare see the same records (names, calls, order, statistics).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..analysis.compare.pairs import Tensor
from ..analysis.compare.run import tensors_of_records
from ..analysis.reader.containers import Iteration, Rank
from ..analysis.reader.records import build_records
from ..analysis.reader import scan
from ..format import layout as fl

__all__ = ["Reference"]


class Reference:
    """A dump read one iteration at a time: ``tensors(rank, iteration)``, ``source(rank, name)``."""

    def __init__(self, path: str):
        self.path = Path(path)
        self._ranks: Dict[int, Rank] = {}
        self._cached: Optional[Tuple[int, int]] = None
        self._tensors: List[Tensor] = []
        p = self.path
        m = fl.RANK_RE.match(p.name)
        if m:
            self._dirs = {int(m.group(1)): p}
        else:
            self._dirs = {int(fl.RANK_RE.match(e.name).group(1)): Path(e.path) for e in os.scandir(p)
                          if e.is_dir() and fl.RANK_RE.match(e.name)}

    def rank_for(self, rank: int) -> Optional[int]:
        """The reference rank compared with ``rank``: the same id, else the only one there is."""
        if rank in self._dirs:
            return rank
        return next(iter(self._dirs)) if len(self._dirs) == 1 else None

    def _rank(self, rid: int) -> Rank:
        """The rank's skeleton: metadata, graphs, execution orders (no iteration read)."""
        rank = self._ranks.get(rid)
        if rank is None:
            rp = self._dirs[rid]
            rank = Rank(rid, rp)
            md = rp / fl.METADATA_DIR
            rank.data_dump = scan.read_json(md / fl.DATA_DUMP_JSON) or {}
            rank.manifest = scan.read_json(md / fl.MANIFEST_JSON)
            scan._scan_graph_files(rank, rp / fl.GRAPHS_DIR)          # the reader's own steps of scan_rank
            scan._scan_execution_orders(rank, rp / fl.EXECUTION_ORDER_DIR)
            for g in rank.graphs.values():
                scan.load_graph_ops(g)
            self._ranks[rid] = rank
        return rank

    def _iteration_folders(self, rank: Rank, iteration: int) -> List[Iteration]:
        out = []
        name = fl.iteration_dir_name(iteration)
        for net in sorted(os.scandir(rank.path), key=lambda e: e.name):
            if not net.is_dir() or net.name in fl.SPECIAL_DIRS or net.name.startswith("."):
                continue
            for g in sorted(os.scandir(net.path), key=lambda e: e.name):
                folder = Path(g.path) / name
                if g.is_dir() and g.name.isdigit() and folder.is_dir():
                    out.append(Iteration(rank.rank_id, net.name, int(g.name), iteration, folder))
        return out

    def tensors(self, rank: int, iteration: int) -> List[Tensor]:
        """The reference's tensors of ``iteration`` (every graph), in execution order, as
        ``opdump compare`` reads them; [] when the reference has no such rank/iteration."""
        rid = self.rank_for(rank)
        if rid is None:
            return []
        if self._cached == (rid, iteration):
            return self._tensors
        self._cached, self._tensors = None, []          # the previous iteration is dropped first
        full = self._rank(rid)
        its = self._iteration_folders(full, iteration)
        for it in its:
            scan.scan_iteration(it)
        view = Rank(rid, full.path, full.data_dump, full.config, full.manifest, full.graphs, its)
        scan.finish_rank(view)
        self._tensors = tensors_of_records(build_records({rid: view})) if its else []
        self._cached = (rid, iteration)
        return self._tensors

    def source(self, rank: int, graph: int, name: str) -> Tuple[str, str]:
        """(``file:line``, code) of an operator from the reference's listing, or ("", "")."""
        rid = self.rank_for(rank)
        if rid is None:
            return "", ""
        g = self._rank(rid).graphs.get(graph)
        info = g.op(name) if g is not None else None
        return (info.source, info.code) if info is not None else ("", "")
