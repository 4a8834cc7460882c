"""Parameters' statistic.csv rows made by ONE call of the native row sink.

Why: ``Recorder.record_parameters`` called the sink once per parameter (~7 us of Python each,
on the training thread, at every dumped graph call); one call for all of them gives the same
rows: the sink's row k is item k as slot k of one operator, given back its name and slot 0.

Guarantee (``tests/test_parameter_rows.py``): the rows, statistics handles and entries equal
those of one call per parameter (item k at timestamp ``ts + k``, slot 0, its own name; a
tensor seen twice read once); when the sink does not take every item nothing changes and the
caller records them one by one.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch

from ..format.files import PARAMETER_TYPE
from ..stats.contract import ROW_FIELDS

_SLOT = ROW_FIELDS.index("slot")


def parameter_rows(sink, rows: list, items: Sequence[Tuple[str, torch.Tensor]], ts: int, recorder) -> bool:
    """The rows of every parameter of ``items`` made by ONE native call (the native row sink;
    the caller holds the recorder's lock): item k at timestamp ``ts + k``, slot 0, named by its
    name: the rows and statistics one call per parameter gives (~7 us of Python saved per
    parameter on the training thread).  False, having changed nothing, when the sink does not
    take every item (the caller then records them one by one)."""
    if type(rows) is not list:          # a RowBatch: records named and placed by the sink itself
        recorded = sink.record(rows, PARAMETER_TYPE, [name for name, _ in items], "output", ts,
                               [t for _, t in items])
        if recorded < 0:
            return False
        recorder.tensors_recorded += recorded
        return True
    made: list = []
    if sink.record(made, PARAMETER_TYPE, "", "output", ts, [t for _, t in items]) < 0:
        return False
    # the sink's row k is item k as slot k of one operator: its name and slot 0 put back
    rows += [(PARAMETER_TYPE, items[r[_SLOT]][0]) + r[2:_SLOT] + (0,) + r[_SLOT + 1:] for r in made]
    recorder.tensors_recorded += len(made)
    return True
