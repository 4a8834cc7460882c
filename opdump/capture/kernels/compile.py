"""The kernel-dump variant of one Dynamo graph: inductor's own code, observed per kernel.

``graph_dump: "kernels"`` (README, "Kernel-level graph dump").  The graph is
compiled by inductor (``compile_fx``, with the user's ``options``) through an
``inner_compile`` that, for each AOT graph (forward, backward, inference):

1. reads the graph handed to inductor into operator instances
   (:class:`~.origins.Origins`) before it is lowered;
2. lowers it with ``trace.provenance_tracking_level = 1`` (inductor marks every
   kernel call and records the post-grad nodes each kernel computes) and without
   the FX graph cache (a cache hit skips code generation, so no provenance);
   CUDA graphs are off in this variant (a tap copies tensors out, which a graph
   capture cannot hold);
3. adds a tap after every kernel call of the wrapper module
   (:func:`~.wrapper.instrument_wrapper`), loads it as a module of its own and
   makes it the compiled graph's callable, between the runtime's ``begin`` and
   ``end``; writes the listing (``.ir``/``.json``, one entry per kernel with its
   fused ATen operators, their source lines and the generated code's path) and
   ``…graph_{id}.kernels.json``.

The plain variant (the user's backend on the same Dynamo graph) is compiled
separately by :class:`~opdump.capture.graph.capture.GraphCapture`; iterations
that do not dump run it.  Kernels are generated from the same graph with the
same settings in both, so a dumped iteration computes bit-identical values.

Failures: anything of opdump's failing in steps 1 or 3 gives the capture's one
warning (``GraphCapture.fail``) and the graph keeps inductor's unmarked callable.
Errors of inductor itself propagate as they would without opdump.
"""
from __future__ import annotations

import json
import os
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.fx as fx

from ..graph import faults
from ..graph.inputs import lifted_constants, param_positions
from ..graph.listing import write_graph_files
from ..graph.runtime import GraphRuntime
from ..op_info import OpInfo
from .compare import Comparison, Reference, buffer_origin_pass, reference_copy
from .origins import FusedOp, Origins
from .report import write_report
from .wrapper import TAP, KernelCall, buffer_names, instrument_wrapper
from ...format.dtypes import dtype_name
from ...debug.exception import mark_raised_by_operator

#: inductor settings of the dumped variant (only what it must change; the user's options are kept)
DUMP_PATCHES = {"trace.provenance_tracking_level": 1, "fx_graph_cache": False, "triton.cudagraphs": False}


def is_inductor(real) -> bool:
    """Is the user's backend inductor (the only one whose kernels can be observed)?  Under
    ``opdump run`` a ``torch.compile(mode=..., options=...)`` arrives as torch's inductor wrapper."""
    return real is None or real == "inductor" or isinstance(real, torch._TorchCompileInductorWrapper)


def compile_kernels(capture, gm: fx.GraphModule, example_inputs: Sequence, real_options: dict,
                    real=None) -> Callable:
    """Inductor's compiled code for Dynamo's graph ``gm``, with a tap after each kernel; the
    user's ``mode``/``options`` (inductor config patches) are kept."""
    from torch._functorch import config as functorch_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner(graph: fx.GraphModule, inputs, **kwargs):
        kind = "backward" if kwargs.get("is_backward") else ("inference" if kwargs.get("is_inference") else "forward")
        return _compile_one(capture, graph, inputs, kwargs, kind, compile_fx_inner)

    options = dict(real_options)
    patches = dict(options.pop("options", None) or options.pop("config_patches", None) or {})
    if isinstance(real, torch._TorchCompileInductorWrapper):
        patches = {**real.config, **patches}
    with functorch_config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, inner_compile=inner, config_patches=patches or None)


def _compile_one(capture, gm: fx.GraphModule, inputs, kwargs: dict, kind: str, compile_fx_inner):
    from torch._inductor import config as inductor_config
    from torch._inductor import debug as inductor_debug

    session = capture.session
    if capture.failed or session is None:
        return compile_fx_inner(gm, inputs, **kwargs)
    origins = None
    try:
        origins = Origins(gm, kind, capture.root)
        params = param_positions(gm, capture.names) if kind != "backward" else []
        constants = lifted_constants(gm)
    except Exception as exc:  # noqa: BLE001 - the dump must never break the compile
        capture.fail(exc, f"reading the {kind} graph's operators")
    if origins is None:
        return compile_fx_inner(gm, inputs, **kwargs)
    patches = dict(DUMP_PATCHES)
    buffers: Dict[str, Optional[str]] = {}          # buffer -> the FX node whose value it holds
    layouts: Dict[str, Any] = {}                    # buffer -> (shape, dtype)
    patches["_post_fusion_custom_pass"] = buffer_origin_pass(buffers, inductor_config._post_fusion_custom_pass,
                                                             layouts)
    reference = None
    if session.config.compare_compiled:
        try:
            reference = Reference(reference_copy(gm), buffers)
        except Exception as exc:  # noqa: BLE001
            capture.fail(exc, f"copying the {kind} graph for its reference run")
            return compile_fx_inner(gm, inputs, **kwargs)
    with inductor_debug.reset_provenance_globals(), inductor_config.patch(patches):
        compiled = compile_fx_inner(gm, inputs, **kwargs)
        provenance = {k: list(v) for k, v in inductor_debug._inductor_triton_kernel_to_post_grad_node_info.items()}
    try:
        _observe(capture, session, compiled, gm, kind, origins, provenance, params, constants, reference,
                 Buffers(buffers, layouts))
    except Exception as exc:  # noqa: BLE001
        capture.fail(exc, f"instrumenting the {kind} graph's kernels")
    return compiled


