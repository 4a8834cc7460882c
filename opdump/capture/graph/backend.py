"""opdump's ``torch.compile`` backend (SPEC F10).

For each graph Dynamo hands over, two callables are built:
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
"""
from __future__ import annotations

import functools
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.fx as fx

from ..naming import _clean_path
from .instrument import GraphRuntime, instrument
from .ops import read_ops
from .strides import tolerate_real_strides
from ...write.dtypes import dtype_name
from ...write.graph_files import render_execution_order, render_graph_json, render_ir

Real = Union[str, Callable, None]


def backend(real: Real = "inductor", *, session=None, **real_options) -> Callable:
    """A ``torch.compile`` backend that dumps, wrapping the user's ``real`` backend.

    ``real`` is a backend name (``"inductor"``, ``"eager"``, ``"aot_eager"``…) or a
    backend callable; ``session`` defaults to the current session (or one started
    from ``$OPDUMP_CONFIG``) at compile time.
    """
    def opdump_backend(gm: fx.GraphModule, example_inputs):
        from ...session import current_session
        sess = session or current_session()
        if sess is None:
            raise RuntimeError("opdump.backend: no dump session; set OPDUMP_CONFIG or open "
                               "`with opdump.Session(config):` before the first call of the compiled model")
        return _GraphCapture(sess, real, real_options).compile(gm, example_inputs)

    opdump_backend.__name__ = "opdump"
    return opdump_backend


