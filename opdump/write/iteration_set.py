"""The dumped iterations of a session as ranges, kept up to date as iterations are added.

Why: ``manifest.json`` says which iterations were dumped (``"0-2|5"``, the config's
``iteration`` syntax) and is rewritten at every iteration end.  Rebuilding that text from
a set of every iteration so far (sort, then scan) costs O(n log n) per iteration: 2 ms per
step after 10 000 steps, 20 ms after 100 000 -- an every-step dump (the overflow watch)
slowed down the longer it ran.  Here an iteration added at or after the last one (the
usual case) extends or opens the last range in O(1), and the text is built from the
ranges, stopping once it is long enough to be cut.

Guarantee: :meth:`IterationSet.text` is exactly
:func:`opdump.write.manifest.iteration_ranges` of the same iterations (the same
1024-character cut); ``len()`` is how many distinct iterations were added.
"""
from __future__ import annotations

import bisect
from typing import List, Optional

#: the manifest keeps its page: a longer text is cut at 1000 characters (manifest.iteration_ranges)
_LIMIT, _CUT = 1024, 1000


class IterationSet:
    """Distinct iteration numbers as sorted, disjoint, non-adjacent ``[first, last]`` ranges."""

    __slots__ = ("_firsts", "_lasts", "_count", "_text")

    def __init__(self) -> None:
        self._firsts: List[int] = []
        self._lasts: List[int] = []
        self._count = 0
        self._text: Optional[str] = ""

    def __len__(self) -> int:
        return self._count

    def __contains__(self, iteration: int) -> bool:
        k = bisect.bisect_right(self._firsts, iteration) - 1
        return k >= 0 and iteration <= self._lasts[k]

    def add(self, iteration: int) -> None:
        i = int(iteration)
        firsts, lasts = self._firsts, self._lasts
        if firsts and i >= firsts[-1]:          # at or after the last range's start: O(1)
            if i <= lasts[-1]:
                return
            self._count += 1
            self._text = None
            if i == lasts[-1] + 1:
                lasts[-1] = i
            else:
                firsts.append(i)
                lasts.append(i)
            return
        if i in self:
            return
        self._count += 1
        self._text = None
        k = bisect.bisect_left(firsts, i)         # the range after i (if any) starts at firsts[k] > i
        joins_before = k > 0 and lasts[k - 1] == i - 1
        joins_after = k < len(firsts) and firsts[k] == i + 1
        if joins_before and joins_after:
            lasts[k - 1] = lasts[k]
            del firsts[k], lasts[k]
        elif joins_before:
            lasts[k - 1] = i
        elif joins_after:
            firsts[k] = i
        else:
            firsts.insert(k, i)
            lasts.insert(k, i)

    def text(self) -> str:
        """``"0-2|5"``; over 1024 characters: cut at the last whole range within the first
        1000, then ``"|…"`` (as ``iteration_ranges``).  Built only when the set changed."""
        if self._text is None:
            parts, n = [], -1
            for a, b in zip(self._firsts, self._lasts):
                part = str(a) if a == b else f"{a}-{b}"
                parts.append(part)
                n += len(part) + 1
                if n > _LIMIT:              # the cut only looks at the first 1000 characters
                    break
            text = "|".join(parts)
            if len(text) > _LIMIT:
                text = text[:_CUT].rsplit("|", 1)[0] + "|…"
            self._text = text
        return self._text
