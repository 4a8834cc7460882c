"""What a dump-path graph calls while it runs: :class:`GraphRuntime`.

The taps that :mod:`.instrument` inserts are bound methods of one runtime per
ATen graph, so the graph's generated code holds its runtime and nothing else
does: when Dynamo drops the graph (``torch._dynamo.reset()``), the runtime goes
with it.  The runtime holds its session only until the session closes
(:meth:`GraphRuntime.detach`), so a compiled model that outlives its session
does not keep the session's writer, recorder and buffers alive.

Guarantees:
* no exception leaves a tap: a failure marks the graph's capture failed (one
  warning naming the graph, see ``_GraphCapture.fail``), every runtime of that
  capture stops recording, and the graph call goes on unchanged — the taps
  only read tensors, so the values the graph computes are the same;
* a detached or failed runtime records nothing, at the cost of one attribute
  test per tap;
* lifted constants are written once, at the graph's first dumped call, outside
  any fake-tensor mode (README, "Output layout": constants).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch.utils import _pytree as pytree

from ..op_info import OpInfo
from . import faults, native_taps


class GraphRuntime:
    """Per-graph state the taps need: the session, the graph id, the operators."""

    def __init__(self, owner, session, graph_id: int, kind: str, ops: Sequence[OpInfo],
                 params: Sequence[Tuple[int, str]], constants: Sequence[Tuple[str, torch.Tensor]] = ()):
        self.owner = owner                   # the capture this graph belongs to (its fail())
        self.session = session
        self.recorder = session.recorder
        self.graph_id = graph_id
        self.kind = kind
        self.ops = list(ops)
        self.params = list(params)           # (placeholder position, dump name)
        self.constants: List[Tuple[str, torch.Tensor]] = list(constants)   # written at the first dumped call
        self.folder: Optional[str] = None    # set while a dumped call runs
        self.kernel_args = session.config.save_kernel_args
        self.native = None                   # native statistics taps (.native_taps), set by instrument
        # a call of a graph whose operators write nothing but fresh outputs is a hold window:
        # tensor files written from the tensors' own memory (opdump/recorder/held.py); a dump
        # writing no tensor file (statistics only) opens none (nothing would be held in it)
        cfg = session.config
        self.holding = (cfg.dump_tensors and cfg.graph_dump != "kernels"
                        and not any(op.mutates for op in self.ops))
        self._window = None                  # the open hold window (recorder/held.Window) of the call in progress

    def _close_window(self) -> None:
        """End of the hold window: held tensors copied unless private (opdump/recorder/held.py)."""
        window, self._window = self._window, None
        if window is not None:
            self.recorder.holds.close(window)

    def call_raised(self) -> None:
        """The dumped call raised and the user's error propagates (.capture): its hold window
        closes now, before any user code runs, as the end tap would have closed it."""
        if self._window is not None and self.recorder is not None:
            try:
                self._close_window()
            except Exception:  # noqa: BLE001 - the dump must never break the step
                pass

    def detach(self) -> None:
        """Stop recording for good and drop every reference to the session (close or failure)."""
        self.folder = None
        if self._window is not None:
            try:
                self._close_window()
            except Exception:  # noqa: BLE001 - the dump must never break the step
                pass
        self.session = self.recorder = None
        self.constants = []
        if self.native is not None:
            self.native.release()

    # ------------------------------------------------------------------ taps (called by the graph)
    def begin(self, placeholders: Sequence) -> None:
        """First node of the graph: opens the iteration folder when the iteration dumps."""
        self.folder = None
        session = self.session
        if session is None:
            return
        try:
            faults.check("call")
            session.note_graph_ran(self.graph_id)
            if not session.is_dumping():
                return
            folder = session.iteration_dir(self.graph_id)
            recorder = self.recorder
            if self.native is not None:      # first: the parameters below may use values carried in the memo
                self.native.open(recorder, folder, native_taps.fast(recorder), session.iteration)
            if self.holding:
                self._close_window()             # a call that never reached its end (it raised)
                self._window = recorder.holds.open()
            if self.constants:
                constants, self.constants = self.constants, []
                recorder.record_parameters(session.layout.constants_dir(self.graph_id), constants, self._window)
            if self.params:
                recorder.record_parameters(folder, [(name, placeholders[position]) for position, name in self.params
                                                    if isinstance(placeholders[position], torch.Tensor)],
                                          self._window)
            if self.kernel_args:
                for op in self.ops:
                    if op.selected:
                        recorder.record_kernel_args(folder, op)
            self.folder = folder
        except Exception as exc:  # noqa: BLE001 - the dump must never break the step
            self._failed(exc, "the start of a dumped call")

    def end(self) -> None:
        """Last node before the output: collects this call's statistics."""
        if self.folder is None:
            return
        self.folder = None
        try:
            if self.native is not None:
                self.recorder.tensors_recorded += self.native.close()
            self._close_window()
            self.recorder.flush_statistics()
        except Exception as exc:  # noqa: BLE001
            self._failed(exc, "the end of a dumped call")

    def tap_inputs(self, index: int, tensors, files: bool = True) -> None:
        folder = self.folder
        if folder is None:
            return
        try:
            faults.check("tap")
            self.recorder.record_all(folder, self.ops[index], "input", tensors, files, self._window)
        except Exception as exc:  # noqa: BLE001
            self._failed(exc, f"the inputs of {self.ops[index].full_name}")

    def tap_outputs(self, index: int, value, files: bool = True) -> None:
        folder = self.folder
        if folder is None:
            return
        op = self.ops[index]
        try:
            faults.check("tap")
            # Output slots are positions among the output's leaves, so a None output
            # (e.g. convolution_backward's grad_input of a first layer) keeps its slot.
            if isinstance(value, torch.Tensor):
                leaves = (value,)
            elif isinstance(value, (tuple, list)) and all(v is None or isinstance(v, torch.Tensor) for v in value):
                leaves = value           # the usual multi-output form: no pytree walk
            else:
                leaves = pytree.tree_leaves(value)
            recorder = self.recorder
            if op.mutates:                 # written in place: what was recorded of it before is stale
                for t in leaves:
                    if isinstance(t, torch.Tensor):
                        recorder.forget(t)
            recorder.record_all(folder, op, "output", leaves, files, self._window)
        except Exception as exc:  # noqa: BLE001
            self._failed(exc, f"the outputs of {op.full_name}")

    def _failed(self, exc: BaseException, where: str) -> None:
        self.folder = None
        if self.native is not None:
            self.native.close()
        try:
            self.owner.fail(exc, f"graph {self.graph_id} ({self.kind}), at {where}")
        except Exception:  # noqa: BLE001 - even the warning must not reach the step
            self.detach()
