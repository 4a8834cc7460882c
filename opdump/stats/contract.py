"""The layouts and codes opdump's Python shares with its C++ module, on the Python side.

Why: a tuple position or an enum value that both languages must agree on is a contract;
each is named here once, and its C++ twin in ``contract.h``.  The C++ module exports its
values and :mod:`.native` compares them with these at load: a difference (a stale build,
an edit on one side only) makes opdump warn once and use its Python path, never a
silently misread tuple.  Every Python user of these layouts imports them from here.
"""
from __future__ import annotations

#: bumped with ``contract.h``'s ``kAbi`` whenever a signature or a layout changes
ABI = 4

#: statistic.csv cell kinds; the code of a kind is its index
CELL_KINDS = ("element", "computed", "count", "text")

#: how an element value is written: integer text, numpy float16 / float32 str, Python repr
CELL_PRECISIONS = ("integer", "half", "single", "double")

#: a fused entry, the native memo's tuple for a tensor it read (``fused_stats`` gives the first four)
FUSED_FIELDS = ("max", "min", "sum", "sum_of_squares", "numel")
F_MAX, F_MIN, F_SUM, F_SUMSQ, F_NUMEL = range(len(FUSED_FIELDS))

#: the statistic categories a fused entry gives; the code of a category is its index
FUSED_CATEGORIES = ("max", "min", "avg", "l2norm", "count")

#: one queued statistic.csv row: ONE flat tuple of strings, ints, a dtype, a handle and a future
#: (a flat tuple of such objects is untracked by the garbage collector, see opdump/recorder.py)
ROW_FIELDS = ("op_type", "op_name", "stream", "timestamp", "io", "slot", "nbytes",
              "dtype", "shape", "device_handle", "host_future")

#: tensors with gaps up to this many bytes are copied to contiguous memory, then read once
COPY_LIMIT = 32 << 20

#: the host mode's float64 summation order (``cpu_kernel.cpp``'s ``host_stats`` and its numpy twin in
#: :mod:`opdump.stats.host`): each of HOST_LANES lanes sums the elements i ≡ lane (mod HOST_LANES) of a
#: chunk of HOST_CHUNK elements in order; lanes, the chunk's tail, then chunks are added in order
HOST_LANES = 16
HOST_CHUNK = 1 << 16

#: what the native module exports, by attribute name, and the value it must have
EXPORTED = {
    "ABI": ABI,
    "CELL_KINDS": CELL_KINDS,
    "CELL_PRECISIONS": CELL_PRECISIONS,
    "FUSED_FIELDS": FUSED_FIELDS,
    "FUSED_CATEGORIES": FUSED_CATEGORIES,
    "ROW_FIELDS": ROW_FIELDS,
    "COPY_LIMIT": COPY_LIMIT,
    "HOST_LANES": HOST_LANES,
    "HOST_CHUNK": HOST_CHUNK,
}
