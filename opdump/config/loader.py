"""Find, read and dispatch a config file to its dialect.

``load_config`` reads the file once and keeps its bytes (the writer copies them
byte-identical to ``.dump_metadata/data_dump.json``); ``load_config_dict`` does
the dialect detection and validation for an already-parsed object.  Every
failure is one :class:`ConfigError` naming the file — hostile input included: nesting
deeper than :data:`MAX_DEPTH`, numbers past Python's digit limit, bytes that are not
UTF-8 (tested by tests/test_config_fuzz.py with random JSON and mutated configs).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from . import validate as v
from .acl import parse_acl
from .errors import ConfigError
from .mindspore import OPDUMP, SECTIONS, parse_mindspore, parse_opdump_settings
from .model import DumpConfig

__all__ = ["load_config", "load_config_dict", "CONFIG_ENV"]

CONFIG_ENV = ("OPDUMP_CONFIG", "MINDSPORE_DUMP_CONFIG")
#: how deep a config file's arrays/objects may nest (opdump's own need 3 levels)
MAX_DEPTH = 32
INT64 = 2 ** 63
SHAPES = ('a MindSpore config {"common_dump_settings": {...}, "e2e_dump_settings": {...}} '
          'or an ACL/torchair config {"dump": {...}}')


def load_config(path: Optional[str] = None, *, env: Optional[Mapping[str, str]] = None) -> DumpConfig:
    """Load and validate the config at ``path`` (default: ``$OPDUMP_CONFIG``, alias ``$MINDSPORE_DUMP_CONFIG``)."""
    env = os.environ if env is None else env
    field = "config file"
    if path is None:
        field, path = _config_from_env(env)
    file = os.path.abspath(path)
    try:
        with open(file, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise ConfigError(field, path, "no such file", file) from None
    except IsADirectoryError:
        raise ConfigError(field, path, "is a directory, not a JSON file", file) from None
    except OSError as exc:
        raise ConfigError(field, path, f"cannot be read: {exc.strerror or exc}", file) from None
    data = _parse_json(raw, file)
    return load_config_dict(data, file=file, env=env).replace(source_bytes=raw)


def load_config_dict(data: Any, *, file: Optional[str] = None,
                     env: Optional[Mapping[str, str]] = None) -> DumpConfig:
    """Validate an already-parsed config object of either JSON dialect."""
    env = os.environ if env is None else env
    try:
        _check_bounds(data)
        config = _dispatch(data, env)
    except ConfigError as err:
        raise err.with_file(file) from None
    return config.replace(source_file=file)


def _config_from_env(env: Mapping[str, str]) -> Tuple[str, str]:
    for var in CONFIG_ENV:
        if env.get(var):
            return var, env[var]
    raise ConfigError(CONFIG_ENV[0], "<not set>", f"set {CONFIG_ENV[0]} (or its alias {CONFIG_ENV[1]}) to the "
                      "path of the dump config JSON, or pass the path explicitly")


def _parse_json(raw: bytes, file: str) -> Any:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError("(file)", f"<byte {exc.start}>", "is not UTF-8 text; a config is a UTF-8 JSON file",
                          file) from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ConfigError("(json)", f"<line {exc.lineno}, column {exc.colno}>", f"invalid JSON: {exc.msg}",
                          file) from None
    except ConfigError as err:                 # a duplicate key
        raise err.with_file(file) from None
    except RecursionError:
        raise ConfigError("(json)", "<nesting>", f"is nested too deeply; a config is at most {MAX_DEPTH} levels "
                          "deep", file) from None
    except ValueError as exc:                  # e.g. a number past Python's 4300-digit conversion limit
        raise ConfigError("(json)", "<a number>", f"cannot be read ({exc}); config numbers are small integers",
                          file) from None
    return data


def _check_bounds(data: Any) -> None:
    """No array/object nested deeper than :data:`MAX_DEPTH`, no integer beyond int64, anywhere:
    checked iteratively before any validator (whose messages show values) sees them."""
    stack = [(data, "(top level)", 1)]
    while stack:
        value, field, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ConfigError(field, "<nesting>", f"is nested too deeply; a config is at most {MAX_DEPTH} "
                                  "levels deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                name = (f"{field}[{key}]" if isinstance(value, list) else
                        str(key) if field == "(top level)" else f"{field}.{key}")
                stack.append((item, name, depth + 1))
        elif isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
            raise ConfigError(field, value, f"is beyond any config number (int64: at most {INT64 - 1})")


def _no_duplicate_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(key, value, "appears twice in the same JSON object; keep one")
        out[key] = value
    return out


def _dispatch(data: Any, env: Mapping[str, str]) -> DumpConfig:
    """Detect the dialect from the top-level keys."""
    if not isinstance(data, dict):
        raise ConfigError("(top level)", data, f"must be a JSON object: {SHAPES}")
    if "dump" in data:
        v.check_keys(data, ["dump", OPDUMP], "")
        extra = parse_opdump_settings(data[OPDUMP]) if OPDUMP in data else {}
        return parse_acl(data["dump"], env, extra)
    known = list(SECTIONS) + ["dump"]
    if any(key in SECTIONS for key in data):
        return parse_mindspore(data, env)
    for key, value in data.items():
        if v.suggest(key, known).startswith("unknown field; did you mean"):
            raise ConfigError(key, value, v.suggest(key, known))
    keys = [json.dumps(k) for k in list(data)[:8]] + (["..."] if len(data) > 8 else [])
    shown = "{}" if not data else "{" + ", ".join(f"{k}: ..." for k in keys) + "}"
    raise ConfigError("(top level)", f"<{shown}>", f"unrecognised config; expected {SHAPES}")
