"""Online compare against a reference dump (``opdump_settings.reference``; README, "Online compare").

Why: a run that parts from its reference (the fp32 run, the last good commit) at step
4,000 should say so at step 4,000, name the operator and its line, keep the tensors of
that operator -- and not write the tensors of the thousands that agree.

How: every tensor the recorder is handed gets its statistics row as usual and a host
copy that is *held* (:meth:`OnlineCompare.record`; a copy, not a reference, since a later
in-place write -- the optimizer's, a ``relu_`` -- would change a referenced tensor
before the verdict).  When the recorder reads its batch of device statistics
(:meth:`~opdump.recorder.core.Recorder.flush_statistics`: the end of a graph call or an
iteration, or earlier when the held copies reach the writer's byte budget or
:data:`BATCH_OPS` operators; never an extra sync per operator), :meth:`judge` turns the
batch's rows into the records ``opdump compare`` reads from a statistic.csv, pairs them
with the reference's records of the same iteration and judges each pair -- with the
offline compare's own matchers (:func:`opdump.analysis.compare.match.match`), verdicts
(:func:`~opdump.analysis.compare.verdict.judge_pair`, tensor metrics when the run saves
tensors and the reference has the file) and first-divergence rule.  The held copies of
every operator call with a ``diverged`` tensor are then written (inputs and outputs);
the others are dropped.

The first divergence of the run is printed on stderr at once (one line: iteration,
operator, source line, metrics); each iteration folder gets ``online_compare.json``.

Where the difference began (:mod:`.online_origin`): the run's first difference (offline
first-difference rule, same dtypes) is kept and reported as the ``origin`` of a later first
divergence, so a difference that grew from ``warning`` verdicts is not blamed on a later
operator.

With ``stop_on_divergence`` the run stops at the next iteration boundary (the optimizer
step, or ``Session.step()``) by raising :class:`DivergenceStop` there -- a
``BaseException``, so the script's ``except Exception`` does not swallow it; ``opdump run``
turns it into exit status :data:`EXIT_DIVERGED` with the dump closed and complete.

Guarantees: nothing else raises into the training thread (a failure is one warning; the
statistics go on being written); memory is bounded: held copies stay within the writer's
byte budget (one operator larger than it is held alone), the reference is read one
iteration at a time (:mod:`.reference`) and its tensor files only for a pair to judge.
"""
from __future__ import annotations

import json
import math
import os
import sys
import warnings
import weakref
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..analysis.compare.first import first_divergence
from ..analysis.compare.noise_floor import demote_noise
from ..analysis.compare.match import default_matchers, match
from ..analysis.compare.pairs import METRIC_COLUMNS, Pair, Tensor
from ..analysis.compare.verdict import Thresholds, judge_metrics, judge_pair
from ..analysis.metrics import tensor_metrics
from ..analysis.reader.npy import load_checked
from ..analysis.reader.sources import is_library_file
from ..format.dtypes import dtype_name
from ..format.files import PARAMETER_TYPE, parameter_file_name, tensor_file_name
from ..format.layout import ONLINE_COMPARE_JSON, parse_iteration_dir
from ..format.names import sanitize
from ..format.statistics import CATEGORIES
from ..recorder.copies import copy_out, stream_id_of
from ..recorder.rows import shape_text
from ..write.dtypes import to_numpy
from .online_origin import describe_origin, first_difference_of
from .reference import Reference

__all__ = ["OnlineCompare", "DivergenceStop", "EXIT_DIVERGED", "BATCH_OPS"]

#: operators held at most before their batch is judged (one device-statistics read)
BATCH_OPS = 2048
#: ``opdump run``'s exit status when ``stop_on_divergence`` stopped the run
EXIT_DIVERGED = 3
#: the live side's ``path`` while its held copy is compared with a reference file
_HELD = "<held in memory>"


class DivergenceStop(BaseException):
    """``stop_on_divergence``: raised at the iteration boundary after the first divergence
    (``info``: the divergence, as in ``online_compare.json``)."""

    def __init__(self, info: Dict[str, Any]):
        self.info = info
        super().__init__(f"stopped at the first divergence: {describe(info)}")


