"""Device statistics: torch reductions on the tensor's own device (``stat_calc_mode: "device"``).

:class:`DeviceStatsBatch` launches a few reduction kernels per tensor on the
current stream of the tensor's device, keeps the 0-dim results on the device,
and :meth:`DeviceStatsBatch.collect` gathers everything of a device with one
stack and ONE device-to-host copy — the only synchronisation.  Nothing is
copied to the host per tensor, and the tensor itself never leaves its device.

Device-capable categories: every category except ``md5`` (which needs the
bytes on the host).  Kernels per tensor: ``max``+``min`` share one
``torch.aminmax``; ``avg`` one ``mean``; ``l2norm`` one
``torch.linalg.vector_norm``; each count a compare + a sum; ``finite max`` /
``finite min`` a ``nan_to_num`` + ``amax``/``amin``; ``count`` none (it is the
numel).  Integer results (counts, integer max/min) are kept as int64 and are
exact; float results are carried as float64 (bit-cast into the same int64
transfer buffer), so element values and float32 results are exact.

``device_stat_precision_mode``:

* ``"high"``: ``avg`` and ``l2norm`` accumulate in float32 on CUDA (float64 for
  float64 tensors) and in float64 on CPU; integer and bool tensors in float64.
  torch reads float16/bfloat16 and upcasts on the fly on CUDA (no copy); on CPU
  a float64 temporary of the tensor is made.  Even in float32, a float32
  tensor whose l2norm exceeds ~1.8e19 (sum of squares > float32 max) gives
  ``inf``.
* ``"low"``: ``avg`` and ``l2norm`` are computed in the tensor's own dtype (torch
  may still accumulate internally in float32, but the result is rounded to that
  dtype): less memory, but overflow: a float16 tensor whose l2norm (or avg)
  exceeds 65504 gives ``inf``, and bfloat16 results keep 8 bits of mantissa.
  Integer and bool tensors use float32.

In both modes ``max``/``min`` and the counts are exact (computed in the
tensor's dtype), NaN/Inf propagate as in host mode (see :mod:`opdump.stats.host`).
float8 tensors are upcast to float32 first (a temporary copy: torch has no
float8 reductions); bool tensors are read as uint8; uint16/uint32 are copied
to int64 and uint64 to float64 (torch lacks their reductions; uint64 values
above 2**53 are rounded).  Empty tensors launch no
kernels (counts 0, other values None); complex and other unsupported dtypes
launch nothing (all None).  Device and host results agree exactly for
max/min/counts and within float32 rounding for avg/l2norm (relative 1e-5 for
well-conditioned data in high mode).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from .host import _FLOAT8, supported_dtype

PRECISIONS = ("high", "low")


class _Ctx:
    """Per-tensor launch context: the working view and shared intermediates."""

    __slots__ = ("x", "is_float", "precision", "cpu", "_minmax")

    def __init__(self, t: torch.Tensor, precision: str):
        if t.dtype is torch.bool:
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
def d_max(c: _Ctx):
    return c.minmax()[1]


def d_min(c: _Ctx):
    return c.minmax()[0]


def _finite(c: _Ctx, largest: bool):
    if not c.is_float:
        return c.minmax()[1 if largest else 0]
    fill = float("-inf") if largest else float("inf")
    masked = torch.nan_to_num(c.x, nan=fill, posinf=fill, neginf=fill)
    return masked.amax() if largest else masked.amin()


def d_finite_max(c: _Ctx):
    return _finite(c, True)


def d_finite_min(c: _Ctx):
    return _finite(c, False)


_BLOCK = 4096


def _blocks(c: _Ctx):
    """(rows, tail) of a large CPU float tensor below float64, else None.

    On CPU "high" precision means float64 accumulation; asking torch for a float64
    reduction of a float32 tensor materialises a float64 copy of it (a full extra
    pass and 2x its memory).  Instead, rows of 4096 elements are reduced in float32
    (relative error ~1e-7 per row) and the row results combined in float64, which
    keeps the total within ~1e-6 relative (typically 1e-9) of a float64 reduction at
    the cost of one pass.
    """
    x = c.x
    if (not c.cpu or not c.is_float or x.dtype == torch.float64 or c.precision != "high"
            or x.numel() < 4 * _BLOCK):
        return None
    if not x.is_contiguous():
        # no reshape (it would copy): rows along the last dimension, read in place
        return (x, x.new_empty(0)) if x.dim() >= 2 and x.shape[-1] >= 64 else None
    flat = x.view(-1)
    m = flat.numel() // _BLOCK * _BLOCK
    return flat[:m].view(-1, _BLOCK), flat[m:]


def d_avg(c: _Ctx):
    parts = _blocks(c)
    if parts is not None:
        rows, tail = parts
        total = rows.sum(dim=-1, dtype=torch.float32).sum(dtype=torch.float64) + tail.sum(dtype=torch.float64)
        return total / c.x.numel()
    acc = c.acc_dtype()
    return c.x.mean() if acc is None else c.x.mean(dtype=acc)


def d_l2norm(c: _Ctx):
    parts = _blocks(c)
    if parts is not None:
        rows, tail = parts
        per_row = torch.linalg.vector_norm(rows, dim=-1, dtype=torch.float32).to(torch.float64)
        return torch.sqrt(per_row.square().sum() + tail.to(torch.float64).square().sum())
    acc = c.acc_dtype()
    if acc is None:
        return torch.linalg.vector_norm(c.x)
    if not c.is_float:
        return torch.linalg.vector_norm(c.x.to(acc))
    return torch.linalg.vector_norm(c.x, dtype=acc)


def d_count(c: _Ctx):
    return c.x.numel()


def _d_count_where(op, value, floats_only=False):
    def fn(c: _Ctx):
        if floats_only and not c.is_float:
            return 0
        return op(c.x, value).sum()
    return fn


def d_nan_count(c: _Ctx):
    return torch.isnan(c.x).sum() if c.is_float else 0


d_negative_count = _d_count_where(torch.lt, 0)
d_positive_count = _d_count_where(torch.gt, 0)
d_zero_count = _d_count_where(torch.eq, 0)
d_neg_inf_count = _d_count_where(torch.eq, float("-inf"), floats_only=True)
d_pos_inf_count = _d_count_where(torch.eq, float("inf"), floats_only=True)


class _Entry:
    __slots__ = ("device", "plan", "nfloat", "nint", "dtype", "stream")

    def __init__(self, device, plan, nfloat, nint, dtype, stream):
        self.device = device        # None: nothing launched
        self.plan = plan            # per category: ("f", i) | ("i", i) | ("v", value)
        self.nfloat = nfloat
        self.nint = nint
        self.dtype = dtype
        self.stream = stream


class DeviceStatsBatch:
    """Statistics launched on the tensors' devices, gathered with one copy per device.

    ``categories``: the device-capable categories to compute, in the order
    :meth:`collect` returns them.
    """

    def __init__(self, categories: Sequence[str], precision: str = "high"):
        from .categories import lookup        # categories imports this module

        if precision not in PRECISIONS:
            raise ValueError(f"device_stat_precision_mode must be one of {PRECISIONS}, got {precision!r}")
        cats = [lookup(c) for c in categories]
        bad = [c.name for c in cats if c.device is None]
        if bad:
            raise ValueError(f"statistic categories {bad} cannot be computed on the device")
        self.categories = tuple(c.name for c in cats)
        self._cats = cats
        self.precision = precision
        self._entries: List[_Entry] = []
        self._floats: Dict[torch.device, List[torch.Tensor]] = {}
        self._ints: Dict[torch.device, List[torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def dtype(self, index: int) -> torch.dtype:
        """The dtype of the tensor added as ``index`` (for formatting)."""
        return self._entries[index].dtype

    def add(self, tensor: torch.Tensor) -> int:
        """Launch the statistics of ``tensor`` (no sync); returns its index for :meth:`collect`."""
        index = len(self._entries)
        t = tensor.detach()
        if not supported_dtype(t.dtype) or not self._cats:
            self._entries.append(_Entry(None, [("v", None)] * len(self._cats), 0, 0, t.dtype, None))
            return index
        if t.numel() == 0:
            plan = [("v", 0 if c.kind == "count" else None) for c in self._cats]
            self._entries.append(_Entry(None, plan, 0, 0, t.dtype, None))
            return index
        dev = t.device
        floats = self._floats.setdefault(dev, [])
        ints = self._ints.setdefault(dev, [])
        f0, i0 = len(floats), len(ints)
        plan = []
        with torch.no_grad():
            ctx = _Ctx(t, self.precision)
            for c in self._cats:
                r = c.device(ctx)
                if not isinstance(r, torch.Tensor):
                    plan.append(("v", r))
                elif r.dtype.is_floating_point:
                    plan.append(("f", len(floats) - f0))
                    floats.append(r)
                else:
                    plan.append(("i", len(ints) - i0))
                    ints.append(r)
        stream = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
        self._entries.append(_Entry(dev, plan, len(floats) - f0, len(ints) - i0, t.dtype, stream))
        return index

    def collect(self) -> List[List[Any]]:
        """Per added tensor, its values in category order (float, int or None).

        One stack and one ``.cpu()`` per device.  ``finite max``/``finite min``
        without any finite element are None.  The batch keeps its entries until
        :meth:`clear`.
        """
        host: Dict[torch.device, tuple] = {}
        for dev in self._floats:
            floats, ints = self._floats[dev], self._ints[dev]
            if not floats and not ints:
                continue
            if dev.type == "cuda":
                current = torch.cuda.current_stream(dev)
                for s in {e.stream for e in self._entries if e.device == dev} - {current, None}:
                    current.wait_stream(s)
            with torch.no_grad():
                parts = []
                if floats:
                    parts.append(torch.stack(floats).to(torch.float64).view(torch.int64))
                if ints:
                    parts.append(torch.stack(ints).to(torch.int64))
                buf = (parts[0] if len(parts) == 1 else torch.cat(parts)).cpu().numpy()
            nf = len(floats)
            host[dev] = (buf[:nf].view(np.float64), buf[nf:])
        out: List[List[Any]] = []
        offsets = {dev: [0, 0] for dev in host}
        for e in self._entries:
            if e.device is None:
                out.append([v for _, v in e.plan])
                continue
            fvals, ivals = host[e.device]
            off = offsets[e.device]
            row = []
            for cat, (kind, v) in zip(self._cats, e.plan):
                if kind == "f":
                    v = float(fvals[off[0] + v])
                    if cat.name in ("finite max", "finite min") and not np.isfinite(v):
                        v = None
                elif kind == "i":
                    v = int(ivals[off[1] + v])
                row.append(v)
            off[0] += e.nfloat
            off[1] += e.nint
            out.append(row)
        return out

    def clear(self) -> None:
        self._entries.clear()
        self._floats.clear()
        self._ints.clear()
