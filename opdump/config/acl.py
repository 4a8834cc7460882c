"""The ACL / torchair dialect (README "Other dialects"): ``{"dump": {...}}``.

Maps the Ascend keys onto the one DumpConfig: ``dump_mode`` input/output/all ->
``input_output`` 1/2/0 (default "output", as in CANN), ``dump_data``
tensor/stats -> ``saved_data`` tensor/statistic, ``dump_debug`` "on" -> overflow
(``op_debug_mode`` 3, inputs and outputs), ``dump_step`` -> ``iteration``,
``layer`` lists -> ``kernels`` with ``dump_mode`` 1 when every dump_list entry
lists layers; entries naming a ``model_name`` (a graph's name,
``graph_{id}``, see :mod:`opdump.format.acl_layout`) -> ``model_filter``; ``dump_op_switch``
"on" -> ``single_op`` (eager operators written flat); ``file_format`` (opdump's
extension) "bin" by default, "npy" with ``dump_data`` "stats"; ``dump_scene`` "watcher" -> watcher mode (``layers`` are the
triggers, ``watcher_nodes`` the watched operators; torchair's restrictions are
errors).  ``dump_path`` may be relative (to the working directory) and may use
``$VAR``, as in CANN.  The result uses the ACL directory layout.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Tuple

from . import validate as v
from .errors import ConfigError
from .iteration import parse_iteration
from .model import DumpConfig
from .rules import apply_rules
from .warn import warn_config
from ..format.acl_layout import sanitize_model_name

DUMP = "dump"

DUMP_FIELDS = {
    "dump_list": v.Field(lambda value, field: _dump_list(value, field), "_list"),
    "dump_path": v.Field(v.path_string, "_path"),
    "dump_mode": v.Field(v.mapped({"input": 1, "output": 2, "all": 0}), "input_output"),
    "dump_op_switch": v.Field(v.choice("on", "off"), "_op_switch"),
    "dump_data": v.Field(v.mapped({"tensor": "tensor", "stats": "statistic"}), "saved_data"),
    "dump_debug": v.Field(v.mapped({"on": 3, "off": 0}), "op_debug_mode"),
    "dump_scene": v.Field(v.choice("watcher"), "dump_scene"),
    "dump_step": v.Field(parse_iteration, "iteration"),
    # opdump's extension: "bin" (default with tensors; the Ascend DumpData file) or "npy"
    "file_format": v.Field(v.choice("bin", "npy"), "file_format"),
}

ENTRY_FIELDS = {
    "model_name": v.Field(lambda value, field: _model_name(value, field)),
    "layer": v.Field(v.name_list),
    "watcher_nodes": v.Field(v.name_list),
}

NAMES = {"input_output": "dump.dump_mode", "saved_data": "dump.dump_data", "op_debug_mode": "dump.dump_debug",
         "iteration": "dump.dump_step", "kernels": "dump.dump_list", "dump_scene": "dump.dump_scene",
         "file_format": "dump.file_format", "model_filter": "dump.dump_list"}


def _model_name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(field, value, "must be a non-empty string (the model's name)")
    return value


def _dump_list(value: Any, field: str) -> List[Tuple[int, Dict[str, Any]]]:
    if not isinstance(value, list):
        raise ConfigError(field, value, 'must be a list of objects {"model_name": ..., "layer": [...]}')
    entries = []
    for i, entry in enumerate(value):
        prefix = f"{field}[{i}]"
        entries.append((i, v.apply_table(v.expect_dict(entry, prefix), ENTRY_FIELDS, prefix + ".")))
    return entries


def _model_filter(entries) -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """dump_list entries as (model_name, layers): a graph is dumped when an entry names it
    (``graph_{id}``, compared sanitized; an entry without model_name names every graph), and
    of it the operators its entries list (all of them when one of its entries lists none)."""
    out = []
    for i, e in entries:
        layers = e.get("layer", ())
        if layers:
            v.kernel_list(list(layers), f"dump.dump_list[{i}].layer")   # the three kernels forms
        out.append((sanitize_model_name(e.get("model_name", "")), tuple(layers)))
    return tuple(out)


def _union(lists) -> Tuple[str, ...]:
    out: List[str] = []
    for names in lists:
        out.extend(n for n in names if n not in out)
    return tuple(out)


def parse_acl(dump: Any, env: Mapping[str, str], extra: Mapping[str, Any] = ()) -> DumpConfig:
    """Build a DumpConfig from the value of ``"dump"``; ``extra`` holds opdump_settings values."""
    kw = v.apply_table(v.expect_dict(dump, DUMP), DUMP_FIELDS, DUMP + ".")
    entries = kw.pop("_list", [])
    op_switch = kw.pop("_op_switch", "off")
    raw_path = kw.pop("_path", "")
    kw.setdefault("input_output", 2)                       # CANN's default dump_mode is "output"
    if not raw_path:
        raise ConfigError("dump.dump_path", raw_path, "required: the directory to dump into (absolute, or "
                          "relative to the working directory)")
    path = v.expand_env(raw_path, "dump.dump_path", env)
    kw["path"] = v.check_path(path, "dump.dump_path", relative_to=os.getcwd())
    layers = _union(e.get("layer", ()) for _, e in entries)
    watched = _union(e.get("watcher_nodes", ()) for _, e in entries)
    if kw.get("dump_scene") == "watcher":
        _check_watcher(kw, entries, watched, op_switch)
    else:
        for i, e in entries:
            if "watcher_nodes" in e:
                raise ConfigError(f"dump.dump_list[{i}].watcher_nodes", list(e["watcher_nodes"]),
                                  'only used with "dump_scene": "watcher"')
        if kw.get("op_debug_mode") == 3:
            # dump_data "stats" is allowed: statistic.csv rows of the overflowing operators (README, Debug dumps)
            _warn_overflow_ignores(dump, entries)
            kw["input_output"] = 0                          # overflow dump saves inputs and outputs
        else:
            if entries and all(e.get("layer") for _, e in entries):
                kw.update(dump_mode=1, kernels=layers)        # the union selects; model_filter narrows
            if any("model_name" in e for _, e in entries):
                kw["model_filter"] = _model_filter(entries)
    kw["single_op"] = op_switch == "on"
    kw.setdefault("file_format", "npy" if kw.get("saved_data") == "statistic" else "bin")
    kw.update(extra)
    kw = apply_rules(kw, NAMES)
    return DumpConfig(layout="acl", dialect="acl", **kw)


def _warn_overflow_ignores(dump: Mapping[str, Any], entries) -> None:
    """``dump_debug: "on"`` watches every operator of every graph and saves inputs and outputs
    (README, Debug dumps), as CANN's overflow detection does: say so when the config asks for
    less -- ``layer``/``model_name`` entries or a ``dump_mode`` other than "all" -- rather than
    drop them silently (the MindSpore dialect warns the same way for ``dump_mode`` 1)."""
    ignored = [f'dump.dump_list[{i}].{k}' for i, e in entries for k in ("model_name", "layer") if e.get(k)]
    if dump.get("dump_mode") not in (None, "all"):
        ignored.append(f'dump.dump_mode "{dump["dump_mode"]}"')
    if ignored:
        warn_config(f'opdump: {", ".join(ignored)} ignored with dump.dump_debug "on": every operator of every '
                    "graph is watched for overflow, and an overflowing operator's inputs and outputs are saved")


def _check_watcher(kw: Dict[str, Any], entries, watched: Tuple[str, ...], op_switch: str) -> None:
    """Seed 003's watcher restrictions."""
    if kw.get("op_debug_mode") == 3:
        raise ConfigError("dump.dump_debug", "on", 'cannot be combined with "dump_scene": "watcher"')
    if op_switch == "on":
        raise ConfigError("dump.dump_op_switch", "on", 'cannot be combined with "dump_scene": "watcher"')
    if kw["input_output"] != 2:
        raise ConfigError("dump.dump_mode", {0: "all", 1: "input"}[kw["input_output"]],
                          'must be "output" with "dump_scene": "watcher"')
    for i, e in entries:
        if "model_name" in e:
            raise ConfigError(f"dump.dump_list[{i}].model_name", e["model_name"],
                              'is not supported with "dump_scene": "watcher"')
    if not watched:
        raise ConfigError("dump.dump_list", [dict(e) for _, e in entries],
                          'watcher mode needs at least one entry with "watcher_nodes": [...]')
    for i, e in entries:                 # names take the three forms of kernels (a regex must compile)
        for key in ("layer", "watcher_nodes"):
            if key in e:
                v.kernel_list(list(e[key]), f"dump.dump_list[{i}].{key}")
    # the entries' pairs are merged: an entry without "layer" makes every operator a trigger
    every = any(not e.get("layer") for _, e in entries if e.get("watcher_nodes"))
    kw.update(watcher_nodes=watched,
              watcher_layer=() if every else _union(e.get("layer", ()) for _, e in entries))
