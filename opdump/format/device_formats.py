"""Ascend device tensor formats <-> host layouts (NCHW / NCDHW / ND), in pure numpy.

A tensor in an Ascend ``bin`` dump file (:mod:`opdump.format.ascend_bin`) is stored in the
*device* format the kernel used: channels split into blocks of ``C0`` (NC1HWC0), weights
tiled into 16 x C0 fractals (FRACTAL_Z), matrices tiled into 16 x W0 blocks (FRACTAL_NZ),
each padded with zeros up to whole blocks. :func:`to_host` turns such an array back into
the logical tensor of the original ``shape`` (padding removed); :func:`from_host` is the
inverse (zero padding), which the writer may use and which documents the layout.

Unlike the rest of :mod:`opdump.format` this module needs numpy (it moves data); it still
has no I/O and imports nothing else of opdump. No Ascend toolkit is needed.

Conventions (the reference is MindSpore's device-shape transfer code,
``ms_device_shape_transfer.cc``; the table below is the layout this module guarantees):

* ``shape`` is the logical (host) shape in the host layout: NCHW for the 4-D formats,
  NCDHW for the 5-D ones, ND (``(..., H, W)``) for FRACTAL_NZ. A 4-D format given a shorter
  shape pads it the way MindSpore does: ``(C,) -> (1, C, 1, 1)``, ``(N, C) -> (N, C, 1, 1)``,
  ``(N, C, H) -> (N, C, H, 1)`` (5-D formats likewise to NCDHW); the result has ``shape``.
* ``C0`` (the channel block, also W0 of FRACTAL_NZ) is read from a device-shaped array's
  last dimension; for a flat array it comes from the dtype: 32 for int8/uint8, 16 for
  everything else (``cube_k``). int4 data unpacked to int8 has C0 = 64 on the device:
  pass ``c0=64`` (or a device-shaped array). NC1HWC0_C04 / FRACTAL_Z_C04 use C0 = 4.
* N blocks of the fractal formats are 16 (``N0``), as are H0 of FRACTAL_NZ.
* Format names are the ``OutputFormat`` enum names with or without ``FORMAT_`` prefix.

Index mapping per format (host element -> position in the device array; ``C1 =
ceil(C / C0)``, ``N1 = ceil(N / 16)``, ``//`` and ``%`` integer division and remainder):

=================  ===========================  =============================================
format             device shape                 host element -> device index
=================  ===========================  =============================================
NC1HWC0            (N, C1, H, W, C0)            [n,c,h,w] -> [n, c//C0, h, w, c%C0]
NDC1HWC0           (N, D, C1, H, W, C0)         [n,c,d,h,w] -> [n, d, c//C0, h, w, c%C0]
FRACTAL_Z          (C1*H*W, N1, 16, C0)         [n,c,h,w] -> [(c//C0)*H*W + h*W + w,
                                                 n//16, n%16, c%C0]
FRACTAL_Z_3D       (D*C1*H*W, N1, 16, C0)       [n,c,d,h,w] -> [((d*C1 + c//C0)*H + h)*W + w,
                                                 n//16, n%16, c%C0]
FRACTAL_NZ         (..., W1, H1, 16, W0)        [..., h, w] -> [..., w//W0, h//16, h%16,
                                                 w%W0]; 1-D (W,) is viewed as (1, W)
C1HWNCoC0          (C1, H, W, N, C0, C0)        [n,c,h,w] -> [c//C0, h, w, n, c%C0, c%C0]
                                                 (the diagonal; off-diagonal entries are 0)
=================  ===========================  =============================================

FRACTAL_Z / FRACTAL_Z_3D with ``groups > 1`` (the bin file's ``sub_format``): the host
weight is ``(groups*cout, cin, [D,] H, W)``; ``e = min(lcm(lcm(cin, C0)/cin, lcm(cout,
16)/cout), groups)`` groups share one padded block of ``cin_opt = ceil(e*cin/C0)*C0``
input and ``cout_opt = ceil(e*cout/16)*16`` output channels; host ``[g*cout + n, c, d, h,
w]`` goes to ``dst_ci = (g%e)*cin + c``, ``dst_co = (g%e)*cout + n`` of block ``g//e``:
device index ``((((g//e)*D + d)*C1 + dst_ci//C0)*H + h)*W + w`` (C1 = cin_opt/C0), then
``dst_co`` (split in ``//16``, ``%16``), then ``dst_ci % C0``; device shape
``(ceil(groups/e)*D*C1*H*W, cout_opt/16, 16, C0)``. groups = 1 is the plain layout.

Plain layouts are transposed to the host layout: NHWC, HWCN, CHWN -> NCHW; NDHWC, DHWCN,
DHWNC -> NCDHW; NCHW, NCDHW, ND, NC, NCL, MD are reshaped only. Anything else raises
:class:`UnknownFormat` (callers save such a tensor as it is, with a warning).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

__all__ = ["UnknownFormat", "to_host", "from_host", "device_shape", "cube_k", "is_known", "KNOWN_FORMATS",
           "HOST_FORMATS"]

N0 = 16  # N block of FRACTAL_Z / H0 of FRACTAL_NZ (kCubeSize)


class UnknownFormat(Exception):
    """The format is not one this module converts (the caller keeps the device array)."""


def cube_k(dtype) -> int:
    """The C0 a dtype gets on the device: 32 for 8-bit integers, 16 otherwise."""
    dt = np.dtype(dtype)
    return 32 if dt in (np.dtype(np.int8), np.dtype(np.uint8)) else 16


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _name(fmt: str) -> str:
    if not isinstance(fmt, str):
        raise UnknownFormat(f"format {fmt!r} is not a format name")
    name = fmt.strip().upper()
    return name[len("FORMAT_"):] if name.startswith("FORMAT_") else name


def _pad_shape(shape: Tuple[int, ...], rank: int, fmt: str) -> Tuple[int, ...]:
    """Pad a shorter logical shape to NCHW (rank 4) or NCDHW (rank 5) as MindSpore does."""
    if len(shape) == rank:
        return shape
    if len(shape) == 0 or len(shape) > rank:
        raise ValueError(f"{fmt}: shape {shape} cannot be laid out as a {rank}-D tensor")
    if len(shape) == 1:
        return (1, shape[0]) + (1,) * (rank - 2)
    return shape + (1,) * (rank - len(shape))


# --- plain layouts: the device array is the host tensor with axes permuted --------------

# device axis order, as indices into the host shape (NCHW / NCDHW)
_PERMUTED = {
    "NHWC": (0, 2, 3, 1), "HWCN": (2, 3, 1, 0), "CHWN": (1, 2, 3, 0),
    "NDHWC": (0, 2, 3, 4, 1), "DHWCN": (2, 3, 4, 1, 0), "DHWNC": (2, 3, 4, 0, 1),
}
_IDENTITY = ("NCHW", "NCDHW", "ND", "NC", "NCL", "MD")
#: formats whose device array already is the host tensor (reshaped only)
HOST_FORMATS = _IDENTITY


# --- blocked layouts --------------------------------------------------------------------

class _Layout:
    """One blocked device format: its device shape for a host shape and both directions.

    ``host`` is the padded host shape (NCHW / NCDHW / (B, H, W)), ``c0`` the channel block.
    """

    def __init__(self, rank: int, dev_rank: int, c0_fixed: Optional[int] = None):
        self.rank, self.dev_rank, self.c0_fixed = rank, dev_rank, c0_fixed

    def dev_shape(self, host, c0):  # pragma: no cover - overridden
        raise NotImplementedError

    def to_host(self, dev, host, c0):  # pragma: no cover - overridden
        raise NotImplementedError

    def from_host(self, a, c0):  # pragma: no cover - overridden
        raise NotImplementedError


def _pad_to(a: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Zero-pad ``a`` at the end of each axis up to ``sizes``."""
    if tuple(a.shape) == tuple(sizes):
        return a
    out = np.zeros(tuple(sizes), dtype=a.dtype)
    out[tuple(slice(0, s) for s in a.shape)] = a
    return out


