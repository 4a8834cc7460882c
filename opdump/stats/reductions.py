"""The torch reductions behind device statistics, one function per category.

Each ``d_<category>(ctx)`` launches its kernels on the tensor's own device (no sync)
and returns a 0-dim tensor on that device, or a Python number known without any kernel
(``count``, the NaN count of an integer tensor…); :class:`Ctx` holds the working view
and what several categories share (one ``aminmax`` for ``max`` and ``min``).
:data:`DEVICE_FUNCTIONS` maps a category name to its function (``md5`` has none: it
needs the bytes on the host).  Accumulation rules per precision: see
:mod:`opdump.stats.device`.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

from .host import _FLOAT8

PRECISIONS = ("high", "low")


class Ctx:
    """Per-tensor launch context: the working view and shared intermediates."""

    __slots__ = ("x", "is_float", "is_bool", "precision", "cpu", "_minmax")

    def __init__(self, t: torch.Tensor, precision: str):
        """``t``: the tensor in memory order (see :func:`.memory.memory_order`)."""
        self.is_bool = t.dtype is torch.bool
        if self.is_bool:
            t = t.view(torch.uint8)
        elif t.dtype in _FLOAT8:
            t = t.to(torch.float32)
        elif t.dtype in (torch.uint16, torch.uint32):
            t = t.to(torch.int64)       # torch has no min/max/compare kernels for them
        elif t.dtype is torch.uint64:
            t = t.to(torch.float64)
        self.cpu = t.device.type == "cpu"
        if self.cpu and precision == "high" and t.dtype in (torch.float16, torch.bfloat16):
            t = t.float()    # exact; CPU reductions of half types are ~10x slower than of float32
        self.x = t
        self.is_float = t.dtype.is_floating_point
        self.precision = precision
        self._minmax = None

    def minmax(self):
        if self._minmax is None:
            self._minmax = torch.aminmax(self.x)
        return self._minmax

    def acc_dtype(self) -> Optional[torch.dtype]:
        """Accumulation dtype for avg/l2norm; None: the tensor's own dtype."""
        x = self.x
        if not self.is_float:
            return torch.float64 if self.precision == "high" else torch.float32
        if self.precision == "low":
            return None
        if x.dtype == torch.float64 or self.cpu:
            return torch.float64
        return torch.float32


# Each device function returns a 0-dim tensor on the device (a slot), a Python
# number known without any kernel (count, the NaN count of an int tensor…).
def d_max(c: Ctx):
    return c.minmax()[1]


def d_min(c: Ctx):
    return c.minmax()[0]


def _finite(c: Ctx, largest: bool):
    if not c.is_float:
        return c.minmax()[1 if largest else 0]
    fill = float("-inf") if largest else float("inf")
    masked = torch.nan_to_num(c.x, nan=fill, posinf=fill, neginf=fill)
    return masked.amax() if largest else masked.amin()


def d_finite_max(c: Ctx):
    return _finite(c, True)


def d_finite_min(c: Ctx):
    return _finite(c, False)


_ROW_LENGTHS = (4096, 2048, 1024)


def _blocks(c: Ctx):
    """(rows, tail) of a large CPU float tensor below float64, else None; tail may be None.

    On CPU "high" precision means float64 accumulation; asking torch for a float64
    reduction of a float32 tensor materialises a float64 copy of it (a full extra
    pass and 2x its memory).  Instead, rows of 1024–4096 elements (a length that
    divides the tensor when one does, so there is no tail) are reduced in float32
    (relative error ~1e-7 per row) and the row results combined in float64, which
    keeps the total within ~1e-6 relative (typically 1e-9) of a float64 reduction at
    the cost of one pass.
    """
    x = c.x
    n = x.numel()
    if (not c.cpu or not c.is_float or x.dtype == torch.float64 or c.precision != "high"
            or n < 4 * _ROW_LENGTHS[0]):
        return None
    if not x.is_contiguous():
        # no reshape (it would copy): rows along the last dimension, read in place
        return (x, None) if x.dim() >= 2 and x.shape[-1] >= 64 else None
    flat = x.view(-1)
    for length in _ROW_LENGTHS:
        if n % length == 0:
            return flat.view(-1, length), None
    m = n // _ROW_LENGTHS[0] * _ROW_LENGTHS[0]
    return flat[:m].view(-1, _ROW_LENGTHS[0]), flat[m:]


def _with_tail(per_row: torch.Tensor, tail: Optional[torch.Tensor]) -> torch.Tensor:
    return per_row if tail is None else torch.cat([per_row.reshape(-1), tail])


def _true_count(c: Ctx) -> torch.Tensor:
    """A bool tensor's sum (= its sum of squares), exact, without a float copy of it."""
    return c.x.sum(dtype=torch.int64).to(torch.float64)


def d_avg(c: Ctx):
    if c.is_bool:
        return _true_count(c) / c.x.numel()
    parts = _blocks(c)
    if parts is not None:
        rows, tail = parts
        sums = rows.sum(dim=-1, dtype=torch.float32)
        return _with_tail(sums, tail).sum(dtype=torch.float64) / c.x.numel()
    acc = c.acc_dtype()
    return c.x.mean() if acc is None else c.x.mean(dtype=acc)


def d_l2norm(c: Ctx):
    if c.is_bool:
        return _true_count(c).sqrt()
    parts = _blocks(c)
    if parts is not None:
        # sqrt(sum of squared row norms + sum of squared tail elements), in float64
        rows, tail = parts
        per_row = torch.linalg.vector_norm(rows, dim=-1, dtype=torch.float32)
        return torch.linalg.vector_norm(_with_tail(per_row, tail), dtype=torch.float64)
    acc = c.acc_dtype()
    if acc is None:
        return torch.linalg.vector_norm(c.x)
    if not c.is_float:
        return torch.linalg.vector_norm(c.x.to(acc))
    return torch.linalg.vector_norm(c.x, dtype=acc)


def d_count(c: Ctx):
    return c.x.numel()


def _d_count_where(op, value, floats_only=False):
    def fn(c: Ctx):
        if floats_only and not c.is_float:
            return 0
        return op(c.x, value).sum()
    return fn


def d_nan_count(c: Ctx):
    return torch.isnan(c.x).sum() if c.is_float else 0


d_negative_count = _d_count_where(torch.lt, 0)
d_positive_count = _d_count_where(torch.gt, 0)
d_zero_count = _d_count_where(torch.eq, 0)
d_neg_inf_count = _d_count_where(torch.eq, float("-inf"), floats_only=True)
d_pos_inf_count = _d_count_where(torch.eq, float("inf"), floats_only=True)


#: category name -> its device function
DEVICE_FUNCTIONS: Dict[str, Callable[[Ctx], object]] = {
    "max": d_max, "min": d_min, "avg": d_avg, "count": d_count,
    "negative zero count": d_negative_count, "positive zero count": d_positive_count,
    "nan count": d_nan_count, "negative inf count": d_neg_inf_count, "positive inf count": d_pos_inf_count,
    "zero count": d_zero_count, "l2norm": d_l2norm, "finite max": d_finite_max, "finite min": d_finite_min,
}
