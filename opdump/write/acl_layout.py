"""Where every file of an ACL-layout dump goes (the names: :mod:`opdump.format.acl_layout`).

:func:`open_acl_folder` opens the rank folder ``{dump_path}/[worldsize{N}_global_rank{r}/]{time}/
{device_id}`` when a session starts: ``dump_path`` must exist and be writable (as CANN and
torchair require; a ConfigError naming ``dump.dump_path`` / ``dump_config.dump_path``
otherwise), the folder is created, locked and probed like the MindSpore rank folder
(:mod:`.dump_folder`).  The ``{time}`` folder is new for every run: when this device's
folder of that second already holds a dump (or another process holds it), the next free
second is used, so ``opdump_settings.existing`` does not apply to this layout.

:class:`AclLayout` is the MindSpore :class:`~.layout.Layout` with the ACL folders: data in
``graph_{id}/{id}/{iteration}/`` (flat in the rank folder for eager operators with
``dump_op_switch`` "on"), and the graphs selected by ``dump_list[].model_name``: a data folder
of a graph no entry names is recorded in :attr:`AclLayout.folder_filter` (the recorder skips
it), as is the per-graph ``layer`` list.  Every path stays under the open rank folder.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Dict, List, Optional, Tuple

import torch

from ..config import ConfigError, DumpConfig
from ..format import acl_layout as acl
from ..select.kernels import KernelMatcher
from .dump_folder import _probe, holds_dump
from .layout import Layout
from .safe_fs import NAME_MAX, PATH_MAX, DumpLocked, DumpTree, UnsafePath

#: the dump path's field, by dialect, for messages
PATH_FIELDS = {"acl": "dump.dump_path", "options": "dump_config.dump_path"}
_TRIES = 1000


def path_field(config: DumpConfig) -> str:
    return PATH_FIELDS.get(config.dialect, "dump.dump_path")


def world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def device_id(rank: int) -> int:
    """The CUDA device index when CUDA is in use, else ``LOCAL_RANK``, else the rank."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    try:
        return int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        return int(rank)


def _check_dump_path(config: DumpConfig) -> None:
    field, path = path_field(config), config.path
    if not os.path.isdir(path):
        raise ConfigError(field, path, "does not exist or is not a folder; create it first (the dump path "
                          "must exist, as in CANN/torchair)", config.source_file)
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(field, path, "is not writable by this user (the dump path needs read and write "
                          "permission)", config.source_file)
    parts = os.fsencode(path).split(b"/")
    if any(len(p) > NAME_MAX for p in parts) or len(os.fsencode(path)) + 2 * NAME_MAX + 64 >= PATH_MAX:
        raise ConfigError(field, path, f"is too long for the dump's files (paths are limited to {PATH_MAX - 1} "
                          "bytes)", config.source_file)


def rank_dir(config: DumpConfig, rank: int, when: float) -> str:
    world = (world_size(), rank) if config.world_folder else None
    return os.path.join(config.path, *acl.rank_parts(acl.time_dir_name(when), device_id(rank), world))


def open_acl_folder(config: DumpConfig, rank: int, when: Optional[float] = None) -> Tuple[str, DumpTree]:
    """(the dump root, the rank folder open and locked); ConfigError when it cannot hold a dump."""
    _check_dump_path(config)
    when = time.time() if when is None else when
    for k in range(_TRIES):
        folder = rank_dir(config, rank, when + k)
        tree = DumpTree(folder)
        try:
            tree.open(create=True)
        except UnsafePath:
            continue                               # a link planted there: take the next second
        except OSError as exc:
            raise ConfigError(path_field(config), config.path, f"cannot hold a dump ({exc.filename or folder}: "
                              f"{exc.strerror or exc})", config.source_file) from None
        try:
            tree.lock()
            if holds_dump(tree):
                tree.close()
                continue
            _probe(tree)
        except DumpLocked:
            tree.close()
            continue
        except OSError as exc:
            tree.close()
            raise ConfigError(path_field(config), config.path, f"cannot hold a dump ({folder}: "
                              f"{exc.strerror or exc})", config.source_file) from None
        return config.path, tree
    raise ConfigError(path_field(config), config.path, "no free time folder in the next "
                      f"{_TRIES} seconds", config.source_file)


