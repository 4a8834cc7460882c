"""The text of statistic.csv rows, made in the writer thread.

A queued row is ONE flat tuple (fields in the order of
:data:`opdump.stats.contract.ROW_FIELDS`); its text is a cached head
(op type, op name, task, stream), the timestamp, a cached middle (io, slot, size,
dtype, shape) and the statistic cells.  Guarantee: the bytes equal what the csv
module writes for the same cells (``tests/test_stats_csv.py`` checks it with
hypothesis), whatever the names hold.

When opdump's native module is loaded, a batch's text is made in one call to its
``encode_rows`` (``cell_text.cpp``: the fields read with the GIL, the text assembled without
it), ~0.2 µs per row instead of ~5 µs of Python; a batch it does not write exactly (a control
character in a name, which the Python path escapes; a field of another type) comes back None
and is written by the Python path below, which is also the path without the module
(``OPDUMP_CPU_KERNEL=0``).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from ..format.dtypes import dtype_name
from ..write.statistic_csv import encode_fields
from ..stats import format_shape, native


@functools.lru_cache(maxsize=4096)
def shape_text(shape: torch.Size) -> str:
    return format_shape(shape)


# The text of a row around its timestamp, encoded once per operator / tensor kind: a row
# is then head + timestamp + middle + its statistic cells, with no CSV work per row.
@functools.lru_cache(maxsize=65536)
def row_head(op_type: str, op_name: str, stream: int) -> str:
    return encode_fields((op_type, op_name, "0", str(stream))) + ","


@functools.lru_cache(maxsize=65536)
def row_middle(io: str, slot: int, nbytes: int, dtype: torch.dtype, shape: str) -> str:
    return "," + encode_fields((io, str(slot), str(nbytes), dtype_name(dtype), shape)) + ","


# A queued row is ONE flat tuple of strings, ints and a dtype (plus its host-statistics
# future, if any), its fields in the order of opdump/stats/contract.py's ROW_FIELDS (which the
# native row sink shares through contract.h, checked at load).  Once the native row sink is in
# use, a folder's rows are a RowBatch (opdump/stats/row_batch.h): the native makers' rows kept as
# C++ records, not tuples, whose text encode_rows makes from the records (the same bytes); read
# from Python, it is the sequence of the tuples a list would hold.  The garbage collector
# untracks such a tuple the first time it looks at it; a row holding the tensor's torch.Size
# (a tuple subclass, never untracked) or nested in another tuple stays tracked, and rows
# waiting for the low-priority writer (it may lag many steps behind, within its byte budget)
# then fill the oldest generation and trigger full collections (see BENCHMARKS.md).

#: what one statistic.csv row is reckoned to hold until it is written (its text and metadata)
ROW_BYTES = 256


#: MindSpore dtype names by torch dtype, for the native encoder (which fills it through dtype_name)
_DTYPE_NAMES: dict = {}


def _native_encoder():
    """The native ``encode_rows`` when the module is already loaded (never loads or builds it)."""
    return getattr(native.module(), "encode_rows", None) if native.is_loaded() else None


def encode_batch(stats, batch, device_cells, native_text: bool = True) -> bytes:
    """The statistic.csv text of ``batch`` (queued rows of one folder), with the device cells
    collected for them and their host-statistics futures (``native_text`` False: the Python
    path, whatever the module)."""
    encode = _native_encoder() if native_text else None
    if encode is not None:
        text = _encode_native(encode, stats, batch, device_cells)
        if text is not None:
            return text
    return _encode_python(stats, batch, device_cells)


def _encode_native(encode, stats, batch, device_cells) -> Optional[bytes]:
    if stats.device_only:
        return encode(batch, device_cells.joined(), False, "," * (len(stats.categories) - 1),
                      _DTYPE_NAMES, dtype_name)
    dev = device_cells.cells()
    tails = [",".join(stats.row_cells(None if h is None else dev[h], None if f is None else f.result()))
             for *_, h, f in batch]
    return encode(batch, tails, True, "", _DTYPE_NAMES, dtype_name)


def _encode_python(stats, batch, device_cells) -> bytes:
    (op_types, op_names, streams, stamps, ios, slots, sizes, dtypes, shapes,
     handles, futures) = zip(*batch)
    if stats.device_only:           # the common case: the cells are the device cells, in order
        cells = dict(enumerate(device_cells.joined()))
        cells[None] = "," * (len(stats.categories) - 1)
        tails = map(cells.__getitem__, handles)
    else:
        dev = device_cells.cells()
        tails = [",".join(stats.row_cells(None if h is None else dev[h], None if f is None else f.result()))
                 for h, f in zip(handles, futures)]
    # Built with map/zip over columns: no Python bytecode per row, so this thread does not
    # trade the GIL with the training thread row by row.  Statistic cells are numbers, md5
    # hex digests or empty: nothing in them needs CSV quoting.
    lines = map("".join, zip(map(row_head, op_types, op_names, streams), map(str, stamps),
                             map(row_middle, ios, slots, sizes, dtypes, shapes), tails))
    return ("\n".join(lines) + "\n").encode("utf-8")
