"""The dump session: owns the config, the step counter, the writer and the hooks.

One session is *current* at a time; capture front-ends (the ``torch.compile``
backend, the eager dispatch mode) ask it whether the current iteration dumps and
hand it their tensors.  ``opdump run`` opens one around the user's script;
Python users open one with ``with opdump.Session(config):``.

Reliability (README, "Reliability"): the dump folder is checked, created, probed
and locked when the session starts (a path that cannot hold a dump is a
ConfigError before the first step); afterwards no file-system error reaches the
caller: the first one is reported once as a warning, dumping stops, training goes
on, and ``manifest.json`` records it.  A process forked from a dumping process
(a DataLoader worker) never writes.  A closed session leaves no hook, lock or
reference behind.

Iterations: the counter advances after every ``optimizer.step()``
(a global optimizer post-hook; a ``GradScaler.step`` that skips it counts too:
``step_driver.watch_scaler_steps``) or on :meth:`Session.step`.  Until either has
happened, each new top-level call of a dumped model is an iteration: a compiled
frame (any of its graphs: a recompile is the same frame) or an eager model call that
already ran in the current iteration starts a new one, unless a live optimizer holds the
model's parameters (its step will end the iteration: ``step_driver.py``).
"""
from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
import warnings
import weakref
from typing import Callable, Dict, List, Optional, Set, Union

import torch

from . import active
from .config import ConfigError, DumpConfig, load_config
from .debug.exception import ExceptionDump
from .debug.sample import manifest_fields as sample_fields
from .recorder import Recorder
from .select import OpSelector
from .step_driver import StepDriverProbe, watch_scaler_steps
from .stats.engine import host_categories
from .version import __version__
from .format import layout as fmt
from .write.dump_folder import open_rank_folder
from .write.acl_layout import AclLayout, open_acl_folder
from .write.layout import Layout
from .write.iteration_set import IterationSet
from .write.manifest import Manifest
from .write.run_metadata import write_run_metadata
from .write.safe_fs import DumpTree
from .write.writer import BackgroundWriter

#: sessions of this process with a dump folder, for the fork hook (weak: never keeps one alive)
_LIVE: "weakref.WeakSet[Session]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) never writes: its copies of the sessions stop."""
    for session in list(_LIVE):
        session._abandon_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

def _session_from_env() -> None:
    """:mod:`opdump.active`'s factory: opens a session from ``$OPDUMP_CONFIG`` (closed at exit)."""
    if os.environ.get("OPDUMP_CONFIG") or os.environ.get("MINDSPORE_DUMP_CONFIG"):
        try:
            session = Session()
        except ConfigError as exc:      # asked from inside the training: warn once, dump off
            active.set_factory(None)
            warnings.warn(f"opdump: dumping is off: {exc}", UserWarning, stacklevel=4)
            return
        session._activate_locked()
        session._close_at_exit()


active.set_factory(_session_from_env)


def current_session(create: bool = True) -> Optional["Session"]:
    """The active session; with ``create``, one is started from ``$OPDUMP_CONFIG`` if none is."""
    return active.current(create)


class HookHandle:
    """Removes one hook of a session (like torch's ``RemovableHandle``)."""

    __slots__ = ("_hooks", "_hook")

    def __init__(self, hooks: list, hook: Callable):
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        try:
            self._hooks.remove(self._hook)
        except ValueError:
            pass


#: what each dialect calls the operator filter (for the "matched no operator" warning)
_KERNELS_FIELD = {"acl": "dump_list layer", "options": "dump_config.dump_layer"}


