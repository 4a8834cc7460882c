"""The records of one Ascend ``bin`` dump file: one :class:`~.files.TensorFile` per input and
output (README, "Analysis").

A bin file is named ``{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}``
(:func:`opdump.format.acl_layout.parse_bin_name`; a mapped name is looked up in
``mapping.csv`` first) and holds all of its operator's dumped inputs and outputs
(:func:`opdump.format.ascend_bin.read_header`). Each becomes a tensor record like one
``.npy`` file of the MindSpore layout: ``io``/``slot`` from its place in the file, dtype
in MindSpore's spelling, format ``DefaultFormat`` once converted to the host layout (the
device format's name when opdump keeps the device layout), and a path under which
:mod:`.bincache` serves its values as an ``.npy``. Only the header is read here.
"""
from __future__ import annotations

from typing import List, Optional

from ...format import acl_layout, ascend_bin
from ...format.dtypes import dtype_name
from ...format.files import DEFAULT_FORMAT
from . import bincache
from .files import TensorFile


def is_bin_name(name: str) -> bool:
    return acl_layout.parse_bin_name(name) is not None


def bin_tensor_files(it, path: str, name: str) -> Optional[List[TensorFile]]:
    """The tensor records of the bin file at ``path`` whose (unmapped) name is ``name``, in
    the iteration folder ``it`` (:class:`~.containers.Iteration`); None when ``name`` is no
    bin file name or the file is not a readable bin file (the caller lists it as unread)."""
    parsed = acl_layout.parse_bin_name(name)
    if parsed is None:
        return None
    try:
        header = ascend_bin.read_header(path)
    except ascend_bin.BinFormatError:
        return None
    kind = "op"
    if parsed.is_parameter:
        kind = "constant" if it.iteration is None else "parameter"
    out = []
    for info in header.inputs + header.outputs:
        if bincache.is_absent(info):
            continue
        torch_name = info.dtype
        dtype = dtype_name(torch_name) if torch_name else info.data_type_name
        fmt = DEFAULT_FORMAT if bincache.in_host_layout(info) else info.format_name
        out.append(TensorFile(bincache.register(path, info), it.rank, it.net, it.graph, it.iteration,
                              parsed.op_type, parsed.op_name, parsed.op_name, parsed.task_id, parsed.stream_id,
                              parsed.timestamp, info.kind, info.index, fmt, dtype, kind, info.size))
    return out