class _NC1HWC0(_Layout):
    def dev_shape(self, host, c0):
        n, c, h, w = host
        return (n, _ceil(c, c0), h, w, c0)

    def to_host(self, dev, host, c0):
        n, c, h, w = host
        c1 = _ceil(c, c0)
        return dev.reshape(n, c1, h, w, c0).transpose(0, 1, 4, 2, 3).reshape(n, c1 * c0, h, w)[:, :c]

    def from_host(self, a, c0):
        n, c, h, w = a.shape
        c1 = _ceil(c, c0)
        return _pad_to(a, (n, c1 * c0, h, w)).reshape(n, c1, c0, h, w).transpose(0, 1, 3, 4, 2)


class _NDC1HWC0(_Layout):
    def dev_shape(self, host, c0):
        n, c, d, h, w = host
        return (n, d, _ceil(c, c0), h, w, c0)

    def to_host(self, dev, host, c0):
        n, c, d, h, w = host
        c1 = _ceil(c, c0)
        return (dev.reshape(n, d, c1, h, w, c0).transpose(0, 2, 5, 1, 3, 4)
                .reshape(n, c1 * c0, d, h, w)[:, :c])

    def from_host(self, a, c0):
        n, c, d, h, w = a.shape
        c1 = _ceil(c, c0)
        return (_pad_to(a, (n, c1 * c0, d, h, w)).reshape(n, c1, c0, d, h, w)
                .transpose(0, 3, 1, 4, 5, 2))


