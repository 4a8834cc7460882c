"""How statistic values and shapes are written as ``statistic.csv`` cells.

Numbers
    * integers (counts, and max/min of integer and bool tensors) are written as
      plain integers: ``0``, ``-3``, ``12``;
    * floats are written with the *shortest decimal that round-trips*, so that
      reading a cell back with ``float()`` (or ``np.float32``/``np.float16``)
      gives exactly the value that was computed:

      - values that are elements of the tensor (``max``, ``min``, ``finite max``,
        ``finite min``) are written in the precision of the tensor's dtype:
        float16 with numpy's float16 shortest repr, float32 / bfloat16 / float8
        with numpy's float32 shortest repr (every bfloat16 and float8 value is
        exactly a float32), float64 with Python's ``repr``;  e.g. the float32
        value nearest to 0.1 is written ``0.1``, not ``0.10000000149011612``;
      - computed values (``avg``, ``l2norm``) are written with Python's
        ``repr(float)`` of the float64 result;
      - notation: float64 values follow Python's ``repr`` (positional for
        1e-4 <= |x| < 1e16, otherwise scientific: ``1e+20``, ``1.5e-07``);
        float32/float16 elements follow numpy's ``str`` of the scalar, which turns
        scientific sooner (float32 ``1234567.0`` is ``1.234567e+06``); a float always
        shows a ``.`` or an exponent (``3.0``), which tells it apart from an integer;
      - NaN is written ``nan``, infinities ``inf`` and ``-inf``, a computed negative
        zero ``-0.0``; an element that is zero (a max or min of 0) is written ``0.0``
        whatever its sign: when a tensor holds both ``0.0`` and ``-0.0``, which of
        the two a max/min reduction returns depends on its reading order (numpy,
        torch, MindSpore and opdump's CPU kernel differ), so the sign would not be
        reproducible;
    * a statistic that does not exist (max of an empty tensor, anything of a
      complex tensor, ``finite max`` of a tensor without finite element) is an
      empty cell.

The same text is written by opdump's native module (``cell_text.cpp``), when it is
built, for every cell of a row at once; :func:`native_precision` and
:func:`native_codes` give it what it needs.

Shapes
    MindSpore's style (``tensor_stat_dump.cc``): ``(d0,d1,...)`` without spaces;
    a 1-dim tensor is ``(5)`` (no trailing comma), a 0-dim tensor ``()``.
    MindSpore always wraps the shape in double quotes; opdump's CSV writer quotes
    it when it contains a comma (``"(2,3)"``), which every CSV reader parses the
    same way.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch

from .contract import CELL_KINDS, CELL_PRECISIONS, FUSED_CATEGORIES

#: value precision used to print tensor elements, by torch dtype
_ELEMENT_NP = {
    torch.float16: np.float16,
    torch.float64: np.float64,
}


def element_format_dtype(dtype: torch.dtype):
    """The numpy float type whose shortest repr prints elements of ``dtype`` exactly."""
    if dtype in _ELEMENT_NP:
        return _ELEMENT_NP[dtype]
    if dtype.is_floating_point:
        return np.float32           # float32, bfloat16 and all float8 formats
    return None                     # integers / bool: printed as integers


def format_float(value: float, np_type=np.float64) -> str:
    """Shortest round-trip decimal of ``value`` in the precision ``np_type``."""
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if np_type is np.float64:
        return repr(value)
    # numpy's str() of float16/float32 scalars is the shortest repr that
    # round-trips in that precision (Dragon4), with Python's notation thresholds.
    return str(np_type(value))


def format_int(value) -> str:
    return str(int(value))


def format_computed(value) -> str:
    """A computed float64 value (avg, l2norm)."""
    if value is None:
        return ""
    return format_float(value, np.float64)


def format_count(value) -> str:
    if value is None:
        return ""
    return format_int(value)


def format_shape(shape: Iterable[int]) -> str:
    """``(2,3)``; ``(5)`` for one dimension; ``()`` for a 0-dim tensor (MindSpore style)."""
    return "(" + ",".join(str(int(d)) for d in shape) + ")"


def format_cell(kind: str, value, dtype: Optional[torch.dtype]) -> str:
    """Format one statistic by its category kind (see :mod:`opdump.stats.categories`)."""
    return cell_formatter(kind, dtype)(value)


def _text(value) -> str:
    return "" if value is None else str(value)


def _computed(value) -> str:
    """:func:`format_computed`, the special cases left to ``repr`` (which writes them alike)."""
    return "" if value is None else repr(float(value))


@functools.lru_cache(maxsize=None)
def cell_formatter(kind: str, dtype: Optional[torch.dtype]) -> Callable[[Any], str]:
    """``value -> cell`` for one category kind and tensor dtype: :func:`format_cell` with the
    dispatch done once (the writer formats thousands of cells per step)."""
    if kind == "element":
        np_type = element_format_dtype(dtype) if dtype is not None else None
        if np_type is None:
            return format_count

        if np_type is np.float64:
            to_text = repr
        else:
            def to_text(value: float) -> str:
                return str(np_type(value))

        def element(value) -> str:
            # format_float without its special cases: numpy's str and Python's repr already
            # write nan, inf and -inf that way (tests/test_stats_host.py checks the equality).
            # A zero extreme is unsigned: its sign depends on the reading order (module docstring).
            if value is None:
                return ""
            value = float(value)
            return "0.0" if value == 0 else to_text(value)
        return element
    if kind == "computed":
        return _computed
    if kind == "count":
        return format_count
    return _text                    # "text" (md5 hex digest)


# ------------------------------------------------------------------ the native formatter's codes
# (contract.py's tables, which native.py checks against cell_text.cpp's at load)
_NATIVE_KINDS = {kind: code for code, kind in enumerate(CELL_KINDS)}
_NATIVE_PRECISIONS = {t: CELL_PRECISIONS.index(p) for t, p in
                      ((None, "integer"), (np.float16, "half"), (np.float32, "single"), (np.float64, "double"))}
_NATIVE_FUSED = {category: code for code, category in enumerate(FUSED_CATEGORIES)}


@functools.lru_cache(maxsize=None)
def native_precision(dtype: torch.dtype) -> int:
    """How ``cell_text.cpp`` writes an element of ``dtype`` (as :func:`element_format_dtype`)."""
    return _NATIVE_PRECISIONS[element_format_dtype(dtype)]


def native_codes(cats) -> tuple:
    """``(kinds, fused)`` codes of ``cell_text.cpp`` for categories ``cats``
    (:class:`~opdump.stats.categories.Category`): each one's kind, and which value of the
    CPU kernel's tuple gives it (-1: none)."""
    return ([_NATIVE_KINDS[c.kind] for c in cats], [_NATIVE_FUSED.get(c.name, -1) for c in cats])
