"""The exception dump (``op_debug_mode`` 4; README, "Debug dumps").

Why: when an operator raises (a shape mismatch, an index out of range, a dtype error, a
device-side assert), the user wants the failing call isolated: its inputs, its arguments,
where it came from, and a script that raises the same error without the model.

The capture front-ends run every operator of every iteration inside ``try`` (eager: the
dispatch mode; graph mode: each operator node of the operator-by-operator path is
pointed at a guard, :func:`guard`).  When one raises they call
:meth:`ExceptionDump.record` and re-raise the very same exception object (bare
``raise``): type, message, arguments and the traceback's frames of the user's code are
unchanged.  Nothing is recorded for an operator that returns.

:meth:`ExceptionDump.record`, synchronously on the raising thread, before the exception
propagates (the process may die right after):

* the operator's inputs, whole, under the layout's normal tensor file names
  (``{op_type}.{op_name}.0.{stream}.{ts}.input.{slot}.DefaultFormat.{dtype}.npy``), in
  the iteration folder ``{net}/{graph_id}/{iteration}/``;
* ``exception.json`` there (:data:`~opdump.format.layout.EXCEPTION_JSON`, rewritten whole
  with every exception of that folder): op, op type, overload, the error text and type,
  source line and stack, the arguments (tensors by slot) and the non-tensor arguments;
* ``repro_<op_type>-op<N>.py`` (:mod:`.repro`), a standalone numpy/torch script;
* the manifest, so a reader sees the files even if the process dies now.

A run in which nothing raised writes the run's metadata and a manifest all the same, from
the session's start (:meth:`ExceptionDump.attach`): ``opdump ls`` says that no operator raised.

Guarantees: nothing here raises into the user's code (a failure costs one warning, the
user's exception still propagates); each distinct (operator, exception type, message) is
dumped once per session (the same scope, operator type, exception type and message is the
same error, whatever its ``-op<N>`` and a module's call count ``@N``) and at most :data:`MAX_DUMPS` per session (code that catches an
operator's exception on purpose, every step, fills no disk); an exception already dumped
by an inner capture is not dumped again (:func:`was_dumped`).

CUDA (untested: no GPU in this project's test machines): a device-side assert is
reported asynchronously by CUDA, at a later operator or sync, and leaves the CUDA
context unusable.  The record says ``"device_side": true``; inputs that cannot be copied
any more are listed with ``"saved": false`` and the reason; the note in the JSON and the
script says to re-run with ``CUDA_LAUNCH_BLOCKING=1`` so that the failing kernel's own
operator raises.
"""
from __future__ import annotations

import collections
import json
import os
import re
import sys
import threading
import traceback
import warnings
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import torch

from ..format.dtypes import dtype_name
from ..format.files import DEFAULT_FORMAT, tensor_file_name
from ..format.layout import EXCEPTION_JSON
from .repro import Arguments, non_tensor_arguments, qualified_op, render_script, source_of, stored_kind

#: distinct exceptions dumped per session at most
MAX_DUMPS = 64
_REPEAT = re.compile(r"@\d+(?=/|-|$)")        # the call count a scope gets for a module's later calls
_MARKERS = ("device-side assert", "CUDA error", "CUBLAS_STATUS", "cudaError", "an illegal memory access")

# Exceptions already dumped (by id, type and args: exceptions take no weak references).
# Checked while the exception propagates, so an id is not yet reused.
_dumped: Deque[Tuple[int, type, tuple]] = collections.deque(maxlen=32)
_dumped_lock = threading.Lock()


def _key(exc: BaseException) -> Tuple[int, type, tuple]:
    return id(exc), type(exc), exc.args


def was_dumped(exc: BaseException) -> bool:
    """Was ``exc`` raised by an operator whose exception dump already ran?  (The graph
    dispatcher re-raises such an exception as the user's own instead of treating it as a
    failure of the dump path.)"""
    key = _key(exc)
    with _dumped_lock:
        return key in _dumped


def _mark(exc: BaseException) -> None:
    with _dumped_lock:
        _dumped.append(_key(exc))


# Exceptions raised by an operator of the user's program on a graph dump path (marked by
# :func:`guard`, in every mode): the graph dispatcher lets them propagate as the user's own
# instead of treating them as a failure of the dump (README, "Graph mode").
_raised: Deque[Tuple[int, type, tuple]] = collections.deque(maxlen=32)


