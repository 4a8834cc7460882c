"""An iteration folder's ``.npy`` tensor files as columns (one list per field), built
without a :class:`~.files.TensorFile` per file; the objects are made only when asked for.

Why: a dump of 32,700 small tensors a side spent most of its reading in one Python call
chain and one dataclass per file (name parse, object, sort key, call counter, name
resolution, then the records table reading each attribute back with ``getattr``): ~0.6 s
of one core a side.  Here the names are matched by one regular expression each (``map``:
no Python frame per file), their fields split into columns with ``zip``, the folder's
sort and call numbers computed on those columns, and the records table
(:mod:`.records_columns`) takes the columns as they are.  The child that reads B
(:mod:`opdump.analysis.compare.open_pair`) also pickles lists instead of 32,700 objects.

When (:func:`file_columns` returns None otherwise and the scan makes one object per file
as before): a folder whose tensor files are all ``.npy`` files named in the full form
(README, "Dump layout": ``{op_type}.{op_name}.{task}.{stream}.{timestamp}.{io}.{slot}.
{format}.{dtype}.npy``, :data:`opdump.format.files.FULL_TENSOR_NAME_RE`), with no
``mapping.csv`` entry and no Ascend bin file.  ``OPDUMP_READER_COLUMNS=0`` turns it off.

Guarantee: :meth:`FileColumns.tensor_files` is the list the per-file scan makes -- the
same :class:`~.files.TensorFile` fields (as :func:`.names_fast.tensor_name_fields` parses
them), in the same order (the scan's stable sort on (timestamp, file name, input first,
slot) of the folder's listing order) and the same call numbers; the columns are those
objects' attributes (tests/test_reader_file_columns.py compares both scans).  Once the
objects are made (:attr:`.containers.Iteration.files`), they are the truth: the columns
are dropped, since a caller may change an object.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

from ...format import files as ff
from ...format import layout as fl
from .files import TensorFile
from .stat_table import columns_enabled

__all__ = ["FileColumns", "file_columns", "folder_columns", "split_names", "FIELDS"]

#: the columns, in :class:`~.files.TensorFile`'s field order after (path, rank, net, graph, iteration)
FIELDS = ("op_type", "op_file", "op", "task_id", "stream_id", "timestamp", "io", "slot", "format", "dtype",
          "kind", "nbytes", "call")

_INPUT = "input"


class FileColumns:
    """The tensor files of one folder, column-wise, in the scan's order (module doc).
    ``cols``: field -> list (:data:`FIELDS` and ``path``); ``rank``, ``net``, ``graph``,
    ``iteration``: the folder's."""

    __slots__ = ("cols", "rank", "net", "graph", "iteration", "n")

    def __init__(self, cols: Dict[str, List[Any]], rank: int, net: str, graph: int, iteration: Optional[int]):
        self.cols, self.rank, self.net, self.graph, self.iteration = cols, rank, net, graph, iteration
        self.n = len(cols["path"])

    def __len__(self) -> int:
        return self.n

    def tensor_files(self) -> List[TensorFile]:
        """One :class:`~.files.TensorFile` per file, as the per-file scan makes them."""
        c = self.cols
        r, net, g, it = self.rank, self.net, self.graph, self.iteration
        return [TensorFile(p, r, net, g, it, ty, of, op, task, stream, ts, io, slot, fmt, dt, kind, nb, call)
                for p, ty, of, op, task, stream, ts, io, slot, fmt, dt, kind, nb, call in zip(
                    c["path"], *(c[k] for k in FIELDS))]

    def resolve(self, m: Dict[str, str], global_map: Dict[str, str]) -> None:
        """:func:`.scan.resolve_names`' rule for the ``op`` column, once per distinct
        (file name, kind)."""
        kinds, ofs = self.cols["kind"], self.cols["op_file"]
        done: Dict[Tuple[str, str], str] = {}
        ops: List[str] = []
        prefix = ff.PARAMETER_TYPE + "."
        const = fl.CONSTANTS_DIR + "/" + prefix
        for kind, of in zip(kinds, ofs):
            k = (kind, of)
            v = done.get(k)
            if v is None:
                if kind == "op":
                    v = m.get(of) or global_map.get(of) or of
                else:
                    v = (prefix if kind == "parameter" else const) + of
                done[k] = v
            ops.append(v)
        self.cols["op"] = ops