class _FracZ(_Layout):
    """FRACTAL_Z (rank 4) and FRACTAL_Z_3D (rank 5), groups = 1."""

    def _dims(self, host):
        if self.rank == 4:
            n, c, h, w = host
            return n, c, 1, h, w
        return host

    def dev_shape(self, host, c0):
        n, c, d, h, w = self._dims(host)
        return (d * _ceil(c, c0) * h * w, _ceil(n, N0), N0, c0)

    def to_host(self, dev, host, c0):
        n, c, d, h, w = self._dims(host)
        c1, n1 = _ceil(c, c0), _ceil(n, N0)
        # device (D, C1, H, W, N1*16, C0) -> host (N, C1, C0, D, H, W)
        a = dev.reshape(d, c1, h, w, n1 * N0, c0).transpose(4, 1, 5, 0, 2, 3)
        return a.reshape(n1 * N0, c1 * c0, d, h, w)[:n, :c].reshape(host)

    def from_host(self, a, c0):
        n, c, d, h, w = self._dims(a.shape)
        c1, n1 = _ceil(c, c0), _ceil(n, N0)
        p = _pad_to(a.reshape(n, c, d, h, w), (n1 * N0, c1 * c0, d, h, w))
        p = p.reshape(n1 * N0, c1, c0, d, h, w).transpose(3, 1, 4, 5, 0, 2)
        return p.reshape(d * c1 * h * w, n1, N0, c0)


