"""``statistic.csv``: its columns and the statistic categories, as one plain table.

Why: the config validates ``statistic_category`` names against this table, the
statistics engine (:mod:`opdump.stats`) writes the columns it names, and the reader
reads them back by the same headers (docs/design.md, "Statistics columns").  Nothing
here computes anything; :mod:`opdump.stats.categories` binds each name to its host and
device computations.

::

    config name            column               kind      meaning
    ---------------------  -------------------  --------  ------------------------------------
    max                    Max Value            element   largest element; NaN if any NaN
    min                    Min Value            element   smallest element; NaN if any NaN
    avg                    Avg Value            computed  mean (float64 on host); NaN if a NaN
    count                  Count                count     number of elements
    negative zero count    Negative Zero Count  count     elements < 0 (-Inf included)
    positive zero count    Positive Zero Count  count     elements > 0 (+Inf included)
    nan count              NaN Count            count     NaN elements
    negative inf count     Negative Inf Count   count     -Inf elements
    positive inf count     Positive Inf Count   count     +Inf elements
    zero count             Zero Count           count     elements == 0 (+0.0 and -0.0)
    md5                    MD5                  text      MD5 of the raw bytes, original dtype
    l2norm                 L2Norm Value         computed  sqrt(sum of squares); NaN if a NaN
    finite max (opdump)    Finite Max Value     element   largest finite element, or empty
    finite min (opdump)    Finite Min Value     element   smallest finite element, or empty

"negative zero count" / "positive zero count" are MindSpore's names: they count
elements below / above zero, not signed zeros.  The kind decides the cell's text
(:mod:`opdump.stats.formatting`).

Guarantees: :data:`CATEGORIES` keeps the table's order; every column maps back to its
category's ``key`` through :data:`HEADER_KEYS` (which also knows the spellings other
writers use: ``Nan Count``, ``MD5 Value``, ``l2norm``).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Dict, Iterable, List, Tuple


@dataclass(frozen=True)
class Category:
    """One statistic category: its config name, ``statistic.csv`` column, value kind and the
    reader's column key."""

    name: str          # the statistic_category name in the config
    column: str        # the statistic.csv header
    kind: str          # "element" | "computed" | "count" | "text"
    key: str           # the column's name in the reader's tables
    extension: bool = False   # opdump's, not MindSpore's


TABLE: Tuple[Category, ...] = (
    Category("max", "Max Value", "element", "max"),
    Category("min", "Min Value", "element", "min"),
    Category("avg", "Avg Value", "computed", "avg"),
    Category("count", "Count", "count", "count"),
    Category("negative zero count", "Negative Zero Count", "count", "negative_zero_count"),
    Category("positive zero count", "Positive Zero Count", "count", "positive_zero_count"),
    Category("nan count", "NaN Count", "count", "nan_count"),
    Category("negative inf count", "Negative Inf Count", "count", "negative_inf_count"),
    Category("positive inf count", "Positive Inf Count", "count", "positive_inf_count"),
    Category("zero count", "Zero Count", "count", "zero_count"),
    Category("md5", "MD5", "text", "md5"),
    Category("l2norm", "L2Norm Value", "computed", "l2norm"),
    Category("finite max", "Finite Max Value", "element", "finite_max", extension=True),
    Category("finite min", "Finite Min Value", "element", "finite_min", extension=True),
)

#: name -> Category, in the table's order
CATEGORIES: Dict[str, Category] = {c.name: c for c in TABLE}
#: MindSpore's categories (its ALL_STATISTICS), in order
ALL_STATISTICS: Tuple[str, ...] = tuple(c.name for c in TABLE if not c.extension)
#: opdump's extensions beyond MindSpore's
EXTENSIONS: Tuple[str, ...] = tuple(c.name for c in TABLE if c.extension)
#: every name ``statistic_category`` accepts
VALID_STATISTICS: Tuple[str, ...] = ALL_STATISTICS + EXTENSIONS
DEFAULT_STATISTICS: Tuple[str, ...] = ("max", "min", "l2norm")

#: the per-tensor columns before the statistics (MindSpore's statistic.csv)
BASE_HEADER: Tuple[str, ...] = ("Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot",
                                "Data Size", "Data Type", "Shape")
#: base header -> the reader's column key (with other writers' spellings)
BASE_KEYS: Dict[str, str] = {
    "Op Type": "op_type", "Op Name": "op", "Task ID": "task_id", "Stream ID": "stream_id",
    "Timestamp": "timestamp", "IO": "io", "Input/Output": "io", "Slot": "slot",
    "Data Size": "data_size", "Data Type": "dtype", "Format": "format", "Shape": "shape",
}
#: statistic header -> the reader's column key (with other writers' spellings)
HEADER_KEYS: Dict[str, str] = {
    **{c.column: c.key for c in TABLE},
    "Nan Count": "nan_count", "MD5 Value": "md5", "l2norm": "l2norm",
}
#: the reader's numeric statistic keys, in table order
NUMERIC_KEYS: List[str] = [c.key for c in TABLE if c.kind != "text"]


def lookup(name: str) -> Category:
    """The category called ``name``; ValueError naming the closest one otherwise."""
    try:
        return CATEGORIES[name]
    except KeyError:
        near = difflib.get_close_matches(str(name), list(CATEGORIES), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"unknown statistic category {name!r}{hint}; "
                         f"known: {', '.join(CATEGORIES)}") from None


def statistic_columns(categories: Iterable[str]) -> List[str]:
    return [lookup(c).column for c in categories]


def statistic_header(categories: Iterable[str]) -> List[str]:
    """The statistic.csv header for ``categories`` (config order)."""
    return [*BASE_HEADER, *statistic_columns(categories)]