def _root_class() -> Optional[str]:
    """The class of ``self`` in the frame Dynamo is compiling (the model's root), if any."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        tx = InstructionTranslator.current_tx()
        code = tx.f_code
        if code.co_argcount:
            first = tx.f_locals.get(code.co_varnames[0])
            if isinstance(first, torch.nn.Module):
                return type(first).__name__
    except Exception:  # noqa: BLE001 - Dynamo internals vary across versions: the scope simply omits the root
        return None
    return None


_last_root: Dict[str, str] = {}


def _frame_key() -> Optional[str]:
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        code = InstructionTranslator.current_tx().f_code
        name = re.sub(r"^torch_dynamo_resume_in_(.*)_at_\d+$", r"\1", code.co_name)
        return f"{code.co_filename}:{name}"
    except Exception:  # noqa: BLE001
        return None


class _GraphCapture:
    def __init__(self, session, real: Real, real_options: dict):
        self.session = session
        self.real = real
        self.real_options = real_options
        self.root: Optional[str] = None
        self.input_names: List[Optional[str]] = []
        self.forward_id: Optional[int] = None

    # ------------------------------------------------------------------ compile
    def compile(self, gm: fx.GraphModule, example_inputs: Sequence):
        from torch._dynamo.backends.common import aot_autograd

        key = _frame_key()
        self.root = _root_class() or (key and _last_root.get(key))
        if key and self.root:
            _last_root[key] = self.root
        self.input_names = self._input_names(gm, example_inputs)
        device = next((t.device for t in example_inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
        self.device_ok = self.session.device_allowed(device)

        dump_fn = aot_autograd(
            fw_compiler=functools.partial(self._compile_aten, kind="forward"),
            bw_compiler=functools.partial(self._compile_aten, kind="backward"),
            inference_compiler=functools.partial(self._compile_aten, kind="inference"),
            keep_inference_input_mutations=True,
        )(gm, example_inputs)
        cfg = self.session.config
        real_fn = None
        if not (cfg.iteration.all and cfg.enable and self.device_ok):
            real_fn = self._compile_real(gm, example_inputs)
        return self._dispatcher(dump_fn, real_fn)

    def _compile_real(self, gm, example_inputs):
        real = self.real
        if real is None or isinstance(real, str):
            real = torch._dynamo.lookup_backend(real or "inductor")
        if self.real_options:
            return real(gm, example_inputs, **self.real_options)
        return real(gm, example_inputs)

    def _dispatcher(self, dump_fn, real_fn):
        session = self.session
        capture = self

        def opdump_graph_call(*args):
            fid = capture.forward_id if capture.forward_id is not None else -1
            session.enter_forward(fid)
            if real_fn is None or (capture.device_ok and session.is_dumping()):
                return dump_fn(*args)
            session.note_graph_ran(fid)
            return real_fn(*args)

        return opdump_graph_call

    @staticmethod
    def _input_names(gm: fx.GraphModule, example_inputs) -> List[Optional[str]]:
        """Dump names of Dynamo's graph inputs: parameter/buffer paths, else ``inputs{k}``."""
        names: List[Optional[str]] = []
        k = 0
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, node in enumerate(placeholders):
            value = example_inputs[i] if i < len(example_inputs) else None
            if not isinstance(value, torch.Tensor):
                names.append(None)
                continue
            source = getattr(node.meta.get("grapharg"), "source", None)
            text = ""
            if source is not None:
                text = source.name() if callable(getattr(source, "name", None)) else str(getattr(source, "name", ""))
            if "_parameters[" in text or "_buffers[" in text or isinstance(value, torch.nn.Parameter):
                names.append(_clean_path(text.replace("._parameters['", ".").replace("._buffers['", ".")) or node.name)
            else:
                names.append(f"inputs{k}")
                k += 1
        return names

    def _compile_aten(self, gm: fx.GraphModule, example_inputs, *, kind: str):
        from functorch.compile import make_boxed_func

        session = self.session
        cfg = session.config
        graph_id = session.new_graph_id()
        if kind != "backward":
            self.forward_id = graph_id
        pairs = read_ops(gm, kind, self.root)
        ops = [op for _, op in pairs]
        for op in ops:
            op.selected = session.selector.select(op)
        params = self._param_positions(gm) if kind != "backward" else []
        runtime = GraphRuntime(session, graph_id, kind, ops, params)
        self._write_graph_files(gm, graph_id, kind, ops, params)
        self._dump_constants(gm, graph_id)
        tolerate_real_strides(gm)
        instrument(gm, runtime, [n for n, _ in pairs], cfg.dump_inputs, cfg.dump_outputs)
        return make_boxed_func(gm.forward)

    def _param_positions(self, gm: fx.GraphModule) -> List[Tuple[int, str]]:
        """(placeholder position, name) of the AOT forward inputs that map to Dynamo inputs."""
        out = []
        for pos, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
            desc = node.meta.get("desc")
            idx = getattr(desc, "idx", pos) if desc is not None else pos
            if isinstance(idx, int) and 0 <= idx < len(self.input_names) and self.input_names[idx]:
                out.append((pos, self.input_names[idx]))
        return out

    def _write_graph_files(self, gm, graph_id: int, kind: str, ops, params) -> None:
        layout = self.session.layout
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        described = []
        for pos, name in params:
            val = placeholders[pos].meta.get("val")
            meta = (tuple(val.shape), dtype_name(val.dtype)) if isinstance(val, torch.Tensor) else None
            described.append((name, meta))
        layout.write_small(layout.ir_path(graph_id), render_ir(graph_id, kind, ops, described).encode())
        layout.write_small(layout.ir_path(graph_id, "json"), render_graph_json(graph_id, kind, ops, described).encode())
        layout.write_small(layout.execution_order_path(graph_id),
                           render_execution_order(op.full_name for op in ops).encode())

    def _dump_constants(self, gm: fx.GraphModule, graph_id: int) -> None:
        """Lifted constant tensors of the graph → ``{graph_id}/constants/`` (SPEC F19)."""
        session = self.session
        constants = []
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(gm, str(node.target), None)
                if isinstance(value, torch.Tensor):
                    constants.append(value)
        if not constants or not session.config.enable:
            return
        session.recorder.record_parameters(session.layout.constants_dir(graph_id),
                                           [(f"data-{i}", value) for i, value in enumerate(constants)])

