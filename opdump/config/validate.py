"""Field converters and checks shared by every dialect.

Each dialect describes its fields as a table ``json name -> Field(converter,
attr)``; :func:`apply_table` walks it, so adding a field is one table line.  A
converter takes ``(value, dotted_field_name)`` and returns the value to store in
:class:`~opdump.config.model.DumpConfig` or raises :class:`ConfigError`; file
names are attached by the loader, so nothing here needs to know the file.
"""
from __future__ import annotations

import difflib
import os
import re
import string
from typing import Any, Callable, Dict, Iterable, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..format.statistics import VALID_STATISTICS
from .errors import ConfigError

Converter = Callable[[Any, str], Any]

#: the largest integer a config field takes (int64, as MindSpore's parser)
INT64_MAX = 2 ** 63 - 1

#: Characters allowed in a dump path: MindSpore's set (letters, digits, ``-``, ``_``, ``/``) plus ``.``.
PATH_CHARS = frozenset(string.ascii_letters + string.digits + "_-./")
PATH_CHARS_TEXT = "letters, digits, '_', '-', '.' and '/'"
NET_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-.")
NET_NAME_CHARS_TEXT = "letters, digits, '_', '-' and '.'"

DIAGNOSTIC_ENV = ("OPDUMP_DIAGNOSTIC_DATA_PATH", "MS_DIAGNOSTIC_DATA_PATH")
REGEX_PREFIX, REGEX_SUFFIX = "name-regex(", ")"


#: a :class:`Field`'s ``attr`` for a field that is checked but not kept (no DumpConfig attribute
#: reads it: the feature it configures is refused, e.g. ``overflow_number``, ``sample_num``)
CHECK_ONLY = "-"


class Field(NamedTuple):
    """One config field: how to convert it and which DumpConfig attribute gets it."""

    conv: Converter
    attr: Optional[str] = None          # None: same name as the JSON key; CHECK_ONLY: not kept


# ---------------------------------------------------------------- generic helpers
def quoted(names: Iterable[Any]) -> str:
    """``"a", "b" or "c"`` — how allowed values are listed in messages."""
    shown = [f'"{n}"' if isinstance(n, str) else str(n) for n in names]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


def suggest(name: str, known: Sequence[str]) -> str:
    """The unknown-name message: the nearest known name (difflib) and the full list."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f'did you mean "{close[0]}"? ' if close else ""
    return f"unknown field; {hint}known: {', '.join(known)}"


def check_keys(obj: Mapping[str, Any], known: Sequence[str], prefix: str) -> None:
    """Reject the first key of ``obj`` that is not in ``known``, suggesting the nearest."""
    for key, value in obj.items():
        if key not in known:
            raise ConfigError(f"{prefix}{key}", value, suggest(key, known))


def expect_dict(value: Any, field: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(field, value, "must be a JSON object {...}")
    return value


def apply_table(section: Mapping[str, Any], table: Mapping[str, Field], prefix: str) -> Dict[str, Any]:
    """Check ``section``'s keys against ``table`` and convert each present field."""
    check_keys(section, list(table), prefix)
    out: Dict[str, Any] = {}
    for key, spec in table.items():
        if key in section:
            value = spec.conv(section[key], prefix + key)
            if spec.attr != CHECK_ONLY:
                out[spec.attr or key] = value
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------- converter factories
def integer(choices: Optional[Sequence[int]] = None, lo: Optional[int] = None, hi: Optional[int] = None) -> Converter:
    """An integer (never a bool, never a float) among ``choices`` or within ``lo..hi``."""
    if choices is not None:
        allowed = f"must be an integer {quoted(choices)}"
    elif hi is None:
        hi = INT64_MAX          # every count opdump keeps is an int64 (as MindSpore's)
        allowed = f"must be an integer >= {lo} (at most {INT64_MAX})"
    else:
        allowed = f"must be an integer from {lo} to {hi}"

    def conv(value: Any, field: str) -> int:
        ok = _is_int(value) and (value in choices if choices is not None else
                                 (lo is None or value >= lo) and (hi is None or value <= hi))
        if not ok:
            raise ConfigError(field, value, allowed)
        return value
    return conv


