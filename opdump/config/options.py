"""The options-object dialect (the TF adapter's ``npu_device`` dump_config and torchair's ``dump_config``; README "Other dialects").

``DumpOptions`` mirrors those attributes so a script written for the TF adapter
or torchair ports by changing the import.  ``dump_config_path`` loads that JSON
file (any dialect) instead, as torchair recommends; it cannot be mixed with the
other dump options (as in torchair: the JSON takes over everything but enable_dump).
Results use the ACL directory layout, like the toolchains the options come from.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from . import validate as v
from .errors import ConfigError
from .iteration import parse_iteration
from .loader import load_config
from .model import DumpConfig
from .rules import apply_rules

PREFIX = "dump_config."


def _opt_bool(value: Any, field: str) -> Optional[bool]:
    return None if value is None else v.boolean(value, field)


def _opt_str(value: Any, field: str) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise ConfigError(field, value, "must be a string")
    return value


def _layer(value: Any, field: str) -> tuple:
    if value is None:
        return ()
    if not isinstance(value, str):
        raise ConfigError(field, value, 'must be a string of operator names separated by spaces, e.g. "Add_1 Mul_1"')
    return v.name_list(value.split(), field)


FIELDS = {
    "enable_dump": v.Field(_opt_bool),
    "dump_path": v.Field(_opt_str),
    "dump_step": v.Field(lambda value, field: None if value is None else parse_iteration(value, field)),
    "dump_mode": v.Field(v.mapped({"input": 1, "output": 2, "all": 0})),
    "dump_data": v.Field(v.mapped({"tensor": "tensor", "stats": "statistic"})),
    "dump_layer": v.Field(_layer),
    "dump_config_path": v.Field(_opt_str),
    "quant_dumpable": v.Field(_opt_bool),
}

NAMES = {"input_output": PREFIX + "dump_mode", "saved_data": PREFIX + "dump_data",
         "iteration": PREFIX + "dump_step", "kernels": PREFIX + "dump_layer"}


@dataclass
class DumpOptions:
    """The TF adapter's and torchair's ``dump_config`` options; every field optional.

    ``enable_dump`` None means: on when ``dump_config_path`` is given, else off.
    ``dump_path`` None is the working directory (as in torchair); relative paths are
    relative to it.  ``quant_dumpable`` is accepted and ignored (PyTorch has no
    pre-quantisation graph to dump).
    """

    enable_dump: Optional[bool] = None
    dump_path: Optional[str] = None
    dump_step: Optional[str] = None            # None: every iteration
    dump_mode: str = "output"                  # input | output | all
    dump_data: str = "tensor"                  # tensor | stats
    dump_layer: Optional[str] = None           # operator names separated by spaces
    dump_config_path: Optional[str] = None
    quant_dumpable: Optional[bool] = None

    def to_config(self, env: Optional[Mapping[str, str]] = None) -> DumpConfig:
        """Validate and convert (raises ConfigError naming ``dump_config.<option>``)."""
        env = os.environ if env is None else env
        raw = dataclasses.asdict(self)
        kw = {name: spec.conv(raw[name], PREFIX + name) for name, spec in FIELDS.items()}
        enable = kw["enable_dump"]
        if kw["dump_config_path"] is not None:
            return self._from_file(kw["dump_config_path"], enable, env)
        layers = kw["dump_layer"]
        out = dict(input_output=kw["dump_mode"], saved_data=kw["dump_data"], enable=bool(enable))
        if kw["dump_step"] is not None:
            out["iteration"] = kw["dump_step"]
        if layers:
            out.update(dump_mode=1, kernels=layers)
        path = kw["dump_path"] or "."
        out["path"] = v.check_path(v.expand_env(path, PREFIX + "dump_path", env), PREFIX + "dump_path",
                                   relative_to=os.getcwd())
        out = apply_rules(out, NAMES)
        return DumpConfig(layout="acl", dialect="options", **out)

    def _from_file(self, path: str, enable: Optional[bool], env: Mapping[str, str]) -> DumpConfig:
        defaults = DumpOptions()
        for f in dataclasses.fields(self):
            if f.name not in ("enable_dump", "dump_config_path") and getattr(self, f.name) != getattr(defaults, f.name):
                raise ConfigError(PREFIX + f.name, getattr(self, f.name),
                                  "cannot be combined with dump_config.dump_config_path (the JSON file configures "
                                  "everything but enable_dump); drop one of them")
        config = load_config(os.path.abspath(path), env=env)
        return config if enable is not False else config.replace(enable=False)


def from_options(env: Optional[Mapping[str, str]] = None, **options: Any) -> DumpConfig:
    """``from_options(enable_dump=True, dump_path="/d", dump_step="0|5", ...)`` -> DumpConfig."""
    known = [f.name for f in dataclasses.fields(DumpOptions)]
    v.check_keys(options, known, PREFIX)
    return DumpOptions(**options).to_config(env=env)