class _FracZGroups(_FracZ):
    """FRACTAL_Z / FRACTAL_Z_3D with groups > 1 (an index table, see the module docstring)."""

    def __init__(self, rank: int, groups: int):
        super().__init__(rank, 4)
        self.groups = groups

    def _plan(self, host, c0):
        n, cin, d, h, w = self._dims(host)
        g = self.groups
        if n % g:
            raise ValueError(f"FRACTAL_Z with groups={g}: N={n} is not a multiple of groups")
        cout = n // g
        e = min(math.lcm(cin, c0) // cin if cin else 1, math.lcm(cout, N0) // cout if cout else 1, g)
        cin_opt, cout_opt = _ceil(e * cin, c0) * c0, _ceil(e * cout, N0) * N0
        return cout, cin, d, h, w, e, cin_opt // c0, cout_opt

    def dev_shape(self, host, c0):
        cout, cin, d, h, w, e, c1, cout_opt = self._plan(host, c0)
        return (_ceil(self.groups, e) * d * c1 * h * w, cout_opt // N0, N0, c0)

    def index(self, host, c0) -> np.ndarray:
        """Flat device index of every host element, shaped like the (padded) host."""
        cout, cin, d, h, w, e, c1, cout_opt = self._plan(host, c0)
        g_, n_, c_, d_, h_, w_ = np.ix_(np.arange(self.groups), np.arange(cout), np.arange(cin),
                                        np.arange(d), np.arange(h), np.arange(w))
        ci = (g_ % e) * cin + c_
        co = (g_ % e) * cout + n_
        row = (((g_ // e) * d + d_) * c1 + ci // c0) * h + h_
        idx = ((row * w + w_) * cout_opt + co) * c0 + ci % c0
        return idx.reshape(host)

    def to_host(self, dev, host, c0):
        return dev.reshape(-1)[self.index(host, c0)]

    def from_host(self, a, c0):
        out = np.zeros(int(np.prod(self.dev_shape(a.shape, c0))), dtype=a.dtype)
        out[self.index(a.shape, c0)] = a
        return out.reshape(self.dev_shape(a.shape, c0))


class _C1HWNCoC0(_Layout):
    def dev_shape(self, host, c0):
        n, c, h, w = host
        return (_ceil(c, c0), h, w, n, c0, c0)

    def to_host(self, dev, host, c0):
        n, c, h, w = host
        c1 = _ceil(c, c0)
        diag = np.diagonal(dev.reshape(c1, h, w, n, c0, c0), axis1=4, axis2=5)  # (C1,H,W,N,C0)
        return diag.transpose(3, 0, 4, 1, 2).reshape(n, c1 * c0, h, w)[:, :c]

    def from_host(self, a, c0):
        n, c, h, w = a.shape
        c1 = _ceil(c, c0)
        p = _pad_to(a, (n, c1 * c0, h, w)).reshape(n, c1, c0, h, w).transpose(1, 3, 4, 0, 2)
        out = np.zeros((c1, h, w, n, c0, c0), dtype=a.dtype)
        k = np.arange(c0)
        out[..., k, k] = p
        return out


class _FracNZ(_Layout):
    """FRACTAL_NZ: host (..., H, W) -> device (..., W1, H1, 16, W0)."""

    @staticmethod
    def _hw(shape):
        if len(shape) == 0:
            raise ValueError("FRACTAL_NZ: a scalar has no matrix layout")
        if len(shape) == 1:
            return (), 1, shape[0]
        return tuple(shape[:-2]), shape[-2], shape[-1]

    def dev_shape(self, host, c0):
        batch, h, w = self._hw(host)
        return batch + (_ceil(w, c0), _ceil(h, N0), N0, c0)

    def to_host(self, dev, host, c0):
        batch, h, w = self._hw(host)
        b, w1, h1 = int(np.prod(batch, dtype=np.int64)), _ceil(w, c0), _ceil(h, N0)
        a = dev.reshape(b, w1, h1, N0, c0).transpose(0, 2, 3, 1, 4).reshape(b, h1 * N0, w1 * c0)
        return a[:, :h, :w].reshape(host)

    def from_host(self, a, c0):
        batch, h, w = self._hw(a.shape)
        b, w1, h1 = int(np.prod(batch, dtype=np.int64)), _ceil(w, c0), _ceil(h, N0)
        p = _pad_to(a.reshape(b, h, w), (b, h1 * N0, w1 * c0))
        return p.reshape(b, h1, N0, w1, c0).transpose(0, 3, 1, 2, 4).reshape(self.dev_shape(a.shape, c0))


_BLOCKED: Dict[str, Callable[[int], _Layout]] = {
    "NC1HWC0": lambda g: _NC1HWC0(4, 5),
    "NC1HWC0_C04": lambda g: _NC1HWC0(4, 5, c0_fixed=4),
    "NDC1HWC0": lambda g: _NDC1HWC0(5, 6),
    "FRACTAL_Z": lambda g: _FracZ(4, 4) if g <= 1 else _FracZGroups(4, g),
    "FRACTAL_Z_C04": lambda g: _FracZ(4, 4, c0_fixed=4),
    "FRACTAL_Z_3D": lambda g: _FracZ(5, 4) if g <= 1 else _FracZGroups(5, g),
    "C1HWNCOC0": lambda g: _C1HWNCoC0(4, 6),
    "FRACTAL_NZ": lambda g: _FracNZ(0, 4),
}

KNOWN_FORMATS = tuple(sorted(set(_BLOCKED) | set(_PERMUTED) | set(_IDENTITY)))


def is_known(fmt: str) -> bool:
    """Whether :func:`to_host` converts ``fmt`` (a name, with or without ``FORMAT_``)."""
    try:
        return _name(fmt) in KNOWN_FORMATS
    except UnknownFormat:
        return False


def _layout(name: str, groups: int) -> _Layout:
    if name == "FRACTAL_Z_C04" and groups > 1:
        raise UnknownFormat("FRACTAL_Z_C04 with groups > 1 is not supported")
    return _BLOCKED[name](int(groups or 1))


def _c0(layout: _Layout, array: np.ndarray, c0: Optional[int]) -> int:
    if layout.c0_fixed:
        return layout.c0_fixed
    if c0:
        return int(c0)
    if array.ndim >= layout.dev_rank and array.ndim > 1:
        return int(array.shape[-1])
    return cube_k(array.dtype)


def device_shape(fmt: str, shape: Sequence[int], dtype=np.float16, groups: int = 1, *,
                 c0: Optional[int] = None) -> Tuple[int, ...]:
    """The device shape a tensor of host ``shape`` gets in ``fmt`` (C0 from ``dtype``)."""
    name, shape = _name(fmt), tuple(int(s) for s in shape)
    if name in _IDENTITY:
        return shape
    if name in _PERMUTED:
        perm = _PERMUTED[name]
        return tuple(_pad_shape(shape, len(perm), name)[i] for i in perm)
    if name not in _BLOCKED:
        raise UnknownFormat(f"device format {fmt!r} is not supported")
    layout = _layout(name, groups)
    host = _pad_shape(shape, layout.rank, name) if layout.rank else shape
    return tuple(layout.dev_shape(host, layout.c0_fixed or c0 or cube_k(dtype)))


def to_host(array, fmt: str, shape, groups: int = 1, *, c0: Optional[int] = None) -> np.ndarray:
    """The host tensor (NCHW / NCDHW / ND, exactly ``shape``) held by a device-format array.

    ``array`` is flat (as read from a bin file) or already device-shaped; its size must be
    the device size for ``shape`` (else ``ValueError`` naming both). Padding is dropped.
    Raises :class:`UnknownFormat` for a format this module does not know.
    """
    name, shape = _name(fmt), tuple(int(s) for s in shape)
    a = np.asarray(array)
    if name in _IDENTITY:
        return _sized(a, shape, fmt, shape).reshape(shape)
    if name in _PERMUTED:
        perm = _PERMUTED[name]
        host = _pad_shape(shape, len(perm), name)
        dev = tuple(host[i] for i in perm)
        return _sized(a, dev, fmt, shape).reshape(dev).transpose(np.argsort(perm)).reshape(shape)
    if name not in _BLOCKED:
        raise UnknownFormat(f"device format {fmt!r} is not supported")
    layout = _layout(name, groups)
    k = _c0(layout, a, c0)
    host = _pad_shape(shape, layout.rank, name) if layout.rank else shape
    dev = layout.dev_shape(host, k)
    out = layout.to_host(_sized(a, dev, fmt, shape, k), host, k)
    return np.ascontiguousarray(out).reshape(shape)


def from_host(array, fmt: str, groups: int = 1, *, c0: Optional[int] = None) -> np.ndarray:
    """The device-shaped array of ``fmt`` holding host tensor ``array`` (zero padding).

    The inverse of :func:`to_host`: ``to_host(from_host(a, f), f, a.shape)`` equals ``a``.
    C0 comes from ``c0`` or the dtype (:func:`cube_k`).
    """
    name, a = _name(fmt), np.asarray(array)
    if name in _IDENTITY:
        return a.copy()
    if name in _PERMUTED:
        perm = _PERMUTED[name]
        return np.ascontiguousarray(a.reshape(_pad_shape(a.shape, len(perm), name)).transpose(perm))
    if name not in _BLOCKED:
        raise UnknownFormat(f"device format {fmt!r} is not supported")
    layout = _layout(name, groups)
    k = layout.c0_fixed or c0 or cube_k(a.dtype)
    host = _pad_shape(a.shape, layout.rank, name) if layout.rank else a.shape
    return np.ascontiguousarray(layout.from_host(a.reshape(host), k))


def _sized(a: np.ndarray, dev: Sequence[int], fmt: str, shape, c0: Optional[int] = None) -> np.ndarray:
    need = int(np.prod(dev, dtype=np.int64))
    if a.size != need:
        extra = f", C0={c0}" if c0 else ""
        raise ValueError(f"{fmt}: shape {tuple(shape)}{extra} needs a device array of {need} elements "
                         f"{tuple(dev)}, got {a.size} {tuple(a.shape)}")
    return a
