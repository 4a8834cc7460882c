"""Collective operators (torch.distributed's ``c10d`` ops) in the eager capture: their
outputs are recorded when the collective has completed, not when the call returns.

``c10d::allreduce_`` and the other collectives (``broadcast_``, ``allgather_``,
``reduce_scatter_``, ``_allgather_base_``, …; README, Rank consistency) return a ``Work``
handle: the reduction may still be running when the call returns (always with
``async_op=True``, and in DDP's reducer, which waits only at the end of the backward pass).
Their schemas do not mark the tensors they write ``(a!)`` and the backends bump no version
counter, so what the call returned is no witness of the final values.

Guarantees (mode-0 dumps):

* **Inputs** are recorded before the call, as for any operator (the values each rank
  contributed).
* **Outputs** (the written argument: ``tensors`` of ``allreduce_``/``broadcast_``, the
  output tensors of the gathers/scatters, ``recv_``'s buffers) are the values the collective
  produced: a callback on the work's future (``Work.get_future().then``, run by the backend
  when the work completes, on its own thread; on CUDA ordered after the collective on the
  stream) takes a copy of them; the training thread records that copy at the next collective
  it dispatches or at the iteration's end, under the operator's own name and slots
  (``<scope>/allreduce_-opN`` ``output.k``: naming and execution order are unchanged).  A work
  already complete at the call's return is recorded at once.  Nothing waits for
  communication: no ``wait()`` the program does not do itself (a future wakes its waiters
  before it runs its callbacks, so at an iteration's end a work already complete is given
  up to a second for its callback's copy, which needs no communication).
* **Not complete at the iteration's end** (the program never waited for it in that
  iteration): its outputs are recorded when the work completes, at a later iteration's end or
  when the capture stops, in the iteration folder of the call (``late: true`` in
  ``collectives.json``); one whose work never completes before the capture stops has no
  output files (``complete: false``, one warning).
* Each dumped iteration that ran a collective gets ``collectives.json`` in its folder (written
  whole, rewritten when a late work completes): per collective its name, type, order, group
  size and world size, whether its outputs must agree across the group's ranks
  (``replicated``: all-reduce, broadcast, all-gather), and ``complete`` (its outputs were
  recorded from the completed work).  ``opdump compare --ranks`` judges collective outputs
  only from this file (:mod:`opdump.analysis.ranks`).
* A backend whose work has no future: outputs are recorded at the call's return, as any
  operator's, and ``complete`` is false.  Nothing here raises into the training code: an
  error in the callback leaves that collective ``complete: false``.

Not covered: the overflow (``op_debug_mode`` 3) and watcher modes judge collective outputs
as the call returns them.  The CUDA/NCCL path is written for torch's CUDA-aware futures but
untested on a GPU (no GPU in this project's CI).
"""
from __future__ import annotations

import json
import threading
import warnings
from collections import deque
from typing import Any, Dict, List, Optional, Tuple

import torch

from ...format.layout import COLLECTIVES_JSON


#: c10d operator -> (position, name) of the argument it writes (its outputs)
WRITTEN: Dict[str, Tuple[int, str]] = {
    "allreduce_": (0, "tensors"), "allreduce_coalesced_": (0, "tensors"), "broadcast_": (0, "tensors"),
    "reduce_": (0, "tensors"), "allgather_": (0, "output_tensors"), "_allgather_base_": (0, "output_tensor"),
    "allgather_coalesced_": (0, "output_lists"), "allgather_into_tensor_coalesced_": (0, "outputs"),
    "reduce_scatter_": (0, "output_tensors"), "_reduce_scatter_base_": (0, "output_tensor"),
    "reduce_scatter_tensor_coalesced_": (0, "outputs"), "gather_": (0, "output_tensors"),
    "scatter_": (0, "output_tensors"), "alltoall_": (0, "output_tensors"), "alltoall_base_": (0, "output"),
    "recv_": (0, "tensors"), "recv_any_source_": (0, "tensors"),
}

