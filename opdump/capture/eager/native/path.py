"""Which eager iterations the native observer serves, and what Python gives it.

:class:`NativeEager` is mixed into :class:`~opdump.capture.eager.mode.EagerCapture`.  The
native path (``observer.cpp``) serves a dumped iteration, instead of the dispatch mode,
only where it is proven to give the Python capture's statistic.csv (all columns but the
timestamps, same rows in the same order; tests/test_native_eager*.py):

* statistics only, every category from the native one-pass kernel (``stat_calc_mode``
  ``"device"`` or ``"host"``, no ``md5``, precision ``"high"``), no tensor files, no online
  compare, ``file_format`` npy, no ACL folder filter;
* ``dump_mode`` 0 (every operator), ``op_debug_mode`` 0, no watcher, no ``save_kernel_args``;
* or instead the overflow watch (``op_debug_mode`` 3, any recorder settings: the Python watch
  records): the observer reads outputs and hands the operators it cannot clear to the
  watch (:mod:`.watch`, ``watch.cpp``; tests/test_native_watch.py);
* ``torch.distributed`` not initialised (the Python capture records a collective's outputs
  when its work completes);
* not the first dumped iteration (that one writes the listing with the Python capture);
* the probe passed (below);
* nothing compiled in the process (``torch._dynamo`` has analysed no frame), no other
  dispatch mode on the stack;
* ``OPDUMP_NATIVE_EAGER`` is not ``0`` and the native module is built; CUDA not initialised in
  the process unless ``OPDUMP_NATIVE_EAGER=1`` (untested on a GPU).

Tensors the native memo does not read (not CPU, a dtype it lacks) are recorded by the
Python recorder, called from C++ for that operator side.  An operator whose name is not in
the listing yet is described by a call into Python (its sources, argument text and
shapes), as the Python capture does.

The probe (why a served iteration is the Python capture's): in the first dumped iteration
the observer runs beside the Python capture's dispatch mode and only names operators (no
rows; calls made while the mode handles an operator -- its own call of it, opdump's work,
the ``detach`` of an output autograd saves -- are none of the user's: the mode is off the
stack then).  At that iteration's end its names are compared with the capture's: the
observer serves later iterations only if every name is the same, in the same order.  A
difference, or a pattern the observer does not model (an operator called by another
operator's autograd kernel, above autograd: the mode would see it first), is one
``RuntimeWarning``; the Python capture then serves every iteration, so the dump is the
Python capture's either way.

Failure: anything the observer cannot handle in a served iteration (a C++ or Python error,
an operator called above autograd by another one -- a program whose operators changed
since the probe) turns it off; none of that iteration's rows is written (they wait in the
recorder until the iteration ends: never rows of both paths, never rows the Python capture
would not write), one ``RuntimeWarning`` says why and which iteration is missing, and the
Python capture serves every later iteration.  Nothing raises into the user's code.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import List, Optional

import torch

from ....stats.native import switched_on
from .callbacks import NativeCallbacks
from .inert import InertMode
from .watch import NativeWatch

ENV_SWITCH = "OPDUMP_NATIVE_EAGER"


def native_enabled() -> bool:
    """The switch: the observer serves eligible iterations unless ``OPDUMP_NATIVE_EAGER=0``
    (on by default: its dumps equal the Python capture's on the suite and the zoo, and the
    probe proves the naming of each program it serves)."""
    return switched_on(ENV_SWITCH)


def native_requested() -> bool:
    """``OPDUMP_NATIVE_EAGER=1`` set explicitly: a program the probe turns away is told so."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


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


def _cuda_in_use() -> bool:
    """CUDA initialised in this process: the native path is on by default only for CPU programs
    (its CUDA side -- every CUDA tensor handed to the Python recorder from C++ -- has not been
    run on a GPU yet); ``OPDUMP_NATIVE_EAGER=1`` asks for it there too."""
    cuda = sys.modules.get("torch.cuda")
    return bool(cuda is not None and cuda.is_initialized())


