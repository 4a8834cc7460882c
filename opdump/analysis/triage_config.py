"""The two configs ``opdump triage`` runs the script with (README, Analysis: triage).

* Run 1: the user's MindSpore ``data_dump.json`` (or, without one, a device-statistics
  dump of every operator, every iteration), its ``path`` replaced by the triage folder's
  ``run1`` so that each triage writes a fresh dump; ``--iterations`` replaces ``iteration``.
* Run 2: run 1's config with ``dump_mode`` 1, ``kernels`` = the suspects' full names (and
  parameter names), ``iteration`` = the suspect iterations, ``saved_data`` ``full`` (whole
  tensors, plus the statistics that show whether run 2 reproduces run 1).

Guarantees: each config is validated by opdump's own loader before any run starts (a bad
one raises :class:`opdump.ConfigError`) and is written whole (temporary file, then rename).
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict, Iterable, List, Optional

from ..config import ConfigError, load_config
from .whole_files import write_text

__all__ = ["DEFAULT_CATEGORIES", "run1_config", "run2_config", "write_config"]

#: statistics run 1 writes by default: NaN/Inf counts for the overflow rule, max/min/avg/l2norm
#: for the trends, watch conditions and a reference comparison
DEFAULT_CATEGORIES = ["max", "min", "avg", "l2norm", "nan count", "negative inf count", "positive inf count"]


def _default() -> Dict[str, Any]:
    return {
        "common_dump_settings": {
            "op_debug_mode": 0, "dump_mode": 0, "path": "", "net_name": "Net", "iteration": "all",
            "saved_data": "statistic", "input_output": 0, "kernels": [],
            "statistic_category": list(DEFAULT_CATEGORIES),
        },
        "e2e_dump_settings": {"enable": True, "trans_flag": True, "stat_calc_mode": "device"},
    }


def run1_config(path: str, user_config: Optional[str] = None, iterations: Optional[str] = None) -> Dict[str, Any]:
    """Run 1's config as a dict (see module doc). ``user_config``: a MindSpore-dialect JSON."""
    if user_config:
        load_config(user_config)           # the user's file as given: its own errors, its own name
        with open(user_config, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
        if not isinstance(doc, dict) or "common_dump_settings" not in doc:
            raise ConfigError("(sections)", sorted(doc) if isinstance(doc, dict) else doc,
                              "triage writes run 2's config in MindSpore's dialect: a data_dump.json with "
                              "'common_dump_settings'", file=user_config)
    else:
        doc = _default()
    common = doc["common_dump_settings"]
    common["path"] = os.path.abspath(path)
    if iterations is not None:
        common["iteration"] = iterations
    return doc


def run2_config(run1: Dict[str, Any], path: str, kernels: Iterable[str], iterations: Iterable[int]) -> Dict[str, Any]:
    """Run 2's config: tensors and statistics of only ``kernels`` at only ``iterations``."""
    doc = copy.deepcopy(run1)
    common = doc["common_dump_settings"]
    ks: List[str] = []
    for k in kernels:
        if k and k not in ks:
            ks.append(k)
    its = sorted({int(i) for i in iterations})
    if not ks or not its:
        raise ValueError("run 2 needs at least one suspect operator and one iteration")
    common.update({"path": os.path.abspath(path), "dump_mode": 1, "kernels": ks,
                   "iteration": "|".join(str(i) for i in its), "saved_data": "full", "input_output": 0})
    if common.get("saved_data") == "full" and not common.get("statistic_category"):
        common["statistic_category"] = list(DEFAULT_CATEGORIES)
    cats = common.get("statistic_category") or []
    for c in ("nan count", "negative inf count", "positive inf count", "max", "min"):
        if c not in cats:
            cats.append(c)
    common["statistic_category"] = cats
    doc.setdefault("e2e_dump_settings", {}).setdefault("enable", True)
    return doc


def write_config(doc: Dict[str, Any], path: str) -> str:
    """Write ``doc`` to ``path`` whole and check it with opdump's loader (raises ConfigError)."""
    write_text(path, json.dumps(doc, indent=2) + "\n")
    load_config(path)
    return path
