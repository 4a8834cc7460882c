"""Eager capture: a ``TorchDispatchMode`` that sees every ATen operator.

``EagerCapture(session).start()`` (or ``with EagerCapture(session):``) installs

* a :class:`TorchDispatchMode` on the calling thread (autograd's engine carries
  it into the backward pass, also on CUDA worker threads);
* global module forward pre/post hooks (the module scope stack, see
  :mod:`.scopes`), and global optimizer step pre/post hooks (optimizer scope).

Decisions (README-ready):

* **Graph id.** The eager front-end takes one graph id from the session when it
  starts (``session.new_graph_id()``; ``0`` under ``opdump run``, which starts it
  before the script).  Forward, backward and optimizer operators of an
  iteration all live in ``{net}/{graph_id}/{iteration}/``.  A ``torch.compile``'d
  sub-module gets its own graph ids from the graph front-end, so names never
  collide; its operators are not captured again here (see :mod:`.sources`).
* **Names.** ``<scope>/<OpType>-op<N>``; ``N`` counts the captured operators of
  the iteration in execution order (forward, then backward, then optimizer),
  starting at 0 — selection does not change it, code outside the capture scope
  does not shift it, so the same program yields the same names.
  Forward scopes come from the module stack (``Default/<Root>/<name-Class>/…``),
  backward ones are ``Gradients/<forward scope>`` of the forward operator that
  created the autograd node being run (matched by autograd sequence number;
  gradient accumulation into ``.grad`` takes the scope of the parameter's
  module; unknown nodes: ``Gradients/Default``), ``optimizer.step()`` ops are
  ``Default/optimizer-<OptimizerClass>``, anything else ``Default``.
* **What is captured** (``eager_capture`` in ``opdump_settings``): ``"model"``
  (default) = operators inside a module's forward, inside autograd's backward and
  inside ``optimizer.step()``; ``"all"`` adds everything else the thread runs
  (data generation, loss functions called as plain functions, ``.grad`` zeroing).
  With ``root_modules`` given, only those modules (and what they call) count as
  the model.
* **Iterations.** Each top-level call of a root module calls
  ``session.enter_forward`` (keyed per root module, so ``model`` then ``loss_fn``
  modules in one step are one iteration); the optimizer hook of the session does
  the rest (README, How it works).  Every top-level call is recorded with
  ``session.note_graph_ran`` (the global execution order).
* **Files per dumped iteration.** The ``.ir``/``.json`` listing of graph
  ``{graph_id}`` (graph kind ``eager``) is every operator seen in any dumped
  iteration, in first-seen order (rewritten when an iteration adds one, see
  :mod:`.state`); ``execution_order/ms_execution_order_graph_{id}.csv`` is the
  first dumped iteration's order, and each dumped iteration writes its own order
  as ``ms_execution_order_graph_{id}.csv`` inside its iteration folder.
* **Source lines.** The innermost user-visible frame (the user's code or a
  library such as ``transformers``; not torch, the standard library or opdump)
  is an operator's line; the listing keeps the whole visible stack (see
  :mod:`.sources`).  Backward operators take their forward operator's lines.
* **Forward hooks.** Operators run by a module's own forward hooks carry that
  module's scope: the module leaves the scope stack after its last hook.
* **Non-finite arguments.** An operator with an Inf/NaN non-tensor argument
  (``scalar_tensor(-inf)``, ``masked_fill(…, -inf)``, ``finfo.min``) is flagged
  ``nonfinite_args`` in the listing: it is not an overflow origin.
* **Parameters.** At the first call of each root in a dumped iteration its
  parameters and buffers are dumped as ``Parameter.<path>`` — the values the
  forward uses (before the update).  Parameters of compiled sub-modules are left
  to the graph front-end.
* **Tensors.** Inputs are copied before the operator runs (in-place operators
  cannot alter them), outputs after; an in-place operator that returns nothing
  (``_foreach_add_``) has its mutated arguments dumped as its outputs.
* **Cost.** The mode is on the dispatch stack only during iterations that dump
  (pushed at a dumped iteration's start, popped at its end, see
  :meth:`EagerCapture._sync_mode`); other iterations run plain eager.  If it
  cannot be popped (a mode entered later sits above it), it forwards each
  operator after two attribute checks.  Stack walking, names and copies happen
  only in dumped iterations.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from ..naming import backward_scope
from ..op_info import OpInfo
from .parameters import index_parameters, parameters_to_dump
from .schema import facts_of
from .scopes import ScopeTracker, _scope_of, display_class, is_compiled_wrapper
from .sources import walk
from .state import TOP, IterationState, Listing, Phase
from .values import arg_text, flat_tensors, has_nonfinite_arg, meta, non_tensor_args, output_slots, tensors_at

_current_node = torch._C._current_autograd_node
_get_sequence_nr = torch.autograd._get_sequence_nr
_is_compiling = torch.compiler.is_compiling
_ACCUMULATE = "torch::autograd::AccumulateGrad"
_GLOBAL_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


class _DumpMode(TorchDispatchMode):
    """The dispatch mode; everything but the not-dumping fast path is in :class:`EagerCapture`."""

    def __init__(self, capture: "EagerCapture"):
        super().__init__()
        self.capture = capture
        self.session = capture.session

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile keeps compiling with this mode on the stack (a mode that does not
        # ignore compile internals makes Dynamo skip every frame).
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        cap = self.capture
        if cap._checked != self.session.iteration:
            cap._refresh()
        if cap._unsettled:
            cap._settle()
        if not cap._dumping or cap._internal:
            return func(*args, **kwargs) if kwargs else func(*args)
        return cap._dispatch(func, args, kwargs or {})


class EagerCapture:
    """Dump eager operators of ``session`` (default: the current session)."""

    def __init__(self, session=None, root_modules: Optional[Iterable[torch.nn.Module]] = None):
        if session is None:
            from ...session import current_session
            session = current_session()
            if session is None:
                raise RuntimeError("EagerCapture: no dump session; open `with opdump.Session(config):` first")
        self.session = session
        cfg = session.config
        self.config = cfg
        self.capture_all = cfg.eager_capture == "all"
        if isinstance(root_modules, torch.nn.Module):
            root_modules = [root_modules]
        self._root_list = None if root_modules is None else list(root_modules)
        self.roots = None if root_modules is None else {id(m) for m in self._root_list}
        self.graph_id: Optional[int] = None
        self.tracker = ScopeTracker()
        self.listing = Listing()
        self._mode: Optional[_DumpMode] = None
        self._handles: List[Any] = []
        self._tails: Dict[int, Any] = {}      # id(module) -> handle of our last forward hook on it
        self._optimizers: List[str] = []
        self._checked: Optional[int] = None
        self._dumping = False
        self._internal = 0
        self._active = False
        self._started = False
        self._state: Optional[IterationState] = None
        self._counts_iter: Optional[int] = None
        self._dumped_any = False
        # config decisions read per operator, resolved once
        self._dump_in = cfg.dump_inputs
        self._dump_out = cfg.dump_outputs
        self._kernel_args = cfg.save_kernel_args
        self._select_all = session.selector.mode == 0
        # outputs of the last in-place operator whose recorded version must catch up with
        # autograd's bump (see Recorder.settle), settled when the next operator arrives
        self._unsettled: List[torch.Tensor] = []
        self._selected: Dict[str, bool] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "EagerCapture":
        if self._started:
            raise RuntimeError("EagerCapture.start(): already started")
        self._started = True
        session = self.session
        if self.graph_id is None:
            self.graph_id = session.new_graph_id()
        warnings.filterwarnings("ignore", message=_GLOBAL_HOOK_WARNING, category=UserWarning)
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        self._handles = [
            register_module_forward_pre_hook(self._module_pre),
            register_module_forward_hook(self._module_post, always_call=True),
            register_optimizer_step_pre_hook(self._optimizer_pre),
            register_optimizer_step_post_hook(self._optimizer_post),
        ]
        session.on_iteration_end(self._iteration_end)
        session.on_close(self.stop)
        self._active = True
        self._checked = None
        self._mode = _DumpMode(self)
        self._pushed = False
        self._sync_mode(session.is_dumping())
        return self

    def _sync_mode(self, want: bool) -> None:
        """Keep the dispatch mode on the stack only for iterations that dump.

        A dispatch mode costs even when it returns at once (every operator goes through
        Python), so iterations that do not dump run with no mode at all.  Called only at
        safe points (start, iteration ends, a root module's pre-hook), never inside the
        mode's own dispatch.  If another mode was entered after ours it cannot be popped:
        ours stays, and its fast path returns at once.
        """
        mode = self._mode
        if mode is None:
            return
        if want and not self._pushed:
            mode.__enter__()
            self._pushed = True
        elif not want and self._pushed and _get_current_dispatch_mode() is mode:
            mode.__exit__(None, None, None)
            self._pushed = False

    def stop(self) -> None:
        """Uninstall everything and write the files of the iteration in progress."""
        if not self._active:
            return
        self._active = False
        self._dumping = False
        mode, self._mode = self._mode, None
        if mode is not None and self._pushed:
            self._pushed = False
            if _get_current_dispatch_mode() is mode:
                mode.__exit__(None, None, None)
            else:   # another mode was entered after ours and is still active: ours stays, inert
                warnings.warn("opdump: EagerCapture.stop() while another dispatch mode entered later is active; "
                              "the capture is off but its mode stays on the stack", RuntimeWarning, stacklevel=2)
        for handle in self._handles + list(self._tails.values()):
            handle.remove()
        self._handles = []
        self._tails.clear()
        self.tracker.stack.clear()
        self._optimizers.clear()
        state, self._state = self._state, None
        if state is not None:
            self._finish(state)

    def __enter__(self) -> "EagerCapture":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ iterations
    def _refresh(self) -> None:
        session = self.session
        it = session.iteration
        self._checked = it
        if it != self._counts_iter:
            self._counts_iter = it
            self.tracker.new_iteration()
        state = self._state
        if state is not None and state.number != it:
            self._state = None
            self._finish(state)
        self._dumping = self._active and session.is_dumping()
        if self._dumping and self._state is None:
            self._state = IterationState(it, first=not self._dumped_any)

    def _iteration_end(self, iteration: int) -> None:
        state = self._state
        if state is not None and state.number == iteration:
            self._state = None
            self._finish(state)
        self._checked = None
        session = self.session
        if self._active:   # the session is about to move to iteration + 1
            self._sync_mode(session.enabled and (iteration + 1) in session.config.iteration)

    def _folder(self, state: IterationState) -> str:
        if state.folder is None:
            state.folder = self.session.iteration_dir(self.graph_id)
        return state.folder

    def _finish(self, state: IterationState) -> None:
        """Write the listing (when it grew) and the execution order of a finished iteration;
        flush its statistics."""
        session = self.session
        self._unsettled = []
        self._internal += 1
        try:
            if state.n:
                self._dumped_any = True
                self._write_files(state)
            session.recorder.flush_statistics()
        finally:
            self._internal -= 1

    def _write_files(self, state: IterationState) -> None:
        gid = self.graph_id
        layout = self.session.layout
        listing = self.listing
        folder = self._folder(state)
        if listing.dirty:
            layout.write_listing(gid, "eager", list(listing.ops.values()), listing.params)
            listing.dirty = False
        names = state.names
        if not listing.order_written:
            layout.write_execution_order(gid, names)
            layout.write_execution_order(gid, names, folder)
            listing.order_written = True
        else:
            # every other iteration: its order file is made in the writer (a folder and a
            # file created per step, ~0.3 ms, off the training thread)
            self.session.writer.submit(lambda: layout.write_execution_order(gid, names, folder))

    # ------------------------------------------------------------------ hooks
    def _module_pre(self, module, args) -> None:
        if _is_compiling() or not self._active:
            return
        tracker = self.tracker
        if module._forward_hooks:
            self._hook_last(module)
        if not tracker.stack:
            if self.roots is not None and id(module) not in self.roots:
                return
            self._enter_root(module)
            return
        frame = tracker.push(module)
        if self._dumping and self._state is not None and not frame.transparent:
            self._state.modules.setdefault(id(module), (frame.scope, frame.ids))

    def _hook_last(self, module) -> None:
        """``module`` has forward hooks of its own, which torch runs after the global ones:
        make sure our last hook runs after them, and leaves the scope there, so that the
        operators of the module's hooks carry its scope."""
        hooks = module._forward_hooks
        handle = self._tails.get(id(module))
        if handle is None or handle.id not in hooks:
            handle = self._tails[id(module)] = module.register_forward_hook(self._module_last, always_call=True)
        elif next(reversed(hooks)) != handle.id:
            hooks.move_to_end(handle.id)

    def _module_post(self, module, args, output) -> None:
        if _is_compiling():
            return
        handle = self._tails.get(id(module))
        if handle is not None and handle.id in module._forward_hooks:
            return                      # left by _module_last, after the module's own hooks
        if self.tracker.stack:
            self.tracker.pop(module)

    def _module_last(self, module, args, output) -> None:
        if _is_compiling():
            return
        if self.tracker.stack:
            self.tracker.pop(module)

    def _enter_root(self, module) -> None:
        session = self.session
        self._internal += 1
        try:
            session.enter_forward((self.graph_id, id(module)))     # may end the iteration
        finally:
            self._internal -= 1
        if self._checked != session.iteration:
            self._refresh()
        self._sync_mode(self._dumping)
        frame = self.tracker.push_root(module)
        session.note_graph_ran(self.graph_id)
        state = self._state
        if self._dumping and state is not None:
            state.modules.setdefault(id(module), (frame.scope, frame.ids))
            if id(module) not in state.roots_done:
                state.roots_done.add(id(module))
                self._internal += 1
                try:
                    index_parameters(state, module, frame.root)
                    if not is_compiled_wrapper(module):
                        dumped = parameters_to_dump(session, state, self.listing, module)
                        if dumped:
                            session.recorder.record_parameters(self._folder(state), dumped)
                finally:
                    self._internal -= 1

    def _optimizer_pre(self, optimizer, args, kwargs) -> None:
        if not _is_compiling():
            self._optimizers.append(display_class(optimizer))

    def _optimizer_post(self, optimizer, args, kwargs) -> None:
        if not _is_compiling() and self._optimizers:
            self._optimizers.pop()

    # ------------------------------------------------------------------ operators
    def _settle(self) -> None:
        """The in-place operator whose outputs were recorded last has returned (autograd
        bumped their versions after the mode): their recordings take the new version."""
        tensors, self._unsettled = self._unsettled, []
        settle = self.session.recorder.settle
        for t in tensors:
            settle(t)

    def _backward_scope(self, state: IterationState, node) -> Tuple[str, Tuple[str, ...], Tuple]:
        """Scope, module ids and source lines of the forward operator a backward node belongs to."""
        info = state.seq.get(node._sequence_nr())
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
            return None if node.name().startswith("CompiledFunction") else Phase.BACKWARD
        if self._optimizers:
            return Phase.OPTIMIZER
        if self.tracker.stack:
            return Phase.MODULE
        if self.capture_all:
            return Phase.OUTSIDE
        state.seq.setdefault(_get_sequence_nr() - 1, TOP)
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
        if phase is Phase.MODULE:
            top = self.tracker.stack[-1]
            scope, ids = top.scope, top.ids
        elif phase is Phase.BACKWARD:
            scope, ids, forward_sources = self._backward_scope(state, node)
            sources = forward_sources or sources
        elif phase is Phase.OPTIMIZER:
            scope, ids = f"Default/optimizer-{self._optimizers[-1]}", ()
        else:
            scope, ids = TOP[0], TOP[1]
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
        if phase <= Phase.MODULE:
            state.seq.setdefault(_get_sequence_nr() - 1, (scope, ids, sources))
        state.names.append(name)
        return self._run(state, op, describe, func, args, kwargs, facts)

    def _run(self, state: IterationState, op: OpInfo, describe: bool, func, args, kwargs, facts):
        """Run a captured operator: its inputs recorded before, its outputs after."""
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
                if outputs:
                    recorder.record_all(state.folder or self._folder(state), op, "output",
                                        self._on_allowed_devices(outputs))
                if written:
                    self._unsettled = written
            if describe:
                self._describe(op, args, kwargs, inputs, outputs)
        if describe:
            self.listing.add(op)
        return out

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
