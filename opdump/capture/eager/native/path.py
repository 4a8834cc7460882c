"""Which eager iterations the native observer serves, and what Python gives it.

:class:`NativeEager` is mixed into :class:`~opdump.capture.eager.mode.EagerCapture`.  The
native path (``observer.cpp``) serves a dumped iteration, instead of the dispatch mode,
only where it is proven to give the Python capture's statistic.csv (all columns but the
timestamps, same rows in the same order; tests/test_native_eager*.py):

* statistics only, every category from the native one-pass kernel (``stat_calc_mode``
  ``"device"`` or ``"host"``, no ``md5``, precision ``"high"``), no tensor files, no online
  compare, ``file_format`` npy, no ACL folder filter;
* ``dump_mode`` 0 (every operator), ``op_debug_mode`` 0, no watcher, no ``save_kernel_args``;
* not the first dumped iteration (that one writes the listing with the Python capture);
* nothing compiled in the process (``torch._dynamo`` has analysed no frame), no other
  dispatch mode on the stack;
* ``OPDUMP_NATIVE_EAGER=1`` and the native module is built.

Tensors the native memo does not read (not CPU, a dtype it lacks) are recorded by the
Python recorder, called from C++ for that operator side.  An operator whose name is not in
the listing yet is described by a call into Python (its sources, argument text and
shapes), as the Python capture does.

Not equal yet (why it is opt-in): under a dispatch mode, torch runs ``aten::detach`` where plain
eager runs no operator at all -- an autograd node saving an operator's output for backward
(``relu``, ``sigmoid``, ``softmax``…: ``SavedVariable`` calls ``shallow_copy_and_detach``, which
goes through the mode), the same node unpacking it in backward, and gradient accumulation.
The Python capture names and records these ``detach`` calls; the observer never sees them
(they are no dispatcher calls), so on a model with such operators its iterations have every
other operator and row, in the same order with the same scopes and statistics, but not
those ``detach`` operators, and the indices after them are smaller (tests compare exactly
that).  The listing then gains the shifted names as new entries.

Failure: anything the observer cannot handle (a C++ or Python error, an operator called
above autograd by another one) turns it off; at the next module boundary one
``RuntimeWarning`` says why and the Python capture serves every later iteration.  Nothing
raises into the user's code.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Any, List, Optional

import torch

from ...op_info import OpInfo
from ...naming import backward_scope
from ..schema import facts_of
from ..scopes import _scope_of
from ..sources import walk
from ..state import Phase
from ..values import flat_tensors, has_nonfinite_arg, non_tensor_args

ENV_SWITCH = "OPDUMP_NATIVE_EAGER"


def native_enabled() -> bool:
    """The switch: ``OPDUMP_NATIVE_EAGER=1`` lets the observer serve eligible iterations (off by
    default: see "Not equal yet" in the module docstring)."""
    return os.environ.get(ENV_SWITCH, "0").strip().lower() in ("1", "true", "yes", "on")


def _observer():
    """The C++ observer (``eager_observer`` of opdump's native module), or None."""
    from ....stats import native
    mod = native.module()
    return getattr(mod, "eager_observer", None) if mod is not None else None


def _compiled_anything() -> bool:
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    frames = counters.get("frames") if counters is not None else None
    return bool(frames and any(frames.values()))


def split_args(func, values: List[Any]):
    """``(args, kwargs)`` as a dispatch mode receives them from the full argument list: kwarg-only
    arguments by name unless they hold their default, trailing defaulted positional ones left out."""
    schema = func._schema
    arguments = schema.arguments
    positional, kwargs = [], {}
    for arg, value in zip(arguments, values):
        if arg.kwarg_only:
            if not _is_default(arg, value):
                kwargs[arg.name] = value
        else:
            positional.append((arg, value))
    while positional and _is_default(*positional[-1]):
        positional.pop()
    return [v for _, v in positional], kwargs


def _is_default(arg, value) -> bool:
    if not arg.has_default_value():
        return False
    default = arg.default_value
    if isinstance(value, torch.Tensor) or isinstance(default, torch.Tensor):
        return False
    return type(default) is type(value) and default == value


class NativeEager:
    """The native path's side of :class:`~opdump.capture.eager.mode.EagerCapture`."""

    _native_live = False          # the observer is installed (it serves the dumped iteration in progress)
    _native_broken = False        # it failed once: the Python capture serves the rest of the session
    _native_static: Optional[bool] = None
    _native_state = None          # the IterationState whose names the observer is counting
    _native_pushed = 0            # listing entries the observer was told about
    _native_probing = False       # the observer names the Python capture's iteration beside it (no rows)
    _native_verdict = None        # None: not probed yet; True: the probe's names were the capture's; str: why not
    _native_probe_names: List[str] = []
    _native_probe_state = None    # the IterationState the probe names
    _native_dropped = None        # the IterationState a native failure dropped (nothing more of it is captured)
    _internal_n = 0

    # ``_internal`` > 0 while opdump's own Python runs inside a capture (its operators are not the
    # user's): the observer is paused then, and hands its rows and names over
    @property
    def _internal(self) -> int:
        return self._internal_n

    @_internal.setter
    def _internal(self, value: int) -> None:
        old = self._internal_n
        self._internal_n = value
        if self._native_live:
            if old == 0 and value > 0:
                self._native_pause()
            elif old > 0 and value == 0:
                self._native_resume()

    # ------------------------------------------------------------------ which iterations
    def _native_eligible(self) -> bool:
        """The session-wide conditions (module docstring), resolved once."""
        if self._native_static is None:
            self._native_static = False
            try:
                self._native_static = self._native_settings_ok() and _observer() is not None
            except Exception:  # noqa: BLE001 - never into the user's code: the Python capture serves
                self._native_static = False
        return self._native_static

    def _native_settings_ok(self) -> bool:
        if not native_enabled():
            return False
        cfg, session = self.config, self.session
        recorder = session.recorder
        if not (session.device_statistics_only and recorder._launch is not None and recorder.online is None
                and recorder.bin is None and recorder.folder_filter is None):
            return False
        if (cfg.op_debug_mode != 0 or cfg.save_kernel_args or session.selector.mode != 0
                or self._overflow is not None or self._watcher is not None or self._exception is not None):
            return False
        sink = recorder._native_sink()
        batch = getattr(sink, "_batch", None)
        return batch is not None and getattr(batch, "_memo", None) is not None

    def _native_take(self, want: bool) -> bool:
        """Called where the dispatch mode is pushed or popped (``_sync_mode``): whether the
        dispatch mode is wanted for the iteration about to run (False: the observer serves it)."""
        try:
            if self._native_dropped is not None:
                if self._native_dropped is self._state and self._active:
                    return False        # the rest of an iteration a native failure dropped: nothing
                self._native_dropped = None
            if self._native_probing:
                probed = self._native_probe_state
                if want and (probed is None or probed is self._state):
                    return want         # the probed iteration goes on (or has not begun)
                self._native_end_probe()
            usable = (want and not self._native_broken and self._active and self._native_eligible()
                      and not _compiled_anything()
                      and torch._C._len_torch_dispatch_stack() == (1 if self._pushed_mode() else 0))
            if usable and self._native_verdict is None and not self._dumped_any:
                self._native_install(probe=True)
                return want
            use = usable and self._native_verdict is True and self._dumped_any and self.listing.order_written
            if use and not self._native_live:
                self._native_install()
            elif not use and self._native_live:
                self._native_uninstall()
            return want and not self._native_live
        except Exception as exc:  # noqa: BLE001
            self._native_fail(f"{type(exc).__name__}: {exc}")
            return want

    def _pushed_mode(self) -> bool:
        return bool(getattr(self, "_pushed", False)) and self._mode is not None

    def _native_end_probe(self) -> None:
        """The probed iteration is over: the native path may serve later iterations only if the
        observer named every operator of it as the Python capture did (same names, same order)."""
        state = self._native_probe_state
        self._native_uninstall()
        self._native_probing = False
        self._native_obs.set_probe(False, 0)
        if self._native_broken:
            return
        names, python = self._native_probe_names, (state.names if state is not None else None)
        self._native_probe_names = []
        if python is None or not python:
            self._native_verdict = None             # nothing was dumped: probe the next dumped iteration
        elif names == python:
            self._native_verdict = True
        else:
            at = next((i for i, (a, b) in enumerate(zip(names, python)) if a != b), min(len(names), len(python)))
            self._native_verdict = (f"its operators differ from the Python capture's at #{at} "
                                    f"({names[at] if at < len(names) else 'end'} vs "
                                    f"{python[at] if at < len(python) else 'end'})")
            self._native_fail(self._native_verdict)

    def _native_install(self, probe: bool = False) -> None:
        obs = _observer()
        self._native_obs = obs
        obs.configure(self._native_info, self._native_bind, self._native_owner, self._native_slow,
                      self._native_describe_start, self._native_describe_end, self._dump_in, self._dump_out,
                      self.capture_all)
        names = list(self.listing.ops)
        obs.add_listed(names[self._native_pushed:])
        self._native_pushed = len(names)
        obs.new_iteration()
        self._native_state = None
        self._native_probing = probe
        self._native_probe_state = None
        self._native_probe_names = []
        obs.set_probe(probe, 1 if probe else 0)     # probe: our dispatch mode will be on the stack
        batch = self._native_batch()
        obs.install(batch._memo, batch._entries, batch._dtypes)
        self._native_live = True
        self.tracker.on_change = self._native_scope
        self._native_scope()
        self._native_optimizer()
        if self._internal_n:
            obs.pause()

    def _native_uninstall(self) -> None:
        obs = self._native_obs
        if not self._internal_n:
            self._native_pause()
        obs.uninstall()
        obs.set_scope(None)
        obs.set_optimizer(None)
        self._native_live = False
        self.tracker.on_change = None
        self._native_state = None

    def _native_fail(self, why: str) -> None:
        dropped = ""
        state = self._native_state
        if self._native_live and not self._native_probing and state is not None:
            self._native_drop(state)
            dropped = f"; iteration {state.number} is not dumped"
        if not self._native_broken:
            warnings.warn(f"opdump: the native eager capture stopped ({why}){dropped}; the Python capture serves the "
                          f"following iterations",
                          RuntimeWarning, stacklevel=2)
        self._native_broken = True
        if self._native_live:
            try:
                self._native_obs.uninstall()
            except Exception:  # noqa: BLE001
                pass
            self._native_live = False
            self.tracker.on_change = None
        self._native_probing = False

    def _native_drop(self, state) -> None:
        """A native iteration met what the observer does not model: none of its rows is written
        (they were queued, never flushed: a dump never mixes native and Python rows, nor holds
        rows the Python capture would not have written), and nothing more of it is captured."""
        recorder = self.session.recorder
        if state.folder is not None:
            with recorder._lock:
                recorder._pending.pop(state.folder, None)
        state.names = []
        state.n = 0
        self._native_dropped = state
        self._dumping = False

    # ------------------------------------------------------------------ boundaries
    def _native_batch(self):
        return self.session.recorder._native_sink()._batch

    def _native_pause(self) -> None:
        obs = self._native_obs
        names, nonfinite, recorded, ts = obs.pause()
        state = self._native_state
        if self._native_probing:
            self._native_probe_names += names
            error = obs.take_error()
            if error is not None:
                self._native_verdict = error
                self._native_fail(error)
            return
        if state is not None and names:
            state.names += names
            state.n = len(state.names)
        listing = self.listing
        for name in nonfinite:
            op = listing.ops.get(name)
            if op is not None and not op.nonfinite_args:
                op.nonfinite_args = True
                listing.dirty = True
        recorder = self.session.recorder
        recorder.tensors_recorded += recorded
        clock = recorder.clock
        if ts > clock._last:
            clock._last = ts
        error = obs.take_error()
        if error is not None:
            self._native_fail(error)

    def _native_resume(self) -> None:
        self._native_obs.resume()
        self._native_new_state()

    def _native_new_state(self) -> None:
        state = self._state
        if state is not None and state is not self._native_state:
            self._native_obs.new_iteration()
            self._native_state = state
            if self._native_probing:
                if self._native_probe_state is None:
                    self._native_probe_state = state
                    self._native_probe_names = []
                return
            self._native_pushed_names()

    def _native_pushed_names(self) -> None:
        names = list(self.listing.ops)
        if len(names) > self._native_pushed:
            self._native_obs.add_listed(names[self._native_pushed:])
            self._native_pushed = len(names)

    def _native_scope(self) -> None:
        stack = self.tracker.stack
        self._native_obs.set_scope(stack[-1].scope if stack else None)

    def _native_optimizer(self) -> None:
        if self._native_live:
            opt = self._optimizers
            self._native_obs.set_optimizer(f"Default/optimizer-{opt[-1]}" if opt else None)

    # ------------------------------------------------------------------ called from C++ (rare)
    @staticmethod
    def _native_info(name: str, overload: str):
        """Per operator overload, once: (op type, written positions, writes a list, returns nothing),
        or None when it is not dumped as an operator."""
        ns, _, op = name.partition("::")
        func = getattr(getattr(getattr(torch.ops, ns), op), overload or "default")
        facts = facts_of(func)
        if facts.types is None:
            return None
        return facts.types[0], [i for i, _ in facts.written], facts.writes_list, bool(facts.mutated)

    def _native_bind(self):
        """(the rows list of the iteration's folder, the clock's last stamp), or
        None when no dumped iteration is in progress."""
        state = self._state
        if state is None or not self._dumping:
            return None
        self._native_new_state()
        recorder = self.session.recorder
        folder = state.folder or self._folder(state)
        with recorder._lock:
            rows = recorder._rows_of(folder)
        return rows, recorder.clock._last

    def _native_owner(self, var) -> Optional[str]:
        """``Gradients/<scope>`` of the module owning parameter ``var`` (gradient accumulation)."""
        state = self._state
        owner = state.owners.get(id(var)) if state is not None else None
        if owner is None:
            return None
        module_id, pairs, root = owner
        info = state.modules.get(module_id) or (_scope_of(pairs, root), ())
        return backward_scope(info[0])

    def _native_slow(self, op_type, name, io, tensors, ts):
        """One operator side with a tensor the native memo does not read: the Python recorder."""
        recorder = self.session.recorder
        if ts > recorder.clock._last:
            recorder.clock._last = ts
        op = OpInfo(0, op_type, "", "", (), ())
        op.__dict__["full_name"] = name
        recorder.record_all(self._folder(self._state), op, io, self._on_allowed_devices(tensors))
        return recorder.clock._last

    def _native_describe_start(self, index, op_type, overload, scope, phase, forward, var, qualname, values):
        """A new operator (not in the listing): its listing entry, as the Python capture makes it."""
        ns, _, op_name = qualname.partition("::")
        func = getattr(getattr(getattr(torch.ops, ns), op_name), overload or "default")
        args, kwargs = split_args(func, values)
        state, listing = self._state, self.listing
        ids, sources = (), ()
        if phase == Phase.BACKWARD:
            fwd = listing.ops.get(forward) if forward is not None else None
            if fwd is not None:
                ids, sources = fwd.module_ids, fwd.source
            elif var is not None and state is not None:
                owner = state.owners.get(id(var))
                if owner is not None:
                    ids = (state.modules.get(owner[0]) or ("", ()))[1]
        elif phase == Phase.MODULE and self.tracker.stack:
            ids = self.tracker.stack[-1].ids
        if not sources:
            sources = walk(1, True)[1]
        op = OpInfo(index, op_type, scope, overload or "default", ids, sources)
        op.nonfinite_args = has_nonfinite_arg(args, kwargs)
        op.selected = True
        op.args = non_tensor_args(func, args, kwargs)
        inputs = flat_tensors(args, [])
        if kwargs:
            flat_tensors(kwargs.values(), inputs)
        return op, args, kwargs, inputs

    def _native_describe_end(self, token, outputs) -> None:
        op, args, kwargs, inputs = token
        self._describe(op, args, kwargs, inputs, outputs)
        self.listing.add(op)
