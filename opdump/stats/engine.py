"""The statistics engine: decides, per category, host or device, and assembles rows.

* ``stat_calc_mode: "host"``: every category is computed on the host with the host
  mode's semantics (:mod:`opdump.stats.host`): all but ``md5`` when the tensor is
  recorded, from the tensor itself (:class:`~opdump.stats.host_batch.HostStatsBatch`: the
  native single pass for CPU tensors, numpy otherwise; no copy), through the same batch
  interface as device mode (:meth:`StatsEngine.device_launch` … the names are the
  batch's); ``md5`` from the CPU copy the capture side makes (:meth:`StatsEngine.host_cells`).
* ``stat_calc_mode: "device"``: the device-capable categories (all but
  ``md5``) are launched on the tensor's device (:meth:`StatsEngine.device_launch`)
  and gathered with one copy per device (:meth:`StatsEngine.device_collect`);
  the others fall back to the host, and :meth:`StatsEngine.fallback_warning`
  names them once.  When nothing falls back, :attr:`StatsEngine.needs_host_copy`
  is False and the capture side must not copy tensors to the host for statistics.

Usage by the capture side::

    engine = StatsEngine(config)
    h = engine.device_launch(tensor)                 # no sync; None if nothing on device
    host = engine.host_cells(cpu_copy) if engine.needs_host_copy else None   # writer thread
    ...
    dev = engine.device_collect()                    # once per flush: one sync per device
    cells = engine.row_cells(None if h is None else dev[h], host)
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .categories import lookup, statistic_header
from . import native
from .device import PRECISIONS, DeviceStatsBatch
from .formatting import cell_formatter, format_cell, native_codes, native_precision
from .host import reduce_tensor
from .host_batch import HostStatsBatch

MODES = ("host", "device")


def host_categories(categories: Sequence[str], stat_calc_mode: str) -> Tuple[str, ...]:
    """The categories computed from a CPU copy of each tensor, in a writer thread: those that
    need the bytes (``md5``), in either mode (host mode computes the others when a tensor is
    recorded, from the tensor itself: :class:`~opdump.stats.host_batch.HostStatsBatch`)."""
    cats = [lookup(c) for c in categories]
    return tuple(c.name for c in cats if not c.device_capable)


class StatsEngine:
    def __init__(self, config=None, *, categories: Optional[Sequence[str]] = None,
                 stat_calc_mode: Optional[str] = None, precision: Optional[str] = None):
        """From a :class:`~opdump.config.model.DumpConfig`, or the three settings as keywords."""
        if categories is None:
            categories = config.statistic_category
        if stat_calc_mode is None:
            stat_calc_mode = config.stat_calc_mode if config is not None else "host"
        if precision is None:
            precision = config.device_stat_precision_mode if config is not None else "high"
        if stat_calc_mode not in MODES:
            raise ValueError(f"stat_calc_mode must be one of {MODES}, got {stat_calc_mode!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"device_stat_precision_mode must be one of {PRECISIONS}, got {precision!r}")
        cats = [lookup(c) for c in categories]
        self.categories = tuple(c.name for c in cats)
        self.mode = stat_calc_mode
        self.precision = precision
        self._cats = cats
        self.host_categories = host_categories(self.categories, stat_calc_mode)
        self.device_categories = tuple(c for c in self.categories if c not in self.host_categories)
        self._host_cats = [lookup(c) for c in self.host_categories]
        if not self.device_categories:
            self._batch = None
        elif stat_calc_mode == "host":
            self._batch = HostStatsBatch(self.device_categories)
        else:
            self._batch = DeviceStatsBatch(self.device_categories, precision)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ plan
    @property
    def needs_host_copy(self) -> bool:
        """True if some category is computed on the host (from a CPU copy of the tensor)."""
        return bool(self.host_categories)

    def header(self) -> List[str]:
        return statistic_header(self.categories)

    def fallback_warning(self) -> Optional[str]:
        """One message for the start of the run when device mode computes some categories on the host."""
        if self.mode != "device" or not self.host_categories:
            return None
        names = ", ".join(repr(c) for c in self.host_categories)
        return (f"stat_calc_mode 'device': statistic categor{'y' if len(self.host_categories) == 1 else 'ies'} "
                f"{names} cannot be computed on the device and will be computed on the host "
                f"(every dumped tensor is copied to the host for them)")

    # ------------------------------------------------------------------ device
    def device_launch(self, tensor: torch.Tensor) -> Optional[int]:
        """Launch the device statistics of ``tensor`` (no sync); a handle for :meth:`device_collect`."""
        if self._batch is None:
            return None
        with self._lock:
            return self._batch.add(tensor)

    def device_adder(self) -> Optional[Callable[[torch.Tensor], int]]:
        """:meth:`device_launch` without this engine's lock, for a caller that serialises
        every call into the engine under a lock of its own (the recorder's fast path)."""
        return self._batch.add if self._batch is not None else None

    def device_row_sink(self):
        """The batch's native row recorder (see :meth:`DeviceStatsBatch.row_sink`), or None; like
        :meth:`device_adder`, for a caller that holds a lock of its own around every call."""
        return self._batch.row_sink() if self._batch is not None else None

    def device_forget(self, tensor: torch.Tensor) -> None:
        """``tensor`` is being written in place: later tensors on its memory are computed anew."""
        if self._batch is not None:
            with self._lock:
                self._batch.forget(tensor)

    def device_settle(self, tensor: torch.Tensor) -> None:
        """The operator that wrote ``tensor`` (and whose output it was) has returned: see
        :meth:`DeviceStatsBatch.settle`."""
        if self._batch is not None:
            with self._lock:
                self._batch.settle(tensor)

    def device_collect(self) -> List[Dict[str, str]]:
        """Formatted device cells (``{category: cell}``) of every launched tensor, indexed by handle.

        One synchronisation per device; the handles are reset afterwards.
        """
        return self.device_gather().cells()

    def device_gather(self) -> "DeviceCells":
        """The sync half of :meth:`device_collect`: values brought to the host, handles reset.

        The formatting (Python work per tensor) is left to :meth:`DeviceCells.cells`,
        which the recorder calls in a writer thread.
        """
        if self._batch is None:
            return DeviceCells(None, ())
        with self._lock:
            gathered = self._batch.gather()
            self._batch.clear()
        return DeviceCells(gathered, self.device_categories)

    # ------------------------------------------------------------------ host
    def host_cells(self, cpu_tensor: torch.Tensor) -> Dict[str, str]:
        """Formatted host cells (``{category: cell}``) of a CPU tensor (thread-safe)."""
        if not self._host_cats:
            return {}
        values = reduce_tensor(cpu_tensor, [c.host for c in self._host_cats])
        return {c.name: format_cell(c.kind, v, cpu_tensor.dtype) for c, v in zip(self._host_cats, values)}

    # ------------------------------------------------------------------ rows
    @property
    def device_only(self) -> bool:
        """Every category is computed on the device (a row's cells are its device cells, in order)."""
        return self.device_categories == self.categories

    def row_cells(self, device_cells: Optional[Dict[str, str]],
                  host_cells: Optional[Dict[str, str]]) -> List[str]:
        """The statistic cells of one row, in config order (missing: empty cell)."""
        device_cells = device_cells or {}
        host_cells = host_cells or {}
        out = []
        for name in self.categories:
            cell = device_cells.get(name)
            if cell is None:
                cell = host_cells.get(name, "")
            out.append(cell)
        return out


class DeviceCells:
    """Device statistics of one flush, formatted on first use (thread-safe)."""

    def __init__(self, gathered, categories: Sequence[str]):
        self._gathered = gathered
        self.categories = tuple(categories)
        self._cats = [lookup(c) for c in categories]
        self._lists: Optional[List[List[str]]] = None
        self._joined: Optional[List[str]] = None
        self._lock = threading.Lock()

    def lists(self) -> List[List[str]]:
        """Per handle, its cells in :attr:`categories` order."""
        with self._lock:
            if self._lists is None:
                g = self._gathered
                if g is None:
                    self._lists = []
                else:
                    kinds = [c.kind for c in self._cats]
                    formatters: Dict[torch.dtype, list] = {}
                    lists = []
                    for vals, dt in zip(g.values(), g.dtypes):
                        fmt = formatters.get(dt)
                        if fmt is None:
                            fmt = formatters[dt] = [cell_formatter(k, dt) for k in kinds]
                        lists.append([f(v) for f, v in zip(fmt, vals)])
                    self._lists = lists
            return self._lists

    def joined(self) -> List[str]:
        """Per handle, its cells joined by ``,`` (numbers and empty cells: nothing to quote).

        Written by the native formatter (``cell_text.cpp``, the same text ~10x faster) when
        opdump's native module is loaded, else from :meth:`lists`."""
        with self._lock:
            if self._joined is None:
                formatter = native.loaded_cell_formatter()
                g = self._gathered
                if formatter is not None and g is not None:
                    kinds, fused = native_codes(self._cats)
                    # one lookup per dtype, then a dict read per entry (no Python call per tensor)
                    precision = {d: native_precision(d) for d in set(g.dtypes)}
                    self._joined = formatter(g.entries(), list(map(precision.__getitem__, g.dtypes)), kinds, fused)
        if self._joined is None:
            joined = list(map(",".join, self.lists()))
            with self._lock:
                self._joined = joined
        return self._joined

    def cells(self) -> List[Dict[str, str]]:
        """Per handle, ``{category: cell}``."""
        return [dict(zip(self.categories, row)) for row in self.lists()]
