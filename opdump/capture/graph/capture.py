"""One graph handed over by Dynamo: its dump path, its real path, and the fallback.

For each graph two callables are built:
* the *dump path*: AOTAutograd lowers the graph to ATen forward and backward
  graphs (no decompositions beyond ATen's own, so ``convolution``, ``addmm``,
  ``native_layer_norm`` stay whole); each gets a graph id in compile order, its
  ``.ir``/JSON/execution-order files, views that tolerate real strides
  (:mod:`.strides`) and taps inserted by :mod:`.instrument`; it runs operator by
  operator like MindSpore's O0;
* the *real path*: the user's own backend (inductor by default), compiled on
  the untouched graph.
Each call picks the dump path only when the current iteration dumps, so other
iterations run at the real backend's speed.  A backward pass follows its
forward: it is instrumented exactly when its forward ran on the dump path.

Guarantees (README, "Graph mode"): nothing that goes wrong on the dump side
reaches the user's compile or step, and the user's own errors reach the user
unchanged.  An exception an operator of the user's program raises in a dumped
call (an index out of range, a shape mismatch, ``torch._assert``, a custom op's
error) propagates as it is: no warning, no second run, and later iterations
dump as before (the rule is :func:`.errors.users_error`).  Any other exception
while building the dump path or running it — opdump's own, or a limit of the
operator-by-operator path (out of memory, a kernel eager lacks) — gives ONE
warning naming the graph (:meth:`GraphCapture.fail`);
the graph then runs on the real backend (a failure at compile time compiles it
then; after a failure at run time with no real path compiled, as with
``iteration: "all"``, Dynamo's graph runs eagerly); a backward compiled after the failure runs uninstrumented; a tap that
fails leaves the current call's values unchanged.  A call that failed at run time
runs again, whole, on that path, from the same inputs: AOTAutograd applies a
graph's input mutations (buffers and inputs updated in place) only after its last
operator, so a failure inside the graph left none of them applied; what the
failed run did outside tensors stays done (random draws advanced the generator,
a custom op's own side effects happened) and happens again.  Errors of the user's real
backend are the user's own and propagate as they would without opdump, and so
do the exceptions Dynamo raises through a backend on purpose (restart, skip).
When the session closes, the capture drops its reference to it: the compiled
model keeps working (real path, or the dump path with inert taps) and keeps
nothing of the session alive.
"""
from __future__ import annotations

import functools
import warnings
import weakref
from typing import Callable, List, Optional, Sequence, Union

import torch
import torch.fx as fx
from torch._dynamo.exc import RestartAnalysis, SkipFrame

from ...debug.exception import compiled_call_failed, guard_operators
from . import faults
from .errors import users_error
from .frame_scope import FrameScope, frame_scope
from .frames import frame_entry, frame_key, root_class
from .inputs import input_names, lifted_constants, param_positions
from .instrument import instrument, uninstrument
from .listing import write_graph_files
from .ops import read_ops
from .runtime import GraphRuntime
from .strides import tolerate_real_strides

Real = Union[str, Callable, None]

#: exceptions Dynamo raises through a backend on purpose (restart the analysis with other
#: assumptions, skip the frame): passed through, they are no failure of the dump
_DYNAMO_CONTROL = (RestartAnalysis, SkipFrame)


def compile_real(real: Real, real_options: dict, gm: fx.GraphModule, example_inputs):
    """The user's backend (a name or a callable) applied to Dynamo's graph."""
    if real is None or isinstance(real, str):
        real = torch._dynamo.lookup_backend(real or "inductor")
    if real_options:
        return real(gm, example_inputs, **real_options)
    return real(gm, example_inputs)


_warned_backends: set = set()


