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
* ``avg``: sum in float64 (numpy pairwise summation) divided by the count; NaN
  if any NaN, ±Inf if an Inf (NaN if both signs).
* ``l2norm``: sqrt of the float64 sum of squares; NaN if any NaN, else Inf if
  any Inf.  float64 tensors whose squares overflow float64 are rescaled by the
  chunk's largest magnitude, so a finite float64 tensor gets a finite norm.
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

    ``update`` None: the value depends only on the count (e.g. ``count``).
    """

    start: Callable[[], Any]
    update: Optional[Callable[[Any, Chunk], Any]]
    finish: Callable[[Any, int], Any]
    needs_raw: bool = False


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


def _avg_update(state, chunk: Chunk):
    return state + float(np.sum(chunk.vals, dtype=np.float64))


def _ssq(f: np.ndarray) -> float:
    # einsum, not np.dot: BLAS would start its own threads (and, next to torch's
    # OpenMP pool, spin against it); einsum is one SIMD loop in this thread.
    return float(np.einsum("i,i->", f, f))


def _l2_update(state: List, chunk: Chunk):
    f = chunk.f64
    ssq = _ssq(f)
    if not math.isfinite(ssq) and chunk.vals.dtype == np.float64 and chunk.all_finite:
        scale = float(np.max(np.abs(f)))
        g = f / scale
        state.append((scale, _ssq(g)))
    else:
        state.append((1.0, ssq))
    return state


def _l2_finish(state: List, n: int):
    if n == 0:
        return None
    scale = max(s for s, _ in state)
    if scale == 1.0:
        return math.sqrt(math.fsum(q for _, q in state))
    return scale * math.sqrt(math.fsum((s / scale) ** 2 * q for s, q in state))


def _md5_update(h, chunk: Chunk):
    h.update(chunk.raw)
    return h


MAX = _extreme(True, False)
MIN = _extreme(False, False)
FINITE_MAX = _extreme(True, True)
FINITE_MIN = _extreme(False, True)
AVG = Reducer(lambda: 0.0, _avg_update, lambda s, n: s / n if n else None)
L2NORM = Reducer(list, _l2_update, _l2_finish)
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
def _host_view(t: torch.Tensor) -> torch.Tensor:
    if t.device.type != "cpu":
        raise ValueError(f"host statistics need a CPU tensor, got one on {t.device}")
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.contiguous().reshape(-1)


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
    if n and active:
        itemsize = flat.element_size()
        want_raw = any(reducers[i].needs_raw for i in active)
        raw_all = flat.view(torch.uint8).numpy() if want_raw else None
        values = _numpy_values(flat)
        is_float = dtype.is_floating_point
        with np.errstate(all="ignore"):     # inf - inf, inf * 0…: the IEEE answers are wanted
            for a in range(0, n, chunk_elements):
                b = min(a + chunk_elements, n)
                vals = values(a, b)
                raw = raw_all[a * itemsize:b * itemsize] if want_raw else None
                chunk = Chunk(vals, raw, is_float)
                for i in active:
                    states[i] = reducers[i].update(states[i], chunk)
    return [r.finish(s, n) for r, s in zip(reducers, states)]


def host_statistics(tensor: torch.Tensor, categories: Sequence[str]) -> List[str]:
    """Formatted statistic.csv cells of ``tensor`` (a CPU tensor) for ``categories``, in order."""
    cats = [lookup(c) for c in categories]    # names and kinds: the format's table
    values = reduce_tensor(tensor, [REDUCERS[c.name] for c in cats])
    return [format_cell(c.kind, v, tensor.dtype) for c, v in zip(cats, values)]