#: collectives whose outputs are the same on every rank of the group
REPLICATING = frozenset({"allreduce_", "allreduce_coalesced_", "broadcast_", "allgather_", "_allgather_base_",
                         "allgather_coalesced_", "allgather_into_tensor_coalesced_"})


def written_by(func) -> Optional[Tuple[Tuple[int, str], ...]]:
    """The argument positions a ``c10d`` collective writes (its outputs); None for any other operator."""
    if getattr(func, "namespace", None) != "c10d":
        return None
    spec = WRITTEN.get(getattr(func, "_opname", ""))
    return (spec,) if spec is not None else None


def _script_objects(values, kind: str) -> List[Any]:
    out = []
    for v in values if isinstance(values, (list, tuple)) else (values,):
        if isinstance(v, torch.ScriptObject):
            try:
                if v._type().name() == kind:
                    out.append(v)
            except Exception:                  # noqa: BLE001 - not one of ours
                pass
        elif isinstance(v, (list, tuple)):
            out.extend(_script_objects(v, kind))
    return out


def _future_of(out):
    """The completion future of the ``Work`` a c10d call returned, or None."""
    works = _script_objects(out, "Work")
    if not works:
        return None
    from torch._C._distributed_c10d import Work
    return Work.unbox(works[0]).get_future()


def _group_sizes(args) -> Tuple[Optional[int], Optional[int]]:
    """(size of the call's process group, world size), None where unknown."""
    try:
        import torch.distributed as dist
        from torch._C._distributed_c10d import ProcessGroup
        groups = _script_objects(list(args), "ProcessGroup")
        size = ProcessGroup.unbox(groups[0]).size() if groups else None
        world = dist.get_world_size() if dist.is_initialized() else None
        return size, world
    except Exception:                          # noqa: BLE001 - informative only
        return None, None


class _Call:
    """One collective call of a dumped iteration."""

    __slots__ = ("op", "folder", "iteration", "entry", "tensors", "future", "ready")

    def __init__(self, op, folder: str, iteration: int, entry: Dict[str, Any], tensors):
        self.op, self.folder, self.iteration, self.entry, self.tensors = op, folder, iteration, entry, tensors
        self.future = None
        self.ready = threading.Event()       # set once the completion callback has run