def _warn_not_inductor(real: Real) -> None:
    """``graph_dump: "kernels"`` with another backend: its kernels cannot be observed (once per backend)."""
    name = real if isinstance(real, str) else getattr(real, "__name__", repr(real))
    if name not in _warned_backends:
        _warned_backends.add(name)
        warnings.warn(f"opdump: graph_dump \"kernels\" observes inductor's kernels only; graphs compiled with "
                      f"backend {name!r} are dumped operator by operator", RuntimeWarning, stacklevel=3)


class GraphCapture:
    """The dump and real paths of one Dynamo graph, and what happens when the dump side fails."""

    def __init__(self, session, real: Real, real_options: dict):
        self.session = session
        self.real = real
        self.real_options = real_options
        self.root: Optional[str] = None
        self.frame_scope = FrameScope()
        self.frame: Optional[str] = None
        self.names: List[Optional[str]] = []
        self.forward_id: Optional[int] = None
        #: what a call of this graph counts as for iterations without an optimizer: its frame
        #: (every recompile of it alike), else its forward graph (``Session.enter_forward``)
        self.entry = None
        self.device_ok = True
        self.failed = False
        self.runtimes: List[GraphRuntime] = []
        self.real_fn = None
        self.gm: Optional[fx.GraphModule] = None
        # weakly: a graph Dynamo dropped (reset, recompile) is not kept alive by an open session
        detach = weakref.WeakMethod(self.detach)
        session.on_close(lambda: detach() is not None and detach()())

    # ------------------------------------------------------------------ compile
    def compile(self, gm: fx.GraphModule, example_inputs: Sequence):
        self.gm = gm
        self.entry = frame_entry()
        dump_fn = None
        try:
            dump_fn = self._compile_dump(gm, example_inputs)
        except _DYNAMO_CONTROL:
            raise
        except Exception as exc:  # noqa: BLE001 - the dump must never break the compile
            self.fail(exc, "building the dump path")
        cfg = self.session.config
        if self.failed or not (cfg.iteration.all and cfg.enable and self.device_ok):
            self.real_fn = compile_real(self.real, self.real_options, gm, example_inputs)
        return self._dispatcher(dump_fn)

    def _compile_dump(self, gm: fx.GraphModule, example_inputs: Sequence):
        from torch._dynamo.backends.common import aot_autograd

        self.frame = frame_key()
        self.frame_scope = frame_scope()           # a graph break's frame: scopes as in eager
        fallback = root_class(self.frame)          # (also remembers the root for later breaks)
        self.root = self.frame_scope.root or fallback
        self.names = input_names(gm, example_inputs)
        device = next((t.device for t in example_inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
        self.device_ok = self.session.device_allowed(device)
        if self.session.config.graph_dump == "kernels":
            from ..kernels.compile import compile_kernels, is_inductor   # not at import: kernels imports graph
            if is_inductor(self.real):
                return compile_kernels(self, gm, example_inputs, self.real_options, self.real)
            _warn_not_inductor(self.real)
        return aot_autograd(
            fw_compiler=functools.partial(self._compile_aten, kind="forward"),
            bw_compiler=functools.partial(self._compile_aten, kind="backward"),
            inference_compiler=functools.partial(self._compile_aten, kind="inference"),
            keep_inference_input_mutations=True,
        )(gm, example_inputs)

    def _compile_aten(self, gm: fx.GraphModule, example_inputs, *, kind: str):
        """AOTAutograd's compiler for one ATen graph: instrumented, or as it is when the
        capture failed (a backward is compiled lazily, at the first backward call)."""
        from functorch.compile import make_boxed_func

        session = self.session
        if self.failed or session is None:
            return make_boxed_func(gm.forward)
        try:
            graph_id = session.new_graph_id()
            if kind != "backward":
                self.forward_id = graph_id
            pairs = read_ops(gm, kind, self.root, self.frame_scope)
            ops = [op for _, op in pairs]
            for op in ops:
                op.selected = session.selector.select(op)
            params = param_positions(gm, self.names) if kind != "backward" else []
            runtime = GraphRuntime(self, session, graph_id, kind, ops, params, lifted_constants(gm))
            self.runtimes.append(runtime)
            if session.exception_dump is None:        # exception dump: nothing written unless one raises
                write_graph_files(session.layout, gm, graph_id, kind, ops, params)
            tolerate_real_strides(gm)
            nodes = [n for n, _ in pairs]
            if session.config.op_debug_mode == 3:     # overflow-only dump: every operator to the watch
                from ...debug.overflow_graph import instrument_overflow, session_watch
                instrument_overflow(gm, runtime, nodes, session_watch(session))
            elif session.exception_dump is None:      # (exception dump: no taps, the guards do it)
                instrument(gm, runtime, nodes, session.config.dump_inputs, session.config.dump_outputs)
            # every mode: each operator inside try, so that its exception is known as the
            # user's (errors.users_error); with the exception dump on, the guard dumps it
            guard_operators(gm, runtime, nodes)
            faults.check(f"compile:{kind}")
        except _DYNAMO_CONTROL:
            raise
        except Exception as exc:  # noqa: BLE001
            self.fail(exc, f"compiling the {kind} graph")
            uninstrument(gm)
            tolerate_real_strides(gm)
        return make_boxed_func(gm.forward)

    # ------------------------------------------------------------------ calls
    def _dispatcher(self, dump_fn):
        capture = self

        def opdump_graph_call(*args):
            session = capture.session
            if session is not None:
                fid = capture.forward_id if capture.forward_id is not None else -1
                session.enter_forward(capture.entry if capture.entry is not None else fid, args)
                if not capture.failed and (capture.real_fn is None or (capture.device_ok and session.is_dumping())):
                    try:
                        faults.check("dumped call")
                        return dump_fn(*args)
                    except Exception as exc:  # noqa: BLE001 - the dump's failure: run again below
                        if users_error(exc):
                            for runtime in capture.runtimes:     # held tensors secured before user code runs
                                runtime.call_raised()
                            raise                 # an operator of the user's program raised: theirs
                        capture.fail(exc, "a dumped call")
                session.note_graph_ran(fid)
                if session.exception_dump is not None:
                    return capture.fallback_naming_errors(*args)
            elif not capture.failed and capture.real_fn is None:
                return dump_fn(*args)                     # the session closed: the taps are inert
            return capture.fallback(*args)

        return opdump_graph_call

    def fallback(self, *args):
        """The real path; after a failure where none was compiled, Dynamo's graph run eagerly."""
        if self.real_fn is not None:
            return self.real_fn(*args)
        return self.gm(*args)

    def fallback_naming_errors(self, *args):
        """op_debug_mode 4, a call off the operator-by-operator path: an exception from the
        compiled code gets one warning naming this graph (README, "Debug dumps")."""
        try:
            return self.fallback(*args)
        except Exception as exc:
            compiled_call_failed(self, exc)
            raise

    # ------------------------------------------------------------------ failure and close
    def describe(self) -> str:
        ids = ", ".join(f"{rt.kind} graph {rt.graph_id}" for rt in self.runtimes)
        where = f" compiled from {self.frame}" if self.frame else ""
        return f"the graph of {self.root or 'the compiled code'}{where}" + (f" ({ids})" if ids else "")

    def fail(self, exc: BaseException, where: str) -> None:
        """The dump side of this graph failed: one warning, no more dumping, real path from now on."""
        first = not self.failed
        self.failed = True
        for runtime in self.runtimes:
            runtime.detach()
        if first:
            warnings.warn(f"opdump: {self.describe()} is no longer dumped: {where} failed with "
                          f"{type(exc).__name__}: {exc}. It runs without dumping from now on; training goes on.",
                          RuntimeWarning, stacklevel=2)

    def detach(self) -> None:
        """The session closed: drop it (and let the runtimes drop it)."""
        for runtime in self.runtimes:
            runtime.detach()
        self.session = None