def raised_by_operator(exc: BaseException) -> bool:
    """Did ``exc`` leave an operator node of a dump-path graph (the operator call itself, not
    a tap and not the graph's machinery)?"""
    key = _key(exc)
    with _dumped_lock:
        return key in _raised


def mark_raised_by_operator(exc: BaseException) -> None:
    """``exc`` is leaving code of the user's program (an operator node: :func:`guard`)."""
    with _dumped_lock:
        _raised.append(_key(exc))


def _warn(message: str, src=None) -> None:
    """A warning (at the user's line ``src`` when known) that cannot raise (``-W error`` makes
    ``warnings.warn`` raise)."""
    try:
        if src is not None:
            warnings.warn_explicit(message, RuntimeWarning, src.file, src.line)
        else:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Exception:  # noqa: BLE001
        try:
            print(message, file=sys.stderr)
        except Exception:  # noqa: BLE001
            pass


def device_side(exc: BaseException) -> bool:
    """Does ``exc`` look like a CUDA error (a device-side assert surfacing)?"""
    accelerator = getattr(torch, "AcceleratorError", None)
    if accelerator is not None and isinstance(exc, accelerator):
        return True
    text = str(exc)
    return any(m in text for m in _MARKERS)


def repro_script_name(op_type: str, index: int) -> str:
    """``repro_<op_type>-op<N>.py``: the repro script of one raising operator in its folder."""
    from ..format.names import sanitize
    return f"repro_{sanitize(op_type)}-op{int(index)}.py"


