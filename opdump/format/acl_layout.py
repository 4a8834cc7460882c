"""The ACL/GE layout (README "Other dialects"): every folder and file name a dump made
from an ACL/torchair/TF-adapter config has, and the patterns that recognise them again.

Why one module: the writer (:mod:`opdump.write.acl_layout`) builds these names and the
reader finds them; both take them from here, as the MindSpore layout's come from
:mod:`opdump.format.layout`.  Pure functions of names: no I/O.

Tree (``[...]`` only in some modes, see below)::

    {dump_path}/[worldsize{N}_global_rank{r}/]{time}/{device_id}/          <- the "rank folder"
        .dump_metadata/{data_dump.json, config.json, manifest.json}
        graphs/ms_output_trace_code_graph_{model_id}.{ir,json}
        execution_order/ms_{global_,}execution_order_graph_{model_id}.csv
        {model_name}/{model_id}/{data_index}/
            {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}          bin file: one operator,
                                                                           all its dumped inputs and outputs
            Parameter.{name}.0.0.{timestamp}                               bin file: one parameter (one output)
            {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{input|output}.{slot}.{format}.{dtype}.npy
                                                                           file_format "npy": one tensor a file,
                                                                           named as in the MindSpore layout
            statistic.csv        dump_data "stats": one row per tensor (same columns as the MindSpore
                                 layout's statistic.csv, README "Statistics")
            mapping.csv          ``{mapped},{original name}`` for names over 255 bytes: a bin file is
                                 stored under 36 random digits, an .npy one under digits + ``.npy``
            ms_execution_order_graph_{model_id}.csv, overflow.json (dump_debug "on")
        {model_name}/{model_id}/constants/                                 lifted constants of a compiled graph

Single-operator mode (``dump_op_switch: "on"``): no ``{model_name}/{model_id}/{data_index}``
levels; every file of every dumped iteration goes straight into the rank folder
``{dump_path}/{time}/{device_id}/`` (beside the special folders), as ACL's single-operator dump.

Meaning of each part for PyTorch (decided here, documented in the README):

* ``worldsize{N}_global_rank{r}``: only for the torchair-style options object
  (``CompilerConfig().dump_config``), as torchair writes it; N = torch.distributed's world size,
  r = the global rank (``worldsize1_global_rank0`` when not distributed).
* ``time``: the session's start, local time, ``YYYYMMDDHHMMSS`` (one per process).
* ``device_id``: the CUDA device index when CUDA is in use at start, else the local rank
  (``LOCAL_RANK``), else the global rank: two CPU ranks never share a folder.
* ``model_name``: the name of the graph: ``graph_{model_id}``, the name after ``# IR entry: @``
  in its ``graphs/ms_output_trace_code_graph_{model_id}.ir`` (eager mode is one graph too).
  ``dump_list[].model_name`` selects graphs by that name (compared after sanitizing).
* ``model_id``: opdump's graph id (compile order; a compiled model's forward and backward
  graphs have their own ids, eager mode one).
* ``data_index``: the iteration (training step), 0-based, as ``dump_step`` counts it.
* ``task_id``: 0 (the operator's execution index is already in its name, ``…-op{N}``).
* ``stream_id``: the CUDA stream id of the tensor's stream, 0 on CPU.
* ``timestamp``: microseconds since the epoch, unique per dumped tensor within a process.

``op_type``/``op_name`` are :func:`~opdump.format.names.sanitize`-d (``.``, ``/``, ``\\``, spaces
and other unsafe characters become ``_``), so a bin file name splits at its dots into
exactly 5 fields; the same holds for ``model_name``.
"""
from __future__ import annotations

import re
import secrets
import time as _time
from dataclasses import dataclass
from typing import Optional, Tuple

from .files import BIN_NAME_RE, mapped_file_name   # noqa: F401 (BIN_NAME_RE re-exported: one pattern)
from .files import MAPPING_FILE, MAX_NAME_BYTES, PARAMETER_TYPE, STATISTIC_FILE   # noqa: F401 (re-exported)
from .layout import CONSTANTS_DIR, EXECUTION_ORDER_DIR, GRAPHS_DIR, METADATA_DIR    # noqa: F401 (re-exported)
from .names import sanitize

#: the layout's name in DumpConfig.layout
LAYOUT = "acl"
TIME_FORMAT = "%Y%m%d%H%M%S"
TIME_RE = re.compile(r"^\d{14}$")
WORLD_RE = re.compile(r"^worldsize(\d+)_global_rank(\d+)$")
DEVICE_RE = re.compile(r"^\d+$")
#: model_name of an opdump graph
MODEL_NAME_PREFIX = "graph_"
MODEL_NAME_RE = re.compile(r"^graph_(\d+)$")
MODEL_ID_RE = re.compile(r"^\d+$")
DATA_INDEX_RE = re.compile(r"^\d+$")
#: folders of a rank folder that are no model's data
SPECIAL_DIRS = frozenset({METADATA_DIR, GRAPHS_DIR, EXECUTION_ORDER_DIR})
#: file_format values of the layout ("bin" is the dialects' default)
FILE_FORMATS = ("bin", "npy")


