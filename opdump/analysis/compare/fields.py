""":class:`.pairs.Tensor` records of a records table, built column by column.

Why: a 136,000-row statistics compare built its tensors one record at a time (a dict per row
through pandas, then ``Tensor(row)``), and :class:`~.pairs.Tensor` computed ``rank``,
``graph``, ``slot``… on first access (a cached property each): every one of them is read for
every tensor (matching, sorting, the table), 3.5 million first-access calls.  Here each
column is converted once (``tolist``, ``int`` only where a column holds something else) and
each tensor gets its record and its identity fields in one dict.

Guarantee: the same objects as ``Tensor(row)`` followed by reading every cached field --
``row`` the record as :meth:`pandas.DataFrame.to_dict` ("records") gives it with
``iteration`` an int or None; ``rank, iteration, graph, op, op_file, op_type, kind, io, slot,
call, order, call_key, tensor_key`` what the properties compute from it; besides,
``record`` (a :class:`RecordSource` of ``rec``, the row's position in it): ``row`` is that
row of ``rec``.  A column whose
``int`` conversion fails leaves every field to the properties (which then raise as before).
"""
from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, Dict, List

from .pairs import Tensor

__all__ = ["make_tensors"]

#: cached properties of Tensor read straight from the record (``row[name]``)
_PLAIN = ("op", "op_file", "op_type", "kind", "io")
#: cached properties of Tensor that are ``int(row[name])``
_INTS = ("rank", "graph", "slot", "call", "order")
_NAMES = ("rank", "iteration", "graph", "op", "op_file", "op_type", "kind", "io", "slot", "call", "order")


def _iteration(it: Any) -> Any:
    try:
        return None if it is None or it != it else int(it)
    except TypeError:  # pd.NA
        return None


def _ints(values: List[Any]) -> List[int]:
    if all(type(v) is int for v in values):
        return values
    return [int(v) for v in values]


def _defaults() -> Dict[str, Any]:
    """Tensor's dataclass fields other than ``row``, at their defaults (as ``Tensor(row)`` sets them)."""
    out = {}
    for f in fields(Tensor):
        if f.name == "row":
            continue
        out[f.name] = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
    return out


def make_tensors(rec) -> List[Tensor]:
    """``[Tensor(r) for r in rec.to_dict("records")]`` (``iteration`` made an int or None),
    identity fields filled (module doc)."""
    names = [str(c) for c in rec.columns]
    values = [rec[c].tolist() for c in rec.columns]
    it_i = names.index("iteration")
    values[it_i] = [_iteration(v) for v in values[it_i]]
    rows = [dict(zip(names, row)) for row in zip(*values)]
    col = dict(zip(names, values))
    try:
        per = [col[n] if n not in _INTS else _ints(col[n]) for n in _NAMES]
    except (KeyError, TypeError, ValueError, OverflowError):
        per = None
    base = _defaults()
    new = Tensor.__new__
    out: List[Tensor] = []
    if per is None:                                   # the properties compute (and raise) as before
        for r in rows:
            t = new(Tensor)
            t.__dict__.update(base, row=r)
            out.append(t)
        return out
    src = RecordSource(rec)
    idx = {n: i for i, n in enumerate(_NAMES)}
    i_it, i_g, i_f, i_io, i_s, i_c = (idx[k] for k in ("iteration", "graph", "op_file", "io", "slot", "call"))
    for k, (r, v) in enumerate(zip(rows, zip(*per))):
        t = new(Tensor)
        d = t.__dict__
        d.update(base)
        d["row"] = r
        d.update(zip(_NAMES, v))
        d["call_key"] = (v[i_it], v[i_g], v[i_f], v[i_c])
        d["tensor_key"] = (v[i_io], v[i_s])
        d["record"] = (src, k)
        out.append(t)
    return out


class RecordSource:
    """The records table a tensor's ``row`` came from (``Tensor.record``: (source, position)):
    lets a stage read a column of many tensors' records at once (:mod:`.stat_gather`)
    instead of one ``row`` dict at a time."""

    __slots__ = ("frame",)

    def __init__(self, frame):
        self.frame = frame
