"""Eager capture (SPEC F11): a ``TorchDispatchMode`` that sees every ATen operator.

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
  the rest (SPEC F12).  Every top-level call is recorded with
  ``session.note_graph_ran`` (the global execution order).
* **Files per dumped iteration.** The ``.ir``/``.json`` listing of graph
  ``{graph_id}`` is the operators as executed in the first dumped iteration
  (graph kind ``eager``); ``execution_order/ms_execution_order_graph_{id}.csv`` is
  that iteration's order, and each dumped iteration writes its own order as
  ``ms_execution_order_graph_{id}.csv`` inside its iteration folder.
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

import os
import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from ..graph.ops import _NOT_OPERATORS
from ..naming import backward_scope, op_type_of
from ..op_info import OpInfo
from ...write.dtypes import dtype_name
from ...write.graph_files import render_execution_order, render_graph_json, render_ir
from .scopes import ScopeTracker, _scope_of, display_class, is_compiled_wrapper
from .sources import walk

_current_node = torch._C._current_autograd_node
_get_sequence_nr = torch.autograd._get_sequence_nr
_is_compiling = torch.compiler.is_compiling
_TOP = ("Default", (), ())
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


class _Iteration:
    """What the capture collects during one dumped iteration."""

    def __init__(self, number: int, listing: bool):
        self.number = number
        self.listing = listing                     # this iteration's ops make the .ir listing
        self.n = 0
        self.ops: List[OpInfo] = []                # listing iteration: every captured op
        self.names: List[str] = []                 # other iterations: full names only
        self.seq: Dict[int, Tuple[str, Tuple[str, ...]]] = {}   # autograd seq nr -> forward (scope, ids)
        self.modules: Dict[int, Tuple[str, Tuple[str, ...]]] = {}  # id(module) -> first (scope, ids)
        self.owners: Dict[int, Tuple] = {}         # id(parameter) -> (id(module), (path, class) pairs, root)
        self.roots_done: set = set()
        self.param_names: set = set()
        self.params: List[Tuple[str, Tuple]] = []  # .ir params: (name, (shape, dtype))
        self.folder: Optional[str] = None
        self.producers = None
        if listing:
            from torch.utils.weak import WeakIdKeyDictionary
            self.producers = WeakIdKeyDictionary()


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
        self._mode: Optional[_DumpMode] = None
        self._handles: List[Any] = []
        self._optimizers: List[str] = []
        self._checked: Optional[int] = None
        self._dumping = False
        self._internal = 0
        self._active = False
        self._started = False
        self._state: Optional[_Iteration] = None
        self._counts_iter: Optional[int] = None
        self._ir_written = False
        # per operator overload, keyed by id(): OpOverloads live for the whole process, and
        # their Python-level __hash__ costs more than the lookup itself
        self._op_types: Dict[int, Optional[Tuple[str, str]]] = {}
        # config decisions read per operator, resolved once
        self._dump_in = cfg.dump_inputs
        self._dump_out = cfg.dump_outputs
        self._kernel_args = cfg.save_kernel_args
        self._select_all = session.selector.mode == 0
        self._mutated: Dict[int, Tuple[Tuple[int, str], ...]] = {}
        self._written: Dict[int, Tuple[Tuple[Tuple[int, str], ...], bool]] = {}
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
        for handle in self._handles:
            handle.remove()
        self._handles = []
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
            self._state = _Iteration(it, listing=not self._ir_written)

    def _iteration_end(self, iteration: int) -> None:
        state = self._state
        if state is not None and state.number == iteration:
            self._state = None
            self._finish(state)
        self._checked = None
        session = self.session
        if self._active:   # the session is about to move to iteration + 1
            self._sync_mode(session.enabled and (iteration + 1) in session.config.iteration)

    def _folder(self, state: _Iteration) -> str:
        if state.folder is None:
            state.folder = self.session.iteration_dir(self.graph_id)
        return state.folder

    def _finish(self, state: _Iteration) -> None:
        """Write the listing / execution order of a finished iteration; flush its statistics."""
        session = self.session
        self._unsettled = []
        self._internal += 1
        try:
            if state.n:
                gid = self.graph_id
                layout = session.layout
                path = os.path.join(self._folder(state), os.path.basename(layout.execution_order_path(gid)))
                if state.listing:
                    order = render_execution_order([op.full_name for op in state.ops]).encode()
                    layout.write_small(layout.ir_path(gid), render_ir(gid, "eager", state.ops, state.params).encode())
                    layout.write_small(layout.ir_path(gid, "json"),
                                       render_graph_json(gid, "eager", state.ops, state.params).encode())
                    layout.write_small(layout.execution_order_path(gid), order)
                    layout.write_small(path, order)
                    self._ir_written = True
                else:
                    # every other iteration: its order file is made in the writer (a folder and a
                    # file created per step, ~0.3 ms, off the training thread)
                    names = state.names
                    session.writer.submit(
                        lambda: layout.write_small(path, render_execution_order(names).encode()))
            session.recorder.flush_statistics()
        finally:
            self._internal -= 1

    # ------------------------------------------------------------------ hooks
    def _module_pre(self, module, args) -> None:
        if _is_compiling() or not self._active:
            return
        tracker = self.tracker
        if not tracker.stack:
            if self.roots is not None and id(module) not in self.roots:
                return
            self._enter_root(module)
            return
        frame = tracker.push(module)
        if self._dumping and self._state is not None and not frame.transparent:
            self._state.modules.setdefault(id(module), (frame.scope, frame.ids))

    def _module_post(self, module, args, output) -> None:
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
                    self._index_parameters(state, module, frame.root)
                    if not is_compiled_wrapper(module):
                        self._dump_parameters(state, module)
                finally:
                    self._internal -= 1

    def _optimizer_pre(self, optimizer, args, kwargs) -> None:
        if not _is_compiling():
            self._optimizers.append(display_class(optimizer))

    def _optimizer_post(self, optimizer, args, kwargs) -> None:
        if not _is_compiling() and self._optimizers:
            self._optimizers.pop()

    # ------------------------------------------------------------------ parameters
    def _index_parameters(self, state: _Iteration, root: torch.nn.Module, root_class: str) -> None:
        """Which module owns each parameter (scope of its gradient accumulation), also inside
        compiled sub-modules, whose modules the hooks do not see."""
        classes = {}
        for path, sub in root.named_modules(remove_duplicate=False):
            if is_compiled_wrapper(sub):
                continue                    # its _orig_mod children carry the names
            clean = ".".join(part for part in path.split(".") if part != "_orig_mod")
            classes.setdefault(clean, display_class(sub))
            pairs = None
            for p in sub._parameters.values():
                if p is not None and id(p) not in state.owners:
                    if pairs is None:
                        parts = clean.split(".") if clean else []
                        pairs = tuple((".".join(parts[:i]), classes.get(".".join(parts[:i]), "Module"))
                                      for i in range(1, len(parts) + 1))
                    state.owners[id(p)] = (id(sub), pairs, root_class)

    def _dump_parameters(self, state: _Iteration, root: torch.nn.Module) -> None:
        compiled = [path for path, sub in root.named_modules() if path and is_compiled_wrapper(sub)]
        items = list(root.named_parameters()) + list(root.named_buffers())
        cfg = self.config
        dumped = []
        for name, value in items:
            if name in state.param_names or (compiled and any(name.startswith(c + ".") for c in compiled)):
                continue
            if not isinstance(value, torch.Tensor):
                continue
            state.param_names.add(name)
            if state.listing:
                state.params.append((name, (tuple(value.shape), dtype_name(value.dtype))))
                state.producers[value] = f"%para{len(state.params)}_{name}"
            if cfg.enable and (value.is_cpu or self.session.device_allowed(value.device)):
                dumped.append((name, value))
        if dumped:
            self.session.recorder.record_parameters(self._folder(state), dumped)

    # ------------------------------------------------------------------ operators
    def _op_type(self, func) -> Optional[Tuple[str, str]]:
        try:
            return self._op_types[id(func)]
        except KeyError:
            pass
        result = None
        if isinstance(func, torch._ops.OpOverload):
            result = op_type_of(func)
            if result[0] in _NOT_OPERATORS:
                result = None
        self._op_types[id(func)] = result
        return result

    def _mutated_args(self, func) -> Tuple[Tuple[int, str], ...]:
        """(position, name) of the arguments an operator returning nothing writes to."""
        try:
            return self._mutated[id(func)]
        except KeyError:
            pass
        schema = getattr(func, "_schema", None)
        out = self._written_args(func)[0] if schema is not None and not schema.returns else ()
        self._mutated[id(func)] = out
        return out

    def _written_args(self, func) -> Tuple[Tuple[Tuple[int, str], ...], bool]:
        """((position, name) of the arguments an operator writes to, does it write a list?)"""
        try:
            return self._written[id(func)]
        except KeyError:
            pass
        written: Tuple[Tuple[int, str], ...] = ()
        lists = False
        schema = getattr(func, "_schema", None)
        if schema is not None:
            args = [(i, a) for i, a in enumerate(schema.arguments)
                    if a.alias_info is not None and a.alias_info.is_write]
            written = tuple((i, a.name) for i, a in args)
            lists = any(isinstance(a.type, torch.ListType) for _, a in args)
        self._written[id(func)] = hit = (written, lists)
        return hit

    def _settle(self) -> None:
        """The in-place operator whose outputs were recorded last has returned (autograd
        bumped their versions after the mode): their recordings take the new version."""
        tensors, self._unsettled = self._unsettled, []
        settle = self.session.recorder.settle
        for t in tensors:
            settle(t)

    def _backward_scope(self, state: _Iteration, node) -> Tuple[str, Tuple[str, ...], Tuple]:
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
            info = _TOP
        return backward_scope(info[0]), info[1], info[2]

    def _dispatch(self, func, args, kwargs):
        state = self._state
        if state is None:
            return func(*args, **kwargs)
        node = _current_node()
        stack = self.tracker.stack
        if node is not None:
            if node.name().startswith("CompiledFunction"):
                return func(*args, **kwargs)
            kind = 2
        elif self._optimizers:
            kind = 3
        elif stack:
            kind = 1
        else:
            kind = 0
            if not self.capture_all:
                state.seq.setdefault(_get_sequence_nr() - 1, _TOP)
                return func(*args, **kwargs)
        types = self._op_type(func)
        if types is None:
            return func(*args, **kwargs)
        listing = state.listing
        if kind == 2 and not listing:
            # a backward operator's compiled region is its node (checked above), and only the
            # listing shows source lines: no stack walk
            sources = ()
        else:
            compiled, sources = walk(2, listing)
            if compiled:
                return func(*args, **kwargs)
        if kind == 1:
            top = stack[-1]
            scope, ids = top.scope, top.ids
        elif kind == 2:
            # a backward operator points at its forward operator's source line
            scope, ids, forward_sources = self._backward_scope(state, node)
            sources = forward_sources or sources
        elif kind == 3:
            scope, ids = f"Default/optimizer-{self._optimizers[-1]}", ()
        else:
            scope, ids = _TOP[0], _TOP[1]
        if kind <= 1:
            state.seq.setdefault(_get_sequence_nr() - 1, (scope, ids, sources))
        index = state.n
        state.n = index + 1
        op_type, overload = types
        op = OpInfo(index, op_type, scope, overload, ids, sources)
        selected = True if self._select_all else self._select(op)
        op.selected = selected
        kernel_args = selected and self._kernel_args
        if listing or kernel_args:
            op.args = _non_tensor_args(func, args, kwargs)
        recorder = self.session.recorder
        dump_in = selected and self._dump_in
        inputs = _flat_tensors(args, []) if (dump_in or listing) else ()
        if kwargs and (dump_in or listing):
            _flat_tensors(kwargs.values(), inputs)
        if selected:
            folder = state.folder or self._folder(state)
            if dump_in and inputs:
                recorder.record_all(folder, op, "input", self._on_allowed_devices(inputs))
            if kernel_args:
                recorder.record_kernel_args(folder, op)
        out = func(*args, **kwargs)
        written = ()
        if selected and _writes(func):      # its arguments changed: recorded copies/statistics are stale
            positions, lists = self._written_args(func)
            written = _tensors_at(args, kwargs, positions)
            # ``_foreach_*`` ops do not bump version counters under a dispatch mode, so views
            # of what they wrote are not guarded: forget every argument, as the safe side
            for t in (_flat_tensors(args, _flat_tensors(kwargs.values(), [])) if lists else written):
                recorder.forget(t)
        dump_out = selected and self._dump_out
        if dump_out or listing:
            mutated = self._mutated_args(func)
            if mutated:
                outputs = _tensors_at(args, kwargs, mutated)
            elif type(out) is torch.Tensor:
                outputs = [out]
            else:
                outputs = _flat_tensors((out,), [])
            if dump_out:
                if outputs:
                    recorder.record_all(state.folder or self._folder(state), op, "output",
                                        self._on_allowed_devices(outputs))
                if written:
                    self._unsettled = written
            if listing:
                self._describe(state, op, func, args, kwargs, inputs, outputs)
        if listing:
            state.ops.append(op)
        else:
            state.names.append(op.full_name)
        return out

    def _on_allowed_devices(self, tensors: List[torch.Tensor]) -> List[Optional[torch.Tensor]]:
        """``tensors``, with None in the slots of tensors on devices ``support_device`` excludes."""
        for t in tensors:
            if not t.is_cpu:
                allowed = self.session.device_allowed
                return [t if t.is_cpu or allowed(t.device) else None for t in tensors]
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

    def _describe(self, state: _Iteration, op: OpInfo, func, args, kwargs, inputs, outputs) -> None:
        """Shapes, dtypes and the argument text of ``op`` for the .ir listing."""
        op.input_meta = [_meta(t) for t in inputs]
        op.output_meta = [_meta(t) for t in outputs]
        op.node_name = op.op_type
        producers = state.producers
        text = ", ".join(_text(a, producers) for a in args)
        if kwargs:
            text += "".join(f", {k}={_text(v, producers)}" for k, v in kwargs.items())
        op.arg_text = text.lstrip(", ")
        if len(outputs) == 1:
            producers[outputs[0]] = f"%{op.index}"
        else:
            for k, t in enumerate(outputs):
                producers[t] = f"%{op.index}[{k}]"


_WRITES: Dict[int, bool] = {}


def _writes(func) -> bool:
    """Does the operator write to any of its arguments (in-place / out= variants)?"""
    key = id(func)
    hit = _WRITES.get(key)
    if hit is None:
        schema = getattr(func, "_schema", None)
        hit = _WRITES[key] = bool(schema is not None and schema.is_mutable)
    return hit


def _flat_tensors(values, out: List[torch.Tensor]) -> List[torch.Tensor]:
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            _flat_tensors(v, out)
    return out


def _tensors_at(args, kwargs, positions: Tuple[Tuple[int, str], ...]) -> List[torch.Tensor]:
    """The tensors of the arguments at ``positions`` ((position, name) pairs: passed
    positionally or by name)."""
    return _flat_tensors([args[i] if i < len(args) else kwargs.get(name) for i, name in positions], [])


def _has_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v) for v in value)
    return False


def _non_tensor_args(func, args, kwargs) -> Dict[str, Any]:
    schema = getattr(func, "_schema", None)
    named: Dict[str, Any] = {}
    if schema is not None:
        for arg, value in zip(schema.arguments, args):
            named[arg.name] = value
    else:
        named.update({f"arg{i}": v for i, v in enumerate(args)})
    named.update(kwargs)
    return {k: v for k, v in named.items() if not _has_tensor(v)}


def _meta(t: torch.Tensor) -> Tuple[Tuple[int, ...], str]:
    return tuple(t.shape), dtype_name(t.dtype)


def _text(value, producers) -> str:
    if isinstance(value, torch.Tensor):
        return producers.get(value, "%input")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_text(v, producers) for v in value) + "]"
    return repr(value)
