"""numpy's OpenBLAS thread count, set through the library numpy loaded.

Compare pins its dot products to one BLAS thread (:func:`single_thread_blas`; each
worker process sets it once): OpenBLAS splits a long dot product over its threads and
adds the parts, so the last digits of cosine, RMSE and Euclidean distance would depend on
the machine's core count, and two workers would each spin two threads on two cores.
"""
from __future__ import annotations

import contextlib
import ctypes
from typing import Any, Iterator, Optional, Tuple


def _openblas() -> Optional[Tuple[Any, Any]]:
    """(set, get) thread-count functions of the OpenBLAS numpy uses, or None."""
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        return None
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas_", "openblas_"):
            for suffix in ("64_", ""):
                s, g = f"{prefix}set_num_threads{suffix}", f"{prefix}get_num_threads{suffix}"
                if hasattr(lib, s) and hasattr(lib, g):
                    return getattr(lib, s), getattr(lib, g)
    return None


_BLAS: Any = False        # not looked up yet


def _blas():
    global _BLAS
    if _BLAS is False:
        _BLAS = _openblas()
    return _BLAS


def set_blas_threads(n: int) -> Optional[int]:
    """Set numpy's OpenBLAS thread count; the previous count (None: not OpenBLAS)."""
    b = _blas()
    if b is None:
        return None
    prev = int(b[1]())
    b[0](int(n))
    return prev


@contextlib.contextmanager
def single_thread_blas() -> Iterator[None]:
    """Dot products on one BLAS thread while the block runs (then the former count)."""
    prev = set_blas_threads(1)
    try:
        yield
    finally:
        if prev is not None and prev != 1:
            set_blas_threads(prev)
