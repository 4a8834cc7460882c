"""The three forms of a ``kernels`` entry (README, "Config reference": ``kernels``).

* ``name-regex(<re>)``: the regex must match the whole full name (``re.fullmatch``);
* a full name (contains ``/``) or a name with an ``-op<N>`` id: exact match of the
  full name, or of the ``<OpType>-op<N>`` tail when the entry has no scope;
* otherwise an operator *type*: case-insensitive substring of the op type.

Parameters (and lifted constants) are named by the same entries, as a
MindSpore dump with a ``kernels`` filter writes only the ``Parameter`` files it
names: a type entry that is a substring of ``Parameter`` (``"Parameter"``)
takes them all; a ``name-regex`` that matches the whole parameter name, as
given (``fc1.weight``) or as in its file name (``fc1_weight``), takes that
parameter; so does any entry equal to one of those names or to
``Parameter.<file name form>``.

The matcher remembers which entries matched anything, so a run can warn about
entries that matched nothing (usually a typo).
"""
from __future__ import annotations

import re
from typing import List, Sequence, Set

_REGEX = re.compile(r"^name-regex\((.*)\)$", re.S)
_OP_ID = re.compile(r"-op\d+$")
_SEPARATORS = re.compile(r"[./\\ ]")        # what a parameter name's file form replaces by "_"


class KernelMatcher:
    def __init__(self, entries: Sequence[str]):
        self.entries = list(entries)
        self._regex = []
        self._exact = []
        self._types = []
        for i, entry in enumerate(self.entries):
            m = _REGEX.match(entry)
            if m:
                self._regex.append((i, re.compile(m.group(1))))
            elif "/" in entry or _OP_ID.search(entry):
                self._exact.append((i, entry))
            else:
                self._types.append((i, entry.lower()))
        self.used: Set[int] = set()

    def matches(self, full_name: str, op_type: str) -> bool:
        hit = False
        tail = full_name.rsplit("/", 1)[-1]
        for i, entry in self._exact:
            if entry == full_name or ("/" not in entry and entry == tail):
                self.used.add(i)
                hit = True
        for i, pattern in self._regex:
            if pattern.fullmatch(full_name):
                self.used.add(i)
                hit = True
        lowered = op_type.lower()
        for i, needle in self._types:
            if needle in lowered:
                self.used.add(i)
                hit = True
        return hit

    def matches_parameter(self, name: str) -> bool:
        """Does an entry name the parameter (or constant) ``name``? (see the module docstring)"""
        file_form = _SEPARATORS.sub("_", name)
        names = (name, file_form, f"Parameter.{file_form}")
        hit = False
        for i, entry in enumerate(self.entries):
            if entry in names:
                self.used.add(i)
                hit = True
        for i, pattern in self._regex:
            if pattern.fullmatch(name) or pattern.fullmatch(file_form):
                self.used.add(i)
                hit = True
        for i, needle in self._types:
            if needle in "parameter":
                self.used.add(i)
                hit = True
        return hit

    def unused(self) -> List[str]:
        return [e for i, e in enumerate(self.entries) if i not in self.used]
