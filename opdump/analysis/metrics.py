"""Tensor-pair metrics, computed in float64 over memory-mapped, chunked data so a
multi-GB pair never sits in memory whole.  Module-level functions only: they run
in worker processes (compare's ProcessPoolExecutor)."""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import numpy as np

from .common import CHUNK_ELEMS, iter_chunks
from .reader import load_array

__all__ = ["tensor_metrics", "pair_metrics", "METRIC_KEYS"]

METRIC_KEYS = ("cosine", "max_abs_err", "max_rel_err", "rmse", "euclidean", "within_1e-3", "within_5e-3",
               "mean_abs_err", "max_abs_ref", "nonfinite_mismatch", "n")


def _real(a: np.ndarray) -> np.ndarray:
    if np.iscomplexobj(a):
        a = np.ascontiguousarray(a)
        return a.view(a.real.dtype)
    return a


def tensor_metrics(a: np.ndarray, b: np.ndarray, chunk: int = CHUNK_ELEMS) -> Dict[str, Any]:
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
    for ca, cb in zip(iter_chunks(a, chunk), iter_chunks(b, chunk)):
        xa = np.asarray(ca, dtype=np.float64)
        xb = np.asarray(cb, dtype=np.float64)
        fa, fb = np.isfinite(xa), np.isfinite(xb)
        both = fa & fb
        if not both.all():
            neither = ~fa & ~fb
            same = neither & ((np.isnan(xa) & np.isnan(xb)) | (xa == xb))
            mism += int((~both).sum() - same.sum())
            xa, xb = xa[both], xb[both]
        if xa.size == 0:
            continue
        d = np.abs(xa - xb)
        ab = np.abs(xb)
        dot += float(np.dot(xa, xb))
        na2 += float(np.dot(xa, xa))
        nb2 += float(np.dot(xb, xb))
        ssq += float(np.dot(d, d))
        sabs += float(d.sum())
        max_abs = max(max_abs, float(d.max()))
        max_ref = max(max_ref, float(ab.max()))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(d == 0, 0.0, d / ab)
        max_rel = max(max_rel, float(rel.max()))
        w1 += int((rel < 1e-3).sum())
        w5 += int((rel < 5e-3).sum())
        n += xa.size
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


def pair_metrics(path_a: str, path_b: str, chunk: int = CHUNK_ELEMS) -> Dict[str, Any]:
    """:func:`tensor_metrics` of two ``.npy`` files (memory-mapped, no pickle)."""
    try:
        a = load_array(path_a)
        b = load_array(path_b)
    except (OSError, ValueError) as e:
        return {"error": f"cannot read: {e}", "n": 0}
    try:
        return tensor_metrics(a, b, chunk)
    finally:
        del a, b


def _task(args) -> Any:
    idx, pa, pb = args
    return idx, pair_metrics(pa, pb)
