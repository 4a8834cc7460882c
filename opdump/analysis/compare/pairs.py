"""The records compare works on: :class:`Tensor` (one dumped tensor of one dump, a row of
:meth:`Dump.records` plus what compare learns about it), :class:`OpCall` (the tensors of one
call of one operator) and :class:`Pair` (a tensor of A, a tensor of B, the rule that paired
them and, once compared, the verdict and metrics).

Why records instead of the reader's dicts: every later stage (matching, verdicts, first
difference, table) reads named fields, so no stage depends on another's private keys.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple

from ...lazy import cached_property
from ..common import base_op_type
from ..reader import scope_of
from ..reader.bincache import source as on_disk     # a bin tensor: {bin file}:{io}.{i}, not its temporary .npy

__all__ = ["Tensor", "OpCall", "Pair", "TABLE_COLUMNS", "dtype_class", "RULE_MAPPING", "RULE_NAME",
           "RULE_ORDER", "RULE_SIGNATURE"]

#: matching rules, as they appear in the ``match`` column and in the summary
RULE_MAPPING = "mapping"
RULE_NAME = "name"
RULE_ORDER = "aligned order"
RULE_SIGNATURE = "unique signature"

TABLE_COLUMNS = [
    "order", "rank", "iteration", "iteration_b", "graph", "op", "op_b", "op_type", "kind", "io", "slot", "call",
    "match", "mode", "verdict", "reason", "identical", "cosine", "max_abs_err", "max_rel_err", "mean_abs_err",
    "rmse", "euclidean", "within_1e-3", "within_5e-3", "nonfinite_mismatch", "stat_max_rel_diff",
    "dtype_a", "dtype_b", "shape_a", "shape_b", "source", "path_a", "path_b",
]

#: TABLE_COLUMNS with the metrics' places (Pair.table_values lists them in this order)
METRIC_COLUMNS = ("cosine", "max_abs_err", "max_rel_err", "mean_abs_err", "rmse", "euclidean", "within_1e-3",
                  "within_5e-3", "nonfinite_mismatch", "stat_max_rel_diff")


@lru_cache(maxsize=1024)
def dtype_class(dtype: Any) -> str:
    """``float`` / ``int`` / ``bool`` / ``complex`` / ``""`` (unknown) from a MindSpore type name
    (``Float32``, ``BFloat16``, ``Int64``…) or a numpy dtype string: bf16 and fp32 tensors are
    the same class, so a cross-precision pair still aligns."""
    s = str(dtype or "").lower()
    if not s or s in ("none", "nan"):
        return ""
    if "complex" in s:
        return "complex"
    if "bool" in s:
        return "bool"
    if "float" in s or s.startswith(("f", "bf")) or "double" in s or "half" in s:
        return "float"
    if "int" in s or s.startswith(("i", "u")):
        return "int"
    return s


@dataclass
class Tensor:
    """One dumped tensor (a file, a statistics row, or both) of one dump."""

    row: Dict[str, Any]                          # the reader's record (Dump.records())
    shape: Optional[Tuple[int, ...]] = None      # from the .npy header or the statistics row
    np_dtype: Optional[str] = None               # numpy dtype of the stored data
    problem: Optional[str] = None                # the file could not be read: why
    layout: Optional[tuple] = None               # reader.npy.npy_layout of the file: its header, parsed once

    # -- the record's fields by name.  The fields that identify the tensor are read from the
    # record once (cached: matching reads them millions of times on a 100,000-row compare);
    # ``dtype`` and ``path`` stay live (the shape reader sets ``np_dtype`` later, the online
    # compare sets a held tensor's path).
    @cached_property
    def rank(self) -> int:
        return int(self.row["rank"])

    @cached_property
    def iteration(self) -> Optional[int]:
        return self.row["iteration"]

    @cached_property
    def graph(self) -> int:
        return int(self.row["graph"])

    @cached_property
    def op(self) -> str:
        return self.row["op"]

    @cached_property
    def op_file(self) -> str:
        return self.row["op_file"]

    @cached_property
    def op_type(self) -> str:
        return self.row["op_type"]

    @cached_property
    def kind(self) -> str:
        return self.row["kind"]

    @cached_property
    def io(self) -> str:
        return self.row["io"]

    @cached_property
    def slot(self) -> int:
        return int(self.row["slot"])

    @cached_property
    def call(self) -> int:
        return int(self.row["call"])

    @cached_property
    def order(self) -> int:
        return int(self.row["order"])

    @property
    def dtype(self) -> Optional[str]:
        d = self.row.get("dtype")
        return d if isinstance(d, str) and d else self.np_dtype

    @property
    def path(self) -> Optional[str]:
        p = self.row.get("path")
        return p if isinstance(p, str) else None

    @property
    def has_stats(self) -> bool:
        return self.row.get("stat_row") is True

    @property
    def nbytes(self) -> int:
        try:
            return int(self.row.get("nbytes") or 0)
        except (TypeError, ValueError):
            return 0

    @cached_property
    def call_key(self) -> Tuple[Any, int, str, int]:
        """Identifies the operator call this tensor belongs to (within a rank)."""
        return (self.iteration, self.graph, self.op_file, self.call)

    @cached_property
    def tensor_key(self) -> Tuple[str, int]:
        return (self.io, self.slot)

    def signature(self) -> Tuple[str, int, Optional[Tuple[int, ...]], str]:
        """What must agree for two tensors to be the same tensor of the same operator."""
        d = self.row.get("dtype")                   # self.dtype, read inline (called per tensor per matcher)
        return (self.io, self.slot, self.shape, dtype_class(d if isinstance(d, str) and d else self.np_dtype))

    def shape_text(self) -> Optional[str]:
        if self.shape is None:
            return None
        try:
            return _shape_text(self.shape)
        except TypeError:           # an unhashable shape (a list): not cached
            return "(" + ",".join(str(int(x)) for x in self.shape) + ")"


_base_type = lru_cache(maxsize=4096)(base_op_type)


@lru_cache(maxsize=4096)
def _shape_text(shape: tuple) -> str:
    return "(" + ",".join(str(int(x)) for x in shape) + ")"


@lru_cache(maxsize=4096)
def _parsed_shape(v: str) -> Optional[Tuple[int, ...]]:
    if not v.strip():
        return None
    return tuple(int(x) for x in re.findall(r"-?\d+", v))


def shape_from_text(v: Any) -> Optional[Tuple[int, ...]]:
    """A statistics row's shape text -> tuple (parsed once per distinct text); None when absent."""
    return _parsed_shape(v) if isinstance(v, str) else None


