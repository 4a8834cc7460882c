"""Where every file of a dump goes: creates the folders and files of the MindSpore
CPU/GPU layout whose names :mod:`opdump.format.layout` defines (docs/design.md, "Layout").

```
{path}/rank_{rank}/.dump_metadata/{data_dump.json,config.json,manifest.json}
{path}/rank_{rank}/{net_name}/{graph_id}/{iteration}/<tensor files>, statistic.csv, mapping.csv
{path}/rank_{rank}/{net_name}/{graph_id}/constants/
{path}/rank_{rank}/graphs/ms_output_trace_code_graph_{graph_id}.{ir,json}
{path}/rank_{rank}/execution_order/ms_{global_,}execution_order_graph_{graph_id}.csv
```
Every path is built from sanitized parts and checked to stay under the root.
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Dict, Optional

from ..format import layout as fmt
from ..format.files import MAPPING_FILE, mapped_file_name, mapping_line, too_long
from ..format.names import sanitize
from .atomic import atomic_save_npy, atomic_write_bytes
from .safe_fs import DumpTree
from .statistic_csv import StatisticCsv
from .graph_files import write_execution_order, write_listing


class Layout:
    def __init__(self, root: str, rank: int, net_name: str, tree: Optional[DumpTree] = None,
                 on_error: Optional[Callable[[BaseException], None]] = None,
                 stopped: Optional[Callable[[], bool]] = None):
        """``tree``: the rank folder, open (:mod:`.safe_fs`: every folder and file below it is
        reached without following a link); ``on_error``: where a failed write made on the
        caller's thread is reported (the session's writer) instead of raising; ``stopped``:
        true once dumping stopped (after a write error nothing more is written)."""
        self.root = os.path.abspath(root)
        self.rank = int(rank)
        self.rank_dir = os.path.join(self.root, fmt.rank_dir_name(self.rank))
        self.net_dir = os.path.join(self.rank_dir, sanitize(net_name))
        if tree is None:
            tree = DumpTree(self.rank_dir)
            tree.open()
        self.tree = tree
        self._on_error = on_error
        self._stopped = stopped
        self._made: set = set()
        self._lock = threading.Lock()
        self._mapped: Dict[tuple, str] = {}

    # -- folders
    def _dir(self, path: str) -> str:
        """A folder's path; no system call: it is created, without following links, when
        its first file is written (:class:`.safe_fs.DumpTree`)."""
        return path

    @property
    def metadata_dir(self) -> str:
        return self._dir(os.path.join(self.rank_dir, fmt.METADATA_DIR))

    @property
    def graphs_dir(self) -> str:
        return self._dir(os.path.join(self.rank_dir, fmt.GRAPHS_DIR))

    @property
    def execution_order_dir(self) -> str:
        return self._dir(os.path.join(self.rank_dir, fmt.EXECUTION_ORDER_DIR))

    def iteration_dir(self, graph_id: int, iteration: int) -> str:
        """The iteration folder's path; it is created by :meth:`place` when its first file is
        written (in a writer thread: a mkdir per graph call is ~0.3 ms on the training thread).
        The graph folder is checked once; the iteration part is a number and cannot escape it."""
        return os.path.join(self._dir(os.path.join(self.net_dir, str(int(graph_id)))),
                            fmt.iteration_dir_name(iteration))

    def constants_dir(self, graph_id: int) -> str:
        return self._dir(os.path.join(self.net_dir, str(int(graph_id)), fmt.CONSTANTS_DIR))

    # -- graph-level files
    def ir_path(self, graph_id: int, ext: str = "ir") -> str:
        return os.path.join(self.graphs_dir, fmt.graph_file_name(graph_id, ext))

    def execution_order_path(self, graph_id: int) -> str:
        return os.path.join(self.execution_order_dir, fmt.execution_order_file_name(graph_id))

    def global_execution_order_path(self, graph_id: int) -> str:
        return os.path.join(self.execution_order_dir, fmt.global_execution_order_file_name(graph_id))

    def _ensure(self, folder: str) -> None:
        """Create ``folder`` (a path this layout built) once."""
        if folder not in self._made:
            with self._lock:
                self.tree.ensure_folder(folder)
                if len(self._made) > 4096:      # one per graph and iteration: keep it bounded
                    self._made.clear()
                self._made.add(folder)

    # -- file names over 255 bytes
    def place(self, folder: str, file_name: str) -> str:
        """The full path of ``file_name`` in ``folder``; a name over 255 bytes is replaced
        by random digits (keeping the extension) and recorded in ``mapping.csv``.  No
        system call for an ordinary name: the folder is made with the file."""
        if not too_long(file_name):
            return os.path.join(folder, file_name)
        key = (folder, file_name)
        with self._lock:
            mapped = self._mapped.get(key)
            if mapped is None:
                mapped = self._stand_in(file_name)
                self._mapped[key] = mapped
                line = mapping_line(mapped, file_name).encode("utf-8")
                try:
                    with self.tree.open_append(os.path.join(folder, MAPPING_FILE)) as fd:
                        os.write(fd, line)
                except Exception as exc:     # noqa: BLE001 - reported: dumping stops
                    self._report(exc)
        return os.path.join(folder, mapped)

    @staticmethod
    def _stand_in(file_name: str) -> str:
        """The name a too-long file is stored under (random digits, its extension kept)."""
        return mapped_file_name(file_name)

    def write_listing(self, graph_id: int, kind: str, ops, params) -> None:
        """A graph's ``.ir`` and ``.json`` (:func:`.graph_files.write_listing`); capture reaches
        the writer through the layout its session holds, without importing :mod:`opdump.write`."""
        write_listing(self, graph_id, kind, ops, params)

    def write_execution_order(self, graph_id: int, full_names, folder: Optional[str] = None) -> None:
        """The graph's execution order, or with ``folder`` one iteration's own
        (:func:`.graph_files.write_execution_order`)."""
        write_execution_order(self, graph_id, full_names, folder)

    def write_small(self, path: str, data: bytes) -> None:
        """Write a small file whole; an error is reported to ``on_error`` (never raised into
        the training thread that writes listings and metadata)."""
        if self._stopped is not None and self._stopped():
            return
        try:
            atomic_write_bytes(path, data, self.tree)
        except Exception as exc:             # noqa: BLE001 - reported: dumping stops
            self._report(exc)

    def save_npy(self, path: str, array) -> None:
        """A tensor file (in a writer job: errors go to the writer)."""
        atomic_save_npy(path, array, self.tree)

    def statistic_csv(self, path: str, categories) -> StatisticCsv:
        return StatisticCsv(path, categories, self.tree)

    def _report(self, exc: BaseException) -> None:
        if self._on_error is None:
            raise exc
        self._on_error(exc)
