"""The recorder (:class:`Recorder`): where both capture front-ends hand over tensors.

It turns "operator X produced tensor T" into writer jobs: an exact copy of T
(a memcpy on CPU, an asynchronous D2H copy into pinned memory on CUDA), a
``.npy`` file and/or a statistic.csv row.  Statistics computed on the device are
launched here without a sync and collected once per graph call / flush.
Everything per-operator that can be computed ahead (names, folders, selection)
is in :class:`~opdump.capture.op_info.OpInfo`.
"""
from __future__ import annotations

import json
import os
import threading
import warnings
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..capture.op_info import OpInfo
from ..format.dtypes import dtype_name
from ..format.files import PARAMETER_TYPE, STATISTIC_FILE, parameter_file_name, tensor_file_name
from ..write.bin_ops import BinOps
from ..write.buffers import HostBuffers, HostCopy
from ..write.dtypes import local_shard, to_numpy
from ..write.statistic_csv import StatisticCsv
from ..stats import StatsEngine, native
from ..stats.device import tensor_version
from ..debug.sample import sample_size, take_array
from .copies import Clock, Seen, copy_out, stream_id_of
from .held import HeldCopy, Holds
from .parameter_rows import parameter_rows
from .rows import ROW_BYTES, encode_batch, shape_text

_UNRESOLVED = object()
#: OPDUMP_ROW_BATCH=0: queued rows as Python tuples in a list, as before RowBatch (A/B, tests)
_ROW_BATCH = os.environ.get("OPDUMP_ROW_BATCH", "1") != "0"


def _holdable(tensor: torch.Tensor) -> bool:
    """A tensor whose file can be written from its own memory (:mod:`.held`): a plain,
    non-empty, C-contiguous CPU tensor, no lazy conjugate/negation, no quantization."""
    return (tensor.device.type == "cpu" and type(tensor) in (torch.Tensor, torch.nn.Parameter)
            and tensor.numel() > 0 and tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg()
            and not tensor.is_quantized)


