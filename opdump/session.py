"""The dump session: owns the config, the step counter, the writer and the hooks.

One session is *current* at a time; capture front-ends (the ``torch.compile``
backend, the eager dispatch mode) ask it whether the current iteration dumps and
hand it their tensors.  ``opdump run`` opens one around the user's script;
Python users open one with ``with opdump.Session(config):``.

Iterations (SPEC F12): the counter advances after every ``optimizer.step()``
(a global optimizer post-hook) or on :meth:`Session.step`.  Until either has
happened, each new top-level call of a dumped model is an iteration: a forward
graph (or eager model call) that already ran in the current iteration starts a
new one.
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import platform
import threading
import warnings
from typing import Callable, Dict, List, Optional, Set, Union

import torch

from .config import ConfigError, DumpConfig, load_config
from .recorder import Recorder
from .select import OpSelector
from .stats.engine import host_categories
from .version import __version__
from .write.layout import Layout
from .write.writer import BackgroundWriter

_current: Optional["Session"] = None
_current_lock = threading.Lock()


def current_session(create: bool = True) -> Optional["Session"]:
    """The active session; with ``create``, one is started from ``$OPDUMP_CONFIG`` if none is."""
    global _current
    with _current_lock:
        if _current is None and create and (os.environ.get("OPDUMP_CONFIG") or os.environ.get("MINDSPORE_DUMP_CONFIG")):
            session = Session()
            session._activate_locked()
            atexit.register(session.close)
        return _current


class Session:
    """Owns one dump: ``with Session("data_dump.json") as s: … s.step()``."""

    def __init__(self, config: Union[DumpConfig, str, os.PathLike, None] = None, *, rank: Optional[int] = None):
        if config is None or isinstance(config, (str, os.PathLike)):
            config = load_config(None if config is None else os.fspath(config))
        if not isinstance(config, DumpConfig):
            raise TypeError("Session(config): expected a DumpConfig or a path to a JSON config")
        self.config = config
        self._check_supported(config)
        self.selector = OpSelector(config)
        #: only statistics computed on the device are dumped: no host copy, no file; the writer's
        #: work is a few rows of text per step, done in the step's idle moments (files and host
        #: statistics must keep up with the step)
        self.device_statistics_only = (config.dump_statistics and not config.dump_tensors and not
                                       host_categories(config.statistic_category, config.stat_calc_mode))
        self.writer = BackgroundWriter(config.writer_queue_mb << 20, config.writer_threads,
                                       low_priority=self.device_statistics_only)
        self.recorder = Recorder(self)
        fallback = self.recorder.stats.fallback_warning() if self.recorder.stats is not None else None
        if fallback:
            warnings.warn(f"opdump: {fallback}", UserWarning, stacklevel=2)
        self.iteration = 0
        self._rank = rank
        self._layout: Optional[Layout] = None
        self._graph_ids = itertools.count()
        self._graph_lock = threading.Lock()
        self._driven = False               # an optimizer step or step() was seen
        self._forward_seen: Set[int] = set()
        self._graph_iterations: Dict[int, Set[int]] = {}
        self._dumped_iterations: Set[int] = set()
        self._iteration_end_hooks: List[Callable[[int], None]] = []
        self._close_hooks: List[Callable[[], None]] = []
        self._hook_handle = None
        self._closed = False
        self.enabled = config.enable

    @staticmethod
    def _check_supported(config: DumpConfig) -> None:
        if config.op_debug_mode != 0:
            raise ConfigError("common_dump_settings.op_debug_mode", config.op_debug_mode,
                              "overflow (3) and exception (4) dumps are not implemented in this version; use 0",
                              config.source_file)
        if config.sample_mode:
            raise ConfigError("e2e_dump_settings.sample_mode", config.sample_mode,
                              "sample dump is not implemented in this version; use 0", config.source_file)
        if config.file_format != "npy":
            raise ConfigError("common_dump_settings.file_format", config.file_format,
                              "only \"npy\" is implemented in this version", config.source_file)
        if config.layout != "mindspore":
            raise ConfigError("dump", config.layout,
                              "the ACL/GE layout is not implemented in this version; use a MindSpore data_dump.json",
                              config.source_file)

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Session":
        with _current_lock:
            self._activate_locked()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _activate_locked(self) -> None:
        global _current
        if _current is not None and _current is not self:
            raise RuntimeError("another opdump session is already active")
        _current = self
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self._hook_handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: self._advance())

    def close(self) -> None:
        """Flush everything, write the per-run files, report unused ``kernels`` entries."""
        global _current
        if self._closed:
            return
        self._closed = True
        if self._hook_handle is not None:
            self._hook_handle.remove()
        with _current_lock:
            if _current is self:
                _current = None
        for hook in self._close_hooks:
            hook()
        self._end_iteration(self.iteration)
        errors = self.writer.close()
        self.recorder.close()
        if self._layout is not None:
            self._write_global_orders()
            self._write_manifest(complete=not errors)
        for entry in self.selector.kernels.unused():
            warnings.warn(f"opdump: kernels entry {entry!r} matched no operator", UserWarning, stacklevel=2)

    # ------------------------------------------------------------------ iterations
    def step(self) -> None:
        """Mark the end of a training step (when no optimizer drives the counter)."""
        self._advance()

    def _advance(self) -> None:
        self._driven = True
        self._forward_seen.clear()
        self._end_iteration(self.iteration)
        self.iteration += 1

    def _end_iteration(self, iteration: int) -> None:
        for hook in self._iteration_end_hooks:
            hook(iteration)
        self.recorder.flush_statistics()

    def on_iteration_end(self, hook: Callable[[int], None]) -> None:
        self._iteration_end_hooks.append(hook)

    def on_close(self, hook: Callable[[], None]) -> None:
        self._close_hooks.append(hook)

    def enter_forward(self, key) -> None:
        """A dumped model's forward graph (or eager root call) starts: counts iterations
        when nothing else does.  ``key`` is any hashable naming the entry (a forward graph
        id, or the eager graph id with the root module's id); seeing a key again within
        one iteration starts the next iteration."""
        if not self._driven:
            if key in self._forward_seen:
                self._forward_seen.clear()
                self._end_iteration(self.iteration)
                self.iteration += 1
            self._forward_seen.add(key)

    def note_graph_ran(self, graph_id: int) -> None:
        self._graph_iterations.setdefault(graph_id, set()).add(self.iteration)

    def is_dumping(self) -> bool:
        """Does the current iteration dump?"""
        return (self.enabled and not self._closed and not self.writer.failed
                and self.iteration in self.config.iteration)

    def device_allowed(self, device: torch.device) -> bool:
        """``support_device``: CUDA device indices whose data is dumped (CPU: always)."""
        if device.type != "cuda":
            return True
        index = device.index if device.index is not None else torch.cuda.current_device()
        return index in self.config.support_device

    def new_graph_id(self) -> int:
        with self._graph_lock:
            return next(self._graph_ids)

    def iteration_dir(self, graph_id: int) -> str:
        self._dumped_iterations.add(self.iteration)
        return self.layout.iteration_dir(graph_id, self.iteration)

    # ------------------------------------------------------------------ files
    @property
    def rank(self) -> int:
        if self._rank is None:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                self._rank = torch.distributed.get_rank()
            else:
                self._rank = int(os.environ.get("RANK", "0"))
        return self._rank

    @property
    def layout(self) -> Layout:
        if self._layout is None:
            self._layout = Layout(self.config.path, self.rank, self.config.net_name)
            self._write_metadata()
        return self._layout

    def _write_metadata(self) -> None:
        layout = self._layout
        cfg = self.config
        source = cfg.source_bytes if cfg.source_bytes is not None else json.dumps(
            _config_as_json(cfg), indent=2).encode()
        layout.write_small(os.path.join(layout.metadata_dir, "data_dump.json"), source)
        device = "CPU"
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            device = "GPU"
        meta = {"device_target": device, "opdump_version": __version__, "torch_version": torch.__version__,
                "python_version": platform.python_version(), "rank": self.rank}
        if device == "GPU":
            meta["device_name"] = torch.cuda.get_device_name()
        layout.write_small(os.path.join(layout.metadata_dir, "config.json"), json.dumps(meta).encode())
        self._write_manifest(complete=False)

    def _write_manifest(self, complete: bool) -> None:
        layout = self._layout
        manifest = {
            "complete": complete,
            "tool": "opdump", "version": __version__,
            "dumped_iterations": sorted(self._dumped_iterations),
            "files_written": self.writer.files_written, "bytes_written": self.writer.bytes_written,
            "errors": [repr(e) for e in self.writer.errors[:10]],
        }
        layout.write_small(os.path.join(layout.metadata_dir, "manifest.json"), json.dumps(manifest, indent=1).encode())

    def _write_global_orders(self) -> None:
        for graph_id, iterations in self._graph_iterations.items():
            body = "".join(f"{i}\n" for i in sorted(iterations)).encode()
            self.layout.write_small(self.layout.global_execution_order_path(graph_id), body)

    # ------------------------------------------------------------------ API sugar
    def backend(self, real: Union[str, Callable, None] = "inductor", **real_options):
        """A ``torch.compile`` backend that dumps through this session."""
        from .capture.graph.backend import backend as _backend
        return _backend(real, session=self, **real_options)


def _config_as_json(cfg: DumpConfig) -> dict:
    return {
        "common_dump_settings": {
            "op_debug_mode": cfg.op_debug_mode, "dump_mode": cfg.dump_mode, "path": cfg.path,
            "net_name": cfg.net_name, "iteration": str(cfg.iteration), "saved_data": cfg.saved_data,
            "input_output": cfg.input_output, "kernels": list(cfg.kernels),
            "support_device": list(cfg.support_device), "statistic_category": list(cfg.statistic_category),
        },
        "e2e_dump_settings": {"enable": cfg.enable, "trans_flag": cfg.trans_flag,
                              "stat_calc_mode": cfg.stat_calc_mode,
                              "save_kernel_args": cfg.save_kernel_args},
    }
