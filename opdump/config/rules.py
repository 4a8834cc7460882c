"""Cross-field rules: the combinations MindSpore forbids, and its normalisations.

Single fields are checked by the converters in :mod:`.validate`; what depends on
two fields lives here, once, so every dialect gets the same rules.  The rules
work on DumpConfig attribute names; ``names`` maps them back to the dialect's
dotted JSON names for the messages.

Principle: where MindSpore's documentation says a combination fails (or is "not supported"),
opdump raises; where MindSpore itself overrides a field (overflow/exception
dump ignore ``dump_mode``; exception dump saves inputs of every iteration),
opdump overrides it the same way.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping

from .errors import ConfigError
from .model import DumpConfig, IterationSpec
from .reference import online_compare_rules
from .warn import warn_config

DEFAULTS: Dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(DumpConfig) if f.default is not dataclasses.MISSING
}


def apply_rules(kw: Mapping[str, Any], names: Mapping[str, str]) -> Dict[str, Any]:
    """Return ``kw`` with the normalisations applied; raise on the first forbidden combination."""
    d = {**DEFAULTS, **kw}
    out = dict(kw)

    def fail(attr: str, allowed: str) -> None:
        raise ConfigError(names.get(attr, attr), d[attr], allowed)

    op = d["op_debug_mode"]
    if d["saved_data"] in ("statistic", "full") and d["file_format"] == "bin":
        field = names.get("saved_data", "saved_data")
        value = "stats" if field.endswith("dump_data") else d["saved_data"]    # the ACL/options dialects' word
        raise ConfigError(field, value, f'statistics need {names.get("file_format", "file_format")} "npy", not '
                                        f'"bin"; use {field.rsplit(".", 1)[-1]} "tensor" with "bin"')
    if op in (3, 4):
        # overflow dump: saved_data decides files and/or statistic.csv rows of the overflowing
        # operators (opdump goes beyond MindSpore here, README "Debug dumps")
        if d["saved_data"] != "tensor" and op == 4:
            fail("saved_data", f'must be "tensor" when {names.get("op_debug_mode", "op_debug_mode")} is {op} '
                               "(statistic dump needs op_debug_mode 0 or 3)")
        if d["sample_mode"] != 0:
            fail("sample_mode", f'must be 0 when {names.get("op_debug_mode", "op_debug_mode")} is {op} '
                                "(sample dump needs op_debug_mode 0)")
        if d["dump_mode"] == 1 and op == 3:
            warn_config(f'opdump: {names.get("dump_mode", "dump_mode")} 1 is ignored when '
                        f'{names.get("op_debug_mode", "op_debug_mode")} is 3: every operator is watched '
                        "for overflow (the kernels list is not used)")
        out["dump_mode"] = 0                      # overflow/exception dump ignores the kernel selection
        if op == 3:
            out["kernels"] = ()                   # ...and its entries: no "matched no operator" warning at close
    if op != 3 and kw.get("overflow_number"):
        # a user who set a limit expects an overflow-only dump; without op_debug_mode 3 every
        # selected operator is dumped, every step (a hold-out trial's finding: no word said so)
        warn_config(f'opdump: {names.get("overflow_number", "overflow_number")} {kw["overflow_number"]} is '
                    f'ignored when {names.get("op_debug_mode", "op_debug_mode")} is {op}: it limits the '
                    "overflow-only dump (op_debug_mode 3)" + ("; this config dumps every selected operator"
                                                              if op == 0 else ""))
    if op == 3 and d.get("graph_dump") == "kernels":
        fail("graph_dump", f'must be "operators" when {names.get("op_debug_mode", "op_debug_mode")} is 3 '
                           "(the overflow watch judges operators run one by one, not fused kernels)")
    if op == 3 and d["input_output"] != 0:
        fail("input_output", f'must be 0 when {names.get("op_debug_mode", "op_debug_mode")} is 3 '
                             "(overflow dump saves inputs and outputs)")
    if op == 4:
        if d["input_output"] == 2:
            fail("input_output", f'must be 1 (or 0) when {names.get("op_debug_mode", "op_debug_mode")} is 4 '
                                 "(exception dump saves only inputs)")
        if d.get("graph_dump") == "kernels":
            fail("graph_dump", f'must be "operators" when {names.get("op_debug_mode", "op_debug_mode")} is 4 '
                               "(the operator that raised is found on the operator-by-operator path; "
                               "inductor's fused kernels have no operator to name)")
        given = kw.get("iteration")
        if given is not None and not getattr(given, "all", True):
            warn_config(f'opdump: {names.get("iteration", "iteration")} "{given}" is ignored when '
                        f'{names.get("op_debug_mode", "op_debug_mode")} is 4: every iteration is watched '
                        "for operator exceptions")
        if d["dump_mode"] == 1:
            warn_config(f'opdump: {names.get("dump_mode", "dump_mode")} 1 is ignored when '
                        f'{names.get("op_debug_mode", "op_debug_mode")} is 4: every operator is watched '
                        "for exceptions (the kernels list is not used)")
        out["input_output"] = 1
        out["iteration"] = IterationSpec(all=True)
    if d.get("compare_compiled") and d.get("graph_dump") != "kernels":
        fail("compare_compiled", f'needs {names.get("graph_dump", "graph_dump")} "kernels" '
                                 "(it compares inductor's kernels with the operator reference)")
    if op == 0 and d["dump_mode"] == 1 and not d["kernels"]:
        fail("kernels", f'must name at least one kernel when {names.get("dump_mode", "dump_mode")} is 1')
    if d.get("dump_scene") == "watcher":
        _watcher_rules(kw, d, out, names, fail)
    if d.get("reference") or d.get("stop_on_divergence"):
        online_compare_rules(d, names)
    return out


def _watcher_rules(kw, d, out, names, fail) -> None:
    """Watcher mode (README, "Debug dumps"): it dumps watched outputs only, after trigger
    operators; overflow/exception dumps and operator selections are other modes."""
    scene = names.get("dump_scene", "dump_scene")
    if not d["watcher_nodes"]:
        fail("watcher_nodes", f"watcher mode ({scene}) needs at least one watched operator")
    if d["op_debug_mode"] != 0:
        fail("op_debug_mode", f"must be 0 with watcher mode ({scene}); overflow and exception dumps "
                              "are separate modes")
    if d["dump_mode"] != 0:
        fail("dump_mode", f"must be 0 with watcher mode ({scene}): the operators dumped are the watched ones")
    if "input_output" in kw and d["input_output"] != 2:
        fail("input_output", f"must be 2 (outputs) with watcher mode ({scene}): it dumps watched outputs only")
    out["input_output"] = 2
