"""The objects of a read dump: :class:`Rank` -> :class:`Graph` / :class:`Iteration`.
Plain records filled by :mod:`.scan`; nothing here reads files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from .files import TensorFile
from .ops import OpInfo


@dataclass
class Iteration:
    """One iteration folder (or a graph's ``constants/`` folder: ``iteration`` None)."""

    rank: int
    net: str
    graph: int
    iteration: Optional[int]
    path: Path
    #: the tensor files as objects (:attr:`files`); None while only :attr:`file_columns` holds them
    _files: Optional[List[TensorFile]] = field(default=None, repr=False)
    stats: List[Dict[str, Any]] = field(default_factory=list)
    kernel_args: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # op_file -> args
    raw_files: List[str] = field(default_factory=list)   # Ascend protobuf ("bin") files, not converted
    #: this iteration's own execution order (eager graphs write one per iteration); empty: the graph's
    execution_order: List[str] = field(default_factory=list)
    #: the tensor files as columns (:mod:`.file_columns`) until :attr:`files` makes the objects
    file_columns: Optional[Any] = field(default=None, repr=False, compare=False)

    @property
    def files(self) -> List[TensorFile]:
        """The folder's tensor files, in timestamp order: made from :attr:`file_columns` on
        first use (the columns are then dropped: the objects may be changed by the caller)."""
        if self._files is None:
            fc = self.file_columns
            self._files = fc.tensor_files() if fc is not None else []
            self.file_columns = None
        return self._files

    @files.setter
    def files(self, value: List[TensorFile]) -> None:
        self._files, self.file_columns = value, None

    def has_files(self) -> bool:
        """Whether the folder holds tensor files (without making their objects)."""
        fc = self.file_columns
        return len(fc) > 0 if fc is not None else bool(self._files)


@dataclass
class Graph:
    """A graph: its operators (listing and execution order) and the iterations it ran in."""

    rank: int
    graph_id: int
    kind: Optional[str] = None
    ops: List[OpInfo] = field(default_factory=list)
    execution_order: List[str] = field(default_factory=list)
    iterations_run: List[int] = field(default_factory=list)
    ir_path: Optional[Path] = None
    json_path: Optional[Path] = None
    #: kernel-level graph dump: ``….kernels.json`` (kernels, their output buffers, the operators they store)
    kernels_path: Optional[Path] = None
    #: listed operators that no execution order names (MindSpore's Return, MakeTuple…)
    unordered: Dict[str, OpInfo] = field(default_factory=dict, repr=False)

    def op(self, name: str) -> Optional[OpInfo]:
        for o in self.ops:
            if o.full_name == name or o.file_name == name:
                return o
        return None


@dataclass
class Rank:
    """One ``rank_N`` folder: its metadata, graphs and iteration folders."""

    rank_id: int
    path: Path
    data_dump: Dict[str, Any] = field(default_factory=dict)
    config: Dict[str, Any] = field(default_factory=dict)
    manifest: Optional[Dict[str, Any]] = None
    graphs: Dict[int, Graph] = field(default_factory=dict)
    iterations: List[Iteration] = field(default_factory=list)
    name_map: Dict[str, str] = field(default_factory=dict)    # file-name form -> full name

    @property
    def complete(self) -> Optional[bool]:
        """``manifest.json``'s ``complete`` (opdump dumps); None when unknown (e.g. MindSpore)."""
        if self.manifest is None:
            return None
        v = self.manifest.get("complete")
        return bool(v) if v is not None else None

    @property
    def sample_num(self) -> Optional[int]:
        """Sample dump: tensor files hold only their first ``sample_num`` elements, flattened
        (README, "Debug dumps"); None when they hold whole tensors.  From ``manifest.json``
        (opdump) or the copied ``data_dump.json``'s ``e2e_dump_settings`` (MindSpore)."""
        if self.manifest is not None and "sample_num" in self.manifest:
            v = self.manifest.get("sample_num")
            return int(v) if v else None
        e2e = self.data_dump.get("e2e_dump_settings") if isinstance(self.data_dump, dict) else None
        if isinstance(e2e, dict) and e2e.get("sample_mode") == 1:
            try:
                return int(e2e.get("sample_num", 100))
            except (TypeError, ValueError):
                return 100
        return None
