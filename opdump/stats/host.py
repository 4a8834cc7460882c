"""Host statistics: numpy over a CPU copy of the tensor (``stat_calc_mode: "host"``).

This runs in the background writer threads.  The tensor is walked in chunks of
:data:`CHUNK_ELEMENTS` elements, so that the temporaries (a float32 widening of
a bfloat16/float8 chunk, a float64 upcast for the sum of squares) stay small
and in cache whatever the tensor's size.  Every heavy step is a single-threaded
numpy or hashlib call that releases the GIL (no torch kernels, no BLAS: they
would start thread pools competing with the training's own); the Python work
per chunk is a few dozen calls.

Semantics (per category; see also :mod:`opdump.stats.categories`):

* ``max``/``min``: IEEE like numpy: any NaN makes them NaN, ±Inf take part;
  so the default categories reveal a NaN.  Exact: computed on the tensor's own
  values (bfloat16 and float8 are upcast exactly to float32).
* ``finite max``/``finite min`` (opdump extension): max/min over the finite
  elements only; empty cell when there is none.
* ``avg``: the float64 sum divided by the count; ``l2norm``: sqrt of the float64
  sum of squares (each square rounded to float64, no fused multiply-add).  Both
  sums are taken in ONE fixed order, so that every implementation gives the same
  bits (this numpy path, and opdump's C++ single pass, ``cpu_kernel.cpp``
  ``host_stats``, which computes them for CPU tensors without any copy): the
  flattened tensor (memory order: the sums depend on it only through rounding)
  is cut into chunks of :data:`~opdump.stats.contract.HOST_CHUNK` elements; in a
  chunk, lane ``j`` of :data:`~opdump.stats.contract.HOST_LANES` adds the elements
  ``i ≡ j`` (mod lanes) of the chunk's full rows in order; ``0.0`` plus the lanes
  in order, plus the chunk's last ``< lanes`` elements in order, is the chunk's
  sum; the chunks' sums are added in order.  NaN if any NaN, ±Inf if an Inf
  (avg: NaN if both signs; l2norm: Inf).  float64 tensors whose sum of squares
  overflows although every element is finite are rescaled: ``m * sqrt(sum((x/m)**2))``
  with ``m`` the largest magnitude (same order), so a finite float64 tensor gets a
  finite norm.
* ``count``: number of elements; ``negative zero count``: elements < 0 (-Inf
  included); ``positive zero count``: elements > 0 (+Inf included);
  ``zero count``: elements == 0 (+0.0 and -0.0); NaN is none of them;
  ``nan count``, ``negative inf count``, ``positive inf count``: exact counts.
* ``md5``: hex MD5 of the tensor's raw bytes in its ORIGINAL dtype, C order
  (bfloat16: the 2-byte bf16 patterns; bool: one byte 0/1 per element).
* integer and bool tensors get every statistic (bool as 0/1); their NaN/Inf
  counts are 0.  Integer avg/l2norm go through float64 (int64 values above
  2**53 are rounded).
* empty tensors: ``count`` and the other counts are 0, ``md5`` is the MD5 of
  zero bytes (``d41d8cd98f00b204e9800998ecf8427e``), every other cell is empty.
* complex tensors and dtypes without a numeric host view (quantized, bits,
  sub-byte ``int1..7``/``uint1..7``, packed float4): every cell empty.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..format.statistics import lookup
from .contract import HOST_CHUNK, HOST_LANES
from .memory import dense_view
from .formatting import format_cell

#: elements per chunk: 256 Ki elements = 1 MiB of float32, 2 MiB as float64
CHUNK_ELEMENTS = 1 << 18

_NATIVE = {
    torch.float16, torch.float32, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.uint16, torch.uint32, torch.uint64,
}
_FLOAT8 = tuple(getattr(torch, n) for n in (
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, n))
#: dtypes that are widened (exactly) to float32 chunk by chunk
_UPCAST = (torch.bfloat16,) + _FLOAT8


def supported_dtype(dtype: torch.dtype) -> bool:
    """Whether statistics are computed for ``dtype`` (False: complex, quantized, bits…)."""
    return dtype in _NATIVE or dtype in _UPCAST or dtype is torch.bool


# --------------------------------------------------------------------------- chunks
class Chunk:
    """One slice of the flattened tensor, with lazily computed shared intermediates."""

    __slots__ = ("vals", "raw", "is_float", "_max", "_min", "_f64", "_all_finite")

    def __init__(self, vals: np.ndarray, raw: Optional[np.ndarray], is_float: bool):
        self.vals = vals            # float16/32/64, an integer type, or uint8 for bool
        self.raw = raw              # the original bytes (uint8), only when md5 is wanted
        self.is_float = is_float
        self._max = self._min = self._f64 = self._all_finite = None

    @property
    def max(self):
        if self._max is None:
            self._max = self.vals.max()
        return self._max

    @property
    def min(self):
        if self._min is None:
            self._min = self.vals.min()
        return self._min

    @property
    def f64(self) -> np.ndarray:
        if self._f64 is None:
            self._f64 = self.vals if self.vals.dtype == np.float64 else self.vals.astype(np.float64)
        return self._f64

    @property
    def all_finite(self) -> bool:
        if self._all_finite is None:
            # max and min finite <=> no NaN (it would propagate) and no ±Inf
            self._all_finite = (not self.is_float) or bool(
                np.isfinite(self.max) and np.isfinite(self.min))
        return self._all_finite

    def finite_extreme(self, largest: bool):
        """max/min over the finite elements of the chunk, or None."""
        v = self.max if largest else self.min
        if not self.is_float or np.isfinite(v):
            return v
        finite = self.vals[np.isfinite(self.vals)]
        if finite.size == 0:
            return None
        return finite.max() if largest else finite.min()


# --------------------------------------------------------------------------- reducers
@dataclass(frozen=True)
class Reducer:
    """A fold over the chunks: ``finish(update(...update(start(), c0)..., cN), count)``.

    ``update`` None: the value depends only on the count (e.g. ``count``), or on the
    tensor's float64 sums (``sums`` set: ``finish(sums, count)``, see :func:`float64_sums`).
    """

    start: Callable[[], Any]
    update: Optional[Callable[[Any, Chunk], Any]]
    finish: Callable[[Any, int], Any]
    needs_raw: bool = False
    sums: bool = False


def _extreme(largest: bool, finite: bool) -> Reducer:
    pick = np.maximum if largest else np.minimum     # both propagate NaN

    def update(state, chunk: Chunk):
        v = chunk.finite_extreme(largest) if finite else (chunk.max if largest else chunk.min)
        if v is None:
            return state
        return v if state is None else pick(state, v)

    return Reducer(lambda: None, update, lambda state, n: state)


def _count(predicate: Callable[[np.ndarray], np.ndarray], floats_only: bool = False) -> Reducer:
    def update(state, chunk: Chunk):
        if floats_only and not chunk.is_float:
            return state
        return state + int(np.count_nonzero(predicate(chunk.vals)))

    return Reducer(lambda: 0, update, lambda state, n: state)


# --------------------------------------------------------------------------- the float64 sums
def _ordered_sum(f: np.ndarray) -> float:
    """The float64 sum of one chunk in the module docstring's order (``cpu_kernel.cpp``'s)."""
    full = f.size - f.size % HOST_LANES
    total = 0.0
    if full:
        # a reduction over axis 0 of (rows, lanes) adds row after row into the lanes: each lane
        # is summed in order (numpy's pairwise summation applies along a contiguous axis only)
        for lane in np.add.reduce(f[:full].reshape(-1, HOST_LANES), axis=0).tolist():
            total += lane
    for x in f[full:].tolist():
        total += x
    return total


def float64_sums(values: Callable[[int, int], np.ndarray], n: int, is_f64: bool) -> tuple:
    """``(sum, sum of squares)`` of the ``n`` elements ``values(a, b)`` gives, in float64, in the
    contract's order; a float64 tensor whose sum of squares overflows with every element finite
    gives ``(sum, (m, rescaled sum of squares))`` (see the module docstring)."""
    total = squares = 0.0
    for a in range(0, n, HOST_CHUNK):
        f = values(a, min(a + HOST_CHUNK, n)).astype(np.float64)
        total += _ordered_sum(f)
        squares += _ordered_sum(f * f)
    if is_f64 and math.isinf(squares):
        chunks = [(a, min(a + HOST_CHUNK, n)) for a in range(0, n, HOST_CHUNK)]
        if all(np.isfinite(values(a, b)).all() for a, b in chunks):
            m = max(float(np.max(np.abs(values(a, b)))) for a, b in chunks)
            rescaled = 0.0
            for a, b in chunks:
                g = values(a, b) / m
                rescaled += _ordered_sum(g * g)
            return total, (m, rescaled)
    return total, squares


def _avg_finish(sums, n: int):
    return sums[0] / n if n else None


def _l2_finish(sums, n: int):
    if n == 0:
        return None
    squares = sums[1]
    if isinstance(squares, tuple):
        m, rescaled = squares
        return m * math.sqrt(rescaled)
    return math.sqrt(squares)


def _md5_update(h, chunk: Chunk):
    h.update(chunk.raw)
    return h


MAX = _extreme(True, False)
MIN = _extreme(False, False)
FINITE_MAX = _extreme(True, True)
FINITE_MIN = _extreme(False, True)
AVG = Reducer(lambda: None, None, _avg_finish, sums=True)
L2NORM = Reducer(lambda: None, None, _l2_finish, sums=True)
COUNT = Reducer(lambda: None, None, lambda s, n: n)
NEGATIVE_COUNT = _count(lambda v: v < 0)
POSITIVE_COUNT = _count(lambda v: v > 0)
ZERO_COUNT = _count(lambda v: v == 0)
NAN_COUNT = _count(np.isnan, floats_only=True)
NEG_INF_COUNT = _count(lambda v: v == -np.inf, floats_only=True)
POS_INF_COUNT = _count(lambda v: v == np.inf, floats_only=True)
MD5 = Reducer(hashlib.md5, _md5_update, lambda h, n: h.hexdigest(), needs_raw=True)

#: statistic category name (opdump.format.statistics) -> its host reducer
REDUCERS: Dict[str, Reducer] = {
    "max": MAX, "min": MIN, "avg": AVG, "count": COUNT,
    "negative zero count": NEGATIVE_COUNT, "positive zero count": POSITIVE_COUNT, "nan count": NAN_COUNT,
    "negative inf count": NEG_INF_COUNT, "positive inf count": POS_INF_COUNT, "zero count": ZERO_COUNT,
    "md5": MD5, "l2norm": L2NORM, "finite max": FINITE_MAX, "finite min": FINITE_MIN,
}


# --------------------------------------------------------------------------- driver
def _resolved(t: torch.Tensor) -> torch.Tensor:
    if t.device.type != "cpu":
        raise ValueError(f"host statistics need a CPU tensor, got one on {t.device}")
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


def _host_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` flattened in C order (md5 hashes these bytes)."""
    return _resolved(t).contiguous().reshape(-1)


