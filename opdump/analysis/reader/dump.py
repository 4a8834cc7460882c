"""The dump object: :class:`Dump`, a dump on disk (opdump's or MindSpore's) read into
ranks -> graphs -> iterations -> tensor files (scanned by :mod:`.scan`), with the pandas
tables (``ops``, ``tensors``, ``statistics``, ``records``, ``summary``; records are built
by :mod:`.records`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from .containers import Graph, Iteration, Rank
from .files import TensorFile, npy_header
from .ops import OpInfo
from .records import build_records
from .stat_table import share_cells
from . import bincache
from .acl import scan_acl_rank
from .scan import scan_rank

__all__ = ["Dump", "Rank", "Graph", "Iteration"]


class Dump:
    """A dump on disk (opdump's or MindSpore's): ranks -> graphs -> iterations -> tensors.

    Object access: ``dump.ranks``, ``dump.graph(g)``, ``dump.iterations``, ``dump.tensor_files()``;
    tables (pandas): ``dump.tensors()``, ``dump.ops()``, ``dump.statistics()``,
    ``dump.records()`` (tensors and statistics joined, in execution order),
    ``dump.summary()``.
    """

    def __init__(self, path: os.PathLike, rank_dirs: List[Tuple[int, Path]], loose: bool = False,
                 acl: Optional[List[Tuple[int, Path]]] = None):
        self.path = Path(path)
        self.loose = loose
        self.layout = "acl" if acl else ("folder" if loose else "mindspore")
        self.ranks: Dict[int, Rank] = {}
        for rid, rp in rank_dirs:
            self.ranks[rid] = scan_rank(rid, rp, loose=loose)
        for rid, rp in acl or []:
            self.ranks[rid] = scan_acl_rank(rid, rp)
        self._records = None

    def __getstate__(self):
        """Pickled as its attributes, its statistic tables' cells in one shared nested pickle
        (:func:`.stat_table.share_cells`: compare's parallel open sends B this way)."""
        share_cells(self.ranks)
        return self.__dict__

    # ------------------------------------------------------------------ objects
    @property
    def rank_ids(self) -> List[int]:
        return sorted(self.ranks)

    @property
    def iterations(self) -> List[int]:
        s = set()
        for r in self.ranks.values():
            s.update(it.iteration for it in r.iterations if it.iteration is not None)
        return sorted(s)

    @property
    def sample_num(self) -> Optional[int]:
        """Sample dump: the elements each tensor file holds (its first ones, flattened), or
        None when files hold whole tensors (:attr:`Rank.sample_num`; the largest over ranks)."""
        values = [r.sample_num for r in self.ranks.values() if r.sample_num]
        return max(values) if values else None

    @property
    def graph_ids(self) -> List[int]:
        s = set()
        for r in self.ranks.values():
            s.update(r.graphs)
        return sorted(s)

    def graph(self, graph_id: int, rank: Optional[int] = None) -> Graph:
        r = self.ranks[rank if rank is not None else self.rank_ids[0]]
        return r.graphs[graph_id]

    def op_infos(self, rank: Optional[int] = None) -> Iterator[OpInfo]:
        for rid in self.rank_ids:
            if rank is not None and rid != rank:
                continue
            for gid in sorted(self.ranks[rid].graphs):
                yield from self.ranks[rid].graphs[gid].ops

    def op_info(self, name: str, rank: Optional[int] = None, graph: Optional[int] = None) -> Optional[OpInfo]:
        """The operator named ``name`` (full name or its file-name form)."""
        idx = self.__dict__.get("_op_index")
        if idx is None:
            idx = {}
            for o in self.op_infos():
                for nm in (o.full_name, o.file_name):
                    idx.setdefault((o.rank, o.graph, nm), o)
                    idx.setdefault((o.rank, None, nm), o)
                    idx.setdefault((None, None, nm), o)
            self._op_index = idx
        o = idx.get((rank, graph, name))
        if o is None and graph is not None:
            o = idx.get((rank, None, name))
        return o

    def kernel_listings(self, rank: int) -> Dict[int, dict]:
        """Kernel-level graph dump (README, "Kernel-level graph dump"): graph id -> its
        ``….kernels.json`` (each kernel's output buffers and the operators they store) for
        the graphs of ``rank`` that have one; ``{}`` for an operator or eager dump.  An
        unreadable listing is left out (its kernels then compare as plain operators)."""
        from .scan import read_json
        r = self.ranks.get(rank)
        out: Dict[int, dict] = {}
        for gid, g in (r.graphs.items() if r is not None else ()):
            doc = read_json(g.kernels_path) if g.kernels_path is not None else None
            if doc and isinstance(doc.get("kernels"), list):
                out[gid] = doc
        return out

    def tensor_files(self, rank: Optional[int] = None, iteration: Optional[int] = None) -> List[TensorFile]:
        """Every tensor file (optionally of one rank / iteration), folder by folder, each
        folder's in timestamp order: ``dump.tensor_files()[0].load()``."""
        return [t for rid in self.rank_ids if rank is None or rid == rank
                for it in self.ranks[rid].iterations if iteration is None or it.iteration == iteration
                for t in it.files]

    @property
    def has_tensors(self) -> bool:
        return any(it.has_files() for r in self.ranks.values() for it in r.iterations)

    @property
    def has_statistics(self) -> bool:
        return any(it.stats for r in self.ranks.values() for it in r.iterations)

    @property
    def complete(self) -> Optional[bool]:
        vals = [r.complete for r in self.ranks.values()]
        if any(v is False for v in vals):
            return False
        if vals and all(v is True for v in vals):
            return True
        return None

    def __repr__(self) -> str:
        return (f"Dump({str(self.path)!r}, ranks={self.rank_ids}, graphs={self.graph_ids}, "
                f"iterations={self.iterations})")

    # ------------------------------------------------------------------ tables
    def ops(self):
        """One row per operator per graph: rank, graph, index, full_name, op_type, scope, kind,
        file, line, code (the user's innermost frame), frames (all, as text)."""
        import pandas as pd
        rows = []
        for o in self.op_infos():
            fr = o.user_frame
            rows.append({
                "rank": o.rank, "graph": o.graph, "index": o.index, "full_name": o.full_name,
                "op_type": o.op_type, "scope": o.scope, "kind": o.kind,
                "file": fr.file if fr else None, "line": fr.line if fr else None,
                "code": fr.code if fr else None,
                "frames": " | ".join(str(f) for f in o.sources),
            })
        cols = ["rank", "graph", "index", "full_name", "op_type", "scope", "kind", "file", "line", "code", "frames"]
        return pd.DataFrame(rows, columns=cols)

    def tensors(self, with_shape: bool = True):
        """One row per ``.npy`` file: rank, net, graph, iteration, op, op_type, kind, io, slot,
        call, dtype, shape, format, nbytes, timestamp, task_id, stream_id, order, path, source
        (where it is on disk: ``{bin file}:{io}.{slot}`` for a tensor of an Ascend bin file,
        whose ``path`` is a temporary ``.npy``, see :mod:`.bincache`)."""
        rec = self.records()
        df = rec[rec["path"].notna()].copy()
        if with_shape:
            shapes = []
            for p in df["path"]:
                try:
                    shapes.append(npy_header(p)[0])
                except (OSError, ValueError):
                    shapes.append(None)
            df["shape"] = ["(" + ",".join(str(x) for x in s) + ")" if s is not None else None for s in shapes]
        df["source"] = [bincache.source(p) for p in df["path"]]
        cols = ["rank", "net", "graph", "iteration", "order", "op", "op_type", "kind", "io", "slot", "call",
                "dtype", "shape", "format", "nbytes", "timestamp", "task_id", "stream_id", "path", "source"]
        return df[[c for c in cols if c in df.columns]].reset_index(drop=True)

    def summary(self):
        """Per rank / graph / iteration (``"constants"`` for constants/): ops, parameters,
        tensors (files), stat_rows, bytes."""
        import pandas as pd
        rec = self.records()
        cols = ["rank", "graph", "iteration", "ops", "parameters", "tensors", "stat_rows", "bytes"]
        if rec.empty:
            return pd.DataFrame(columns=cols)
        rows = []
        its = rec["iteration"].astype("object").where(rec["iteration"].notna(), "constants")
        for (rk, g, it), grp in rec.assign(_it=its).groupby(["rank", "graph", "_it"], sort=False):
            rows.append({"rank": int(rk), "graph": int(g), "iteration": it,
                         "ops": grp.loc[grp["kind"] == "op", "op_file"].nunique(),
                         "parameters": grp.loc[grp["kind"] != "op", "op_file"].nunique(),
                         "tensors": int(grp["path"].notna().sum()),
                         "stat_rows": int(grp["stat_row"].fillna(False).astype(bool).sum()),
                         "bytes": int(grp["nbytes"].fillna(0).sum())})
        df = pd.DataFrame(rows, columns=cols)
        order = [1 << 60 if it == "constants" else int(it) for it in df["iteration"]]
        return df.assign(_o=order).sort_values(["rank", "_o", "graph"]).drop(columns="_o").reset_index(drop=True)

    def statistics(self):
        """All statistic.csv rows: rank, net, graph, iteration, op, op_type, io, slot, call, order,
        dtype, shape, data_size, timestamp, task_id, stream_id and the statistics
        (max, min, avg, count, …, l2norm; see :data:`STAT_COLUMNS`)."""
        rec = self.records()
        if "stat_row" not in rec.columns:
            return rec.iloc[0:0]
        df = rec[rec["stat_row"]].copy()
        return df.drop(columns=["stat_row", "path", "nbytes"], errors="ignore").reset_index(drop=True)

    def records(self):
        """Tensors and statistics joined, one row per dumped tensor, in execution order.

        Columns: rank, net, graph, iteration, order (0.. within rank+iteration; constants
        last), exec_index, op (full name when known), op_file, op_type, kind
        (op/parameter/constant), io, slot, call, dtype, format, timestamp, task_id, stream_id,
        path (None when only statistics exist), nbytes, stat_row (the row has statistics),
        shape (from statistics) and the statistic columns present."""
        if self._records is None:
            self._records = self._build_records()
        return self._records

    def _build_records(self):
        return build_records(self.ranks)