def describe(info: Dict[str, Any]) -> str:
    """One line: iteration, operator, source line, what differs and its metrics."""
    m = info.get("metrics") or {}
    vals = ", ".join(f"{k}={m[k]:.6g}" if isinstance(m[k], float) else f"{k}={m[k]}"
                     for k in ("cosine", "max_abs_err", "max_rel_err", "stat_max_rel_diff") if k in m)
    src = info.get("source") or "source unknown"
    line = (f"iteration {info.get('iteration')}, {info.get('op')} ({src}), {info.get('io')}.{info.get('slot')}: "
            f"{info.get('reason')}" + (f" [{vals}]" if vals else ""))
    origin = info.get("origin")
    if origin:
        line += f"; the difference began earlier: {describe_origin(origin)}"
    return line


def _cell(text: str, kind: str) -> Any:
    """A statistic cell as the reader parses it (empty: NaN; true/false: 1/0)."""
    if kind == "text":
        return text.strip()
    v = text.strip()
    if not v:
        return math.nan
    if v.lower() in ("true", "false"):
        return 1.0 if v.lower() == "true" else 0.0
    try:
        return float(v)
    except ValueError:
        return None


class _Held:
    __slots__ = ("copy", "event", "name", "nbytes")

    def __init__(self, copy, event, name: str, nbytes: int):
        self.copy, self.event, self.name, self.nbytes = copy, event, name, nbytes


class _Folder:
    """What the online compare knows of one iteration folder (graph × iteration)."""

    def __init__(self, graph: int, iteration: Optional[int]):
        self.graph, self.iteration = graph, iteration
        self.calls: Dict[Tuple[str, str, int], int] = {}
        self.order = 0
        self.verdicts: Counter = Counter()
        self.unmatched = 0
        self.first: Optional[Dict[str, Any]] = None
        self.origin: Optional[Dict[str, Any]] = None
        self.diverged: List[Dict[str, Any]] = []
        self.saved: List[str] = []
        self.errors: List[str] = []
        self.carried: Dict[tuple, Any] = {}     # outputs demoted as precision noise, for later batches' inputs