class FolderFilter:
    """What the recorder dumps into one data folder: nothing (a graph no ``model_name``
    entry names), or the operators (and parameters) a ``layer`` list matches."""

    __slots__ = ("matcher",)

    def __init__(self, matcher: Optional[KernelMatcher]):
        self.matcher = matcher                      # None: nothing at all

    def op(self, op) -> bool:
        return self.matcher is not None and self.matcher.matches(op.full_name, op.op_type)

    def parameter(self, name: str) -> bool:
        return self.matcher is not None and self.matcher.matches_parameter(name)


class AclLayout(Layout):
    """:class:`~.layout.Layout` with the ACL folders (module docstring)."""

    def __init__(self, config: DumpConfig, rank: int, tree: DumpTree, on_error=None, stopped=None):
        super().__init__(os.path.dirname(tree.path), rank, "Net", tree=tree, on_error=on_error, stopped=stopped)
        self.rank_dir = tree.path
        self.net_dir = tree.path
        self.config = config
        self.single_op = config.single_op
        self._compiled: set = set()                  # graph ids with a listing of a compiled graph
        #: data folder -> FolderFilter, for graphs a model_name filter narrows (read by the recorder)
        self.folder_filter: Dict[str, FolderFilter] = {}
        self._graph_filter: Dict[int, Optional[FolderFilter]] = {}
        self._filter_lock = threading.Lock()
        self._listed: set = set()                     # graph ids with a listing (model_name warnings)

    # -- folders
    def graph_dir(self, graph_id: int) -> str:
        name, model_id, _ = acl.data_parts(graph_id, 0)
        return os.path.join(self.rank_dir, name, model_id)

    def iteration_dir(self, graph_id: int, iteration: int) -> str:
        if self.single_op and graph_id not in self._compiled:
            folder = self.rank_dir                   # single-operator dump: {time}/{device_id}/{file}
        else:
            folder = os.path.join(self.graph_dir(graph_id), acl.data_parts(graph_id, iteration)[2])
        self._apply_filter(graph_id, folder)
        return folder

    def constants_dir(self, graph_id: int) -> str:
        folder = os.path.join(self.graph_dir(graph_id), acl.CONSTANTS_DIR)
        self._apply_filter(graph_id, folder)
        return folder

    def _apply_filter(self, graph_id: int, folder: str) -> None:
        if not self.config.model_filter or folder in self.folder_filter:
            return
        with self._filter_lock:
            if graph_id not in self._graph_filter:
                self._graph_filter[graph_id] = self._filter_of(acl.model_name(graph_id))
            filt = self._graph_filter[graph_id]
            if filt is not None:
                self.folder_filter[folder] = filt

    def _filter_of(self, name: str) -> Optional[FolderFilter]:
        """None: the whole graph is dumped; else what of it."""
        hits = [layers for model, layers in self.config.model_filter if model in ("", name)]
        if not hits:
            return FolderFilter(None)
        if any(not layers for layers in hits):
            return None
        union = []
        for layers in hits:
            union.extend(n for n in layers if n not in union)
        return FolderFilter(KernelMatcher(tuple(union)))

    def write_listing(self, graph_id: int, kind: str, ops, params) -> None:
        if kind != "eager":
            self._compiled.add(graph_id)
        with self._filter_lock:
            self._listed.add(graph_id)
        super().write_listing(graph_id, kind, ops, params)

    def unmatched(self) -> List[str]:
        """What the session warns about at close: a ``dump_list`` ``model_name`` that named
        none of the run's graphs (a copied ``"ResNet-50"`` would dump nothing, silently).
        Unmatched ``layer`` entries are already warned about as ``kernels`` entries."""
        with self._filter_lock:
            names = [acl.model_name(g) for g in sorted(set(self._listed) | set(self._graph_filter))]
        return [f"dump_list model_name {model!r} names no graph of this run (its graphs: {', '.join(names)}; "
                "each graphs/*.ir file starts with '# IR entry: @<model_name>')"
                for model, _ in self.config.model_filter if model and names and model not in names]

    # -- file names over 255 bytes: Layout.place, a bin file's stand-in has no extension
    @staticmethod
    def _stand_in(file_name: str) -> str:
        return acl.mapped_name(file_name)
