"""Tensor statistics for ``statistic.csv`` (README "Statistics").

* :mod:`~opdump.stats.categories`: the table of categories (config name,
  column, kind, host reducer, device function) and the CSV header;
* :mod:`~opdump.stats.host`: numpy statistics of a CPU copy (background threads);
* :mod:`~opdump.stats.device`: torch statistics on the tensor's device, batched,
  one sync per device (:mod:`~opdump.stats.memory`: which memory a tensor reads;
  :mod:`~opdump.stats.reductions`: the torch kernels per category);
* :mod:`~opdump.stats.native`: the only door to opdump's C++ module (one-pass CPU
  statistics, their memo, statistic.csv rows and cell text), built at set-up time,
  checked against :mod:`~opdump.stats.contract` at load, with a Python twin for each part;
* :mod:`~opdump.stats.engine`: host/device split per category and row assembly;
* :mod:`~opdump.stats.formatting`: how numbers and shapes are written.
"""
from .categories import (BASE_HEADER, CATEGORIES, EXTENSIONS, Category, lookup,
                         statistic_columns, statistic_header)
from .device import DeviceStatsBatch
from .engine import StatsEngine
from .formatting import format_shape
from .host import host_statistics

__all__ = [
    "BASE_HEADER", "CATEGORIES", "EXTENSIONS", "Category", "DeviceStatsBatch", "StatsEngine",
    "format_shape", "host_statistics", "lookup", "statistic_columns", "statistic_header",
]
