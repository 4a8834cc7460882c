"""The MindSpore dialect: ``common_dump_settings`` + ``e2e_dump_settings`` (README, Config reference).

Every field of MindSpore's data_dump.json is accepted and checked; ``opdump_settings`` is opdump's
optional third section.  Fields are tables (one line per field); what depends on
several fields is in :mod:`.rules`.  Every field is optional: a missing one takes
the :class:`DumpConfig` default (MindSpore's default), ``path`` falls back to
``$OPDUMP_DIAGNOSTIC_DATA_PATH/debug_dump`` like MindSpore's ``MS_DIAGNOSTIC_DATA_PATH``.

Decisions (README config reference):

* ``path``: absolute; ASCII letters, digits, ``_ - . /`` only (MindSpore's set
  plus ``.``), so spaces, ``$``, ``~``, NUL, newlines and non-ASCII are refused;
  normalised with ``os.path.normpath``.  ``net_name``: one directory name of
  letters, digits, ``_ - .`` (not ``.``/``..``).
* ``e2e_dump_settings.enable`` false is a valid config, recorded as
  ``enable=False``; the runtime treats it as "dump off" (nothing is written).
  A missing ``e2e_dump_settings`` means enabled, as on MindSpore CPU/GPU.
* ``op_debug_mode`` 4 (exception dump) saves inputs of every iteration:
  ``input_output`` 0 becomes 1 (2 is an error), ``iteration`` becomes "all"
  and ``dump_mode`` 0, as MindSpore does.  ``op_debug_mode`` 3 and 4 ignore
  ``dump_mode`` (set to 0) and need ``saved_data`` "tensor" and ``sample_mode`` 0.
* ``overflow_number`` is accepted with any ``op_debug_mode`` (used only by 3; a non-zero value
  with another mode is ignored with a warning, :mod:`.rules`);
  ``kernels`` are validated even when ``dump_mode`` is not 1 (MindSpore's own
  example lists one with ``dump_mode`` 0).  List fields refuse duplicates;
  kernel entries are stripped of outer whitespace.
* ``opdump_settings.existing`` (``"refuse"`` by default): what a session does
  with a rank folder that already holds a dump — refuse (a second run's files
  silently added to a first run's made ``compare`` report nothing), write to
  ``{path}-N``, or empty it first (README, "Reliability").
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

from . import validate as v
from .errors import ConfigError
from .iteration import parse_iteration
from .model import DumpConfig
from .reference import reference_dump
from .rules import apply_rules

COMMON = "common_dump_settings"
E2E = "e2e_dump_settings"
OPDUMP = "opdump_settings"

COMMON_FIELDS = {
    "op_debug_mode": v.Field(v.integer(choices=(0, 3, 4))),
    "dump_mode": v.Field(v.integer(choices=(0, 1, 2))),
    "path": v.Field(v.path_string),
    "net_name": v.Field(v.net_name),
    "iteration": v.Field(parse_iteration),
    "saved_data": v.Field(v.choice("tensor", "statistic", "full")),
    "input_output": v.Field(v.integer(choices=(0, 1, 2))),
    "kernels": v.Field(v.kernel_list),
    "support_device": v.Field(v.device_list),
    "statistic_category": v.Field(v.statistic_list),
    "overflow_number": v.Field(v.integer(lo=0)),                    # used by op_debug_mode 3
    "file_format": v.Field(v.choice("npy", "bin")),
}

E2E_FIELDS = {
    "enable": v.Field(v.boolean),
    "trans_flag": v.Field(v.boolean),
    "stat_calc_mode": v.Field(v.choice("host", "device")),
    "device_stat_precision_mode": v.Field(v.choice("high", "low")),
    "sample_mode": v.Field(v.integer(choices=(0, 1))),
    "sample_num": v.Field(v.integer(lo=1)),                         # used by sample_mode 1
    "save_kernel_args": v.Field(v.boolean),
    # watcher mode (README, "Debug dumps"): {"layer": [...], "watcher_nodes": [...]}
    "watcher": v.Field(lambda value, field: _watcher(value, field), "_watcher"),
}

WATCHER_FIELDS = {
    "layer": v.Field(v.kernel_list, "watcher_layer"),
    "watcher_nodes": v.Field(v.kernel_list),
}

OPDUMP_FIELDS = {
    "writer_queue_mb": v.Field(v.integer(lo=1, hi=1 << 20)),     # up to 1 TiB waiting to be written
    "writer_threads": v.Field(v.integer(lo=1, hi=16)),
    "eager_capture": v.Field(v.choice("model", "all")),
    # graph mode: dump ATen operators run one by one (default) or inductor's compiled kernels
    "graph_dump": v.Field(v.choice("operators", "kernels")),
    # kernels mode: also run the operator reference in dumped iterations and name the first diverging kernel
    "compare_compiled": v.Field(v.boolean),
    # a rank folder that already holds a dump: refuse (default), write to {path}-N, or empty it first
    "existing": v.Field(v.choice("refuse", "new-folder", "overwrite")),
    # online compare (README, "Online compare"): a dump of the same program to compare with as it runs
    "reference": v.Field(reference_dump),
    "stop_on_divergence": v.Field(v.boolean),
}

SECTIONS = {COMMON: COMMON_FIELDS, E2E: E2E_FIELDS, OPDUMP: OPDUMP_FIELDS}

#: DumpConfig attribute -> dotted JSON name, for cross-field messages.
NAMES = {attr: f"{sec}.{attr}" for sec, table in SECTIONS.items() for attr in table}
NAMES.update(dump_scene=f"{E2E}.watcher", watcher_layer=f"{E2E}.watcher.layer",
             watcher_nodes=f"{E2E}.watcher.watcher_nodes")


def _watcher(value: Any, field: str) -> Dict[str, Any]:
    """``e2e_dump_settings.watcher``: the MindSpore-style form of torchair's ``dump_scene``
    "watcher" (``layer``: trigger operators, every one when absent; ``watcher_nodes``: the
    watched operators, required); entries take the three forms of ``kernels``."""
    kw = v.apply_table(v.expect_dict(value, field), WATCHER_FIELDS, field + ".")
    if not kw.get("watcher_nodes"):
        raise ConfigError(field + ".watcher_nodes", list(kw["watcher_nodes"]) if "watcher_nodes" in kw else "<missing>",
                          "required: a non-empty list of the operators whose outputs are watched")
    if "watcher_layer" in kw and not kw["watcher_layer"]:
        raise ConfigError(field + ".layer", [], "must name at least one trigger operator; leave it out "
                          "to check after every operator")
    return {"dump_scene": "watcher", **kw}


def parse_opdump_settings(value: Any) -> Dict[str, Any]:
    """The optional ``opdump_settings`` section (also accepted beside an ACL ``dump``)."""
    return v.apply_table(v.expect_dict(value, OPDUMP), OPDUMP_FIELDS, OPDUMP + ".")


def parse_mindspore(data: Mapping[str, Any], env: Mapping[str, str]) -> DumpConfig:
    """Build a DumpConfig from a MindSpore-dialect JSON object (raises ConfigError)."""
    v.check_keys(data, list(SECTIONS), "")
    if COMMON not in data:
        raise ConfigError(COMMON, "<missing>", f"required section; it holds {', '.join(COMMON_FIELDS)}")
    kw: Dict[str, Any] = {}
    for section, table in SECTIONS.items():
        if section in data:
            kw.update(v.apply_table(v.expect_dict(data[section], section), table, section + "."))
    raw_path = kw.pop("path", "")
    field = NAMES["path"]
    kw["path"] = v.check_path(raw_path, field) if raw_path else v.diagnostic_path(field, env)
    kw.update(kw.pop("_watcher", {}))
    kw = apply_rules(kw, NAMES)
    return DumpConfig(layout="mindspore", dialect="mindspore", **kw)
