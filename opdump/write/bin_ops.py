"""``file_format: "bin"``: one Ascend DumpData file per operator (README "Ascend bin files").

The recorder hands over an operator's inputs (before it runs) and outputs (after); a bin
file holds both, so :class:`BinOps` keeps exact host copies of the inputs until the
outputs arrive (only the inputs with ``dump_mode`` "input", only the outputs with
"output"), then queues one writer job that encodes them with
:func:`opdump.format.ascend_bin.encode` and writes the file whole (temporary file +
rename, through the open rank folder: :meth:`.safe_fs.DumpTree.write_file`).  Inputs
whose outputs never came (the operator raised) are written alone at the next flush.

Guarantees: the bytes of every tensor in a file are exactly those the operator received /
produced (a contiguous copy taken when the recorder is called; conjugate/negative views
resolved); input/output indices are the recorder's slots: a slot holding no tensor (None,
a non-tensor, an unsupported tensor) is an empty ``DT_UNDEFINED`` entry, so index ``i`` of
the file is slot ``i`` of the npy names; bfloat16, float8 and complex32 keep their device
bytes (``DT_BF16``…).  Format: NCHW for 4-D tensors, NCDHW for 5-D, ND otherwise (the host
layouts; nothing is converted).  Memory: the copies count against the writer's byte
budget when the job is queued; at most one operator's inputs wait per (folder, operator).
Nothing here raises into the caller: errors go to the writer (dumping stops).
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..format import acl_layout as acl
from ..format import ascend_bin
from ..format.ascend_dtypes import DT_OF_TORCH
from ..format.names import sanitize
from .atomic import _tmp_name

_RAW_VIEW = {"bfloat16": torch.int16, "complex32": torch.float16, "float8_e5m2": torch.uint8,
             "float8_e4m3fn": torch.uint8, "float8_e8m0fnu": torch.uint8}
_EMPTY = ascend_bin.RawTensor(b"", 0, ())          # DT_UNDEFINED, no bytes: a slot without a tensor
_FORMATS = {4: "NCHW", 5: "NCDHW"}


def host_tensor(t: torch.Tensor) -> Optional[Any]:
    """An exact host copy of ``t`` as :func:`~opdump.format.ascend_bin.encode` takes it (a
    numpy array, or a RawTensor of device bytes); None for a dtype bin files cannot hold."""
    name = str(t.dtype)[6:]
    if name not in DT_OF_TORCH or name == "int4":
        return None
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.device.type == "cpu":
        c = t.clone(memory_format=torch.contiguous_format)
    else:                                   # a synchronous device-to-host copy (untested on GPU here)
        c = t.to("cpu", memory_format=torch.contiguous_format, copy=True)
    view = _RAW_VIEW.get(name)
    if view is None:
        return c.numpy()
    return ascend_bin.RawTensor(c.view(view).numpy(), name, tuple(c.shape))


def _nbytes(items) -> int:
    return sum(a.nbytes if hasattr(a, "nbytes") else a.data.nbytes for a in items if a is not None and a is not _EMPTY)


def _formats(kind: str, items) -> Dict[Tuple[str, int], str]:
    out = {}
    for i, a in enumerate(items):
        shape = a.shape if not isinstance(a, ascend_bin.RawTensor) else a.shape
        fmt = _FORMATS.get(len(shape)) if a is not _EMPTY else None
        if fmt:
            out[(kind, i)] = fmt
    return out


def _writev_all(fd: int, buffers: List[Any]) -> None:
    views = [memoryview(b).cast("B") for b in buffers if len(memoryview(b).cast("B"))]
    while views:
        n = os.writev(fd, views[:1024])
        while n and views:
            if n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][n:]
                n = 0


class BinOps:
    """Pairs an operator's inputs with its outputs and writes its bin file (module docstring)."""

    def __init__(self, session, clock):
        self.session = session
        self.writer = session.writer
        self.clock = clock
        cfg = session.config
        self.inputs_too = cfg.dump_inputs
        self.outputs_too = cfg.dump_outputs
        self._pending: Dict[Tuple[str, str], Tuple[Any, List[Any], int]] = {}
        self._lock = threading.Lock()
        self._warned: set = set()

    def _slots(self, tensors: Sequence[Any]) -> Tuple[List[Any], int]:
        items: List[Any] = []
        stream = 0
        for t in tensors:
            a = None
            if isinstance(t, torch.Tensor) and t.layout is torch.strided and not t.is_meta:
                a = host_tensor(t)
                if a is None:
                    self._warn(f"dtype {t.dtype}")
                elif t.is_cuda and not stream:
                    stream = int(torch.cuda.current_stream(t.device).stream_id)
            items.append(_EMPTY if a is None else a)
        while items and items[-1] is _EMPTY:
            items.pop()
        return items, stream

    def _warn(self, what: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(f"opdump: {what} cannot be written to a bin file; its slot is left empty",
                          RuntimeWarning, stacklevel=4)

    def record(self, folder: str, op, io: str, tensors: Sequence[Any]) -> None:
        """The inputs (``io`` "input") or outputs of ``op`` (:class:`~opdump.capture.op_info.OpInfo`)."""
        items, stream = self._slots(tensors)
        key = (folder, op.full_name)
        if io == "input":
            if not self.outputs_too:
                self._submit(folder, op.file_stem, op.full_name, items, [], stream)
                return
            with self._lock:
                old = self._pending.pop(key, None)
                self._pending[key] = (op, items, stream)
            if old is not None:                 # the same operator again before its outputs: write it alone
                self._submit(folder, old[0].file_stem, old[0].full_name, old[1], [], old[2])
            return
        with self._lock:
            pending = self._pending.pop(key, None)
        inputs, in_stream = (pending[1], pending[2]) if pending is not None else ([], 0)
        self._submit(folder, op.file_stem, op.full_name, inputs, items, stream or in_stream)

    def record_parameter(self, folder: str, name: str, tensor: torch.Tensor) -> None:
        """A parameter / constant: ``Parameter.{name}.0.0.{timestamp}``, one output."""
        items, stream = self._slots([tensor])
        if items:
            self._submit(folder, f"{acl.PARAMETER_TYPE}.{sanitize(name)}", name, [], items, stream)

    def flush(self) -> None:
        """Write the inputs still waiting for outputs (operators that raised), alone."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for (folder, _), (op, items, stream) in pending.items():
            self._submit(folder, op.file_stem, op.full_name, items, [], stream)

    def _submit(self, folder: str, stem: str, op_name: str, inputs: List[Any], outputs: List[Any],
                stream: int) -> None:
        ts = self.clock()
        file_name = f"{stem}.0.{stream}.{ts}"
        nbytes = _nbytes(inputs) + _nbytes(outputs)
        layout = self.session.layout

        def job() -> None:
            formats = {**_formats("input", inputs), **_formats("output", outputs)}
            buffers = ascend_bin.encode(op_name, inputs, outputs, timestamp=ts, formats=formats)
            path = layout.place(folder, file_name)
            layout.tree.write_file(path, lambda fd: _writev_all(fd, buffers), _tmp_name, fresh=True)
            self.writer.count(nbytes)
        self.writer.submit(job, nbytes)