@dataclass
class OpCall:
    """The tensors of one call of one operator, in one dump, in execution order."""

    tensors: List[Tensor]
    index: int = 0                                # position among the calls of its dump

    @property
    def first(self) -> Tensor:
        return self.tensors[0]

    @property
    def op(self) -> str:
        return self.first.op

    @property
    def scope(self) -> str:
        op = self.first.op
        return scope_of(op) if "/" in op else ""

    @property
    def base_type(self) -> str:
        return _base_type(self.first.op_type)

    def signature(self, ios: frozenset) -> tuple:
        """Operator type and the signature of each tensor whose io is in ``ios``."""
        return (self.base_type,) + tuple(sorted((t.signature() for t in self.tensors if t.io in ios),
                                               key=lambda s: (s[0], s[1])))

    def named_signature(self, ios: frozenset) -> tuple:
        return (self.op,) + self.signature(ios)


@dataclass
class Pair:
    """A tensor of A and its counterpart in B (either may be None: unmatched), how they were
    paired, and -- once compared -- the verdict, the metrics and whether they are identical."""

    a: Optional[Tensor]
    b: Optional[Tensor]
    rule: str = ""                     # RULE_MAPPING / RULE_NAME / RULE_ORDER; "" when unmatched
    mode: str = ""                     # tensor | statistics | "" (not compared)
    verdict: Optional[str] = None
    reason: str = ""
    identical: Optional[bool] = None   # bit-equal or within the same-dtype tolerance (None: not compared)
    metrics: Dict[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def side(self) -> Tensor:
        """The tensor that locates the pair (A's when there is one)."""
        return self.a if self.a is not None else self.b  # type: ignore[return-value]

    @property
    def matched(self) -> bool:
        return self.a is not None and self.b is not None

    @property
    def same_dtype(self) -> bool:
        a, b = self.a, self.b
        if a is None or b is None:          # one side's dtype "": never the same
            return False
        da, db = a.row.get("dtype"), b.row.get("dtype")        # a.dtype, b.dtype read inline
        da = (da if isinstance(da, str) and da else a.np_dtype) or ""
        db = (db if isinstance(db, str) and db else b.np_dtype) or ""
        return bool(da) and (da == db or da.lower() == db.lower())

    def sort_key(self) -> tuple:
        t = self.side
        it = t.iteration
        return (0 if self.a is not None else 1, 1 << 60 if it is None else it, t.rank, t.order)

    def table_values(self) -> List[Any]:
        """The pair's row of the table as a list in :data:`TABLE_COLUMNS` order (``order``
        None), without building a dict per pair."""
        a, b = self.a, self.b
        t = a if a is not None else b
        pa = a.path if a is not None else None
        pb = b.path if b is not None else None
        m = self.metrics
        return [None, t.rank, a.iteration if a is not None else None, b.iteration if b is not None else None,
                t.graph, a.op if a is not None else None, b.op if b is not None else None, t.op_type, t.kind,
                t.io, t.slot, t.call, self.rule, self.mode, self.verdict, self.reason, self.identical,
                m.get("cosine"), m.get("max_abs_err"), m.get("max_rel_err"), m.get("mean_abs_err"), m.get("rmse"),
                m.get("euclidean"), m.get("within_1e-3"), m.get("within_5e-3"), m.get("nonfinite_mismatch"),
                m.get("stat_max_rel_diff"),
                a.dtype if a is not None else None, b.dtype if b is not None else None,
                a.shape_text() if a is not None else None, b.shape_text() if b is not None else None,
                self.source, on_disk(pa) if pa else None, on_disk(pb) if pb else None]