def _short_name(kernel: str) -> str:
    """The op name of a kernel's files: ``cpp_fused_add_relu_0``, ``addmm`` (extern_kernels.addmm),
    ``convolution_backward`` (torch.ops.aten.convolution_backward.default)."""
    if kernel.startswith("extern_kernels."):
        return kernel[len("extern_kernels."):].replace(".", "_")
    if kernel.startswith("torch.ops."):
        parts = kernel.split(".")
        return parts[3] if len(parts) > 3 else parts[-1]
    return kernel.replace(".", "_")


def _common_scope(fused: List[FusedOp], default: str) -> str:
    scopes = [op.scope.split("/") for op in fused]
    if not scopes:
        return default
    common = scopes[0]
    for parts in scopes[1:]:
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return "/".join(common) or default


class Buffers:
    """What inductor's scheduler said about each buffer: the FX node it holds, its shape and dtype."""

    def __init__(self, origins: Dict[str, Optional[str]], layouts: Dict[str, Any]):
        self.origins, self.layouts = origins, layouts

    def describe(self, expression: str, origins: Origins, lowered: fx.GraphModule) -> Dict[str, Any]:
        names = buffer_names([expression])
        name = names[0] if names else None
        node = self.origins.get(name) if name else None
        instance = origins.instance_of(node, lowered)
        layout = self.layouts.get(name) if name else None
        return {"buffer": expression, "node": node, "stores": instance.full_name if instance else None,
                "stores_occurrence": instance.occurrence if instance else None,
                "stores_output": _leaves_operator(node, origins, lowered) if instance else None,
                "shape": list(layout[0]) if layout else None,
                "dtype": dtype_name(layout[1]) if layout else None}


def _leaves_operator(node_name: str, origins: Origins, lowered: fx.GraphModule) -> Optional[bool]:
    """Does the value of ``node_name`` leave its operator instance (used by another operator,
    saved for backward or returned: an output of the operator) or is it a temporary of the
    operator's decomposition (only its own pieces read it)?  None: cannot be told."""
    node = next((n for n in lowered.graph.nodes if n.name == node_name), None)
    own = origins.by_node.get(node_name)
    if node is None or own is None:
        return None
    for user in node.users:
        if user.op == "output" or origins.by_node.get(user.name, -1) != own:
            return True
    return False


def kernel_ops(calls: List[KernelCall], provenance: Dict[str, List[str]], origins: Origins,
               lowered: fx.GraphModule, code_path: str, kind: str, buffers: Optional[Buffers] = None) -> List[OpInfo]:
    """One OpInfo per kernel call: its name, scope (common scope of its operators), the source
    lines of its operators, its outputs' shapes and dtypes (where inductor's layout is plain),
    and (in ``args``, listed in .ir/.json) the kernel, the fused operators and the generated
    code's path."""
    default = "Gradients/Default" if kind == "backward" else "Default"
    ops = []
    for call in calls:
        fused = origins.fused(provenance.get(f"{call.kernel}:{call.handle}", []), lowered)
        sources, seen = [], set()
        for op in fused:
            for src in op.source:
                if src not in seen:
                    seen.add(src)
                    sources.append(src)
        ops.append(OpInfo(
            index=call.index, op_type=_short_name(call.kernel), scope=_common_scope(fused, default),
            source=tuple(sources), node_name=f"kernel{call.index}",
            args={"kernel": call.kernel, "fused_operators": [op.full_name for op in fused],
                  "generated_code": f"{code_path}:{call.line}"},
            arg_text=", ".join(call.outputs),
        ))
        described = [buffers.describe(e, origins, lowered) for e in call.outputs] if buffers else []
        if described and all(d["shape"] is not None for d in described):
            ops[-1].output_meta = [(tuple(d["shape"]), d["dtype"]) for d in described]
        ops[-1].fused = fused          # for the kernels.json listing
        ops[-1].buffers = described or [{"buffer": e} for e in call.outputs]
    return ops