class ExceptionDump:
    """One session's exception dump: :meth:`record` is called by a front-end's ``except``."""

    def __init__(self, session):
        self.session = session
        self.dumped = 0
        self._seen: set = set()
        self._records: Dict[str, List[dict]] = {}    # folder -> its exception.json records
        self._lock = threading.Lock()
        self._warned_limit = False

    def attach(self) -> None:
        """The run's metadata is written when the session starts (:meth:`write_metadata`
        ``at_start``, called by the session once its folder is open): a run in which no
        operator raised still leaves ``config.json``, ``data_dump.json`` and a manifest,
        ``exceptions`` 0 (``opdump ls``: "no operator raised", "... so far (the run did not
        finish)" while ``complete`` is false, a run killed in its first iteration included);
        an empty rank folder is a dump that never started.  At each iteration end and at close
        the layout is used, which fixes the rank: a later ``init_process_group`` that gives
        another rank moves the metadata to that rank's folder (``Session._make_layout``)."""
        session = self.session
        session.on_iteration_end(lambda iteration: self.write_metadata())
        session.on_close(self.write_metadata)

    def write_metadata(self, at_start: bool = False) -> None:
        """The session's layout made (it writes the metadata and the manifest) or confirmed
        unless dumping stopped.  Never raises."""
        session = self.session
        try:
            if not session.enabled or session._forked or session.writer.failed:
                return
            if at_start:
                session.write_metadata_at_start()
            else:
                session.layout      # noqa: B018 - made (or its rank confirmed) on first use
        except Exception as failure:  # noqa: BLE001 - never into the user's code
            _warn(f"opdump: the exception dump could not write the run's metadata: {type(failure).__name__}: "
                  f"{failure}")

    def record(self, op, func, args: Sequence[Any], kwargs: Dict[str, Any], exc: BaseException,
               graph_id: int, sources: Sequence = ()) -> None:
        """Dump the call ``func(*args, **kwargs)`` of ``op`` (an OpInfo), which raised ``exc``.
        Never raises; never changes ``exc``."""
        try:
            if was_dumped(exc):
                return
            _mark(exc)
            session = self.session
            if session is None or not session.enabled or session._closed or session.writer.failed:
                return
            # the same error again (another call of the module: scope@N, -opN): once
            key = (_REPEAT.sub("", op.scope), op.op_type, type(exc), str(exc))
            with self._lock:
                if key in self._seen:
                    return
                if self.dumped >= MAX_DUMPS:
                    if not self._warned_limit:
                        self._warned_limit = True
                        _warn(f"opdump: {MAX_DUMPS} operator exceptions dumped in this session; later ones "
                              "are not dumped")
                    return
                self._seen.add(key)
                self.dumped += 1
            folder, missing = self._write(op, func, args, kwargs, exc, graph_id, sources)
            if session.writer.failed:
                return                  # the writer has said it once: dumping stopped
            lost = f" ({missing} input(s) could not be saved, see exception.json)" if missing else ""
            _warn(f"opdump: {op.full_name} raised {type(exc).__name__}; its inputs, exception.json and "
                  f"{repro_script_name(op.op_type, op.index)} are in {folder}{lost}", source_of(sources)[0])
        except Exception as failure:  # noqa: BLE001 - the user's exception must stay the one raised
            _warn(f"opdump: the exception dump of {getattr(op, 'full_name', 'an operator')} failed: "
                  f"{type(failure).__name__}: {failure}")

    # ------------------------------------------------------------------ files
    def _write(self, op, func, args, kwargs, exc, graph_id: int, sources) -> Tuple[str, int]:
        """Inputs, repro script, exception.json and the manifest; (folder, inputs not saved)."""
        session = self.session
        layout = session.layout
        iteration = session.iteration
        folder = session.iteration_dir(graph_id)
        encoded = Arguments(args, kwargs)
        on_device = device_side(exc)
        inputs, rows = self._save_inputs(layout, folder, op, encoded.tensors, on_device)
        src, where = source_of(sources)
        namespace, name, overload = qualified_op(func)
        script = repro_script_name(op.op_type, op.index)
        notes = []
        if on_device:
            notes.append("CUDA reports a device-side assert asynchronously, at a later operator or sync: the "
                         "operator named here is where it surfaced. Re-run the training with "
                         "CUDA_LAUNCH_BLOCKING=1 so that the failing kernel's own operator raises.")
        if not encoded.exact:
            notes.append("some arguments could not be recorded faithfully: " + "; ".join(encoded.unsupported))
        if namespace != "aten":
            notes.append(f"torch.ops.{namespace} must be registered (import the library that defines it) "
                         "before the script calls it")
        message = str(exc)
        record = {
            "op": op.full_name, "op_type": op.op_type, "overload": overload, "order": op.index,
            "call": f"torch.ops.{namespace}.{name}.{overload}",
            "exception_type": f"{type(exc).__module__}.{type(exc).__qualname__}".replace("builtins.", ""),
            "message": message,
            "traceback": traceback.format_exception_only(type(exc), exc)[-1].rstrip("\n")[:2000],
            "source": where, "code": src.code if src is not None else "",
            "stack": [f"{s.file}:{s.line} {s.function}: {s.code}" for s in sources],
            "args": encoded.args_json, "kwargs": encoded.kwargs_json,
            "non_tensor_args": non_tensor_arguments(func, args, kwargs, encoded),
            "inputs": inputs, "repro": script, "repro_exact": encoded.exact,
            "device_side": on_device, "notes": notes,
        }
        with self._lock:
            records = self._records.setdefault(folder, [])
            records.append(record)
            body = {"iteration": iteration, "graph": graph_id, "exceptions": list(records)}
        text = render_script(script=script, op=(namespace, name, overload), full_name=op.full_name,
                             exc_type=type(exc).__name__, message=message, source=where, iteration=iteration,
                             graph=graph_id, inputs=rows, encoded=encoded, notes=notes)
        layout.write_small(layout.place(folder, script), text.encode("utf-8"))
        layout.write_small(layout.place(folder, EXCEPTION_JSON),
                           (json.dumps(body, indent=1, allow_nan=False) + "\n").encode("utf-8"))
        session._write_manifest(complete=False)
        return folder, sum(not i["saved"] for i in inputs)

    def _save_inputs(self, layout, folder: str, op, tensors: Sequence[torch.Tensor],
                     on_device: bool) -> Tuple[List[dict], List[tuple]]:
        """Each input tensor written whole, now (no writer thread): (JSON entries, script rows)."""
        clock = self.session.recorder.clock
        entries, rows = [], []
        for slot, t in enumerate(tensors):
            dtype = dtype_name(t.dtype)
            entry: Dict[str, Any] = {"slot": slot, "dtype": dtype, "shape": list(t.shape),
                                     "stride": _stride(t), "device": str(t.device)}
            file = None
            try:
                file = self._save_one(layout, folder, op, slot, t, clock(), dtype)
                entry.update(saved=True, file=file)
            except Exception as exc:  # noqa: BLE001 - this input is missing, the record says why
                entry.update(saved=False, reason=f"{type(exc).__name__}: {exc}"[:500])
                if on_device:
                    entry["reason"] += " (the CUDA context is unusable after a device-side assert)"
            entries.append(entry)
            rows.append((file, str(t.dtype).replace("torch.", ""), stored_kind(t.dtype), list(t.shape),
                         _stride(t) or [], str(t.device)))
        return entries, rows

    def _save_one(self, layout, folder: str, op, slot: int, t: torch.Tensor, ts: int, dtype: str) -> str:
        from ..write.dtypes import to_numpy
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
            raise TypeError(f"tensor subclass {type(t).__name__} is not saved")
        if t.layout is not torch.strided or t.is_meta:
            raise TypeError(f"a {t.layout} {'meta ' if t.is_meta else ''}tensor is not saved")
        host = t.detach()
        if host.is_conj():
            host = host.resolve_conj()
        if host.is_neg():
            host = host.resolve_neg()
        host = host.to("cpu", copy=True).contiguous()        # synchronous: this file must exist now
        stream = int(torch.cuda.current_stream(t.device).stream_id) if t.is_cuda else 0
        name = tensor_file_name(op.file_stem, 0, stream, ts, "input", slot, DEFAULT_FORMAT, dtype)
        path = layout.place(folder, name)
        layout.save_npy(path, to_numpy(host))
        return os.path.basename(path)