class Session:
    """Owns one dump: ``with Session("data_dump.json") as s: … s.step()``."""

    def __init__(self, config: Union[DumpConfig, str, os.PathLike, None] = None, *, rank: Optional[int] = None):
        if config is None or isinstance(config, (str, os.PathLike)):
            config = load_config(None if config is None else os.fspath(config))
        if not isinstance(config, DumpConfig):
            raise TypeError("Session(config): expected a DumpConfig or a path to a JSON config")
        self.config = config
        self._check_supported(config)
        self.enabled = config.enable
        self._rank = rank
        #: the dump root used (``path``, or ``{path}-N`` with ``existing: "new-folder"``)
        self.dump_root = config.path
        self._tree: Optional[DumpTree] = None
        self.selector = OpSelector(config)
        #: only statistics computed on the device are dumped: no host copy, no file; the writer's
        #: work is a few rows of text per step, done in the step's idle moments (files and host
        #: statistics must keep up with the step)
        self.device_statistics_only = (config.dump_statistics and not config.dump_tensors and not
                                       host_categories(config.statistic_category, config.stat_calc_mode))
        self.writer = BackgroundWriter(config.writer_queue_mb << 20, config.writer_threads,
                                       low_priority=self.device_statistics_only)
        self.recorder = Recorder(self)
        #: op_debug_mode 4: where the front-ends hand an operator that raised (README, "Debug dumps")
        self.exception_dump = ExceptionDump(self) if config.op_debug_mode == 4 else None
        fallback = self.recorder.stats.fallback_warning() if self.recorder.stats is not None else None
        if fallback:
            warnings.warn(f"opdump: {fallback}", UserWarning, stacklevel=2)
        self.iteration = 0
        self._layout: Optional[Layout] = None
        self._provisional_rank: Optional[int] = None    # the layout awaits the real rank (write_metadata_at_start)
        self._graph_ids = itertools.count()
        self._graph_lock = threading.Lock()
        self._driven = False               # an optimizer step or step() was seen
        self._forward_seen: Set[int] = set()
        self._step_driver = StepDriverProbe()      # a live optimizer will end this step
        self._graph_iterations: Dict[int, Set[int]] = {}
        self._dumped_iterations = IterationSet()     # ranges, O(1) per iteration (manifest.json)
        self._iteration_end_hooks: List[Callable[[int], None]] = []
        self._close_hooks: List[Callable[[], None]] = []
        if self.exception_dump is not None:         # a run in which nothing raised still writes its metadata
            self.exception_dump.attach()
        self._hook_handle = None
        self._optimizer_steps = 0               # optimizer.step() calls seen (a GradScaler's skip is one too)
        self._scaler_watch: Callable[[], None] = lambda: None
        self._atexit_hook: Optional[Callable[[], None]] = None
        self._closed = False
        self._forked = False
        self._manifest: Optional[Manifest] = None
        self._manifest_seen: Optional[tuple] = None
        self._manifest_due = False                # an iteration started dumping: write before its jobs run
        self._lag_mark: list = []                 # the writer's jobs at the end of the last iteration
        self._lag_iteration: Optional[int] = None
        self._on_disk_through: Optional[int] = None
        self._started = time.time()             # the ACL layout's {time} folder
        self._tree_rank: Optional[int] = None
        if self.enabled:        # last: nothing after it can fail and leave the folder locked
            self.dump_root, self._tree = self._open_folder(self._start_rank())
            _LIVE.add(self)
            if self.exception_dump is not None:     # never raises
                self.exception_dump.write_metadata(at_start=True)

    @staticmethod
    def _check_supported(config: DumpConfig) -> None:
        if config.file_format == "bin" and config.sample_mode:          # bin files hold whole tensors
            raise ConfigError("e2e_dump_settings.sample_mode", config.sample_mode,
                              'must be 0 with file_format "bin" (a sample dump writes .npy files)', config.source_file)

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Session":
        self._activate_locked()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _activate_locked(self) -> None:
        active.activate(self)
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self._hook_handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: self._optimizer_stepped())
        self._scaler_watch = watch_scaler_steps(lambda: self._optimizer_steps, self._advance)

    def _close_at_exit(self) -> None:
        """Close at interpreter exit (sessions opened from the environment); the hook holds
        the session weakly and is removed by :meth:`close`."""
        ref = weakref.ref(self)

        def close() -> None:
            session = ref()
            if session is not None:
                session.close()
        self._atexit_hook = close
        atexit.register(close)

    def close(self) -> None:
        """Flush everything, write the per-run files, report unused ``kernels`` entries,
        release the dump folder and every hook (nothing keeps the session alive after)."""
        if self._closed:
            return
        self._closed = True
        if self._hook_handle is not None:
            self._hook_handle.remove()
            self._hook_handle = None
            self._scaler_watch()
        if self._atexit_hook is not None:
            atexit.unregister(self._atexit_hook)
            self._atexit_hook = None
        active.deactivate(self)
        try:
            for hook in tuple(self._close_hooks):        # a hook may remove itself (EagerCapture.stop)
                hook()
            self._end_iteration(self.iteration)
        finally:                        # whatever a hook raised, the files are flushed and the folder freed
            errors = self.writer.close()
            self.recorder.close()
            if self._layout is not None:
                if not errors:
                    self._on_disk_through = self._lag_iteration
                    self._write_global_orders()
                self._write_manifest(complete=not self.writer.errors, running=False)
            if self._manifest is not None:
                self._manifest.close()
            if self._tree is not None:
                self._tree.close()
            _LIVE.discard(self)
            self._iteration_end_hooks.clear()
            self._close_hooks.clear()
        field = _KERNELS_FIELD.get(self.config.dialect, "kernels")     # the name the user wrote
        for entry in self.selector.kernels.unused():
            warnings.warn(f"opdump: {field} entry {entry!r} matched no operator", UserWarning, stacklevel=2)
        if isinstance(self._layout, AclLayout):
            for message in self._layout.unmatched():
                warnings.warn(f"opdump: {message}", UserWarning, stacklevel=2)

    def _abandon_in_child(self) -> None:
        """After ``fork``, in the child: this copy of the session never writes (the parent
        keeps the dump, its lock and its writer)."""
        self._forked = True
        self._closed = True
        self.enabled = False
        self.writer.abandon()
        if self._manifest is not None:
            self._manifest.forget_in_child()
        if self._tree is not None:
            self._tree.forget_in_child()
        self._hook_handle = None
        self._atexit_hook = None

    # ------------------------------------------------------------------ iterations
    def step(self) -> None:
        """Mark the end of a training step (when no optimizer drives the counter)."""
        self._advance()

    def _optimizer_stepped(self) -> None:
        self._optimizer_steps += 1
        self._advance()

    def _advance(self) -> None:
        self._driven = True
        self._forward_seen.clear()
        self._end_iteration(self.iteration)
        self.iteration += 1
        self._stop_if_diverged()

    def _stop_if_diverged(self) -> None:
        """``stop_on_divergence``: raise the online compare's DivergenceStop at this iteration
        boundary, once (README, "Online compare"); the iteration's files are complete."""
        online = self.recorder.online
        stop = online.take_stop() if online is not None and not self._closed else None
        if stop is not None:
            raise stop

    def _end_iteration(self, iteration: int) -> None:
        """The iteration's end: the hooks (summaries, execution orders…), its statistics, the
        lag bound and the manifest.  The small jobs the end queues are deferred
        (``BackgroundWriter.defer``) and handed to the writer as one job once the manifest
        names the iteration: one writer wake-up and one manifest write per iteration."""
        writer = self.writer
        if self._layout is not None and not self._forked:
            writer.defer(before=self._declare)
        try:
            for hook in tuple(self._iteration_end_hooks):
                hook(iteration)
            self.recorder.flush_statistics()
            if self.recorder.online is not None:
                self.recorder.online.finish(iteration)
            self._bound_lag(iteration)
        finally:
            writer.release_deferred()       # a hook raised: the jobs still go (manifest first)

    def _declare(self) -> None:
        """Before the deferred jobs of an iteration's end reach the writer: the manifest names
        the iteration that wrote into a folder meanwhile (:meth:`iteration_dir`)."""
        if self._manifest_due and not self._forked:
            self._write_manifest(complete=False)

    def _bound_lag(self, iteration: int) -> None:
        """Wait for the writer jobs queued up to the end of the previous iteration: the files
        and rows of an iteration are on disk at most one iteration after it ends, whatever
        the writer threads' priority (they run whenever the training thread waits here).
        Then the manifest says so, and the jobs the end deferred go to the writer."""
        if self._layout is None or self._forked:
            return
        writer = self.writer
        writer.wait(self._lag_mark)
        through = self._lag_iteration
        if not self._closed:
            if through is not None and not writer.failed:      # after an error, files are missing
                self._on_disk_through = through
            # the counter moves to iteration + 1 right after this (_advance, enter_forward): a
            # kill from now on is in that iteration, whether or not it writes a file before
            self._write_manifest(complete=False, in_progress=iteration + 1)
        writer.release_deferred()
        self._lag_mark, self._lag_iteration = writer.mark(), iteration

    def on_iteration_end(self, hook: Callable[[int], None]) -> "HookHandle":
        """Call ``hook(iteration)`` at the end of every iteration; ``.remove()`` on the result undoes it."""
        self._iteration_end_hooks.append(hook)
        return HookHandle(self._iteration_end_hooks, hook)

    def on_close(self, hook: Callable[[], None]) -> "HookHandle":
        """Call ``hook()`` when the session closes; ``.remove()`` on the result undoes it."""
        self._close_hooks.append(hook)
        return HookHandle(self._close_hooks, hook)

    def enter_forward(self, key, tensors=()) -> None:
        """A dumped model's forward graph (or eager root call) starts: counts iterations
        when nothing else does.  ``key`` is any hashable naming the entry (Dynamo's frame id,
        else a forward graph id; or the eager graph id with the root module's id); seeing a
        key again within one iteration starts the next iteration — unless a live optimizer
        holds one of ``tensors`` (the root module's parameters, the graph's inputs): its
        ``step()`` will end the iteration (a model called twice per training step)."""
        if not self._driven:
            if key in self._forward_seen and not self._step_driver.repeated_call_waits(tensors):
                self._forward_seen.clear()
                self._end_iteration(self.iteration)
                self.iteration += 1
                self._stop_if_diverged()
            self._forward_seen.add(key)

    @property
    def counts_model_calls(self) -> bool:
        """Does :meth:`enter_forward` still count iterations by model calls (no optimizer step
        nor :meth:`step` seen yet)?  Once False, it does nothing."""
        return not self._driven

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
        if self.iteration not in self._dumped_iterations:
            self._dumped_iterations.add(self.iteration)
            # the manifest names this iteration as the one in progress before any of its files
            # can reach the disk: a kill must not leave it saying the previous one was.  At an
            # iteration's end its jobs are deferred until _declare/_bound_lag has written it
            if self.writer.defers_here():
                self._manifest_due = True
            else:
                self._write_manifest(complete=False)
        return self.layout.iteration_dir(graph_id, self.iteration)

    # ------------------------------------------------------------------ files
    def _start_rank(self) -> int:
        """The rank as known when the session starts (the folder locked then); the layout
        moves to the real rank if ``torch.distributed`` is initialised later with another."""
        if self._rank is not None:
            return self._rank
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank()
        try:
            return int(os.environ.get("RANK", "0"))
        except ValueError:
            return 0

    @property
    def rank(self) -> int:
        if self._rank is None:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                self._rank = torch.distributed.get_rank()
            else:
                self._rank = self._start_rank()
        return self._rank

    @property
    def layout(self) -> Layout:
        if self._layout is None or self._provisional_rank is not None:
            self._make_layout()
        return self._layout

    def write_metadata_at_start(self) -> None:
        """The layout made now, writing the run's metadata and a manifest (``complete`` false):
        the exception dump's (``op_debug_mode`` 4) run killed before anything else is written is
        told from one that never started.  While ``torch.distributed`` may still give another
        rank, the layout is the start rank's provisionally: its first use after this keeps it
        or moves the dump to the real rank (:meth:`_make_layout`)."""
        if self._layout is not None:
            return
        if self._rank is not None or (torch.distributed.is_available() and torch.distributed.is_initialized()):
            self._make_layout()
            return
        rank = self._tree_rank if self._tree_rank is not None else self._start_rank()
        self._build_layout(rank)
        self._provisional_rank = rank

    def _make_layout(self) -> None:
        provisional, self._provisional_rank = self._provisional_rank, None
        if provisional is not None:
            if self.rank == provisional:
                return                  # the metadata written at start is the real rank's
            self._drop_layout()         # only the metadata is in it: the folder goes, as an empty one does
        self._build_layout(self.rank)

    def _build_layout(self, rank: int) -> None:
        tree = self._tree_for(rank)
        if self.config.layout == "acl":
            self._layout = AclLayout(self.config, rank, tree, on_error=self._write_failed,
                                     stopped=lambda w=self.writer: w.failed)
            if self.config.model_filter:          # graphs dump_list's model_name entries select
                self.recorder.folder_filter = self._layout.folder_filter
        else:
            self._layout = Layout(self.dump_root, rank, self.config.net_name, tree=tree,
                                  on_error=self._write_failed, stopped=lambda w=self.writer: w.failed)
        if tree.is_open:
            self._manifest = Manifest(tree, os.path.join(self._layout.metadata_dir, fmt.MANIFEST_JSON))
            self._write_metadata(rank)

    def _drop_layout(self) -> None:
        """Undo a provisional layout (:meth:`write_metadata_at_start`): its manifest closed, the
        rank folder emptied of the metadata (nothing else is written before the layout's first
        use) so that :meth:`_tree_for` removes it."""
        if self._manifest is not None:
            self._manifest.close()
        self._manifest, self._manifest_seen, self._layout = None, None, None
        tree = self._tree
        if tree is not None and tree.is_open:
            try:
                tree.clear()
            except OSError:
                pass

    def _tree_for(self, rank: int) -> DumpTree:
        """The open rank folder of ``rank``; when the rank became known only now (a later
        ``init_process_group``), the folder locked at start is given back and this one opened
        (a failure is a write error: dumping stops)."""
        tree = self._tree
        want = os.path.join(self.dump_root, fmt.rank_dir_name(rank))
        if tree is not None and (tree.path == want if self.config.layout != "acl" else self._tree_rank == rank):
            return tree
        if tree is not None:
            empty = tree.is_open and not tree.entries()
            tree.close()
            if empty:
                try:
                    os.rmdir(tree.path)
                except OSError:
                    pass
        try:
            self.dump_root, self._tree = self._open_folder(rank)
        except (ConfigError, OSError) as exc:
            self._tree = DumpTree(want)             # closed: every write through it fails
            self._write_failed(exc if isinstance(exc, OSError) else OSError(str(exc)))
        _LIVE.add(self)
        return self._tree

    def _open_folder(self, rank: int):
        """(dump root, open locked rank folder) of ``rank``: ``{path}/rank_{r}``, or the ACL
        layout's ``{dump_path}/[worldsize…/]{time}/{device_id}`` (:mod:`.write.acl_layout`)."""
        self._tree_rank = rank
        if self.config.layout == "acl":
            return open_acl_folder(self.config, rank, self._started)
        return open_rank_folder(self.config, rank)

    def _write_failed(self, exc: BaseException) -> None:
        """A write error met outside a writer job: reported by the writer (once), dumping stops."""
        if not self._forked:
            self.writer.fail(exc)

    def _write_metadata(self, rank: int) -> None:
        write_run_metadata(self._layout, self.config, rank)
        self._write_manifest(complete=False)

    def _write_manifest(self, complete: bool, running: bool = True, in_progress: Optional[int] = None) -> None:
        """``manifest.json`` (:mod:`.write.manifest`): rewritten only when something changed.
        ``in_progress``: the iteration it names as running (default: the counter's)."""
        manifest, tree = self._manifest, self._tree
        if manifest is None or tree is None:
            return
        errors = self.writer.errors
        if not running:
            in_progress = None
        elif in_progress is None:
            in_progress = self.iteration
        state = (complete, running, in_progress, self._on_disk_through, len(self._dumped_iterations), tree.files_written,
                 tree.rows_written, len(errors))
        if state == self._manifest_seen:
            return
        doc = {
            "complete": complete,
            "tool": "opdump", "version": __version__, "pid": os.getpid(),
            "dumped_iterations": self._dumped_iterations.text(),
            "iteration_in_progress": in_progress,
            "on_disk_through": self._on_disk_through,
            "files_written": tree.files_written, "bytes_written": tree.bytes_written,
            "rows_written": tree.rows_written,
            "errors": [str(e)[:300] for e in errors[:5]], "error_count": len(errors),
            **sample_fields(self.config),
            **({"exceptions": self.exception_dump.dumped} if self.exception_dump is not None else {}),
        }
        try:
            manifest.write(doc)
            self._manifest_seen = state
            self._manifest_due = False
        except Exception as exc:        # noqa: BLE001 - reported: dumping stops
            self._write_failed(exc)

    def _write_global_orders(self) -> None:
        for graph_id, iterations in self._graph_iterations.items():
            body = fmt.render_global_execution_order(iterations).encode()
            self.layout.write_small(self.layout.global_execution_order_path(graph_id), body)

    # ------------------------------------------------------------------ API sugar
    def backend(self, real: Union[str, Callable, None] = "inductor", **real_options):
        """A ``torch.compile`` backend that dumps through this session (with ``op_debug_mode`` 3,
        dumped iterations run op by op under the overflow watch, README "Debug dumps")."""
        from .capture.graph.backend import backend as _backend
        return _backend(real, session=self, **real_options)