class Collectives:
    """The collectives of one :class:`~.mode.EagerCapture` (see the module doc).

    ``defer`` runs on the training thread inside the dispatch mode; the completion callback
    on the backend's thread only copies the outputs and queues them; ``drain``/``finish``
    record them on the training thread (the recorder is not shared across threads)."""

    def __init__(self, capture):
        self.capture = capture
        self._done: deque = deque()                       # (call, copies) from completion callbacks
        self._calls: Dict[int, List[_Call]] = {}          # iteration -> its calls (for collectives.json)
        self._folders: Dict[int, str] = {}
        self._stale: set = set()                          # iterations whose json must be rewritten
        self._ended: set = set()                          # iterations finished with calls pending
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ training thread
    def defer(self, state, op, out, args, outputs) -> bool:
        """Called after collective ``op`` returned ``out``, with its output tensors.  True: its
        outputs are recorded when its work completes; False: the caller records them now."""
        try:
            self.drain()
            recorder = self.capture.session.recorder
            for t in outputs:      # written with no version bump: a copy recorded as its input is stale
                if t is not None:
                    recorder.forget(t)
            folder = state.folder or self.capture._folder(state)
            size, world = _group_sizes(args)
            entry = {"op": op.full_name, "op_type": op.op_type, "order": op.index, "outputs": len(outputs),
                     "group_size": size, "world_size": world,
                     "replicated": op.op_type in REPLICATING, "complete": False}
            call = _Call(op, folder, state.number, entry, list(outputs))
            self._calls.setdefault(state.number, []).append(call)
            self._folders[state.number] = folder
            fut = _future_of(out)
            if fut is None:
                call.tensors = None
                return False                   # no future: recorded now, complete stays false
            if fut.done():
                entry["complete"] = True
                call.tensors = None
                return False
            call.future = fut
            fut.then(lambda _f, call=call: self._completed(call))
            return True
        except Exception:                      # noqa: BLE001 - never into the training code
            return False

    def drain(self) -> None:
        """Record the outputs of every collective completed since the last drain."""
        done = self._done
        while done:
            call, copies = done.popleft()
            cap = self.capture
            recorder = cap.session.recorder
            for t in call.tensors or ():
                if t is not None:
                    recorder.forget(t)
            call.tensors = None
            recorder.record_all(call.folder, call.op, "output", cap._on_allowed_devices(copies))
            call.entry["complete"] = True
            if call.iteration in self._ended:
                call.entry["late"] = True      # completed after its iteration had ended
            self._stale.add(call.iteration)

    def finish(self, iteration: Optional[int]) -> None:
        """An iteration ends (None: the capture stops): record what completed, write the
        iteration's ``collectives.json`` and rewrite those of earlier iterations whose works
        completed late; forget iterations with nothing pending."""
        try:
            self._settle_completed()
            self.drain()
            if iteration in self._calls:
                self._stale.add(iteration)
            for it in sorted(self._stale):
                self._write(it)
            self._stale.clear()
            for it in [i for i, calls in self._calls.items() if all(c.tensors is None for c in calls)]:
                del self._calls[it]
                self._folders.pop(it, None)
                self._ended.discard(it)
            self._ended.update(self._calls)
        except Exception:                      # noqa: BLE001 - never into the training code
            pass

    def _settle_completed(self) -> None:
        """A future marks itself complete (waking whoever waits on it) before it runs its
        callbacks: for a work already complete, let its callback (which needs no further
        communication) finish taking its copy -- at most a second, never a wait for a work
        still running."""
        for calls in self._calls.values():
            for c in calls:
                if c.tensors is not None and c.future is not None and c.future.done():
                    c.ready.wait(1.0)

    def close(self) -> None:
        """The capture stops: late completions are recorded; later ones are dropped."""
        self.finish(None)
        with self._lock:
            self._closed = True
            self._done.clear()
        pending = [c.entry["op"] for calls in self._calls.values() for c in calls if c.tensors is not None]
        if pending:
            try:
                warnings.warn(f"opdump: {len(pending)} collective(s) had not completed when the capture stopped; "
                              f"their outputs are not dumped (collectives.json: complete false): {pending[:3]}",
                              RuntimeWarning, stacklevel=2)
            except Exception:                  # noqa: BLE001 - warnings turned into errors
                pass

    def _write(self, iteration: int) -> None:
        calls = self._calls.get(iteration)
        folder = self._folders.get(iteration)
        if not calls or folder is None:
            return
        session = self.capture.session
        body = {"iteration": iteration, "rank": getattr(session, "rank", None),
                "collectives": [c.entry for c in calls]}
        layout = session.layout
        layout.write_small(layout.place(folder, COLLECTIVES_JSON), json.dumps(body, indent=1).encode())

    # ------------------------------------------------------------------ backend thread
    def _completed(self, call: _Call) -> None:
        """The work completed (on the backend's thread): copy the outputs, queue them."""
        try:
            with self._lock:
                if self._closed or call.tensors is None:
                    return
                with torch.no_grad():
                    copies = [None if t is None else t.detach().clone() for t in call.tensors]
                self._done.append((call, copies))
        except BaseException:                  # noqa: BLE001 - complete stays false
            pass
        finally:
            call.ready.set()


def collectives_of(capture) -> Collectives:
    """The capture's :class:`Collectives`, made at its first collective."""
    c = getattr(capture, "_collectives", None)
    if c is None:
        c = capture._collectives = Collectives(capture)
    return c
