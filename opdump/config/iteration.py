"""Parse iteration selections (``"all"`` or ``"0 | 5-8 | 100-120"``) into an :class:`IterationSpec`.

One grammar serves MindSpore ``iteration``, ACL ``dump_step`` and the options
object's ``dump_step``, so every dialect accepts and rejects the same strings.
Tokens are separated by ``|``; each is ``N`` or an inclusive range ``A-B`` of
non-negative 0-based integers up to :data:`MAX_ITERATION`; whitespace around tokens (and around the dash of
a range) is allowed.  Overlapping or adjacent ranges are merged, so two spellings
of the same set give equal specs and ``str(spec)`` parses back to ``spec``.
"""
from __future__ import annotations

import re
from typing import List, Tuple

from .errors import ConfigError
from .model import IterationSpec

ALLOWED_TEXT = "digits, '-', '|', spaces, or the word all"
_ALLOWED_CHARS = re.compile(r"[0-9|\- \t]*")
_NUMBER = re.compile(r"[0-9]+")
#: the largest iteration number (int64, as MindSpore's)
MAX_ITERATION = 2 ** 63 - 1


def parse_iteration(text: object, field: str = "iteration") -> IterationSpec:
    """Parse ``text``; raise :class:`ConfigError` naming ``field`` on the first problem."""
    if not isinstance(text, str):
        raise ConfigError(field, text, f'must be a string of {ALLOWED_TEXT}, e.g. "0|5-8|100-120" or "all"')
    stripped = text.strip()
    if stripped == "all":
        return IterationSpec(all=True)
    if not stripped:
        raise ConfigError(field, text, f'is empty; use "all" or {ALLOWED_TEXT}')
    if not _ALLOWED_CHARS.fullmatch(text):
        bad = next(c for c in text if not _ALLOWED_CHARS.fullmatch(c))
        raise ConfigError(field, text, f"character {bad!r} is not allowed; use {ALLOWED_TEXT}")
    tokens = text.split("|")
    ranges: List[Tuple[int, int]] = []
    for token in tokens:
        ranges.append(_parse_token(token.strip(), text, field, several=len(tokens) > 1))
    return IterationSpec(all=False, ranges=merge_ranges(ranges))


def _parse_token(token: str, text: str, field: str, several: bool) -> Tuple[int, int]:
    where = f' in token "{token}"' if several else ""
    if not token:
        raise ConfigError(field, text, f"has an empty token (two '|' in a row, or '|' at an end); use {ALLOWED_TEXT}")
    if token.startswith("-"):
        raise ConfigError(field, text, f"iterations are non-negative (0-based){where}; a range is written A-B")
    parts = [p.strip() for p in token.split("-")]
    if len(parts) > 2:
        raise ConfigError(field, text, f"a range has exactly one '-' (A-B){where}")
    for part in parts:
        if not _NUMBER.fullmatch(part):
            what = "a range needs numbers on both sides of '-'" if len(parts) == 2 else "expected a number"
            raise ConfigError(field, text, f"{what}{where}")
    for part in parts:
        digits = part.lstrip("0") or "0"       # int() refuses over 4300 characters, zeros included
        if len(digits) > len(str(MAX_ITERATION)) or int(digits) > MAX_ITERATION:
            raise ConfigError(field, text, f"iteration numbers go up to {MAX_ITERATION} (int64){where}")
    lo, hi = int(parts[0].lstrip("0") or "0"), int(parts[-1].lstrip("0") or "0")
    if lo > hi:
        raise ConfigError(field, text, f"range start {lo} is after end {hi}{where}")
    return lo, hi


def merge_ranges(ranges: List[Tuple[int, int]]) -> Tuple[Tuple[int, int], ...]:
    """Sort inclusive ranges and merge the overlapping or adjacent ones."""
    merged: List[List[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((lo, hi) for lo, hi in merged)