class OnlineCompare:
    """The recorder's online compare (module doc).  ``record`` per tensor, ``make_room``
    before an operator, ``judge`` at each statistics read, ``finish`` at each iteration end."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.session = recorder.session
        cfg = self.config = recorder.config
        self.reference = Reference(cfg.reference)
        self.thresholds = Thresholds()
        self.matchers = default_matchers(order_on_tie=True)   # batches: order is position (match.py)
        self.tensor_mode = cfg.dump_tensors           # "full": tensors compared where the reference has them
        self.first: Optional[Dict[str, Any]] = None   # the run's first divergence
        self.origin: Optional[Dict[str, Any]] = None  # the run's first difference (module doc)
        self._origin_rule = True                      # False once a pair holds different dtypes
        self.stop_pending = False
        self._held: Dict[Tuple[str, int], _Held] = {}
        self._held_bytes = 0
        self._ops = 0
        self._folders: Dict[str, _Folder] = {}
        self._used: Dict[Optional[int], set] = {}     # iteration (None: constants) -> ids of reference tensors paired
        self._sources: Dict[str, Tuple[str, str]] = {}
        self._warned = False

    # ------------------------------------------------------------------ per tensor
    def make_room(self, io: str, tensors: Sequence[Any]) -> None:
        """Before an operator's tensors are recorded: judge what is held when they would not
        fit in the writer's byte budget, or after :data:`BATCH_OPS` operators (only at an
        operator's start, so its inputs and outputs are judged together)."""
        if io != "input" and self.config.dump_inputs:
            return
        self._ops += 1
        if not self._held:
            return
        need = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
        if self._held_bytes + need > self.recorder.writer.budget or self._ops >= BATCH_OPS:
            self.recorder.flush_statistics()

    def record(self, folder: str, op_type: str, op_name: str, io: str, slot: int, tensor: torch.Tensor,
               parameter: bool, op) -> None:
        """Queue ``tensor``'s statistics row and hold a host copy of it until its verdict."""
        rec = self.recorder
        ts = rec.clock()
        stream = stream_id_of(tensor) if tensor.is_cuda else 0
        dtype = dtype_name(tensor.dtype)
        nbytes = tensor.numel() * tensor.element_size()
        host_future = None
        # the same tensor again, unmodified (an operator's input is an earlier one's output):
        # its held copy, host statistics and device statistics are shared
        seen = rec._seen_entry(tensor)
        copy = seen.copy() if seen is not None and seen.copy is not None else None
        if copy is not None and copy.acquire():
            event, fmt, host_future = seen.event, seen.fmt, seen.host_future
        else:
            try:
                copy, event, fmt = copy_out(tensor, self.config.trans_flag, rec.buffers)
            except Exception as exc:   # noqa: BLE001 - the row is still written; this tensor is not saved
                self._fail(exc)
                copy = None
            if copy is not None:
                if rec.stats.needs_host_copy and copy.acquire():       # host statistics from the held copy
                    host_future = rec.writer.submit(lambda: rec._write_job(folder, None, copy, event, True, 0))
                if seen is None:
                    seen = rec._remember(tensor)
                seen.copy, seen.event, seen.fmt, seen.host_future = weakref.ref(copy), event, fmt, host_future
        if copy is not None:
            name = (parameter_file_name(op_name, ts, dtype) if parameter
                    else tensor_file_name(op.file_stem, 0, stream, ts, io, slot, fmt, dtype))
            self._held[(folder, ts)] = _Held(copy, event, name, nbytes)
            self._held_bytes += nbytes            # a shared copy counts twice: the bound errs on the safe side
        if op is not None and op.source and op_name not in self._sources:
            self._sources[op_name] = _user_frame(op.source)
        rec._queue_row(folder, (op_type, op_name, stream, ts, io, slot, nbytes, tensor.dtype,
                                shape_text(tensor.shape)), tensor, seen, host_future)

    # ------------------------------------------------------------------ per batch
    def judge(self, pending: Dict[str, List[tuple]], device_cells) -> None:
        """The rows of one statistics read (``{folder: rows}``): judged, held copies written
        (diverging operators) or dropped."""
        try:
            joined = device_cells.joined() if any(r[9] is not None for rows in pending.values() for r in rows) else []
            for folder, rows in pending.items():
                try:
                    self._judge_folder(folder, rows, joined)
                except Exception as exc:   # noqa: BLE001 - never into the training thread
                    self._fail(exc, folder)
        finally:
            for folder, rows in pending.items():
                for r in rows:
                    self._drop(folder, r[3])

    def _folder(self, folder: str) -> _Folder:
        st = self._folders.get(folder)
        if st is None:
            parent, name = os.path.split(os.path.normpath(folder))
            it = parse_iteration_dir(name)          # None: a graph's constants/ folder
            st = self._folders[folder] = _Folder(int(os.path.basename(parent)), None if it is None else int(it))
        return st

    def _judge_folder(self, folder: str, rows: List[tuple], joined: List[str]) -> None:
        st = self._folder(folder)
        live = [self._live(st, r, joined) for r in rows]
        live.sort(key=lambda t: t.kind != "op")                     # parameters last, as the reader orders them
        rank = self.session.rank
        used = self._used.setdefault(st.iteration, set())
        ref = [t for t in self.reference.tensors(rank, st.iteration) if id(t) not in used]
        same_graph = [t for t in ref if t.graph == st.graph]
        window = _window(same_graph or ref, len(live))
        pairs = [p for p in match(live, window, self.matchers) if p.a is not None]
        for p in pairs:
            if p.b is not None:
                used.add(id(p.b))
            self._judge_pair(folder, p)
        pairs.sort(key=Pair.sort_key)
        demote_noise(pairs, carry=st.carried)   # precision noise is no divergence, online as offline
        diverging = {p.a.call_key for p in pairs if p.verdict == "diverged"}
        for p in pairs:
            st.verdicts[p.verdict or "unmatched"] += 1
            if p.verdict == "diverged":
                st.diverged.append(self._entry(p))
        for t in live:
            if t.call_key in diverging:
                self._save(folder, st, t.row["timestamp"])
        self._find_origin(st, pairs)
        info = first_divergence(pairs, self._source_of)[0] if diverging else None
        if info is not None:
            first = next(p for p in pairs if p.verdict == "diverged" and p.a.kind == "op")   # the one it names
            info["metrics"] = _metrics(first)
            info["reference"] = str(self.reference.path)
            origin = self.origin
            if origin is not None and (origin["iteration"], origin["op"]) != (info["iteration"], info["op"]):
                info["origin"] = origin
                info["cause_here"] = info.get("cause")      # the rule's reading of this batch alone
                info["cause"] = ("the difference began earlier, below the divergence thresholds, at "
                                 + describe_origin(origin) + "; here it crossed them")
            if st.first is None:
                st.first = info
            if self.first is None:
                self.first = info
                print(f"opdump: first divergence from the reference: {describe(info)}", file=sys.stderr, flush=True)
                if self.config.stop_on_divergence:
                    self.stop_pending = True

    def _find_origin(self, st: _Folder, pairs: List[Pair]) -> None:
        """Keep the run's first difference (module doc), from the first batch that has one."""
        if self.origin is not None or not self._origin_rule:
            return
        found = first_difference_of(pairs, self._source_of)
        if found is False:
            self._origin_rule = False          # different dtypes: first divergence only, as offline
        elif found is not None:
            self.origin = st.origin = found

    def _live(self, st: _Folder, row: tuple, joined: List[str]) -> Tensor:
        """A queued statistics row as the record ``opdump compare`` reads back from statistic.csv."""
        op_type, op_name, stream, ts, io, slot, nbytes, dtype, shape, handle, future = row
        parameter = op_type == PARAMETER_TYPE
        of = sanitize(op_name)
        key = (of, io, slot)
        call = st.calls.get(key, 0)
        st.calls[key] = call + 1
        d: Dict[str, Any] = {
            "rank": self.session.rank, "net": self.config.net_name, "graph": st.graph, "iteration": st.iteration,
            "order": st.order, "op": f"{PARAMETER_TYPE}.{of}" if parameter else op_name, "op_file": of,
            "op_type": op_type, "kind": ("parameter" if st.iteration is not None else "constant") if parameter else "op", "io": io, "slot": slot, "call": call,
            "dtype": dtype_name(dtype), "format": "DefaultFormat", "timestamp": ts, "task_id": 0,
            "stream_id": stream, "path": None, "nbytes": 0, "stat_row": True, "shape": shape,
        }
        st.order += 1
        stats = self.recorder.stats
        dev = dict(zip(stats.device_categories, joined[handle].split(","))) if handle is not None else None
        host = future.result() if future is not None else None
        for name, cell in zip(stats.categories, stats.row_cells(dev, host)):
            cat = CATEGORIES.get(name)
            if cat is not None:
                d[cat.key] = _cell(cell, cat.kind)
        t = Tensor(d)
        t.shape = tuple(int(x) for x in shape.strip("()").split(",") if x.strip()) if shape else None
        return t

    def _judge_pair(self, folder: str, p: Pair) -> None:
        """The offline verdict of one pair; tensor metrics from the held copy when the run
        saves tensors and the reference has this tensor's file."""
        th = self.thresholds
        held = self._held.get((folder, p.a.row["timestamp"])) if p.b is not None else None
        if held is None or not self.tensor_mode or not p.b.path or p.b.problem:
            judge_pair(p, th)
            return
        p.a.row["path"] = _HELD
        try:
            if judge_pair(p, th):
                if held.event is not None:
                    held.event.synchronize()
                judge_metrics(p, tensor_metrics(to_numpy(held.copy.tensor), load_checked(p.b.path)), th)
        finally:
            p.a.row["path"] = None

    def _entry(self, p: Pair) -> Dict[str, Any]:
        src, _ = self._source_of(p)
        return {"op": p.a.op, "op_b": p.b.op if p.b is not None else None, "op_type": p.a.op_type,
                "io": p.a.io, "slot": p.a.slot, "call": p.a.call, "match": p.rule, "mode": p.mode,
                "reason": p.reason, "source": src, "metrics": _metrics(p)}

    def _source_of(self, p: Pair) -> Tuple[str, str]:
        """The live operator's user line (as the capture saw it), else the reference listing's."""
        src = self._sources.get(p.a.op, ("", ""))
        if not src[0] and p.b is not None and p.b.kind == "op":
            src = self.reference.source(p.b.rank, p.b.graph, p.b.op)
        return src

    # ------------------------------------------------------------------ held copies
    def _save(self, folder: str, st: _Folder, ts: int) -> None:
        held = self._held.pop((folder, ts), None)
        if held is None:
            return
        self._held_bytes -= held.nbytes
        rec = self.recorder
        rec.writer.submit(lambda: rec._write_job(folder, held.name, held.copy, held.event, False, 0), held.nbytes)
        st.saved.append(held.name)

    def _drop(self, folder: str, ts: int) -> None:
        held = self._held.pop((folder, ts), None)
        if held is not None:
            self._held_bytes -= held.nbytes
            held.copy.release()

    # ------------------------------------------------------------------ iterations
    def finish(self, iteration: int) -> None:
        """The iteration ended (its statistics read): write each of its folders'
        ``online_compare.json``."""
        for folder in [f for f, st in self._folders.items() if st.iteration == iteration]:
            st = self._folders.pop(folder)
            body = {"iteration": iteration, "graph": st.graph, "reference": str(self.reference.path),
                    "complete": not st.errors, "errors": st.errors[:5],
                    "compared": sum(n for v, n in st.verdicts.items() if v != "unmatched"),
                    "verdicts": dict(sorted(st.verdicts.items())), "first_divergence": st.first,
                    "first_difference": st.origin,
                    "diverged": st.diverged, "saved_files": st.saved}
            try:
                layout = self.session.layout
                layout.write_small(layout.place(folder, ONLINE_COMPARE_JSON),
                                   (json.dumps(body, indent=1, default=str) + "\n").encode())
            except Exception as exc:   # noqa: BLE001
                self._fail(exc)
        self._used.pop(iteration, None)
        self._ops = 0

    def take_stop(self) -> Optional[DivergenceStop]:
        """The stop to raise at this iteration boundary (once), or None."""
        if not self.stop_pending:
            return None
        self.stop_pending = False
        return DivergenceStop(self.first or {})

    def _fail(self, exc: BaseException, folder: Optional[str] = None) -> None:
        if folder is not None and folder in self._folders:
            self._folders[folder].errors.append(f"{type(exc).__name__}: {exc}")
        if not self._warned:
            self._warned = True
            warnings.warn(f"opdump: online compare: {type(exc).__name__}: {exc} (the statistics are still written)",
                          RuntimeWarning, stacklevel=2)


def _window(ref: List[Tensor], n_live: int) -> List[Tensor]:
    """The reference tensors a batch of ``n_live`` live tensors is aligned with: the first
    free operator tensors (a few times the batch, so one inserted or missing operator shifts
    nothing) and every free parameter."""
    ops = [t for t in ref if t.kind == "op"]
    keep = 4 * n_live + 4096
    return ops[:keep] + [t for t in ref if t.kind != "op"]


def _metrics(p: Pair) -> Dict[str, Any]:
    return {k: p.metrics[k] for k in METRIC_COLUMNS if k in p.metrics and p.metrics[k] is not None}


def _user_frame(source) -> Tuple[str, str]:
    """(``file:line``, code) of the innermost frame that is the user's (as the reader picks it)."""
    for fr in reversed(source):
        if not is_library_file(fr.file):
            return f"{fr.file}:{fr.line}", fr.code
    fr = source[-1]
    return f"{fr.file}:{fr.line}", fr.code
