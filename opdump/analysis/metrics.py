"""Tensor-pair metrics, computed in float64 over memory-mapped, chunked data so a
multi-GB pair never sits in memory whole.  Module-level functions only: they run
in worker processes (compare's ProcessPoolExecutor).

Files are opened through :func:`checked_header` / :func:`load_checked`: the ``.npy``
header is read and the size it describes is checked against the file's size before
anything is mapped or allocated, so a corrupt or truncated file is reported (by path,
with the reason) instead of asking for terabytes or failing half-way.
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, Tuple

import numpy as np

from .common import iter_chunks
from .reader import load_array

__all__ = ["tensor_metrics", "pair_metrics", "METRIC_KEYS", "checked_header", "load_checked"]

METRIC_KEYS = ("cosine", "max_abs_err", "max_rel_err", "rmse", "euclidean", "within_1e-3", "within_5e-3",
               "mean_abs_err", "max_abs_ref", "nonfinite_mismatch", "n")


def _real(a: np.ndarray) -> np.ndarray:
    if np.iscomplexobj(a):
        a = np.ascontiguousarray(a)
        return a.view(a.real.dtype)
    return a


METRIC_CHUNK = 1 << 16      # elements per step: float64 work buffers stay in the CPU cache


def tensor_metrics(a: np.ndarray, b: np.ndarray, chunk: int = METRIC_CHUNK) -> Dict[str, Any]:
    """Metrics of ``a`` (compared) against ``b`` (reference), flattened, in float64.

    Non-finite values: positions where both hold the same NaN/±Inf agree; any other
    position where either is non-finite counts in ``nonfinite_mismatch``.  The error
    metrics use the positions where both are finite.  ``max_rel_err`` and the
    ``within_*`` shares use ``|a-b| / |b|`` (0 where both are 0, inf where only b is 0).
    ``cosine`` is NaN when exactly one side is all zeros, 1 when both are."""
    a, b = _real(a), _real(b)
    out: Dict[str, Any] = {"shape_a": tuple(a.shape), "shape_b": tuple(b.shape),
                           "np_dtype_a": str(a.dtype), "np_dtype_b": str(b.dtype)}
    if a.size != b.size:
        out.update({"error": f"element count differs: {a.size} vs {b.size}", "n": 0})
        return out
    dot = na2 = nb2 = ssq = sabs = 0.0
    max_abs = max_rel = max_ref = 0.0
    w1 = w5 = n = mism = 0
    m = min(chunk, max(1, a.size))
    bufa, bufb, bufd, buft = (np.empty(m, np.float64) for _ in range(4))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for ca, cb in zip(iter_chunks(a, chunk), iter_chunks(b, chunk)):
            k = ca.size
            xa, xb, d, t = bufa[:k], bufb[:k], bufd[:k], buft[:k]
            xa[...] = ca
            xb[...] = cb
            fa, fb = np.isfinite(xa), np.isfinite(xb)
            if not (fa.all() and fb.all()):
                both = fa & fb
                neither = ~fa & ~fb
                same = neither & ((np.isnan(xa) & np.isnan(xb)) | (xa == xb))
                mism += int(k - both.sum() - same.sum())
                xa, xb = xa[both], xb[both]
                k = xa.size
                if k == 0:
                    continue
                d, t = d[:k], t[:k]
            np.subtract(xa, xb, out=d)
            np.abs(d, out=d)
            dot += float(np.dot(xa, xb))
            na2 += float(np.dot(xa, xa))
            nb2 += float(np.dot(xb, xb))
            ssq += float(np.dot(d, d))
            sabs += float(d.sum())
            max_abs = max(max_abs, float(d.max()))
            np.abs(xb, out=t)
            max_ref = max(max_ref, float(t.max()))
            np.divide(d, t, out=t)                 # 0/0 -> NaN (an exact zero: relative error 0)
            mr = float(np.fmax.reduce(t))
            if mr == mr:
                max_rel = max(max_rel, mr)
            w1 += int(np.count_nonzero(~(t >= 1e-3)))
            w5 += int(np.count_nonzero(~(t >= 5e-3)))
            n += k
    if na2 == 0.0 and nb2 == 0.0:
        cos = 1.0 if n else float("nan")
    elif na2 == 0.0 or nb2 == 0.0:
        cos = float("nan")
    else:
        cos = dot / math.sqrt(na2 * nb2)
        cos = max(-1.0, min(1.0, cos))
    out.update({
        "n": n, "cosine": cos, "max_abs_err": max_abs if n else float("nan"),
        "max_rel_err": max_rel if n else float("nan"),
        "rmse": math.sqrt(ssq / n) if n else float("nan"), "euclidean": math.sqrt(ssq),
        "mean_abs_err": sabs / n if n else float("nan"),
        "within_1e-3": w1 / n if n else float("nan"), "within_5e-3": w5 / n if n else float("nan"),
        "max_abs_ref": max_ref, "nonfinite_mismatch": mism,
    })
    return out


MMAP_MIN_BYTES = 4 << 20     # smaller files are read in one go (cheaper than mapping them)


def checked_header(path: str) -> Tuple[Tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of a ``.npy`` file whose size holds the data its header
    describes. Raises ValueError with the reason otherwise (bad magic, unreadable header,
    object dtype, file shorter than the header says)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, _fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy version {version}")
        except (ValueError, EOFError, SyntaxError, TypeError) as e:
            raise ValueError(f"not a readable .npy header ({e})") from None
        offset = f.tell()
    if dtype.hasobject:
        raise ValueError("holds Python objects (never unpickled)")
    need = offset + math.prod(int(x) for x in shape) * dtype.itemsize
    if size < need:
        raise ValueError(f"truncated or corrupt: the header describes {need} bytes "
                         f"(shape {tuple(shape)}, {dtype}), the file has {size}")
    return tuple(int(x) for x in shape), dtype, offset


def load_checked(path: str) -> np.ndarray:
    """The array of a checked ``.npy`` file, memory-mapped when large (never unpickled)."""
    shape, _dtype, _offset = checked_header(path)
    big = os.path.getsize(path) >= MMAP_MIN_BYTES
    return load_array(path, mmap=big)


def pair_metrics(path_a: str, path_b: str, chunk: int = METRIC_CHUNK) -> Dict[str, Any]:
    """:func:`tensor_metrics` of two ``.npy`` files. A file that cannot be read gives
    ``{"error": reason, "unreadable": path}`` instead of raising (any reason)."""
    arrays = []
    for p in (path_a, path_b):
        try:
            arrays.append(load_checked(p))
        except Exception as e:  # noqa: BLE001 - one bad file must not stop the comparison
            return {"error": f"cannot read {p}: {e}", "unreadable": p, "n": 0}
    a, b = arrays
    try:
        return tensor_metrics(a, b, chunk)
    except Exception as e:  # noqa: BLE001
        return {"error": f"cannot compare: {type(e).__name__}: {e}", "unreadable": path_a, "n": 0}
    finally:
        del a, b, arrays


def _task(args) -> Any:
    idx, pa, pb = args[:3]
    return idx, pair_metrics(pa, pb)


def _batch(tasks) -> Any:
    """Several small pairs in one worker call (one round trip instead of many)."""
    return [_task(t) for t in tasks]