def boolean(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(field, value, "must be true or false (a JSON boolean)")
    return value


def choice(*options: str) -> Converter:
    """One string among ``options``."""
    def conv(value: Any, field: str) -> str:
        if not isinstance(value, str) or value not in options:
            raise ConfigError(field, value, f"must be {quoted(options)}")
        return value
    return conv


def mapped(mapping: Mapping[str, Any]) -> Converter:
    """One string among ``mapping``'s keys, stored as the mapped value."""
    inner = choice(*mapping)
    return lambda value, field: mapping[inner(value, field)]


def _list_of(value: Any, field: str, what: str) -> list:
    if not isinstance(value, list):
        raise ConfigError(field, value, f"must be a list of {what}")
    return value


def _no_duplicates(items: Sequence[Any], value: Any, field: str) -> None:
    seen = set()
    for item in items:
        if item in seen:
            raise ConfigError(field, value, f"lists {item!r} twice; each entry may appear once")
        seen.add(item)


def name_list(value: Any, field: str) -> Tuple[str, ...]:
    """A list of non-empty strings without duplicates (outer whitespace stripped)."""
    items = _list_of(value, field, "non-empty strings")
    out = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(field, value, f"entry {item!r} is not a non-empty string")
        out.append(item.strip())
    _no_duplicates(out, value, field)
    return tuple(out)


def device_list(value: Any, field: str) -> Tuple[int, ...]:
    items = _list_of(value, field, "device ids (integers 0 to 4095)")
    for item in items:
        if not _is_int(item) or not 0 <= item <= 4095:
            raise ConfigError(field, value, f"entry {item!r} is not a device id (an integer from 0 to 4095)")
    _no_duplicates(items, value, field)
    return tuple(items)


def statistic_list(value: Any, field: str) -> Tuple[str, ...]:
    valid = quoted(VALID_STATISTICS)
    items = _list_of(value, field, f"statistic names: {valid}")
    if not items:
        raise ConfigError(field, value, f"must name at least one statistic: {valid}")
    for item in items:
        if item not in VALID_STATISTICS:
            raise ConfigError(field, value, f"{item!r} is not a statistic; valid: {valid}")
    _no_duplicates(items, value, field)
    return tuple(items)


def kernel_list(value: Any, field: str) -> Tuple[str, ...]:
    """``kernels``: names, types or ``name-regex(<re>)`` entries; each regex must compile."""
    kernels = name_list(value, field)
    for kernel in kernels:
        if kernel.startswith(REGEX_PREFIX) and kernel.endswith(REGEX_SUFFIX):
            pattern = kernel[len(REGEX_PREFIX):-len(REGEX_SUFFIX)]
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(field, value, f"{kernel!r}: invalid regular expression: {exc}") from None
    return kernels


def net_name(value: Any, field: str) -> str:
    """A single directory name: non-empty, safe characters, not ``.``/``..``."""
    if not isinstance(value, str) or not value:
        raise ConfigError(field, value, f"must be a non-empty string of {NET_NAME_CHARS_TEXT}")
    bad = next((c for c in value if c not in NET_NAME_CHARS), None)
    if bad is not None:
        raise ConfigError(field, value, f"character {bad!r} is not allowed; use only {NET_NAME_CHARS_TEXT}")
    if set(value) == {"."}:
        raise ConfigError(field, value, "must name a directory, not '.' or '..'")
    return value


def path_string(value: Any, field: str) -> str:
    """The raw ``path`` field: a string (possibly empty: then the diagnostic env var applies)."""
    if not isinstance(value, str):
        raise ConfigError(field, value, f"must be a string: an absolute path of {PATH_CHARS_TEXT}")
    return value


# ---------------------------------------------------------------- paths
def check_path(path: str, field: str, *, relative_to: Optional[str] = None) -> str:
    """Validate a dump root and return it normalised.

    Relative paths are an error unless ``relative_to`` is given (the ACL and
    options dialects, whose toolchains allow paths relative to the working directory).
    """
    bad = next((c for c in path if c not in PATH_CHARS), None)
    if bad is not None:
        raise ConfigError(field, path, f"character {bad!r} is not allowed in a dump path; use only {PATH_CHARS_TEXT}")
    if not path.startswith("/"):
        if relative_to is None:
            raise ConfigError(field, path, "must be an absolute path (starting with '/')")
        path = os.path.join(relative_to, path)
    return os.path.normpath(path)


def diagnostic_path(field: str, env: Mapping[str, str]) -> str:
    """The dump root when ``path`` is missing or empty: ``$OPDUMP_DIAGNOSTIC_DATA_PATH/debug_dump``."""
    for var in DIAGNOSTIC_ENV:
        base = env.get(var, "")
        if base:
            return check_path(os.path.join(base, "debug_dump"), var)
    raise ConfigError(field, "", f"is missing or empty, and neither {DIAGNOSTIC_ENV[0]} nor {DIAGNOSTIC_ENV[1]} "
                      "is set; give an absolute path or set one of them")


_ENV_REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand_env(path: str, field: str, env: Mapping[str, str]) -> str:
    """Expand ``$VAR`` / ``${VAR}`` from ``env`` (torchair configs write ``"$HOME/output"``)."""
    def sub(match: "re.Match[str]") -> str:
        var = match.group(1) or match.group(2)
        if var not in env:
            raise ConfigError(field, path, f"refers to ${var}, which is not set in the environment")
        return env[var]
    return _ENV_REF.sub(sub, path)