def folder_columns(it, seq: List[Any], mapping: Dict[str, str]) -> Optional[FileColumns]:
    """The folder's tensor files as :class:`FileColumns` (``seq``: the scan's ``.npy``
    ``DirEntry`` objects in listing order, and the TensorFile lists of bin files) when they
    are all ``.npy`` files and no ``mapping.csv`` renames them (None otherwise, or when
    ``OPDUMP_READER_COLUMNS=0``)."""
    if not seq or mapping or not columns_enabled() or any(type(x) is list for x in seq):
        return None
    sizes: List[int] = []
    try:                                # each file's size by its name in the open folder: no path walk
        fd = os.open(it.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        fd = -1
    try:
        for e in seq:
            try:
                sizes.append(os.stat(e.name, dir_fd=fd).st_size if fd >= 0 else e.stat().st_size)
            except OSError:
                sizes.append(0)
    finally:
        if fd >= 0:
            os.close(fd)
    return file_columns(it, [e.name for e in seq], [e.path for e in seq], sizes)


def file_columns(it, names: List[str], paths: List[str], sizes: List[int]) -> Optional[FileColumns]:
    """The :class:`FileColumns` of a folder's ``.npy`` entries (``names``, ``paths``, scan
    ``sizes``, in listing order), or None when a name is not in the full form (the per-file
    scan then reads the folder)."""
    fields = split_names(names)
    if fields is None:
        return None
    ty, on, task, stream, ts, io, slot, fmt, dt = fields
    n = len(names)
    param = ff.PARAMETER_TYPE
    pkind = "constant" if it.iteration is None else "parameter"
    kinds = ["op" if t != param else pkind for t in ty]
    inputs = [x != _INPUT for x in io]
    order = sorted(range(n), key=list(zip(ts, on, inputs, slot)).__getitem__)   # stable, as list.sort
    if order != list(range(n)):
        ty, on, task, stream, ts, io, slot, fmt, dt, kinds, paths, sizes = (
            [col[i] for i in order] for col in (ty, on, task, stream, ts, io, slot, fmt, dt, kinds, paths, sizes))
    counters: Dict[Tuple[str, str, int], int] = {}
    calls: List[int] = []
    for k in zip(on, io, slot):
        c = counters.get(k, 0)
        calls.append(c)
        counters[k] = c + 1
    cols = {"path": list(paths), "op_type": list(ty), "op_file": list(on), "op": list(on), "task_id": list(task),
            "stream_id": list(stream), "timestamp": list(ts), "io": list(io), "slot": list(slot),
            "format": list(fmt), "dtype": list(dt), "kind": kinds, "nbytes": list(sizes), "call": calls}
    return FileColumns(cols, it.rank, it.net, it.graph, it.iteration)


#: a run of ``\0``-ended tokens: signed / unsigned ASCII integers (the full form's fields)
_SIGNED = re.compile(r"(?:-?[0-9]+\0)*")
_UNSIGNED = re.compile(r"(?:[0-9]+\0)*")
_IO = frozenset(ff.IO_KINDS)
_NPY_EXT = "." + ff.NPY
_EXT = len(_NPY_EXT)


def split_names(names: List[str]) -> Optional[tuple]:
    """The nine field columns (op_type, op_name, task, stream, timestamp, io, slot, format,
    dtype; the four numbers as ints) of ``.npy`` file names that all match
    :data:`opdump.format.files.FULL_TENSOR_NAME_RE`, else None; ``[]`` gives nine empty tuples.

    The same fields as that expression's groups (:func:`.names_fast.tensor_name_fields`):
    its last seven fields hold no dot, so they are the last seven dot-separated tokens of
    the name less ``.npy``, and its first field (no dot) is what precedes the first dot of
    the rest; the tokens' own patterns are checked over each column joined with ``\0``
    (no file name holds one), one match per column instead of a backtracking match per
    name."""
    if not names:
        return ((),) * 9
    if not all(n.endswith(_NPY_EXT) for n in names):
        return None
    cut = -_EXT
    try:
        heads, task, stream, ts, io, slot, fmt, dt = zip(*(n[:cut].rsplit(".", 7) for n in names))
    except ValueError:                               # a name of fewer than eight tokens
        return None
    if not _IO.issuperset(io):
        return None
    for col, pat in ((task, _SIGNED), (stream, _SIGNED), (ts, _UNSIGNED), (slot, _UNSIGNED)):
        text = "\0".join(col) + "\0"
        if text.count("\0") != len(col) or pat.fullmatch(text) is None:
            return None
    parts = [h.partition(".") for h in heads]
    if not all(p[1] for p in parts):
        return None                                  # no dot before the last seven fields
    ty, _, on = zip(*parts)
    return (ty, on, list(map(int, task)), list(map(int, stream)), list(map(int, ts)), io,
            list(map(int, slot)), fmt, dt)

