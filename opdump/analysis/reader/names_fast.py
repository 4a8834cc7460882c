"""Tensor file names parsed for the folder scan, as plain tuples.

Why: :func:`opdump.format.files.parse_tensor_name` splits the name and builds a frozen
:class:`~opdump.format.files.TensorName` (a dataclass whose ``__init__`` sets each of ten
fields through ``object.__setattr__``): ~3.4 us a file, 0.22 s on a dump of 65,000 files,
where the scan only reads the fields once.  Here the full form (README, "Dump layout":
``{op_type}.{op_name}.{task}.{stream}.{timestamp}.{io}.{slot}.{format}.{dtype}.npy``) is
matched by one regular expression and its fields returned as a tuple.

Guarantee: :func:`tensor_name_fields` equals :func:`fields_of` of
:func:`~opdump.format.files.parse_tensor_name` for every name (tests/test_compare_h2_speed.py
checks generated names): the expression accepts only names that function parses with its
first (nine-token) form and ASCII digits; every other name -- older forms, a mapped
name, non-ASCII digits, anything it rejects or raises on -- goes to that function itself.
The format itself stays defined in :mod:`opdump.format.files` (``FULL_TENSOR_NAME_RE`` beside
``parse_tensor_name``).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from ...format import files as ff

__all__ = ["Fields", "fields_of", "tensor_name_fields", "resolved_fields"]

#: (op_type, op_name, task_id, stream_id, timestamp, io, slot, format, dtype)
Fields = Tuple[str, str, int, int, int, str, int, str, Optional[str]]

_FULL = ff.FULL_TENSOR_NAME_RE


def fields_of(parsed: Optional[ff.TensorName]) -> Optional[Fields]:
    """The tuple of a :class:`~opdump.format.files.TensorName` (None stays None)."""
    if parsed is None:
        return None
    return (parsed.op_type, parsed.op_name, parsed.task_id, parsed.stream_id, parsed.timestamp, parsed.io,
            parsed.slot, parsed.format, parsed.dtype)


def tensor_name_fields(name: str) -> Optional[Fields]:
    """``fields_of(parse_tensor_name(name))``, the common form without the dataclass."""
    m = _FULL.fullmatch(name)
    if m is None:
        return fields_of(ff.parse_tensor_name(name))
    t, n, task, stream, ts, io, slot, fmt, dtype = m.groups()
    return t, n, int(task), int(stream), int(ts), io, int(slot), fmt, dtype


def resolved_fields(name: str, mapping: Dict[str, str]) -> Optional[Fields]:
    """``fields_of(resolve_mapped(name, mapping))``: a folder without ``mapping.csv`` (or a
    name it does not list) is parsed by :func:`tensor_name_fields`."""
    if mapping and (name in mapping or (name.endswith("." + ff.NPY) and name[:-len(ff.NPY) - 1] in mapping)):
        return fields_of(ff.resolve_mapped(name, mapping))
    return tensor_name_fields(name)
