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
  the model.  An operator is a call plain eager makes through the dispatcher: the
  ``detach`` that any dispatch mode is handed when autograd saves or unpacks a tensor
  (or ``.data`` is read) is the observation's own, and is left out before anything
  else sees it (:func:`.dispatch.observation_only`; README, Eager mode).
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
* **Overflow dump** (``op_debug_mode`` 3): operators go to :mod:`opdump.debug.overflow`
  instead of being recorded; only those that overflow are recorded (inputs and outputs),
  parameters are not dumped, and each dumped iteration gets an ``overflow.json``.
* **Exception dump** (``op_debug_mode`` 4): every iteration, every operator of the thread
  runs inside ``try`` (:meth:`OperatorPath._run_guarded`); nothing is recorded or written
  (no listing, no order, no parameters) unless one raises: then
  :mod:`opdump.debug.exception` saves its inputs, ``exception.json`` and a repro script, and
  the same exception propagates.
* **Watcher mode** (``dump_scene`` "watcher"): operators go to :mod:`opdump.debug.watcher`;
  only watched outputs are recorded (when their operator ran, and when they changed),
  parameters are not dumped, and each dumped iteration gets a ``watcher.json``.
* **Cost.** The mode is on the dispatch stack only during iterations that dump
  (pushed at a dumped iteration's start, popped at its end, see
  :meth:`EagerCapture._sync_mode`); other iterations run plain eager.  If it
  cannot be popped (a mode entered later sits above it), it forwards each
  operator after two attribute checks.  Stack walking, names and copies happen
  only in dumped iterations.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, Iterable, List, Optional

import torch
from torch.nn.utils.parametrize import ParametrizationList
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .dispatch import OperatorPath, _DumpMode, _current_node
from .native import NativeEager
from .parameters import index_parameters, members_unchanged, note_members, parameters_to_dump
from .scopes import ScopeTracker, display_class, is_compiled_wrapper
from .state import IterationState, Listing

_is_compiling = torch.compiler.is_compiling
_GLOBAL_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


