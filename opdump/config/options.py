"""The options-object dialect (the TF adapter's ``npu_device`` dump_config and torchair's ``dump_config``; README "Other dialects").

``DumpOptions`` mirrors those attributes so a script written for the TF adapter
or torchair ports by changing the import.  ``dump_config_path`` loads that JSON
file (any dialect) instead, as torchair recommends; set together with any other dump
option it "does not take effect" (torchair's words): it is ignored with a warning naming
that option, and the options are used (so torchair's own example, which sets both, runs).
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
from .warn import warn_config

PREFIX = "dump_config."
#: whose options object: the TF adapter's (``npu_device.global_options().dump_config``) or
#: torchair's (``CompilerConfig().dump_config``, which adds ``worldsize{N}_global_rank{r}/``)
FLAVORS = ("tf_adapter", "torchair")


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
    "file_format": v.Field(lambda value, field: None if value is None else v.choice("bin", "npy")(value, field)),
    "flavor": v.Field(v.choice(*FLAVORS)),
}

NAMES = {"input_output": PREFIX + "dump_mode", "saved_data": PREFIX + "dump_data",
         "iteration": PREFIX + "dump_step", "kernels": PREFIX + "dump_layer",
         "file_format": PREFIX + "file_format"}


@dataclass
class DumpOptions:
    """The TF adapter's and torchair's ``dump_config`` options; every field optional.

    ``enable_dump`` None means: on when ``dump_config_path`` is given, else off.
    ``dump_path`` None is the working directory (as in torchair); relative paths are
    relative to it.  ``quant_dumpable`` is accepted and ignored (PyTorch has no
    pre-quantisation graph to dump).  ``file_format`` (opdump's extension): "bin" (the
    Ascend DumpData file, the default with tensors) or "npy"; None: "bin", or "npy" with
    ``dump_data`` "stats".  ``flavor``: "tf_adapter" (the default) or "torchair" (then the
    dump goes below ``worldsize{N}_global_rank{r}/``, as torchair writes it; not with
    ``dump_config_path``).  The dump path must exist and be writable when the session starts.
    """

    enable_dump: Optional[bool] = None
    dump_path: Optional[str] = None
    dump_step: Optional[str] = None            # None: every iteration
    dump_mode: str = "output"                  # input | output | all
    dump_data: str = "tensor"                  # tensor | stats
    dump_layer: Optional[str] = None           # operator names separated by spaces
    dump_config_path: Optional[str] = None
    quant_dumpable: Optional[bool] = None
    file_format: Optional[str] = None          # bin | npy (opdump's extension)
    flavor: str = "tf_adapter"                 # tf_adapter | torchair

    def to_config(self, env: Optional[Mapping[str, str]] = None) -> DumpConfig:
        """Validate and convert (raises ConfigError naming ``dump_config.<option>``)."""
        env = os.environ if env is None else env
        raw = dataclasses.asdict(self)
        kw = {name: spec.conv(raw[name], PREFIX + name) for name, spec in FIELDS.items()}
        enable = kw["enable_dump"]
        if kw["dump_config_path"] is not None:
            other = self._other_option_set()
            if other is None:
                return self._from_file(kw["dump_config_path"], enable, env)
            warn_config(f"opdump: {PREFIX}dump_config_path {kw['dump_config_path']!r} is ignored: "
                        f"{PREFIX}{other} is set too, and the JSON file does not take effect with other "
                        "dump options (as in torchair); the options are used")
        layers = kw["dump_layer"]
        out = dict(input_output=kw["dump_mode"], saved_data=kw["dump_data"], enable=bool(enable),
                   world_folder=kw["flavor"] == "torchair")
        out["file_format"] = kw["file_format"] or ("npy" if kw["dump_data"] == "statistic" else "bin")
        if kw["dump_step"] is not None:
            out["iteration"] = kw["dump_step"]
        if layers:
            out.update(dump_mode=1, kernels=layers)
        path = kw["dump_path"] or "."
        out["path"] = v.check_path(v.expand_env(path, PREFIX + "dump_path", env), PREFIX + "dump_path",
                                   relative_to=os.getcwd())
        out = apply_rules(out, NAMES)
        return DumpConfig(layout="acl", dialect="options", **out)

    def _other_option_set(self) -> Optional[str]:
        """The first dump option other than enable_dump/dump_config_path/flavor that is set."""
        defaults = DumpOptions()
        for f in dataclasses.fields(self):
            if f.name not in ("enable_dump", "dump_config_path", "flavor") and getattr(self, f.name) != getattr(defaults, f.name):
                return f.name
        return None

    def _from_file(self, path: str, enable: Optional[bool], env: Mapping[str, str]) -> DumpConfig:
        config = load_config(os.path.abspath(path), env=env)
        return config if enable is not False else config.replace(enable=False)


class CompilerConfig:
    """torchair's ``CompilerConfig()``, as far as dumping goes: ``config.dump_config`` is a
    :class:`DumpOptions` of the torchair flavor; ``config.dump_config.to_config()`` gives the
    DumpConfig for :class:`opdump.Session`."""

    def __init__(self) -> None:
        self.dump_config = DumpOptions(flavor="torchair")


class _GlobalOptions:
    def __init__(self) -> None:
        self.dump_config = DumpOptions(flavor="tf_adapter")


_GLOBAL: Optional[_GlobalOptions] = None


def global_options() -> _GlobalOptions:
    """The TF adapter's ``npu_device.global_options()``: one process-wide object whose
    ``dump_config`` is a :class:`DumpOptions` (so seed-style scripts set its attributes)."""
    global _GLOBAL
    if _GLOBAL is None:
        _GLOBAL = _GlobalOptions()
    return _GLOBAL


def from_options(env: Optional[Mapping[str, str]] = None, **options: Any) -> DumpConfig:
    """``from_options(enable_dump=True, dump_path="/d", dump_step="0|5", ...)`` -> DumpConfig."""
    known = [f.name for f in dataclasses.fields(DumpOptions)]
    v.check_keys(options, known, PREFIX)
    return DumpOptions(**options).to_config(env=env)
