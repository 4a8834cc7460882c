"""The statistic categories: one table row per ``statistic_category`` name.

Each row gives the ``statistic.csv`` column, the kind of value (which decides
its formatting, see :mod:`opdump.stats.formatting`), the host reducer
(:mod:`opdump.stats.host`) and the device function (:mod:`opdump.stats.device`,
None when the category needs the host).  Nothing else in opdump keeps a
per-category list::

    config name               column                 meaning                               device
    ------------------------  ---------------------  ------------------------------------  ------
    max                       Max Value              largest element; NaN if any NaN       yes
    min                       Min Value              smallest element; NaN if any NaN      yes
    avg                       Avg Value              mean (float64 on host); NaN if a NaN  yes
    count                     Count                  number of elements                    yes
    negative zero count       Negative Zero Count    elements < 0 (-Inf included)          yes
    positive zero count       Positive Zero Count    elements > 0 (+Inf included)          yes
    nan count                 NaN Count              NaN elements                          yes
    negative inf count        Negative Inf Count     -Inf elements                         yes
    positive inf count        Positive Inf Count     +Inf elements                         yes
    zero count                Zero Count             elements == 0 (+0.0 and -0.0)         yes
    md5                       MD5                    MD5 of the raw bytes, original dtype  no
    l2norm                    L2Norm Value           sqrt(sum of squares); NaN if a NaN    yes
    finite max (opdump)       Finite Max Value       largest finite element, or empty      yes
    finite min (opdump)       Finite Min Value       smallest finite element, or empty     yes

The names "negative zero count" / "positive zero count" are MindSpore's: they
count elements below / above zero, not signed zeros.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional

from . import device as _d
from . import host as _h

#: the per-tensor columns before the statistics (MindSpore's statistic.csv)
BASE_HEADER = ("Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot",
               "Data Size", "Data Type", "Shape")


@dataclass(frozen=True)
class Category:
    name: str                       # the statistic_category name in the config
    column: str                     # the statistic.csv column
    kind: str                       # "element" | "computed" | "count" | "text"
    host: _h.Reducer                # host computation
    device: Optional[Callable]      # device computation, None: host only

    @property
    def device_capable(self) -> bool:
        return self.device is not None


_TABLE = (
    Category("max", "Max Value", "element", _h.MAX, _d.d_max),
    Category("min", "Min Value", "element", _h.MIN, _d.d_min),
    Category("avg", "Avg Value", "computed", _h.AVG, _d.d_avg),
    Category("count", "Count", "count", _h.COUNT, _d.d_count),
    Category("negative zero count", "Negative Zero Count", "count", _h.NEGATIVE_COUNT, _d.d_negative_count),
    Category("positive zero count", "Positive Zero Count", "count", _h.POSITIVE_COUNT, _d.d_positive_count),
    Category("nan count", "NaN Count", "count", _h.NAN_COUNT, _d.d_nan_count),
    Category("negative inf count", "Negative Inf Count", "count", _h.NEG_INF_COUNT, _d.d_neg_inf_count),
    Category("positive inf count", "Positive Inf Count", "count", _h.POS_INF_COUNT, _d.d_pos_inf_count),
    Category("zero count", "Zero Count", "count", _h.ZERO_COUNT, _d.d_zero_count),
    Category("md5", "MD5", "text", _h.MD5, None),
    Category("l2norm", "L2Norm Value", "computed", _h.L2NORM, _d.d_l2norm),
    Category("finite max", "Finite Max Value", "element", _h.FINITE_MAX, _d.d_finite_max),
    Category("finite min", "Finite Min Value", "element", _h.FINITE_MIN, _d.d_finite_min),
)

#: name -> Category, in the table's order
CATEGORIES: Dict[str, Category] = {c.name: c for c in _TABLE}
#: opdump's extensions beyond MindSpore's ALL_STATISTICS
EXTENSIONS = ("finite max", "finite min")


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


def device_capable(name: str) -> bool:
    return lookup(name).device_capable
