"""``opdump_settings.reference`` / ``stop_on_divergence``: the online compare's fields
(README, "Online compare").

Checked when the config is loaded, so a run never starts against a reference that cannot
be read: the reference is an absolute path to a folder that holds an opdump or MindSpore
dump (``rank_N`` folders, or one ``rank_N`` folder, holding ``{net}/{graph}/{iteration}``
folders), it is not the dump's own folder, and the run dumps statistics (the online
compare decides on statistics, and saves the tensors of diverging operators only).
Only names and folders are looked at here (no file is parsed: that is the analysis
side's job, when the first iteration needs it).
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from ..format import layout as fl
from .errors import ConfigError

__all__ = ["reference_dump", "online_compare_rules", "is_dump_folder"]


def _is_rank_folder(path: str) -> bool:
    """A ``rank_N`` folder holding at least one ``{net}/{graph}/{iteration}`` folder."""
    try:
        nets = [e for e in os.scandir(path) if e.is_dir() and e.name not in fl.SPECIAL_DIRS
                and not e.name.startswith(".")]
        for net in nets:
            for g in os.scandir(net.path):
                if g.is_dir() and g.name.isdigit():
                    for it in os.scandir(g.path):
                        if it.is_dir() and fl.parse_iteration_dir(it.name) is not False:
                            return True
    except OSError:
        return False
    return False


def is_dump_folder(path: str) -> bool:
    """True when ``path`` is a dump root (``rank_N`` folders) or a ``rank_N`` folder of one."""
    if fl.RANK_RE.match(os.path.basename(os.path.normpath(path))) and _is_rank_folder(path):
        return True
    try:
        return any(e.is_dir() and fl.RANK_RE.match(e.name) and _is_rank_folder(e.path) for e in os.scandir(path))
    except OSError:
        return False


def reference_dump(value: Any, field: str) -> str:
    """The reference dump's folder: an absolute path to an existing opdump/MindSpore dump."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(field, value, "must be the absolute path of a dump folder (a string)")
    if not os.path.isabs(value):
        raise ConfigError(field, value, "must be an absolute path (the reference dump's root or rank_N folder)")
    path = os.path.normpath(value)
    if not os.path.exists(path):
        raise ConfigError(field, value, "no such folder: the reference must be an existing dump")
    if not os.path.isdir(path):
        raise ConfigError(field, value, "not a folder: give the reference dump's root (holding rank_N) "
                                        "or one rank_N folder")
    if not is_dump_folder(path):
        raise ConfigError(field, value, "not an opdump/MindSpore dump (no rank_N folder holding "
                                        "{net}/{graph_id}/{iteration} folders)")
    return path


def online_compare_rules(d: Mapping[str, Any], names: Mapping[str, str]) -> None:
    """What the online compare needs of the rest of the config (raises ConfigError)."""
    ref_field = names.get("reference", "opdump_settings.reference")
    ref = d.get("reference")
    if d.get("stop_on_divergence") and not ref:
        raise ConfigError(names.get("stop_on_divergence", "opdump_settings.stop_on_divergence"), True,
                          f"needs {ref_field} (the dump to compare with)")
    if not ref:
        return
    path = os.path.normpath(d.get("path") or "")
    if path and (ref == path or ref.startswith(path + os.sep) or path.startswith(ref + os.sep)):
        raise ConfigError(ref_field, ref, f"must not be the dump's own folder ({names.get('path', 'path')} "
                                          f"{path!r}) or inside it")
    if d.get("saved_data") == "tensor":
        raise ConfigError(names.get("saved_data", "saved_data"), "tensor",
                          f'must be "statistic" or "full" with {ref_field}: the online compare decides on '
                          "statistics (\"full\": also on tensors, where the reference has them) and saves "
                          "the tensors of diverging operators only")
    if d.get("op_debug_mode", 0) != 0:
        raise ConfigError(names.get("op_debug_mode", "op_debug_mode"), d.get("op_debug_mode"),
                          f"must be 0 with {ref_field} (the overflow/exception dumps are other modes)")
    if d.get("sample_mode", 0) != 0:
        raise ConfigError(names.get("sample_mode", "sample_mode"), d.get("sample_mode"),
                          f"must be 0 with {ref_field} (the online compare saves whole tensors)")
    if d.get("dump_scene") == "watcher":
        raise ConfigError(ref_field, ref, "the online compare and watcher mode are separate modes")
