"""Folder layout of a dump: every path below the dump root, and the patterns that
recognise them again.

Why: the writer (:mod:`opdump.write.layout`) creates these folders and files and the
reader (:mod:`opdump.analysis.reader`) finds them; both take the names from here
(docs/design.md, "Layout")::

    {path}/rank_{rank}/.dump_metadata/{data_dump.json, config.json, manifest.json}
    {path}/rank_{rank}/{net_name}/{graph_id}/{iteration}/   tensor files, statistic.csv, mapping.csv,
                                                            ms_execution_order_graph_{graph_id}.csv
    {path}/rank_{rank}/{net_name}/{graph_id}/constants/     Parameter.data-{i}.… files
    {path}/rank_{rank}/graphs/ms_output_trace_code_graph_{graph_id}.{ir,json}
    {path}/rank_{rank}/execution_order/ms_execution_order_graph_{graph_id}.csv
    {path}/rank_{rank}/execution_order/ms_global_execution_order_graph_{graph_id}.csv

Pure functions of names: no I/O.  Guarantees: every ``*_file_name`` /
``*_dir_name`` built here matches its ``*_RE`` and parses back to the same number.
"""
from __future__ import annotations

import re
from typing import Iterable, List, Optional

METADATA_DIR = ".dump_metadata"
GRAPHS_DIR = "graphs"
EXECUTION_ORDER_DIR = "execution_order"
CONSTANTS_DIR = "constants"
#: folders of a rank that are not a net's data folder
SPECIAL_DIRS = frozenset({METADATA_DIR, GRAPHS_DIR, EXECUTION_ORDER_DIR})

DATA_DUMP_JSON = "data_dump.json"      # the config as given
CONFIG_JSON = "config.json"            # versions and the normalised config
MANIFEST_JSON = "manifest.json"        # opdump: complete, dumped iterations, files written
#: in an iteration folder, with op_debug_mode 3: the operators that overflowed (README, "Debug dumps")
OVERFLOW_JSON = "overflow.json"
#: in an iteration folder, with op_debug_mode 4: the operators that raised, their arguments and
#: repro scripts (README, "Debug dumps")
EXCEPTION_JSON = "exception.json"
#: in an iteration folder, in watcher mode: the watched outputs' changes and snapshots (README, "Debug dumps")
WATCHER_JSON = "watcher.json"
#: in an iteration folder, with opdump_settings.reference: that iteration's online compare (README, "Online compare")
ONLINE_COMPARE_JSON = "online_compare.json"
#: the same, one row per overflowing output (operator, source line, slot, NaN/+Inf/-Inf counts)
OVERFLOW_CSV = "overflow.csv"
#: in an iteration folder of an eager dump: its collective operators (group size, replicated,
#: complete; README, "Rank consistency")
COLLECTIVES_JSON = "collectives.json"

#: the execution-order CSV's header line (one full name a line below it)
EXECUTION_ORDER_HEADER = "NodeExecutionOrder-FullNameWithScope"

RANK_RE = re.compile(r"^rank_(\d+)$")
GRAPH_FILE_RE = re.compile(r"^ms_output_trace_code_graph_(\d+)\.(ir|json)$")
EXECUTION_ORDER_RE = re.compile(r"^ms_execution_order_graph_(\d+)\.csv$")
GLOBAL_EXECUTION_ORDER_RE = re.compile(r"^ms_global_execution_order_graph_(\d+)\.csv$")
#: torchair's rank folder in the ACL layout
WORLD_RANK_RE = re.compile(r"^worldsize\d+_global_rank(\d+)$")


def rank_dir_name(rank: int) -> str:
    return f"rank_{int(rank)}"


def graph_file_name(graph_id: int, ext: str = "ir") -> str:
    """``ms_output_trace_code_graph_{graph_id}.{ir|json}``: the listing of a graph."""
    return f"ms_output_trace_code_graph_{int(graph_id)}.{ext}"


def execution_order_file_name(graph_id: int) -> str:
    """``ms_execution_order_graph_{graph_id}.csv``: in ``execution_order/`` (the graph's
    order) and, for eager graphs, in each iteration folder (that iteration's own order)."""
    return f"ms_execution_order_graph_{int(graph_id)}.csv"


def global_execution_order_file_name(graph_id: int) -> str:
    """``ms_global_execution_order_graph_{graph_id}.csv``: the iterations the graph ran in."""
    return f"ms_global_execution_order_graph_{int(graph_id)}.csv"


def iteration_dir_name(iteration: Optional[int]) -> str:
    """The folder of an iteration; None: the graph's ``constants/`` folder."""
    return CONSTANTS_DIR if iteration is None else str(int(iteration))


def parse_iteration_dir(name: str) -> Optional[object]:
    """``"7"`` -> 7, ``"constants"`` -> None (the constants folder), else ``False`` (not one)."""
    if name.isdigit():
        return int(name)
    if name == CONSTANTS_DIR:
        return None
    return False


# ---------------------------------------------------------------- file contents
def render_execution_order(full_names: Iterable[str]) -> str:
    """The execution-order CSV: the header, then one full name per line."""
    return EXECUTION_ORDER_HEADER + "\n" + "".join(f"{n}\n" for n in full_names)


def parse_execution_order(text: str) -> List[str]:
    """Full names of an execution-order CSV, in order (header and blank lines dropped).
    Splits on ``\\n`` only: a full name may hold other line separators."""
    lines = [ln.rstrip("\r").strip() for ln in text.split("\n")]
    lines = [ln for ln in lines if ln]
    if lines and lines[0].startswith("NodeExecutionOrder"):
        lines = lines[1:]
    return lines


def render_global_execution_order(iterations: Iterable[int]) -> str:
    """The global execution-order CSV: one iteration number per line, ascending."""
    return "".join(f"{i}\n" for i in sorted(iterations))


def parse_global_execution_order(text: str) -> List[int]:
    """Iterations of a global execution-order CSV (MindSpore may add columns after a comma)."""
    out = []
    for ln in text.split("\n"):
        head = ln.split(",")[0].strip()
        if head.lstrip("-").isdigit():
            out.append(int(head))
    return out