@dataclass(frozen=True)
class BinName:
    """The fields of a bin file's name (``op_type``/``op_name`` in their file-name form)."""

    op_type: str
    op_name: str
    task_id: int
    stream_id: int
    timestamp: int

    def build(self) -> str:
        return f"{self.op_type}.{self.op_name}.{self.task_id}.{self.stream_id}.{self.timestamp}"

    @property
    def is_parameter(self) -> bool:
        return self.op_type == PARAMETER_TYPE


def time_dir_name(seconds: Optional[float] = None) -> str:
    """``YYYYMMDDHHMMSS`` of ``seconds`` since the epoch (default now), local time."""
    return _time.strftime(TIME_FORMAT, _time.localtime(_time.time() if seconds is None else seconds))


def world_dir_name(world_size: int, rank: int) -> str:
    """torchair's ``worldsize{N}_global_rank{r}``."""
    return f"worldsize{int(world_size)}_global_rank{int(rank)}"


def parse_world_dir(name: str) -> Optional[Tuple[int, int]]:
    """``(world_size, rank)`` of a ``worldsize{N}_global_rank{r}`` folder name, else None."""
    m = WORLD_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def model_name(graph_id: int) -> str:
    """The model_name folder of opdump graph ``graph_id`` (``graph_{id}``)."""
    return f"{MODEL_NAME_PREFIX}{int(graph_id)}"


def parse_model_name(name: str) -> Optional[int]:
    """The graph id of an opdump ``graph_{id}`` model_name folder (None for other names,
    e.g. a real GE dump's ``ge_default_…``)."""
    m = MODEL_NAME_RE.match(name)
    return int(m.group(1)) if m else None


def sanitize_model_name(name: str) -> str:
    """``.``, ``/``, ``\\`` and spaces become ``_`` (as CANN does for its model_name folders)."""
    return sanitize(name)


def rank_parts(time_dir: str, device_id: int, world: Optional[Tuple[int, int]] = None) -> Tuple[str, ...]:
    """The folder names from ``dump_path`` down to the rank folder."""
    parts = (time_dir, str(int(device_id)))
    return ((world_dir_name(*world),) + parts) if world is not None else parts


def data_parts(graph_id: int, iteration: int) -> Tuple[str, str, str]:
    """``(model_name, model_id, data_index)`` below the rank folder."""
    return model_name(graph_id), str(int(graph_id)), str(int(iteration))


def constants_parts(graph_id: int) -> Tuple[str, str, str]:
    return model_name(graph_id), str(int(graph_id)), CONSTANTS_DIR


def bin_file_name(op_type: str, op_name: str, task_id: int, stream_id: int, timestamp: int) -> str:
    """``{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}`` with both names sanitized."""
    return BinName(sanitize(op_type), sanitize(op_name), int(task_id), int(stream_id), int(timestamp)).build()


def mapped_name(file_name: str) -> str:
    """The name a too-long file is stored under: a bin file (no extension) gets 36 random
    digits; an ``.npy``/``.json`` one keeps its extension (:func:`opdump.format.files.mapped_file_name`).
    The line ``{mapped},{original}`` goes to ``mapping.csv`` of the same folder
    (:func:`opdump.format.files.mapping_line`; read back with :func:`~opdump.format.files.parse_mapping`)."""
    if BIN_NAME_RE.match(file_name):
        return f"{secrets.randbelow(10 ** 18):018d}{secrets.randbelow(10 ** 18):018d}"
    return mapped_file_name(file_name)


def parse_bin_name(name: str) -> Optional[BinName]:
    """The fields of a bin file name, or None (an ``.npy``/``.csv`` or any other name)."""
    m = BIN_NAME_RE.match(name)
    if m is None:
        return None
    return BinName(m.group("op_type"), m.group("op_name"), int(m.group("task_id")), int(m.group("stream_id")),
                   int(m.group("timestamp")))


__all__ = ["LAYOUT", "TIME_FORMAT", "TIME_RE", "WORLD_RE", "DEVICE_RE", "MODEL_NAME_RE", "MODEL_ID_RE",
           "DATA_INDEX_RE", "BIN_NAME_RE", "SPECIAL_DIRS", "FILE_FORMATS", "BinName", "time_dir_name",
           "world_dir_name", "parse_world_dir", "model_name", "parse_model_name", "sanitize_model_name",
           "rank_parts", "data_parts", "constants_parts", "bin_file_name", "parse_bin_name", "mapped_name",
           "MAPPING_FILE", "STATISTIC_FILE", "MAX_NAME_BYTES"]