def _stride(t: torch.Tensor) -> Optional[List[int]]:
    try:
        return list(t.stride())
    except Exception:  # noqa: BLE001 - layouts without strides
        return None


# ---------------------------------------------------------------------- graph mode
def guard_operators(gm, runtime, nodes: Sequence) -> None:
    """Point each operator node of ``gm`` (``nodes``, aligned with ``runtime.ops``) at a guard
    (:func:`guard`) and recompile: the graph computes the same values, by FX codegen, and an
    operator that raises is marked as the user's error (:func:`raised_by_operator`) and, with
    the exception dump on, dumped.  No other node is added.  Every dump-path graph is guarded
    (after its taps are in: the taps stay outside the guards); ``uninstrument`` puts the
    targets back (``opdump_target``)."""
    for node, op in zip(nodes, runtime.ops):
        target = node.target
        overload = target if isinstance(target, torch._ops.OpOverload) else \
            getattr(getattr(torch.ops.aten, op.op_type), op.overload)    # a stand-in (a tolerant view)
        node.target = guard(runtime, op.index, target, overload)
    for node in gm.graph.nodes:     # the program's other calls: assertions (``_assert_async``), higher-order
        if node.op == "call_function" and isinstance(node.target, _CALLS):     # operators (auto_functionalized)
            node.target = guard(None, -1, node.target, None)       # marked, never dumped (no OpInfo)
    gm.graph.lint()
    gm.recompile()


_CALLS = (torch._ops.OpOverload, torch._ops.HigherOrderOperator)


def guard(runtime, index: int, target, op_overload):
    """The callable an operator node runs instead of ``target``: ``target`` itself, and on an
    exception a mark (:func:`raised_by_operator`), the session's exception dump when there is
    one, then the same exception re-raised.
    ``op_overload`` is the ATen overload the repro script calls (``target`` may be a
    stand-in, e.g. the view that tolerates real strides)."""

    def opdump_guarded_operator(*args, **kwargs):
        try:
            return target(*args, **kwargs)
        except Exception as exc:
            mark_raised_by_operator(exc)
            session = getattr(runtime, "session", None)   # None once the session closed (detached runtime)
            dump = getattr(session, "exception_dump", None)
            if dump is not None:
                op = runtime.ops[index]
                dump.record(op, op_overload, args, kwargs, exc, runtime.graph_id, op.source)
            raise

    opdump_guarded_operator.opdump_target = target
    return opdump_guarded_operator


def compiled_call_failed(capture, exc: BaseException) -> None:
    """A graph call that did not run operator by operator raised (the capture failed earlier,
    or the device is not in ``support_device``): no operator can be named, so one warning
    says which graph it was (README, "Debug dumps")."""
    if was_dumped(exc):
        return
    _mark(exc)
    try:
        why = "its dump path failed earlier" if capture.failed else "its device is not dumped"
        _warn(f"opdump: {type(exc).__name__} raised inside {capture.describe()}, which ran compiled ({why}): "
              "the exception dump cannot name the operator or save its inputs")
    except Exception:  # noqa: BLE001
        pass
