"""The result of a comparison: the table (one row per tensor pair), where A and B part
(first difference, first divergence), what could not be compared (unmatched, unreadable),
how pairs were made, warnings; the text summary, CSV and HTML."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

from .verdict import Thresholds
from ..whole_files import replace_whole

__all__ = ["CompareResult", "RULE_FIRST_DIFFERENCE", "RULE_THRESHOLDS"]

RULE_FIRST_DIFFERENCE = "first difference"     # same dtypes: identical (within tolerance) or not
RULE_THRESHOLDS = "thresholds"                 # dtypes differ: cosine / error thresholds


def rule_of(same: bool, mixed: int, compared: int, thresholds: Thresholds) -> Tuple[str, str]:
    """(rule, note) of a comparison: ``same`` when every compared pair holds one dtype on both
    sides, else ``mixed`` of the ``compared`` pairs differ in dtype."""
    if same:
        return RULE_FIRST_DIFFERENCE, ("A and B hold the same dtypes: identical means bit-equal or within "
                                       f"max({thresholds.same_rtol:g}, eps)·max|B|")
    return RULE_THRESHOLDS, (f"dtypes differ in {mixed} of {compared} compared pairs: "
                             "cosine and error thresholds decide")


def _safe(text: Any) -> str:
    """Printable on any terminal: names holding undecodable bytes are escaped, never raise."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class CompareResult:
    a: str
    b: str
    table: Any                                    # pandas DataFrame, pairs.TABLE_COLUMNS
    first_divergence: Optional[Dict[str, Any]]
    diverged_parameters: List[str] = field(default_factory=list)
    nondeterministic_before: List[str] = field(default_factory=list)   # random ops differing before it
    unmatched_a: List[str] = field(default_factory=list)
    unmatched_b: List[str] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=Thresholds)
    iteration_pairs: List[Tuple[int, int]] = field(default_factory=list)
    ranks: Tuple[Optional[int], Optional[int]] = (None, None)
    first_difference: Optional[Dict[str, Any]] = None
    rule: str = RULE_THRESHOLDS                   # which rule names where A and B part
    rule_note: str = ""
    matched_by: Dict[str, int] = field(default_factory=dict)   # matching rule -> tensor pairs
    operators: Dict[str, int] = field(default_factory=dict)    # calls_a, calls_b, matched_a, matched_b
    unreadable: List[Tuple[str, str]] = field(default_factory=list)   # (path, reason)
    warnings: List[str] = field(default_factory=list)
    front_end_a: List[str] = field(default_factory=list)      # one side only because of the front end
    front_end_b: List[str] = field(default_factory=list)      # (compare.frontend), not unmatched
    kernel_only_a: List[str] = field(default_factory=list)    # kernel dump (compare.kernels): temporaries,
    kernel_only_b: List[str] = field(default_factory=list)    # operators with no kernel buffer; not unmatched

    @property
    def counts(self) -> Dict[str, int]:
        if self.table is None or len(self.table) == 0:
            return {}
        return {str(k): int(v) for k, v in self.table["verdict"].value_counts().items()}

    @property
    def diverged(self) -> bool:
        """A and B part somewhere: a first difference (same dtypes), a diverging operator or
        a diverged parameter."""
        return (self.first_divergence is not None or bool(self.diverged_parameters)
                or (self.rule == RULE_FIRST_DIFFERENCE and self.first_difference is not None))

    def table_columns(self, columns: List[str]):
        """``table[columns]``: the columns a caller lists (``opdump compare``'s non-passing
        tensors) -- a statistics compare makes them without the whole table (.stat_result)."""
        return self.table[columns]

    def to_csv(self, path: Union[str, os.PathLike]) -> None:
        from .table_csv import write_table_csv      # pandas' bytes, column-wise (.table_csv)
        replace_whole(path, lambda tmp: write_table_csv(self.table, tmp))

    def to_html(self, path: Union[str, os.PathLike], **kw) -> None:
        from ..report import write_html_report
        write_html_report(self, path, **kw)

    def to_dict(self) -> Dict[str, Any]:
        """The summary as plain data (``opdump compare --json``)."""
        return {"rule": self.rule, "rule_note": self.rule_note, "first_difference": self.first_difference,
                "first_divergence": self.first_divergence, "counts": self.counts,
                "matched_by": self.matched_by, "operators": self.operators,
                "diverged_parameters": self.diverged_parameters,
                "nondeterministic_before": self.nondeterministic_before,
                "unmatched_a": self.unmatched_a, "unmatched_b": self.unmatched_b,
                "front_end_a": self.front_end_a, "front_end_b": self.front_end_b,
                "kernel_only_a": self.kernel_only_a, "kernel_only_b": self.kernel_only_b,
                "unreadable": [{"path": p, "reason": r} for p, r in self.unreadable],
                "warnings": self.warnings}

    def matching_line(self) -> str:
        ops = self.operators
        by = ", ".join(f"{k} {v}" for k, v in sorted(self.matched_by.items(), key=lambda kv: -kv[1]))
        line = f"matched: {sum(self.matched_by.values())} tensor pairs" + (f" ({by})" if by else "")
        if ops:
            line += (f"; operators matched: {ops.get('matched_a', 0)} of {ops.get('calls_a', 0)} in A, "
                     f"{ops.get('matched_b', 0)} of {ops.get('calls_b', 0)} in B")
        return line

    def summary(self) -> str:
        lines = [f"A: {self.a}", f"B: {self.b} (reference)"]
        c = self.counts
        lines.append("tensors: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) if c else "tensors: none")
        lines.append(self.matching_line())
        lines.append(f"rule: {self.rule}" + (f" ({self.rule_note})" if self.rule_note else ""))
        if self.rule == RULE_FIRST_DIFFERENCE:
            fd = self.first_difference
            if fd:
                lines.append(f"first difference: {fd['op']} (iteration {fd['iteration']}, rank {fd['rank']})")
                lines += self._details(fd)
            else:
                lines.append("first difference: none (every compared tensor is identical within tolerance)")
        fv = self.first_divergence
        head = "first divergence"
        if fv:
            lines.append(f"{head}: {fv['op']} (iteration {fv['iteration']}, {fv['io']}.{fv['slot']}, "
                         f"rank {fv['rank']})")
            lines += self._details(fv)
        else:
            lines.append(f"{head}: none")
        if self.diverged_parameters:
            lines.append("diverged parameters: " + ", ".join(self.diverged_parameters[:10])
                         + (" …" if len(self.diverged_parameters) > 10 else ""))
        if self.nondeterministic_before:
            lines.append("random operators that differ before it: " + ", ".join(self.nondeterministic_before[:5]))
        if self.unmatched_a or self.unmatched_b:
            lines.append(f"unmatched operators: {len(self.unmatched_a)} only in A, {len(self.unmatched_b)} only in B")
        if self.front_end_a or self.front_end_b:
            lines.append(f"front-end operators (not unmatched: one front end runs them, e.g. functionalization "
                         f"copies, graph inputs): {len(self.front_end_a)} only in A, {len(self.front_end_b)} only in B")
        if self.kernel_only_a or self.kernel_only_b:
            lines.append(f"kernel dump (not unmatched: kernel temporaries holding no operator output, operators "
                         f"computed inside a kernel or as views, operator inputs): {len(self.kernel_only_a)} only in A, "
                         f"{len(self.kernel_only_b)} only in B")
        if self.unreadable:
            lines.append(f"unreadable files: {len(self.unreadable)} (not compared)")
            lines += [f"  {p}: {r}" for p, r in self.unreadable[:10]]
            if len(self.unreadable) > 10:
                lines.append(f"  … {len(self.unreadable) - 10} more (see the table)")
        lines += [f"warning: {w}" for w in self.warnings]
        return _safe("\n".join(lines))

    @staticmethod
    def _details(fd: Dict[str, Any]) -> List[str]:
        out = []
        if fd.get("op_b") and fd["op_b"] != fd["op"]:
            out.append(f"  matched in B: {fd['op_b']}")
        if fd.get("source"):
            out.append(f"  source: {fd['source']}" + (f"  {fd['code']}" if fd.get("code") else ""))
        out.append(f"  {fd['reason']}")
        out.append(f"  cause: {fd['cause']}")
        return out
