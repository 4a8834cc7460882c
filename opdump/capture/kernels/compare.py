"""Compiled against reference in one run (``opdump_settings.compare_compiled``).

In a dumped iteration each kernel-mode graph runs its reference first: the graph
handed to inductor (ATen operators, before lowering), operator by operator with
eager kernels, on the same inputs and RNG state, and once more with every
floating tensor in float64.  Then the compiled code runs (its results are the
ones training keeps) and after each kernel its output buffers are compared, in
memory, with the reference value of the FX node each buffer realizes
(inductor's ``get_origin_node()``, read after fusion).

Each compared buffer gets a status (README, "Kernel-level graph dump"):
* ``equal``: bit for bit;
* ``fusion_precision``: differs, and the compiled value is at least as close to the
  float64 reference as the eager one (e.g. inductor computing a bf16 chain in fp32
  and rounding once, where eager rounds after every operator): expected;
* ``close``: differs, within the dtype's tolerance (torch.testing's defaults), the
  compiled value not closer to float64;
* ``diverged``: outside the tolerance and farther from float64 than eager: a real
  difference;
* ``random``: computed by a kernel that fuses a random operator (dropout, rand…):
  compiled code draws from inductor's own generator, so it is not compared.
The report names the first kernel with a ``diverged`` output whose input buffers
all match (``equal``, ``close``, ``fusion_precision`` or not compared; a
``random`` or ``diverged`` input does not match) — the kernel where compiled and
eager numerics part — and the first kernel whose output differs at all while its
inputs are bit-equal.

Guarantees: the reference runs on clones of the inputs an operator of the graph
mutates, and the RNG state (CPU and CUDA) is restored before the compiled code
runs, so the compiled iteration computes what it computes without comparison.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

_TOLERANCE = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
              torch.float64: (1e-7, 1e-7)}
_ORDER = {"unknown": 0, "equal": 0, "close": 1, "fusion_precision": 1, "random": 2, "diverged": 3}

#: ATen operators that draw random numbers: compiled code draws them from inductor's own generator
#: (unless ``fallback_random``), so their values are not comparable with eager's
RANDOM_OPS = frozenset({"inductor_seeds", "inductor_random", "inductor_randint", "inductor_lookup_seed",
                        "native_dropout", "dropout", "rand", "rand_like", "randn", "randn_like", "randint",
                        "randint_like", "bernoulli", "normal", "uniform", "randperm", "multinomial",
                        "exponential", "geometric", "cauchy", "log_normal", "random"})


def reference_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of the graph handed to inductor, before its post-grad passes rewrite it in place."""
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return fx.GraphModule(gm, graph)


def buffer_origin_pass(record: Dict[str, Optional[str]], previous=None, layouts: Optional[Dict[str, Any]] = None):
    """An identity post-fusion pass (``config._post_fusion_custom_pass``) recording buffer → origin
    node (and, in ``layouts``, buffer → (shape, dtype) where the buffer has a plain layout)."""
    def run(nodes):
        if previous is not None:
            nodes = previous(nodes)
        for snode in nodes:
            for sub in snode.get_nodes():
                ir = getattr(sub, "node", None)
                if ir is None:
                    continue
                try:
                    origin = ir.get_origin_node()
                except Exception:  # noqa: BLE001 - some IR nodes have none
                    origin = None
                record[ir.get_name()] = origin.name if origin is not None else None
                if layouts is not None:
                    try:
                        layouts[ir.get_name()] = (tuple(int(d) for d in ir.get_size()), ir.get_dtype())
                    except Exception:  # noqa: BLE001 - multi-output and symbolic layouts: not listed
                        pass
        return nodes
    return run


def _mutated_inputs(gm: fx.GraphModule) -> set:
    placeholders = {n for n in gm.graph.nodes if n.op == "placeholder"}
    mutated = set()
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and schema.is_mutable:
            for arg, value in zip(schema.arguments, node.args):
                if arg.alias_info is not None and arg.alias_info.is_write and value in placeholders:
                    mutated.add(value.name)
    return mutated


class _Recording(fx.Interpreter):
    """Runs the graph with eager kernels, keeping every node's value (optionally all in float64)."""

    def __init__(self, gm: fx.GraphModule, float64: bool):
        super().__init__(gm, garbage_collect_values=False)
        self.float64 = float64
        self.values: Dict[str, Any] = {}

    def _up(self, value):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.double()
        if isinstance(value, torch.dtype) and value.is_floating_point:
            return torch.float64
        return value

    def call_function(self, target, args, kwargs):
        if self.float64:
            args, kwargs = pytree.tree_map(self._up, (args, kwargs))
        return super().call_function(target, args, kwargs)

    def run_node(self, n):
        value = super().run_node(n)
        if n.op != "output":
            self.values[n.name] = value
        return value


class Reference:
    """The graph's reference runs; :meth:`run` gives one :class:`Comparison` per dumped call."""

    def __init__(self, gm: fx.GraphModule, origins: Dict[str, Optional[str]]):
        self.gm = gm
        self.origins = origins
        self.mutated = _mutated_inputs(gm)

    def run(self, args: List[Any]) -> "Comparison":
        placeholders = [n.name for n in self.gm.graph.nodes if n.op == "placeholder"]
        inputs = [a.clone() if isinstance(a, torch.Tensor) and name in self.mutated else a
                  for name, a in zip(placeholders, args)]
        cpu = torch.random.get_rng_state()
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        try:
            with torch.no_grad():
                eager = _Recording(self.gm, False)
                eager.run(*inputs)
                f64 = None
                try:
                    rec = _Recording(self.gm, True)
                    rec.run(*[a.clone() if isinstance(a, torch.Tensor) and name in self.mutated else a
                              for name, a in zip(placeholders, args)])
                    f64 = rec.values
                except Exception:  # noqa: BLE001 - an operator without float64 support: no classification
                    f64 = None
        finally:
            torch.random.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)
        return Comparison(self.origins, eager.values, f64)


