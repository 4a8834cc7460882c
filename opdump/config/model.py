"""The validated, dialect-independent dump configuration.

Every dialect loader (MindSpore ``data_dump.json``, ACL/torchair ``{"dump": …}``,
the options object) produces one :class:`DumpConfig`.  Nothing downstream ever
looks at raw JSON: capture, selection, statistics and writing read only this.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Tuple

from ..format.statistics import ALL_STATISTICS, DEFAULT_STATISTICS   # the one table of categories


@dataclass(frozen=True)
class IterationSpec:
    """Which 0-based iterations dump: ``all`` or a union of inclusive ranges."""

    all: bool = False
    ranges: Tuple[Tuple[int, int], ...] = ()

    def __contains__(self, iteration: int) -> bool:
        if self.all:
            return True
        return any(lo <= iteration <= hi for lo, hi in self.ranges)

    def last(self) -> Optional[int]:
        """The last selected iteration, or None for ``all``."""
        if self.all:
            return None
        return max((hi for _, hi in self.ranges), default=-1)

    def __str__(self) -> str:
        if self.all:
            return "all"
        return "|".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges)


@dataclass(frozen=True)
class DumpConfig:
    """One validated dump configuration (field names follow the MindSpore seed)."""

    # -- common_dump_settings
    path: str                                   # absolute dump root
    net_name: str = "Net"
    iteration: IterationSpec = IterationSpec(all=True)
    op_debug_mode: int = 0                      # 0 normal, 3 overflow, 4 exception
    overflow_number: int = 0                    # op_debug_mode 3: overflowing operators dumped (0: all)
    dump_mode: int = 0                          # 0 all, 1 kernels, 2 set_dump
    saved_data: str = "tensor"                  # tensor | statistic | full
    input_output: int = 0                       # 0 both, 1 inputs, 2 outputs
    kernels: Tuple[str, ...] = ()
    support_device: Tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7)
    statistic_category: Tuple[str, ...] = DEFAULT_STATISTICS
    file_format: str = "npy"                    # npy | bin
    # -- e2e_dump_settings
    enable: bool = True
    trans_flag: bool = True
    stat_calc_mode: str = "host"                # host | device
    device_stat_precision_mode: str = "high"    # high | low
    sample_mode: int = 0
    sample_num: int = 100                       # sample_mode 1: elements saved per tensor file
    save_kernel_args: bool = False
    # -- opdump_settings (opdump's own extensions; all optional)
    writer_queue_mb: int = 256                  # bound of bytes waiting to be written
    writer_threads: int = 2
    eager_capture: str = "model"                # model: inside modules/backward/optimizer; all: everything
    graph_dump: str = "operators"               # graph mode: operators (one by one) | kernels (inductor's, observed)
    compare_compiled: bool = False              # kernels mode: compare each kernel with the eager operator reference
    existing: str = "refuse"                    # a rank folder holding a dump: refuse | new-folder | overwrite
    reference: Optional[str] = None             # online compare against this dump (README, "Online compare")
    stop_on_divergence: bool = False            # online compare: stop the run at the first divergence
    # -- ACL / torchair dialect extras (README, "Other dialects"); the session refuses the ACL layout
    layout: str = "mindspore"                   # mindspore | acl
    dump_scene: str = ""                        # "" | "watcher"
    # -- watcher mode (dump_scene "watcher"; README, "Debug dumps"): kernels-style entries
    watcher_layer: Tuple[str, ...] = ()         # trigger operators (empty: every operator)
    watcher_nodes: Tuple[str, ...] = ()         # watched operators (their outputs)
    # -- ACL layout (opdump/format/acl_layout.py; README, "Other dialects")
    #: dump_list entries naming a model: (model_name, layers); "" matches every graph, () every operator
    model_filter: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    single_op: bool = False                     # dump_op_switch "on": eager operators flat in {time}/{device_id}/
    world_folder: bool = False                  # torchair options: worldsize{N}_global_rank{r}/ after dump_path
    # -- provenance
    dialect: str = "mindspore"                  # mindspore | acl | options
    source_file: Optional[str] = None           # the config file, when there was one
    source_bytes: Optional[bytes] = field(default=None, repr=False, compare=False)

    @property
    def dump_tensors(self) -> bool:
        return self.saved_data in ("tensor", "full")

    @property
    def dump_statistics(self) -> bool:
        return self.saved_data in ("statistic", "full")

    @property
    def dump_inputs(self) -> bool:
        return self.input_output in (0, 1)

    @property
    def dump_outputs(self) -> bool:
        return self.input_output in (0, 2)

    def replace(self, **changes) -> "DumpConfig":
        return dataclasses.replace(self, **changes)