class EagerCapture(NativeEager, OperatorPath):
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
        # op_debug_mode 4 watches every operator of the thread (a loss function called as a plain
        # function raises as often as a module does)
        self.capture_all = cfg.eager_capture == "all" or cfg.op_debug_mode == 4
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
        self._aside = 0     # depth of a parametrized attribute's read outside any model call
        self._active = False
        self._started = False
        self._state: Optional[IterationState] = None
        self._counts_iter: Optional[int] = None
        self._dumped_any = False
        self._ended: tuple = (None, {})        # (number, seq) of the last dumped iteration that ended
        self._members_listed: Dict[int, object] = {}     # debug dumps: roots whose parameters are listed (parameters.note_members)
        # config decisions read per operator, resolved once
        self._dump_in = cfg.dump_inputs
        self._dump_out = cfg.dump_outputs
        self._kernel_args = cfg.save_kernel_args
        self._select_all = session.selector.mode == 0
        # outputs of the last in-place operator whose recorded version must catch up with
        # autograd's bump (see Recorder.settle), settled when the next operator arrives
        self._unsettled: List[torch.Tensor] = []
        self._collectives = None        # torch.distributed collectives, made at the first (.collectives)
        self._selected: Dict[str, bool] = {}
        # op_debug_mode 3: operators go to the overflow watch, recorded only if they overflow
        self._overflow = None
        if cfg.op_debug_mode == 3:
            from ...debug.overflow import OverflowWatch
            self._overflow = OverflowWatch(cfg.overflow_number, self._record_overflow,
                                           lambda: self._folder(self._watched), lambda: session.layout,
                                           submit=lambda job: session.writer.submit(job))
        self._watched: Optional[IterationState] = None
        # op_debug_mode 4: operators run inside try; one that raises goes to the exception dump
        self._exception = session.exception_dump
        if self._exception is not None:
            self._dumped_any = True     # no iteration is "first": no stack kept per operator
        # watcher mode (dump_scene "watcher"): operators go to the watcher, which dumps watched outputs
        self._watcher = None
        if cfg.dump_scene == "watcher":
            from ...debug.watcher import Watcher
            self._watcher = Watcher(cfg, self._record_watcher, lambda: session.recorder,
                                    lambda: self._folder(self._watched), lambda: session.layout, self.listing.ops.get)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "EagerCapture":
        if self._started:
            raise RuntimeError("EagerCapture.start(): already started")
        self._started = True
        session = self.session
        if self.graph_id is None:
            self.graph_id = session.new_graph_id()
        before = list(warnings.filters)
        warnings.filterwarnings("ignore", message=_GLOBAL_HOOK_WARNING, category=UserWarning)
        self._filter = warnings.filters[0] if warnings.filters[0] not in before else None   # removed by stop()
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        self._handles = [
            register_module_forward_pre_hook(self._module_pre),
            register_module_forward_hook(self._module_post, always_call=True),
            register_optimizer_step_pre_hook(self._optimizer_pre),
            register_optimizer_step_post_hook(self._optimizer_post),
        ]
        # removed by stop() with the rest: a capture started again (the bench's toggles) or
        # replaced must not leave its iteration-end hook behind, called every iteration
        self._handles += [session.on_iteration_end(self._iteration_end), session.on_close(self.stop)]
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
        want = self._native_take(want)      # False: the native observer serves the iteration
        mode = self._mode
        if mode is None:
            return
        if want and not self._pushed:
            mode.__enter__()
            self._pushed = True
        elif not want and self._pushed and _get_current_dispatch_mode() is mode:
            mode.__exit__(None, None, None)
            self._pushed = False
        self._native_settle()               # the observer's inert mode, once ours is off the stack

    def stop(self) -> None:
        """Uninstall everything and write the files of the iteration in progress."""
        if not self._active:
            return
        self._active = False
        self._started = False              # start() may run again (same graph id)
        self._dumping = False
        self._native_take(False)
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
        if getattr(self, "_filter", None) is not None and self._filter in warnings.filters:
            warnings.filters.remove(self._filter)
            warnings._filters_mutated()           # what warnings.filterwarnings itself calls
        self._filter = None
        self._tails.clear()
        self.tracker.stack.clear()
        self._optimizers.clear()
        state, self._state = self._state, None
        if state is not None:
            self._finish(state)
        if self._collectives is not None:           # works completed late; the rest are dropped
            self._collectives.close()
            self._collectives = None                # a later start() makes a new one

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
            self._ended = (state.number, state.seq)
            self._finish(state)
        self._dumping = self._active and session.is_dumping()
        if self._dumping and self._state is None:
            self._state = self._watched = IterationState(it, first=not self._dumped_any)
            number, seq = self._ended
            if number == it - 1:    # backward nodes of its forward may run now (a GAN's generator)
                self._state.before = seq

    def _iteration_end(self, iteration: int) -> None:
        state = self._state
        if state is not None and state.number == iteration:
            self._state = None
            self._ended = (state.number, state.seq)
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
            if self._collectives is not None:       # outputs of completed collectives, collectives.json
                self._collectives.finish(state.number)
            if self._overflow is not None:
                self._watched = state
                self._overflow.finish(state.number)
            if self._watcher is not None:
                self._watched = state
                self._watcher.finish(state.number)
            if state.n and self._exception is None:      # exception dump: nothing unless one raised
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
            ops, params = list(listing.ops.values()), list(listing.params)
            listing.dirty = False
            listing.version += 1
            if listing.order_written and self._active:
                # it grew in a later iteration: rendered off the training thread, and only if no
                # newer version was queued meanwhile (writer threads may run them out of order)
                version = listing.version

                def write_if_latest():
                    with listing.lock:
                        if version == listing.version:
                            layout.write_listing(gid, "eager", ops, params)
                self.session.writer.submit(write_if_latest)
            else:
                with listing.lock:
                    layout.write_listing(gid, "eager", ops, params)
        names = state.names
        if not listing.order_written:
            layout.write_execution_order(gid, names)
            layout.write_execution_order(gid, names, folder)
            listing.order_written = True
        else:
            # every other iteration: its order file is made in the writer (a folder and a
            # file created per step, ~0.3 ms, off the training thread)
            self.session.writer.submit(lambda: layout.write_execution_order(gid, names, folder))

    def _record_overflow(self, op, inputs, outputs) -> None:
        """Record an operator the overflow watch found overflowing (inputs and outputs)."""
        recorder = self.session.recorder
        folder = self._folder(self._watched)
        if inputs:
            recorder.record_all(folder, op, "input", self._on_allowed_devices(inputs))
        if outputs:
            recorder.record_all(folder, op, "output", self._on_allowed_devices(outputs))

    def _record_watcher(self, op, outputs, folder: str) -> None:
        """Record a watched operator's outputs (a snapshot of the watcher; None: not that slot)."""
        self.session.recorder.record_all(folder, op, "output", self._on_allowed_devices(outputs))

    # ------------------------------------------------------------------ hooks
    def _module_pre(self, module, args) -> None:
        if _is_compiling() or not self._active:
            return
        tracker = self.tracker
        if not tracker.stack and (self._aside or isinstance(module, ParametrizationList)):
            self._aside += 1    # e.g. weight_norm's weight read outside the model: not a model call
            return
        if module._forward_hooks:
            self._hook_last(module)
        if not tracker.stack:
            if _current_node() is not None:
                self._module_again(module)
                return
            if self.roots is not None and id(module) not in self.roots:
                return
            self._enter_root(module)
            return
        frame = tracker.push(module)
        if self._dumping and not frame.transparent:
            state = self._state
            if state is not None and id(module) not in state.modules:
                state.modules[id(module)] = (frame.scope, frame.ids)
                state.frames[id(module)] = frame

    def _module_again(self, module) -> None:
        """A module called outside every module while autograd runs a backward: activation
        checkpointing recomputing a forward (``torch.utils.checkpoint``; transformers'
        ``gradient_checkpointing_enable``), or a module used in a custom backward.  Never a new
        model call (no root entered: the iteration goes on, no parameter listed again).  When
        the module ran in this iteration's forward its call is pushed again, so its operators
        are named ``Gradients/<that call's scope>`` with their own lines (dispatch.py,
        ``Phase.RECOMPUTE``), as graph mode names a recomputation; else it is set aside like a
        call outside the model (its operators keep the backward node's name)."""
        state = self._state
        frame = state.frames.get(id(module)) if state is not None and self._dumping else None
        if frame is None or frame.module is not module:
            self._aside += 1
            return
        self.tracker.push_again(frame)

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
        if self._aside and not self.tracker.stack:
            self._aside -= 1
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
        if session.counts_model_calls:      # else enter_forward does nothing (an optimizer counts)
            self._internal += 1
            try:
                session.enter_forward((self.graph_id, id(module)), module.parameters())     # may end the iteration
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
            state.frames.setdefault(id(module), frame)
            if id(module) not in state.roots_done:
                state.roots_done.add(id(module))
                self._internal += 1
                try:
                    tree = index_parameters(state, module, frame.root)
                    if not is_compiled_wrapper(module):
                        if self._overflow is None and self._watcher is None and self._exception is None:
                            dumped = parameters_to_dump(session, state, self.listing, module)
                            if dumped:
                                session.recorder.record_parameters(self._folder(state), dumped)
                        elif not members_unchanged(module, tree, self._members_listed):
                            # debug dumps record operators only: the parameters go to the listing,
                            # walked again only when the root's tree changed (a walk a step)
                            parameters_to_dump(session, state, self.listing, module)
                            note_members(module, tree, self._members_listed)
                finally:
                    self._internal -= 1

    def _optimizer_pre(self, optimizer, args, kwargs) -> None:
        if not _is_compiling():
            self._optimizers.append(display_class(optimizer))
            self._native_optimizer()

    def _optimizer_post(self, optimizer, args, kwargs) -> None:
        if not _is_compiling() and self._optimizers:
            self._optimizers.pop()
            self._native_optimizer()