def kernels_json(graph_id: int, kind: str, ops: List[OpInfo], calls: List[KernelCall], code_path: str) -> str:
    """``ms_output_trace_code_graph_{id}.kernels.json``: each kernel, its outputs, its fused operators."""
    doc = {"graph_id": graph_id, "kind": kind, "generated_code": code_path, "kernels": [
        {"index": op.index, "full_name": op.full_name, "kernel": call.kernel, "op_type": op.op_type,
         "handle": call.handle, "generated_code_line": call.line, "outputs": op.buffers,
         "fused_operators": [{"full_name": f.full_name, "op_type": f.op_type, "scope": f.scope,
                              "occurrence": f.occurrence,
                              "source": [{"file": s.file, "line": s.line, "code": s.code, "function": s.function}
                                         for s in f.source]} for f in op.fused]}
        for op, call in zip(ops, calls)]}
    return json.dumps(doc, indent=1)


def _write_report(runtime, comparison: Comparison, folder: str, code_path: str) -> None:
    """The call's compare_compiled report (:mod:`.report`); a failure is the graph's one warning."""
    try:
        write_report(runtime.session, runtime.graph_id, runtime.kind, comparison, folder, code_path)
    except Exception as exc:  # noqa: BLE001
        runtime._failed(exc, "writing compiled_vs_eager")


def _observe(capture, session, compiled, lowered: fx.GraphModule, kind: str, origins: Origins,
             provenance: Dict[str, List[str]], params, constants, reference: Optional[Reference],
             buffers: Optional[Buffers] = None) -> None:
    from torch._inductor.codecache import PyCodeCache

    source = getattr(compiled, "source_code", None)
    if not source or getattr(compiled, "current_callable", None) is None:
        raise RuntimeError("inductor returned no Python wrapper (cpp_wrapper or AOT mode is not observed)")
    source, calls = instrument_wrapper(source, tag=f"opdump kernel taps {uuid.uuid4().hex}")
    module = PyCodeCache.load(source)
    code_path = os.path.abspath(module.__file__)
    graph_id = session.new_graph_id()
    if kind != "backward":
        capture.forward_id = graph_id
    ops = kernel_ops(calls, provenance, origins, lowered, code_path, kind, buffers)
    for op in ops:
        op.selected = session.selector.select(op)
        op.mutates = True       # a kernel writes its buffers with no version bump, in place too (`buf26 = buf25  # reuse`)
    runtime = GraphRuntime(capture, session, graph_id, kind, ops, params, constants)
    capture.runtimes.append(runtime)
    layout = session.layout
    write_graph_files(layout, lowered, graph_id, kind, ops, params)     # .ir/.json, execution order
    layout.write_small(layout.ir_path(graph_id, "kernels.json"),
                       kernels_json(graph_id, kind, ops, calls, code_path).encode())
    dump_outputs = session.config.dump_outputs
    dump_tensors = session.config.dump_tensors
    comparing: List = [None]           # the Comparison of the dumped call in progress

    def tap(index: int, outputs, reads=()) -> None:
        comparison = comparing[0]
        status = None
        if comparison is not None:
            try:
                status = comparison.check(calls[index], ops[index], outputs)
            except Exception as exc:  # noqa: BLE001 - the dump must never break the step
                comparing[0] = None
                runtime._failed(exc, f"comparing {ops[index].full_name} with its reference")
        if not (dump_outputs and ops[index].selected):
            return
        if status is None:
            runtime.tap_outputs(index, outputs)
            return
        # compare_compiled: tensor files only for a diverging kernel (its outputs and the buffers
        # it read), statistics for every kernel (README, "Kernel-level graph dump")
        diverged = status == "diverged"
        runtime.tap_outputs(index, outputs, files=diverged)
        if diverged and dump_tensors and reads:
            runtime.tap_inputs(index, reads)

    module.__dict__[TAP] = tap
    inner_call = module.call

    def call(args):
        live = runtime.session
        if reference is not None and live is not None and live.is_dumping():
            try:
                comparing[0] = reference.run(list(args))
            except Exception as exc:  # noqa: BLE001
                runtime._failed(exc, "the reference run")
        runtime.begin(args)
        folder = runtime.folder
        try:
            return inner_call(args)
        except Exception as exc:
            # inductor's code of the user's program raised (the taps catch their own exceptions):
            # the user's error, propagated unchanged by the graph dispatcher (capture/graph/errors.py)
            mark_raised_by_operator(exc)
            raise
        finally:
            runtime.end()
            comparison, comparing[0] = comparing[0], None
            if comparison is not None and folder is not None:
                _write_report(runtime, comparison, folder, code_path)

    faults.check(f"compile:{kind}")
    compiled.current_callable = call