class Recorder:
    def __init__(self, session):
        self.session = session
        cfg = session.config
        self.config = cfg
        self.writer = writer = session.writer
        self.clock = Clock()
        self.stats = StatsEngine(cfg) if cfg.dump_statistics else None
        # statistic.csv rows per folder, waiting for their device values / host cells
        self._pending: Dict[str, List[tuple]] = {}       # flat row tuples, see :mod:`.rows`
        self._seen: Dict[int, Seen] = {}
        self.buffers = HostBuffers(lambda: writer.budget - writer.held)
        #: tensors written from their own memory inside a graph's hold window (no copy-out)
        self.holds = Holds(self.buffers, writer)
        self._csv: Dict[str, StatisticCsv] = {}
        self._csv_lock = threading.Lock()
        self._kernel_args_done: set = set()
        self._lock = threading.RLock()
        self._warned: set = set()
        #: sample dump: elements kept per tensor file (0: whole tensors)
        self.sample = sample_size(cfg)
        self.tensors_recorded = 0      # tensors recorded (the bench reports it per step)
        # statistics computed on the device only: no host copy, no file (the fast path of record_all);
        # it launches them without the engine's lock: every call into the engine holds self._lock
        self._launch = self.stats.device_adder() if session.device_statistics_only else None
        # ...and the native form of that path for CPU tensors, resolved at the first tensor
        self._sink = _UNRESOLVED if self._launch is not None else None
        #: file_format "bin": one Ascend DumpData file per operator (opdump/write/bin_ops.py)
        self.bin = BinOps(session, self.clock) if cfg.file_format == "bin" and cfg.dump_tensors else None
        #: ACL layout with dump_list model_name entries: data folder -> what is dumped there
        #: (opdump/write/acl_layout.py FolderFilter); None: no such filter
        self.folder_filter: Optional[dict] = None
        #: opdump_settings.reference: every tensor held until its verdict (README, "Online compare")
        self.online = None
        if cfg.reference and self.stats is not None:
            from ..debug.online_compare import OnlineCompare
            self.online = OnlineCompare(self)
            self._launch, self._sink = None, None

    # ------------------------------------------------------------------ tensors
    def record_all(self, folder: str, op: OpInfo, io: str, tensors: Sequence[Optional[torch.Tensor]],
                   files: bool = True, hold: Optional[list] = None) -> None:
        """Dump the input (or output) tensors of ``op`` into ``folder`` (an iteration folder),
        each at its slot (None, or anything not a tensor: nothing at that slot).

        Device statistics only (the fast path): a statistic.csv row and a launch per tensor,
        under one lock and one clock read per operator side (consecutive timestamps); for
        CPU tensors, rows and lookups are made by the native row sink in one call.
        Otherwise each tensor also gets its copy, file and host statistics (:meth:`_record`).
        ``hold``: the caller's open hold window (:mod:`.held`), where a file may be written
        from the tensor's own memory instead of a copy.
        """
        if self.folder_filter is not None:
            only = self.folder_filter.get(folder)
            if only is not None and not only.op(op):
                return
        if self.bin is not None and files:
            self.bin.record(folder, op, io, tensors)      # the files; statistics need "npy" (refused)
            return
        launch = self._launch
        if launch is None:
            if not files and self.stats is None:
                return                   # no file asked for this call, and no statistics at all
            if self.online is not None:
                self.online.make_room(io, tensors)
            for slot, t in enumerate(tensors):
                if isinstance(t, torch.Tensor) and not self._unsupported(t):
                    self._record(folder, op.op_type, op.full_name, io, slot, t, op=op, files=files, hold=hold)
            return
        op_type, name = op.op_type, op.full_name
        ts = self.clock(len(tensors))
        recorded = 0
        with self._lock:
            sink = self._native_sink()
            rows = self._rows_of(folder)
            if sink is not None:            # CPU tensors: the same rows, built natively (row_sink.cpp)
                recorded = sink.record(rows, op_type, name, io, ts, tensors)
                if recorded >= 0:
                    self.tensors_recorded += recorded
                    return
                recorded = 0
            for slot, t in enumerate(tensors):
                if type(t) is not torch.Tensor or t.layout is not torch.strided or t.is_meta:
                    if not isinstance(t, torch.Tensor) or self._unsupported(t):    # the rare cases
                        continue
                stream = stream_id_of(t) if t.is_cuda else 0
                rows.append((op_type, name, stream, ts + slot, io, slot, t.nbytes, t.dtype, shape_text(t.shape),
                             launch(t), None))
                recorded += 1
        self.tensors_recorded += recorded

    def record_parameters(self, folder: str, items: Sequence[Tuple[str, torch.Tensor]],
                          hold: Optional[list] = None) -> None:
        """Dump parameters/buffers/constants, ``(name, tensor)`` each, into ``folder``
        (``Parameter.<name>`` files / rows); device statistics of CPU tensors take the
        native row sink, under one lock and one clock read.  Under a ``kernels`` filter
        only the names it selects are dumped (:meth:`OpSelector.select_parameter`)."""
        items = [(name, local_shard(tensor)) for name, tensor in items]
        selector = self.session.selector
        if selector.mode == 1:
            items = [(name, tensor) for name, tensor in items if selector.select_parameter(name)]
            if not items:
                return
        only = self.folder_filter.get(folder) if self.folder_filter is not None else None
        if only is not None:
            items = [(name, tensor) for name, tensor in items if only.parameter(name)]
        if self.bin is not None:
            for name, tensor in items:
                if isinstance(tensor, torch.Tensor):
                    self.bin.record_parameter(folder, name, tensor)
            return
        sink = self._native_sink()
        if sink is not None:
            ts = self.clock(len(items))
            with self._lock:
                rows = self._rows_of(folder)
                if parameter_rows(sink, rows, items, ts, self):
                    return
                slow = []
                for k, (name, tensor) in enumerate(items):
                    recorded = sink.record(rows, PARAMETER_TYPE, name, "output", ts + k, (tensor,))
                    if recorded < 0:
                        slow.append((name, tensor))
                    else:
                        self.tensors_recorded += recorded
            items = slow
        for name, tensor in items:
            if isinstance(tensor, torch.Tensor) and not self._unsupported(tensor):
                if self.online is not None:     # held copies within the budget, parameter by parameter
                    self.online.make_room("input", (tensor,))
                self._record(folder, PARAMETER_TYPE, name, "output", 0, tensor, parameter=True, hold=hold)

    def _native_sink(self):
        """The native row sink of the device-statistics fast path (resolved once), or None."""
        sink = self._sink
        if sink is _UNRESOLVED:
            with self._lock:
                if self._sink is _UNRESOLVED:
                    self._sink = self.stats.device_row_sink()
                sink = self._sink
        return sink

    def _rows_of(self, folder: str):
        """The statistic.csv rows queued for ``folder`` (the caller holds ``self._lock``): a list
        of row tuples, or, once the native row sink is in use, a ``RowBatch`` (``row_batch.h``:
        the native makers' rows kept as C++ records, a sequence of the same tuples when read)."""
        rows = self._pending.get(folder)
        if rows is None:
            rows = self._pending[folder] = self._new_rows()
        return rows

    def _new_rows(self):
        """An empty row container: a RowBatch when the native row sink is resolved (never resolves
        it: a CUDA-only run does not load the module for this) and ``OPDUMP_ROW_BATCH`` is not 0."""
        sink = self._sink
        if sink is None or sink is _UNRESOLVED or not _ROW_BATCH:
            return []
        batch = native.new_row_batch()      # (an empty RowBatch is falsy, like an empty list)
        return [] if batch is None else batch

    def _record(self, folder, op_type, op_name, io, slot, tensor, parameter=False, op=None, files=True,
                hold=None) -> None:
        """``op``: the operator (its file-name stem; parameters have their own name form);
        ``files`` False: statistics only, whatever ``saved_data`` says (compare_compiled saves
        tensors of diverging kernels only); ``hold``: an open hold window (:mod:`.held`)."""
        cfg = self.config
        self.tensors_recorded += 1
        if self.online is not None:      # a held copy, written only if its operator diverges
            self.online.record(folder, op_type, op_name, io, slot, tensor, parameter, op)
            return
        ts = self.clock()
        stream = stream_id_of(tensor) if tensor.is_cuda else 0
        dtype = dtype_name(tensor.dtype)
        nbytes = tensor.numel() * tensor.element_size()
        want_file = cfg.dump_tensors and files
        stats = self.stats
        host_needed = stats is not None and stats.needs_host_copy
        need_copy = want_file or host_needed
        # sample dump: host statistics need the whole tensor on the host (the file is cut at write
        # time); otherwise only the sample is copied
        sample_copy = self.sample if self.sample and not host_needed else 0
        cut = self.sample if self.sample and host_needed else 0
        copy_bytes = min(nbytes, sample_copy * tensor.element_size()) if sample_copy else nbytes
        # statistics alone: the device batch itself recognises a tensor it has seen
        seen = self._seen_entry(tensor) if need_copy else None
        host_future = None
        if need_copy:
            copy = seen.copy() if seen is not None and seen.copy is not None else None
            self.writer.reserve(copy_bytes)
            buf_new = copy is None or not copy.acquire()
            if not buf_new:              # the same tensor again (an op's input = an earlier op's output)
                event, fmt = seen.event, seen.fmt
            elif (hold is not None and want_file and not host_needed and not sample_copy and _holdable(tensor)
                  and (copy := self.holds.hold(hold, tensor)) is not None):
                event, fmt = None, "DefaultFormat"          # no copy-out: the writer reads the tensor
            else:
                try:
                    copy, event, fmt = copy_out(tensor, cfg.trans_flag, self.buffers, sample_copy)
                except BaseException:
                    self.writer.release(copy_bytes)
                    raise
            if want_file:
                if parameter:
                    name = parameter_file_name(op_name, ts, dtype)
                else:
                    name = tensor_file_name(op.file_stem, 0, stream, ts, io, slot, fmt, dtype)
            else:
                name = None
            # host statistics come from the very copy the file is written from
            host_stats = buf_new or seen is None or seen.host_future is None
            future = self.writer.submit(
                lambda: self._write_job(folder, name, copy, event, host_stats, cut), copy_bytes, reserved=True)
            host_future = future if host_stats else seen.host_future
            if seen is None:
                seen = self._remember(tensor)
            seen.copy, seen.event, seen.fmt = weakref.ref(copy), event, fmt
            if host_stats:
                seen.host_future = future
        if stats is not None:
            self._queue_row(folder, (op_type, op_name, stream, ts, io, slot, nbytes, tensor.dtype,
                                     shape_text(tensor.shape)), tensor, seen, host_future)

    def _queue_row(self, folder: str, prefix: tuple, tensor: torch.Tensor,
                   seen: Optional["Seen"] = None, host_future=None) -> None:
        """Launch the device statistics of ``tensor`` and queue its statistic.csv row
        (its text is made in the writer thread, see :meth:`_write_rows`)."""
        # Launch, append and collect share one lock, so a handle always belongs
        # to the batch that is collected with its row.
        with self._lock:
            if seen is not None and seen.device_handle is not None:
                device_handle = seen.device_handle
            else:
                device_handle = self.stats.device_launch(tensor)
                if device_handle is not None and seen is not None:
                    seen.device_handle = device_handle
            self._rows_of(folder).append(prefix + (device_handle, host_future))

    # ------------------------------------------------------------------ same tensor, seen again
    def _seen_entry(self, tensor: torch.Tensor) -> Optional["Seen"]:
        """What was already done for this very tensor (same object, unmodified) since the last flush.

        An operator's input is usually an earlier operator's output: its statistics are
        computed once and its host copy is shared by both files.  Only weak references
        are kept, so nothing stays alive (the writer's byte budget still bounds memory).
        """
        entry = self._seen.get(id(tensor))
        if (entry is None or entry.version < 0 or entry.tensor() is not tensor
                or entry.version != tensor_version(tensor)):
            return None
        return entry

    def forget(self, tensor: torch.Tensor) -> None:
        """``tensor`` was just written in place: its next recording computes everything anew.

        (Inside a dispatch mode the version counter is not a reliable witness of an
        operator's own in-place write, so the eager front-end says it explicitly.)"""
        with self._lock:
            self._seen.pop(id(tensor), None)
            if self.stats is not None:
                self.stats.device_forget(tensor)

    def settle(self, tensor: torch.Tensor) -> None:
        """``tensor`` was written by an operator that has just returned, after it was recorded
        as that operator's output; no other operator has run since.

        The eager front-end records outputs inside the dispatch mode, and autograd bumps an
        in-place operator's version counter only after the mode returns: without this, the
        next operator reading the tensor (the optimizer's chains of in-place updates) would
        see a new version and compute its statistics, and copy it, once more."""
        with self._lock:
            entry = self._seen.get(id(tensor))
            if entry is not None and entry.tensor() is tensor and entry.version >= 0:
                now = tensor_version(tensor)
                if entry.version <= now <= entry.version + 1:
                    entry.version = now
            if self.stats is not None:
                self.stats.device_settle(tensor)

    def _remember(self, tensor: torch.Tensor) -> "Seen":
        entry = Seen(weakref.ref(tensor), tensor_version(tensor))
        self._seen[id(tensor)] = entry
        return entry

    def _write_job(self, folder: str, name: Optional[str], copy: HostCopy, event,
                   host_stats: bool = True, cut: int = 0) -> Optional[Dict[str, str]]:
        """Write one tensor file and/or compute its host statistics from ``copy``;
        ``cut`` > 0: the file holds only its first ``cut`` elements (sample dump, statistics
        still on the whole copy)."""
        try:
            if type(copy) is HeldCopy:     # written from the tensor's own memory (host statistics: never held)
                if name is not None:
                    written = self.holds.write(self.session.layout, self.session.layout.place(folder, name),
                                               copy, to_numpy)
                    if written:
                        self.writer.count(written)
                return None
            buf = copy.tensor
            if event is not None:
                event.synchronize()
            if name is not None:
                path = self.session.layout.place(folder, name)
                array = to_numpy(buf)
                if cut:
                    array = take_array(array, cut)
                self.session.layout.save_npy(path, array)      # never through a link (safe_fs)
                self.writer.count(array.nbytes)
                del array
            if host_stats and self.stats is not None and self.stats.needs_host_copy:
                return self.stats.host_cells(buf)
            return None
        finally:
            buf = None
            copy.release()

    def close(self) -> None:
        """After the writer drained: free what the recorder keeps between flushes (the
        recycled copy buffers, up to the writer's budget), since compiled graphs keep a
        reference to their session after it closed."""
        self.buffers.close()
        self._seen.clear()
        with self._csv_lock:
            self._csv.clear()

    def _unsupported(self, tensor: torch.Tensor) -> bool:
        if type(tensor) is torch.Tensor and tensor.layout is torch.strided and not tensor.is_meta:
            return False                        # the common case, decided in three attribute reads
        reason = None
        if tensor.is_sparse or tensor.layout != torch.strided:
            reason = f"layout {tensor.layout}"
        elif tensor.device.type == "meta":
            reason = "meta tensors"
        elif type(tensor) is not torch.Tensor and (
                not isinstance(tensor, torch.nn.Parameter)
                # a Parameter of a subclass with its own dispatch (FSDP2's DTensor: no storage of
                # its own, its shard is another tensor): not read as a plain one (seventh trial, B7)
                or type(tensor).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__):
            reason = f"tensor subclass {type(tensor).__name__}"
        if reason is None:
            return False
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(f"opdump: {reason}: not dumped", RuntimeWarning, stacklevel=3)
        return True

    # ------------------------------------------------------------------ kernel args
    def record_kernel_args(self, folder: str, op: OpInfo) -> None:
        if self.folder_filter is not None:
            only = self.folder_filter.get(folder)
            if only is not None and not only.op(op):
                return
        key = (folder, op.full_name)
        if key in self._kernel_args_done:
            return
        self._kernel_args_done.add(key)
        path = self.session.layout.place(folder, f"{op.file_stem}.json")   # format.files.kernel_args_file_name
        data = json.dumps({k: str(v) for k, v in op.args.items()}, indent=2).encode()
        self.writer.submit(lambda: self.session.layout.write_small(path, data))

    # ------------------------------------------------------------------ flushing
    def flush_statistics(self) -> None:
        """End of a graph call / eager flush: collect device statistics (one sync), queue
        the statistic.csv rows, and forget which tensors were seen."""
        if self.bin is not None:
            self.bin.flush()
        with self._lock:
            self._seen.clear()
            if self.stats is None:
                return
            pending, self._pending = self._pending, {}
            if not pending:
                return
            device_cells = self.stats.device_gather()     # the one sync; formatting is left to the writer
        if self.online is not None:                       # verdicts now; held copies written or dropped
            self.online.judge(pending, device_cells)
        for folder, rows in pending.items():
            # the rows' text counts against the writer's byte budget: a writer that falls behind
            # (statistics-only sessions run it at the lowest priority) holds the training thread back
            self.writer.submit(lambda folder=folder, rows=rows: self._write_rows(folder, rows, device_cells),
                               len(rows) * ROW_BYTES)

    def _statistic_csv(self, folder: str) -> StatisticCsv:
        with self._csv_lock:
            csv = self._csv.get(folder)
            if csv is None:         # made in a writer thread: the folder and the header cost syscalls
                if len(self._csv) >= 256:   # older iterations' files: reopening one appends, no new header
                    self._csv.pop(next(iter(self._csv)))
                layout = self.session.layout
                csv = self._csv[folder] = layout.statistic_csv(
                    layout.place(folder, STATISTIC_FILE), self.config.statistic_category)
            return csv

    def _write_rows(self, folder: str, batch, device_cells) -> None:
        self._statistic_csv(folder).append_encoded(encode_batch(self.stats, batch, device_cells), len(batch))
