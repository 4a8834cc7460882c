"""Training runs of zoo models, plain or dumped, as a user would write them.

One loop for every model and mode: seeded model, AdamW, generated batches,
``loss.backward()``, ``opt.step()``, ``opt.zero_grad()``.  A dumped run opens an
``opdump.Session`` on a MindSpore ``data_dump.json`` and starts eager capture
(as ``opdump run`` does); in graph mode the model is ``torch.compile``d with
``session.backend()`` -- inductor as the real backend.

Runs are expensive (Dynamo + AOTAutograd on 2 cores), so :class:`ZooRuns` makes
each ``(model, kind)`` once per test session and hands the same result (or the
same exception) to every check.
"""
from __future__ import annotations

import contextlib
import json
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

import opdump
from opdump.capture.eager import EagerCapture

from .models import MODELS, NanSwitch, ZooModel, nan_hook

STEPS = 2
NAN_STEP = 1
KINDS = ("plain", "eager", "graph", "eager_nan", "graph_nan")   # what ZooRuns.get accepts


@dataclass
class Run:
    """What a run left: its losses (one per step) and, when dumped, its dump root."""

    model: str
    kind: str
    losses: List[torch.Tensor]
    root: Optional[Path]
    seconds: float
    warnings: List[str] = field(default_factory=list)


def write_config(folder: Path, *, saved_data: str, iteration: str = "all") -> Path:
    """A MindSpore ``data_dump.json`` dumping into ``folder/dump`` → its path."""
    cfg = {
        "common_dump_settings": {
            "op_debug_mode": 0, "dump_mode": 0, "path": str(folder / "dump"), "net_name": "Net",
            "iteration": iteration, "saved_data": saved_data, "input_output": 0, "kernels": [],
            "support_device": [0], "statistic_category": ["max", "min", "nan count", "positive inf count",
                                                          "negative inf count", "l2norm"],
        },
        "e2e_dump_settings": {"enable": True, "trans_flag": True},
    }
    path = folder / "data_dump.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path


def train(spec: ZooModel, folder: Optional[Path], *, mode: Optional[str], nan_step: Optional[int] = None,
          steps: int = STEPS, saved_data: str = "tensor", iteration: str = "all") -> Run:
    """Train ``spec`` ``steps`` steps; ``mode`` None (no opdump), ``"eager"`` or ``"graph"``."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = spec.build()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    batches = [spec.batch(gen) for _ in range(steps)]
    handle = None
    if nan_step is not None:
        handle = model.get_submodule(spec.nan_module).register_forward_hook(nan_hook)
    losses: List[torch.Tensor] = []
    start = time.perf_counter()
    NanSwitch.on = False
    with warnings.catch_warnings(record=True) as caught, contextlib.ExitStack() as stack:
        warnings.simplefilter("always")
        forward: Callable = model
        if mode is not None:
            cfg = write_config(folder, saved_data=saved_data, iteration=iteration)
            session = stack.enter_context(opdump.Session(str(cfg)))
            stack.enter_context(EagerCapture(session))
            if mode == "graph":
                forward = torch.compile(model, backend=session.backend("inductor"), dynamic=False)
        try:
            for step, batch in enumerate(batches):
                NanSwitch.on = step == nan_step
                if spec.step_attr:
                    model.zoo_step = step
                with torch.autocast("cpu", dtype=torch.bfloat16) if spec.autocast else contextlib.nullcontext():
                    out = forward(**batch)
                loss = out if isinstance(out, torch.Tensor) else out.loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach().clone())
        finally:
            NanSwitch.on = False
            if handle is not None:
                handle.remove()
    torch._dynamo.reset()
    seconds = time.perf_counter() - start
    return Run(spec.name, mode or "plain", losses, folder / "dump" if mode else None, seconds,
               [f"{w.category.__name__}: {w.message}" for w in caught])


class ZooRuns:
    """Each ``(model, kind)`` run once per test session; a failed run fails every check using it."""

    def __init__(self, make_folder: Callable[[str], Path]):
        self._make_folder = make_folder
        self._done: Dict[Tuple[str, str], object] = {}

    def get(self, name: str, kind: str) -> Run:
        key = (name, kind)
        if key not in self._done:
            spec = MODELS[name]
            mode = None if kind == "plain" else kind.split("_")[0]
            nan = kind.endswith("_nan")
            folder = None if mode is None else self._make_folder(f"zoo_{name}_{kind}")
            try:
                self._done[key] = train(spec, folder, mode=mode, nan_step=NAN_STEP if nan else None,
                                        saved_data="statistic" if nan else "tensor")
            except Exception as exc:  # noqa: BLE001 - handed to every check of this run, with its traceback
                self._done[key] = RuntimeError(f"zoo run {name}/{kind} raised:\n{traceback.format_exc(limit=-4)}")
                self._done[key].__cause__ = exc
        result = self._done[key]
        if isinstance(result, BaseException):
            raise result
        return result

    def timings(self) -> List[Tuple[str, str, float]]:
        return [(n, k, r.seconds) for (n, k), r in self._done.items() if isinstance(r, Run)]