def _leaves(value) -> List[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    return list(value) if isinstance(value, (tuple, list)) else pytree.tree_leaves(value)


def compare_tensors(compiled: torch.Tensor, eager: torch.Tensor, f64: Optional[torch.Tensor]) -> Dict[str, Any]:
    """Metrics and status of one buffer (see the module docstring)."""
    if compiled.shape != eager.shape:
        eager = eager.reshape(compiled.shape) if eager.numel() == compiled.numel() else eager
    if compiled.shape != eager.shape:
        return {"status": "unknown", "reason": f"shape {tuple(compiled.shape)} vs {tuple(eager.shape)}"}
    if torch.equal(compiled, eager):
        return {"status": "equal", "max_abs": 0.0, "max_rel": 0.0}
    if not compiled.is_floating_point():
        return {"status": "diverged", "mismatched": int((compiled != eager).sum())}
    c, e = compiled.double(), eager.double()
    diff = (c - e).abs()
    finite = torch.isfinite(diff)
    max_abs = float(diff[finite].max()) if finite.any() else math.inf
    max_rel = float((diff / e.abs().clamp_min(1e-30))[finite].max()) if finite.any() else math.inf
    rtol, atol = _TOLERANCE.get(compiled.dtype, (1.3e-6, 1e-5))
    close = torch.allclose(compiled.to(eager.dtype), eager, rtol=rtol, atol=atol, equal_nan=True)
    out: Dict[str, Any] = {"max_abs": max_abs, "max_rel": max_rel, "within_tolerance": bool(close),
                           "rtol": rtol, "atol": atol}
    if f64 is not None and f64.shape == compiled.shape:
        err_c = float((c - f64).abs().nan_to_num(math.inf).max())
        err_e = float((e - f64).abs().nan_to_num(math.inf).max())
        out.update(compiled_error_vs_float64=err_c, eager_error_vs_float64=err_e)
        if err_c <= err_e:
            out["status"] = "fusion_precision"
            return out
    out["status"] = "close" if close else "diverged"
    return out


class Comparison:
    """One dumped call: statuses of the buffers compared so far, kernel by kernel."""

    def __init__(self, origins, eager: Dict[str, Any], f64: Optional[Dict[str, Any]]):
        self.origins, self.eager, self.f64 = origins, eager, f64
        self.status: Dict[str, str] = {}            # buffer name -> status
        self.kernels: List[Dict[str, Any]] = []

    def check(self, call, op, outputs) -> str:
        """Compare kernel ``call``'s output buffers (the tap's values) with their reference;
        the kernel's status (its worst output's)."""
        from .wrapper import buffer_names
        names = buffer_names(call.outputs)
        input_status = {n: self.status.get(n, "unknown") for n in call.inputs}    # before this kernel writes
        entry = {"index": call.index, "kernel": call.kernel, "full_name": op.full_name,
                 "fused_operators": op.args.get("fused_operators", []),
                 "source": [f"{s.file}:{s.line}" for s in op.source], "inputs": list(call.inputs),
                 "outputs": []}
        random = any(f.op_type in RANDOM_OPS for f in getattr(op, "fused", ())) or "rand" in call.kernel
        for slot, (name, value) in enumerate(zip(names, outputs)):
            origin = self.origins.get(name)
            if random:                       # inductor's generator, not eager's: nothing to compare
                self.status[name] = "random"
                entry["outputs"].append({"slot": slot, "buffer": name, "reference_node": origin,
                                         "status": "random", "metrics": []})
                continue
            ref = self.eager.get(origin) if origin else None
            ref64 = self.f64.get(origin) if (origin and self.f64 is not None) else None
            results = []
            for i, (c, e) in enumerate(zip(_leaves(value), _leaves(ref) if ref is not None else [])):
                if not (isinstance(c, torch.Tensor) and isinstance(e, torch.Tensor)):
                    continue
                r = _leaves(ref64)[i] if ref64 is not None else None
                results.append(compare_tensors(c.detach(), e, r if isinstance(r, torch.Tensor) else None))
            status = max((r["status"] for r in results), key=lambda s: _ORDER[s], default="unknown")
            self.status[name] = status
            entry["outputs"].append({"slot": slot, "buffer": name, "reference_node": origin, "status": status,
                                     "metrics": results})
        entry["status"] = max((o["status"] for o in entry["outputs"]), key=lambda s: _ORDER[s], default="unknown")
        entry["input_status"] = input_status
        self.kernels.append(entry)
        return entry["status"]

    def report(self, graph_id: int, kind: str, iteration: int, code_path: str) -> Dict[str, Any]:
        def inputs_match(k, allowed):
            return all(s in allowed for s in k["input_status"].values())
        first = next((k for k in self.kernels if k["status"] == "diverged"
                      and inputs_match(k, ("equal", "close", "fusion_precision", "unknown"))), None)
        first_diff = next((k for k in self.kernels if k["status"] not in ("equal", "unknown")
                           and inputs_match(k, ("equal", "unknown"))), None)
        return {"graph_id": graph_id, "kind": kind, "iteration": iteration, "generated_code": code_path,
                "float64_reference": self.f64 is not None,
                "first_divergence": first, "first_difference": first_diff, "kernels": self.kernels}