class NativeEager(NativeCallbacks, NativeWatch):
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
    _native_inert: Optional[InertMode] = None     # on the dispatch stack while the observer serves
    _native_stray: Optional[str] = None            # an operator that reached it
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
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return False        # collectives' outputs are recorded when their work completes (.collectives)
        if self._overflow is not None:      # op_debug_mode 3: the watch (.watch), whatever is recorded
            return self._native_watch_ok()
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
                      and not _compiled_anything() and (not _cuda_in_use() or native_requested())
                      and torch._C._len_torch_dispatch_stack() == ((1 if self._pushed_mode() else 0)
                                                                   + (1 if self._native_inert is not None else 0)))
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
            self._native_fail(self._native_verdict, turned_away=True)

    def _native_install(self, probe: bool = False) -> None:
        obs = _observer()
        self._native_obs = obs
        obs.configure(self._native_info, self._native_bind, self._native_owner, self._native_slow,
                      self._native_describe_start, self._native_describe_end, self._dump_in, self._dump_out,
                      self.capture_all)
        if self._overflow is not None:
            from ....debug.overflow_rules import UNINITIALIZED
            obs.set_watch(self._native_watch_kind, self._native_watch_bound, self._native_watch_add, sorted(UNINITIALIZED))
        names = list(self.listing.ops)
        obs.add_listed(names)       # configure() forgot any earlier capture's (another session's) names
        self._native_pushed = len(names)
        obs.new_iteration()
        self._native_state = None
        self._native_probing = probe
        self._native_probe_state = None
        self._native_probe_names = []
        obs.set_probe(probe, 1)     # one mode of ours on the stack: the Python capture's (probe) or the inert one
        if self._overflow is not None:
            obs.install(None, None, None)
        else:
            batch = self._native_batch()
            obs.install(batch._memo, batch._entries, batch._dtypes)
        self._native_live = True
        self.tracker.on_scope = obs.set_scope
        self._native_scope()
        self._native_optimizer()
        if self._internal_n:
            obs.pause()

    def _native_settle(self) -> None:
        """After ``_sync_mode`` popped the Python capture's mode: the inert mode goes on the stack
        for an iteration the observer serves (it must be the only mode: it is popped last)."""
        try:
            if not self._native_live or self._native_probing or self._native_inert is not None:
                return
            if torch._C._len_torch_dispatch_stack() != 0:
                self._native_fail("another dispatch mode is active")
                self._sync_mode(self._dumping)
                return
            self._native_stray = None
            inert = InertMode(self)
            inert.push()
            self._native_inert = inert
            self._native_obs.set_inert(True)
        except Exception as exc:  # noqa: BLE001 - never into the user's code
            self._native_fail(f"{type(exc).__name__}: {exc}")

    def _native_unsettle(self) -> None:
        inert, self._native_inert = self._native_inert, None
        if inert is not None:
            self._native_obs.set_inert(False)
        if inert is not None and not inert.pop():
            warnings.warn("opdump: the native eager capture's inert dispatch mode stays on the stack under a "
                          "mode entered later", RuntimeWarning, stacklevel=3)

    def _native_uninstall(self) -> None:
        obs = self._native_obs
        if not self._internal_n:
            self._native_pause()
        obs.uninstall()
        self._native_unsettle()
        obs.set_scope(None)
        obs.set_optimizer(None)
        self._native_live = False
        self.tracker.on_scope = None
        self._native_state = None

    def _native_fail(self, why: str, turned_away: bool = False) -> None:
        """Turn the native path off for the session (``why`` says why).  ``turned_away``: the
        probe's verdict, given after the probed iteration (the probe is over by then)."""
        dropped = ""
        state = self._native_state
        if self._native_live and not self._native_probing and state is not None:
            self._native_drop(state)
            dropped = f"; iteration {state.number} is not dumped"
        # a program the probe turns away loses nothing (the Python capture dumped the probed
        # iteration and serves the rest): said only when the native path was asked for by name
        quiet = (self._native_probing or turned_away) and not dropped and not native_requested()
        if not self._native_broken and not quiet:
            warnings.warn(f"opdump: the native eager capture stopped ({why}){dropped}; the Python capture serves the "
                          f"following iterations",
                          RuntimeWarning, stacklevel=2)
        self._native_broken = True
        if self._native_live:
            try:
                self._native_obs.uninstall()
                self._native_unsettle()
            except Exception:  # noqa: BLE001
                pass
            self._native_live = False
            self.tracker.on_scope = None
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
            if self._overflow is not None:
                self._overflow.note_eager()     # operators ran: the iteration gets its summary
        if self._overflow is not None:
            self._native_watch_counted()
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
        if error is None and self._native_stray is not None:
            error = f"{self._native_stray} reached a dispatch mode: the observer cannot tell what the Python capture would see"
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
