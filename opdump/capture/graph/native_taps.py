"""Native graph taps: the statistics taps of a dumped ATen graph, called from its generated
code straight into C++ (``GraphTaps`` in ``opdump/stats/row_sink.cpp``).

Why: with statistics only (no tensor files), a Python tap costs ~10 µs per operator side
around the native work it calls (the bound method, the fault check, ``Recorder.record_all``'s
checks, the clock, the lock, the row sink's wrapper) — on a model with small operators
(AlexNet on CPU) more than the statistics themselves.

Guarantees:
* :func:`build` gives native taps only where ``Recorder.record_all`` would take its native fast
  path (device-statistics-only recorder, native memo and row sink built); otherwise None and
  the graph keeps its Python taps;
* a native tap appends exactly the rows and statistics ``record_all`` would (same names,
  slots, shapes, handles; consecutive timestamps from the recorder's clock), and hands any call
  it does not take to the runtime's Python taps (``GraphRuntime.tap_inputs``/``tap_outputs``);
* :func:`fast` is checked at every dumped call's start: when it no longer holds (an online
  compare, a folder filter), every tap of that call goes to the Python taps;
* the statistics a call read are carried to the later calls of the same iteration (a backward
  reads the tensors its forward saved without reading them again: ``StatsMemo.carry``/``enter``,
  called by ``GraphTaps.close``/``open``), reused only under the memo's rules (the tensor alive,
  the same memory, the same version counter value); a new iteration starts with nothing carried;
* the graph calls the taps as builtins bound to the ``GraphTaps`` object (:func:`methods`: its
  ``fast()`` ones, taking their arguments without pybind11's dispatch, when the module has them);
* ``OPDUMP_GRAPH_NATIVE_TAPS=0`` in the environment (read when a graph is instrumented) keeps
  the Python taps: the reference the parity tests compare with.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from ...stats import native
from . import faults

ENV_SWITCH = "OPDUMP_GRAPH_NATIVE_TAPS"


def enabled_by_environment() -> bool:
    return native.switched_on(ENV_SWITCH)


def fast(recorder) -> bool:
    """Whether ``recorder.record_all`` takes its native fast path for every call now."""
    return (recorder._launch is not None and recorder.folder_filter is None and recorder.bin is None
            and recorder.online is None)


def build(runtime) -> Optional[object]:
    """The native taps of ``runtime``'s graph, or None (Python taps)."""
    recorder = runtime.recorder
    if recorder is None or not enabled_by_environment() or not fast(recorder):
        return None
    sink = recorder._native_sink()           # the RowRecorder over the batch's native memo, or None
    mod = native.module()
    cls = getattr(mod, "GraphTaps", None) if mod is not None else None
    if sink is None or cls is None:
        return None
    batch = sink._batch
    return cls(batch._memo, batch._entries, batch._dtypes, torch.nn.Parameter,
               [(op.op_type, op.full_name) for op in runtime.ops], faults._armed, weakref.ref(runtime))


def methods(taps) -> tuple:
    """``(inputs, outputs, both)``: the callables the graph's generated code calls for ``taps``."""
    fast = getattr(taps, "fast", None)
    bound = fast() if fast is not None else None
    if bound is None:
        return taps.inputs, taps.outputs, taps.both
    for f in bound:     # FX's code generation names a builtin by its module (None here otherwise)
        f.__module__ = type(taps).__module__
    return tuple(bound)
