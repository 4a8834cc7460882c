"""The per-operator path of eager capture: the dispatch mode, and what happens to one
operator of a dumped iteration -- where it runs (:class:`.state.Phase`), its scope and
source lines, its name, its listing entry, and its recorded inputs and outputs.

Split from :mod:`.mode` (lifecycle, iterations, hooks) because this is the hot path: it
runs for every ATen operator of a dumped iteration, so everything per overload is read
once (:mod:`.schema`) and the stack is walked at most once per operator, except for an
operator first seen in a later iteration (see :mod:`.state`).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...debug.overflow import needs_prewrite_copy
from ..naming import backward_scope
from ..op_info import OpInfo
from .collectives import collectives_of
from .schema import facts_of
from .scopes import _scope_of, is_compiled_wrapper as _is_wrapper
from .skipped import skipped_frame
from .sources import walk
from .state import TOP, IterationState, Phase
from .values import arg_text, flat_tensors, has_nonfinite_arg, meta, non_tensor_args, output_slots, tensors_at

_current_node = torch._C._current_autograd_node
_get_sequence_nr = torch.autograd._get_sequence_nr
_ACCUMULATE = "torch::autograd::AccumulateGrad"
_DETACH = torch.ops.aten.detach.default
_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
_AD_INPLACE_OR_VIEW = torch._C.DispatchKey.ADInplaceOrView


def observation_only(func) -> bool:
    """True for a call that exists only because a dispatch mode is watching: a ``detach``
    that did not come through the dispatcher.

    Under any dispatch mode, ``TensorImpl::shallow_copy_and_detach`` (autograd saving an
    operator's output for backward and unpacking it again, ``.data``, ``tensor_data()``)
    calls the Python interpreter's ``detach`` directly, where plain eager copies the
    ``TensorImpl`` with no dispatcher call at all.  A real ``aten::detach`` (the user's
    ``x.detach()``, AccumulateGrad's) reaches the mode through the dispatcher's Python key,
    whose fallback excludes every key above it -- ``ADInplaceOrView`` among them -- from
    the thread's dispatch; the direct call runs with the thread's ordinary key set, where
    ``ADInplaceOrView`` is not excluded (inference mode drops it from the *included* set
    instead).  Only ``detach`` is checked: one identity test per operator.
    """
    return func is _DETACH and not _excluded(_AD_INPLACE_OR_VIEW)


class _DumpMode(TorchDispatchMode):
    """The dispatch mode; everything but the not-dumping fast path is in :class:`~.mode.EagerCapture`."""

    def __init__(self, capture: "OperatorPath"):
        super().__init__()
        self.capture = capture
        self.session = capture.session

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile keeps compiling with this mode on the stack (a mode that does not
        # ignore compile internals makes Dynamo skip every frame).
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DETACH and not _excluded(_AD_INPLACE_OR_VIEW):
            # the mode's own artefact (see observation_only): plain eager runs no operator here
            return func(*args, **kwargs) if kwargs else func(*args)
        cap = self.capture
        if cap._checked != self.session.iteration:
            cap._refresh()
        if cap._unsettled:
            cap._settle()
        if not cap._dumping or cap._internal:
            return func(*args, **kwargs) if kwargs else func(*args)
        return cap._dispatch(func, args, kwargs or {})


def _register(state, info) -> None:
    """The forward operator running now owns autograd's last sequence number and any number
    taken since the last one registered (autograd's clone of an in-place operator's original
    input takes one after the in-place operator's node: that node is this operator's too)."""
    nr = _get_sequence_nr() - 1
    hi = state.seq_hi
    lo = hi + 1 if 0 <= hi < nr <= hi + 16 else nr
    for n in range(lo, nr + 1):
        state.seq.setdefault(n, info)
    if nr > hi:
        state.seq_hi = nr


class OperatorPath:
    """The per-operator methods of :class:`~.mode.EagerCapture` (which sets the attributes
    they read: ``session``, ``tracker``, ``listing``, ``_state``, ``_optimizers``,
    ``capture_all``, ``_select_all``, ``_dump_in``, ``_dump_out``, ``_kernel_args``,
    ``_selected``, ``_unsettled``, ``_overflow``, ``_watcher``)."""

    def _settle(self) -> None:
        """The in-place operator whose outputs were recorded last has returned (autograd
        bumped their versions after the mode): their recordings take the new version."""
        tensors, self._unsettled = self._unsettled, []
        settle = self.session.recorder.settle
        for t in tensors:
            settle(t)

    def _backward_scope(self, state: IterationState, node) -> Tuple[str, Tuple[str, ...], Tuple]:
        """Scope, module ids and source lines of the forward operator a backward node belongs to."""
        nr = node._sequence_nr()
        info = state.seq.get(nr)
        if info is None:        # a forward of the iteration before (a step that ends between them)
            info = state.before.get(nr)
        if info is None and node.name() == _ACCUMULATE:
            var = getattr(node, "variable", None)
            owner = state.owners.get(id(var)) if var is not None else None
            if owner is not None:
                module_id, pairs, root = owner
                info = state.modules.get(module_id) or (_scope_of(pairs, root), ())
                info = (info[0], info[1], ())
        if info is None:
            info = TOP
        return backward_scope(info[0]), info[1], info[2]

    def _phase(self, state: IterationState, node) -> Optional[Phase]:
        """Where the operator runs; None when the capture leaves it alone."""
        if node is not None:
            if node.name().startswith("CompiledFunction"):
                return None
            return Phase.RECOMPUTE if self.tracker.again and self.tracker.stack else Phase.BACKWARD
        if self._optimizers:
            return Phase.OPTIMIZER
        if self.tracker.stack:
            return Phase.MODULE
        if self.capture_all:
            return Phase.OUTSIDE
        _register(state, TOP)
        return None

    def _dispatch(self, func, args, kwargs):
        state = self._state
        if state is None:
            return func(*args, **kwargs)
        node = _current_node()
        phase = self._phase(state, node)
        if phase is None:
            return func(*args, **kwargs)
        facts = facts_of(func)
        if facts.types is None:
            return func(*args, **kwargs)
        first = state.first
        if phase is Phase.BACKWARD and not first:
            # a backward operator's compiled region is its node (checked above), and it shows
            # its forward operator's lines: no stack walk
            sources = ()
        else:
            compiled, sources = walk(2, first)      # (this frame and the mode's skipped)
            if compiled:
                return func(*args, **kwargs)
        if self._exception is not None:         # op_debug_mode 4: named only if it raises
            return self._run_guarded(state, phase, node, facts, sources, func, args, kwargs)
        scope, ids, sources = self._scope(state, phase, node, sources)
        index = state.n
        state.n = index + 1
        op_type, overload = facts.types
        op = OpInfo(index, op_type, scope, overload, ids, sources)
        name = op.full_name
        listed = self.listing.ops.get(name)
        describe = listed is None
        if describe:
            if not first and not sources:
                sources = op.source = walk(2, True)[1]
            op.nonfinite_args = has_nonfinite_arg(args, kwargs)
        else:
            sources = listed.source
            if not listed.nonfinite_args and has_nonfinite_arg(args, kwargs):
                listed.nonfinite_args = True        # seen in a later iteration: the listing says so
                self.listing.dirty = True
            if self._overflow is not None:      # the watch reports these of a later iteration too
                op.nonfinite_args = listed.nonfinite_args and has_nonfinite_arg(args, kwargs)
                op.source = sources
        if phase <= Phase.MODULE:
            _register(state, (scope, ids, sources))
        state.names.append(name)
        return self._run(state, op, describe, func, args, kwargs, facts)

    def _run(self, state: IterationState, op: OpInfo, describe: bool, func, args, kwargs, facts):
        """Run a captured operator: its inputs recorded before, its outputs after."""
        if self._overflow is not None:
            return self._run_watched(op, describe, func, args, kwargs, facts)
        if self._watcher is not None:
            return self._run_watcher(op, describe, func, args, kwargs, facts)
        selected = True if self._select_all else self._select(op)
        op.selected = selected
        kernel_args = selected and self._kernel_args
        if describe or kernel_args:
            op.args = non_tensor_args(func, args, kwargs)
        recorder = self.session.recorder
        dump_in = selected and self._dump_in
        inputs = flat_tensors(args, []) if (dump_in or describe) else ()
        if kwargs and (dump_in or describe):
            flat_tensors(kwargs.values(), inputs)
        if selected:
            folder = state.folder or self._folder(state)
            if dump_in and inputs:
                recorder.record_all(folder, op, "input", self._on_allowed_devices(inputs))
            if kernel_args:
                recorder.record_kernel_args(folder, op)
        out = func(*args, **kwargs)
        written = ()
        if selected and facts.writes:      # its arguments changed: recorded copies/statistics are stale
            written = tensors_at(args, kwargs, facts.written)
            # ``_foreach_*`` ops do not bump version counters under a dispatch mode, so views
            # of what they wrote are not guarded: forget every argument, as the safe side
            for t in (flat_tensors(args, flat_tensors(kwargs.values(), [])) if facts.writes_list else written):
                recorder.forget(t)
        dump_out = selected and self._dump_out
        if dump_out or describe:
            outputs = tensors_at(args, kwargs, facts.mutated) if facts.mutated else output_slots(out)
            if dump_out:
                # a collective's outputs: recorded when its work completes (.collectives)
                if outputs and not (facts.collective and collectives_of(self).defer(state, op, out, args, outputs)):
                    recorder.record_all(state.folder or self._folder(state), op, "output",
                                        self._on_allowed_devices(outputs))
                if written:
                    self._unsettled = written
            if describe:
                self._describe(op, args, kwargs, inputs, outputs)
        if describe:
            self.listing.add(op)
        return out

    def _run_watched(self, op: OpInfo, describe: bool, func, args, kwargs, facts):
        """``op_debug_mode`` 3: run the operator and hand it to the overflow watch
        (:mod:`opdump.debug.overflow`), which records it only if it overflows.  Arguments the
        operator writes are cloned before it runs (the watch keeps references, not copies,
        of everything else, and judges its batch before any write to a tensor it holds)."""
        watch = self._overflow
        if describe:
            op.args = non_tensor_args(func, args, kwargs)
        inputs = flat_tensors(args, [])
        if kwargs:
            flat_tensors(kwargs.values(), inputs)
        saved, cloned, written = inputs, (), ()
        if facts.writes:
            written = inputs if facts.writes_list else tensors_at(args, kwargs, facts.written)
            watch.before_write(written)
            if facts.writes_list or needs_prewrite_copy(op.op_type, op.overload, op.nonfinite_args, args):
                saved, cloned = watch.copy_written(inputs, written, op, args, kwargs)
        out = func(*args, **kwargs)
        if written:      # recorded copies of what it wrote are stale
            forget = self.session.recorder.forget
            for t in written:
                forget(t)
        outputs = tensors_at(args, kwargs, facts.mutated) if facts.mutated else output_slots(out)
        watch.add(op, saved, outputs, op.nonfinite_args, cloned, args=args, kwargs=kwargs)
        if describe:
            self._describe(op, args, kwargs, inputs, outputs)
            self.listing.add(op)
        return out

    def _run_watcher(self, op: OpInfo, describe: bool, func, args, kwargs, facts):
        """Watcher mode: run the operator, then hand its outputs and the arguments it declares
        to write to the watcher (:mod:`opdump.debug.watcher`), which records watched outputs."""
        if describe:
            op.args = non_tensor_args(func, args, kwargs)
        written = ()
        if facts.writes:
            written = (flat_tensors(args, flat_tensors(kwargs.values(), [])) if facts.writes_list
                       else tensors_at(args, kwargs, facts.written))
        out = func(*args, **kwargs)
        if written:      # recorded copies of what it wrote are stale
            forget = self.session.recorder.forget
            for t in written:
                forget(t)
        outputs = tensors_at(args, kwargs, facts.mutated) if facts.mutated else output_slots(out)
        self._watcher.after(op, outputs, written)
        if describe:
            inputs = flat_tensors(args, [])
            if kwargs:
                flat_tensors(kwargs.values(), inputs)
            self._describe(op, args, kwargs, inputs, outputs)
            self.listing.add(op)
        return out

    def _run_guarded(self, state: IterationState, phase: Phase, node, facts, sources, func, args, kwargs):
        """``op_debug_mode`` 4: run the operator; only if it raises is it named (as a mode-0
        dump names it) and handed to the exception dump (:mod:`opdump.debug.exception`:
        inputs, exception.json, repro script, written before this returns); then the very
        same exception is re-raised."""
        index = state.n
        state.n = index + 1
        if phase is Phase.MODULE:           # what a backward operator's scope is looked up from
            top = self.tracker.stack[-1]
            _register(state, (top.scope, top.ids, sources))
        elif phase is Phase.OUTSIDE:
            _register(state, (TOP[0], TOP[1], sources))
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            scope, ids, sources = self._scope(state, phase, node, sources)
            op = OpInfo(index, facts.types[0], scope, facts.types[1], ids,
                        sources or walk(1, True)[1])    # the stack as it is now: the user's line
            self._exception.record(op, func, args, kwargs, exc, self.graph_id, op.source)
            raise

    def _scope(self, state: IterationState, phase: Phase, node, sources) -> Tuple[str, Tuple[str, ...], Tuple]:
        """(scope, module ids, source lines) of an operator running in ``phase``."""
        if phase is Phase.MODULE:
            top = self.tracker.stack[-1]
            if _is_wrapper(top.module):         # a frame Dynamo skipped below a compiled root (.skipped)
                top = skipped_frame(top, self.tracker) or top
            return top.scope, top.ids, sources
        if phase is Phase.BACKWARD:
            scope, ids, forward_sources = self._backward_scope(state, node)
            return scope, ids, forward_sources or sources
        if phase is Phase.RECOMPUTE:        # a forward made again in the backward (mode.py _module_again)
            top = self.tracker.stack[-1]
            return backward_scope(top.scope), top.ids, sources
        if phase is Phase.OPTIMIZER:
            return f"Default/optimizer-{self._optimizers[-1]}", (), sources
        return TOP[0], TOP[1], sources

    def _on_allowed_devices(self, tensors: List[Optional[torch.Tensor]]) -> List[Optional[torch.Tensor]]:
        """``tensors``, with None in the slots of tensors on devices ``support_device`` excludes."""
        for t in tensors:
            if t is not None and not t.is_cpu:
                allowed = self.session.device_allowed
                return [t if t is None or t.is_cpu or allowed(t.device) else None for t in tensors]
        return tensors

    def _select(self, op: OpInfo) -> bool:
        selector = self.session.selector
        if selector.mode != 1:
            return selector.select(op)
        name = op.full_name
        hit = self._selected.get(name)
        if hit is None:
            if len(self._selected) > 1_000_000:
                self._selected.clear()
            hit = self._selected[name] = selector.select(op)
        return hit

    def _describe(self, op: OpInfo, args, kwargs, inputs, outputs) -> None:
        """Shapes, dtypes and the argument text of ``op`` for the listing."""
        op.input_meta = [meta(t) for t in inputs]
        op.output_meta = [meta(t) for t in outputs if t is not None]
        op.node_name = op.op_type
        producers = self.listing.producers
        text = ", ".join(arg_text(a, producers) for a in args)
        if kwargs:
            text += "".join(f", {k}={arg_text(v, producers)}" for k, v in kwargs.items())
        op.arg_text = text.lstrip(", ")
        if len(outputs) == 1:
            if outputs[0] is not None:
                producers[outputs[0]] = f"%{op.index}"
        else:
            for k, t in enumerate(outputs):
                if t is not None:
                    producers[t] = f"%{op.index}[{k}]"
