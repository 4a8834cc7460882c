"""Each statistic category bound to its computations.

The names, ``statistic.csv`` columns and value kinds are :mod:`opdump.format.statistics`
(the one table, docs/design.md "Statistics columns"); this module only adds, per
category, the host reducer (:data:`opdump.stats.host.REDUCERS`) and the device function
(:mod:`opdump.stats.reductions`, None when the category needs the host: ``md5``).
Neither of those imports this module: the import graph has no cycle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

from ..format import statistics as _fmt
from ..format.statistics import BASE_HEADER, EXTENSIONS, statistic_columns, statistic_header
from . import host as _h
from . import reductions as _d

__all__ = ["Category", "CATEGORIES", "BASE_HEADER", "EXTENSIONS", "lookup", "statistic_columns",
           "statistic_header", "device_capable"]

_DEVICE = {
    "max": _d.d_max, "min": _d.d_min, "avg": _d.d_avg, "count": _d.d_count,
    "negative zero count": _d.d_negative_count, "positive zero count": _d.d_positive_count,
    "nan count": _d.d_nan_count, "negative inf count": _d.d_neg_inf_count,
    "positive inf count": _d.d_pos_inf_count, "zero count": _d.d_zero_count,
    "l2norm": _d.d_l2norm, "finite max": _d.d_finite_max, "finite min": _d.d_finite_min,
}


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


#: name -> Category, in the format table's order (every name of the table is bound)
CATEGORIES: Dict[str, Category] = {
    c.name: Category(c.name, c.column, c.kind, _h.REDUCERS[c.name], _DEVICE.get(c.name)) for c in _fmt.TABLE
}


def lookup(name: str) -> Category:
    """The category called ``name``; ValueError naming the closest one otherwise."""
    return CATEGORIES[_fmt.lookup(name).name]


def device_capable(name: str) -> bool:
    return lookup(name).device_capable