def _memory_order_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` flattened in memory order when its elements fill one block (a view), else in C
    order: the order the float64 sums are taken in (the C++ pass reads memory the same way)."""
    t = _resolved(t)
    dense = dense_view(t)
    return (dense if dense is not None else t.contiguous()).reshape(-1)


_F8_TABLES: Dict[torch.dtype, np.ndarray] = {}


def _f8_table(dtype: torch.dtype) -> np.ndarray:
    """float32 value of each of the 256 bit patterns of a float8 dtype."""
    table = _F8_TABLES.get(dtype)
    if table is None:
        table = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float32).numpy()
        _F8_TABLES[dtype] = table
    return table


def _numpy_values(flat: torch.Tensor) -> Callable[[int, int], np.ndarray]:
    """``values(a, b)``: elements a..b of ``flat`` as a numpy array, exact.

    Pure numpy (single-threaded, GIL released): bfloat16 is widened to float32
    by shifting its bits, float8 through a 256-entry table, float16 by numpy's
    cast (all exact); bool is read as uint8.
    """
    dtype = flat.dtype
    if dtype is torch.bfloat16:
        bits = flat.view(torch.int16).numpy().view(np.uint16)
        return lambda a, b: (bits[a:b].astype(np.uint32) << 16).view(np.float32)
    if dtype in _FLOAT8:
        table, bits = _f8_table(dtype), flat.view(torch.uint8).numpy()
        return lambda a, b: table[bits[a:b]]
    if dtype is torch.float16:              # numpy's float16 arithmetic is emulated: widen
        half = flat.numpy()
        return lambda a, b: half[a:b].astype(np.float32)
    native = flat.view(torch.uint8).numpy() if dtype is torch.bool else flat.numpy()
    return lambda a, b: native[a:b]


def reduce_tensor(tensor: torch.Tensor, reducers: Sequence[Reducer],
                  chunk_elements: int = CHUNK_ELEMENTS) -> List[Any]:
    """Raw values (numpy scalars, ints, str, None) of ``reducers`` over ``tensor``.

    Unsupported dtypes (complex, quantized…) give None for every reducer.
    """
    dtype = tensor.dtype
    if not supported_dtype(dtype):
        return [None] * len(reducers)
    flat = _host_view(tensor)
    n = flat.numel()
    states = [r.start() for r in reducers]
    active = [i for i, r in enumerate(reducers) if r.update is not None]
    sums = None
    if n and (active or any(r.sums for r in reducers)):
        values = _numpy_values(flat)
        is_float = dtype.is_floating_point
        with np.errstate(all="ignore"):     # inf - inf, inf * 0…: the IEEE answers are wanted
            if any(r.sums for r in reducers):
                ordered = _memory_order_view(tensor)
                in_order = values if ordered.data_ptr() == flat.data_ptr() else _numpy_values(ordered)
                sums = float64_sums(in_order, n, dtype is torch.float64)
            if active:
                itemsize = flat.element_size()
                want_raw = any(reducers[i].needs_raw for i in active)
                raw_all = flat.view(torch.uint8).numpy() if want_raw else None
                for a in range(0, n, chunk_elements):
                    b = min(a + chunk_elements, n)
                    vals = values(a, b)
                    raw = raw_all[a * itemsize:b * itemsize] if want_raw else None
                    chunk = Chunk(vals, raw, is_float)
                    for i in active:
                        states[i] = reducers[i].update(states[i], chunk)
    return [r.finish(sums if r.sums else s, n) for r, s in zip(reducers, states)]


def host_statistics(tensor: torch.Tensor, categories: Sequence[str]) -> List[str]:
    """Formatted statistic.csv cells of ``tensor`` (a CPU tensor) for ``categories``, in order."""
    cats = [lookup(c) for c in categories]    # names and kinds: the format's table
    values = reduce_tensor(tensor, [REDUCERS[c.name] for c in cats])
    return [format_cell(c.kind, v, tensor.dtype) for c, v in zip(cats, values)]
