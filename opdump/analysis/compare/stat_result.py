"""The result of a statistics-only compare (:mod:`.stat_pairs`): a :class:`.result.CompareResult`
whose table is held as columns (:mod:`.stat_csv` cells) and made a DataFrame only when
read.

Why: ``opdump compare`` on statistics writes the CSV, prints the summary and lists the first
non-passing tensors; none needs the whole DataFrame (the CSV is written from the cells, the
verdict counts from one column, the listing from its eight columns), and
building it cost ~0.09 s of CPU on 100,000 rows.

Guarantee: everything a caller reads is what the eager result gives -- ``table`` is
:func:`.stat_csv.frame_of_cells` of the cells (the frame the eager path built), made on
first read and kept (the cells then let go: memory as the eager result's); ``counts`` the
same dict (the verdict column inferred alone, as the frame infers it column by column,
then ``value_counts``); ``table_columns`` the same columns (made from their cells alone);
``to_csv`` the same bytes (:func:`.stat_csv.write_cells_csv`, else the frame's writer).
Once the frame exists (read, or assigned), it is the table: changes made to it are what
``to_csv`` writes.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Union

from ..whole_files import replace_whole
from .result import CompareResult
from .stat_csv import Cells, frame_of_cells, write_cells_csv

__all__ = ["StatCompareResult", "with_cells"]


class StatCompareResult(CompareResult):
    """:class:`CompareResult` with the table made from cells on first read (module doc)."""

    _frame = None
    _cells: Optional[Cells] = None

    @property
    def table(self):
        if self._frame is None and self._cells is not None:
            self._frame = frame_of_cells(self._cells)
            self._cells = None                  # one copy of the table held, not two
        return self._frame

    @table.setter
    def table(self, value) -> None:
        self._frame = value
        self._cells = None                      # an assigned table is the table

    @property
    def counts(self) -> Dict[str, int]:
        if self._frame is not None or self._cells is None or "verdict" not in self._cells:
            return super().counts
        col = frame_of_cells({"verdict": self._cells["verdict"]})["verdict"]
        if len(col) == 0:
            return {}
        return {str(k): int(v) for k, v in col.value_counts().items()}

    def table_columns(self, columns: List[str]):
        """``table[columns]`` made from those columns' cells alone while the table is not
        made (each column inferred on its own, as in the whole frame: the same columns)."""
        if self._frame is not None or self._cells is None or not all(c in self._cells for c in columns):
            return super().table_columns(columns)
        return frame_of_cells({c: self._cells[c] for c in columns})

    def to_csv(self, path: Union[str, os.PathLike]) -> None:
        if self._frame is not None or self._cells is None:
            return super().to_csv(path)
        cells = self._cells

        def write(tmp: str) -> None:
            if not write_cells_csv(cells, tmp):
                from .table_csv import write_table_csv
                write_table_csv(self.table, tmp)
        replace_whole(path, write)


def with_cells(result: StatCompareResult, cells: Cells) -> StatCompareResult:
    """``result`` holding ``cells`` as its table (made with ``table=None``)."""
    result._cells = cells
    return result
