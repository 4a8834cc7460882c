"""Watcher mode (``dump_scene: "watcher"``; README, "Debug dumps"): who overwrote a watched output?

Why: a tensor that is right when its operator made it and wrong when it is read later was
overwritten in between (an in-place write through an alias, a ``.data`` write, an
optimizer step touching a saved activation).  Watcher mode keeps the outputs of the
*watched* operators (``watcher_nodes``) by reference and, after every *trigger* operator
(``layer``; every captured operator when absent) and after every watched operator, looks
whether a watched output changed.  It dumps a watched operator's outputs when it ran (the
reference picture) and again only when they changed, and names, in a per-iteration
``watcher.json``, the **first operator after which a watched output changed**, with its
full name and source line.

Cheap when nothing changes: a watched output is fingerprinted again only when a witness
says it may have changed:

* ``write``: the trigger declares a write (``(a!)`` in its schema, ``_foreach_*``) to a
  tensor sharing the watched output's storage (views, ``.data``, ``out=``);
* ``version``: the tensor's version counter moved since it was last looked at (a write by
  code the capture does not see as an operator, or an autograd-visible write);
* ``checksum``: with an explicit ``layer``, every trigger fingerprints every watched output
  (catches writes nobody declares, e.g. batch norm's running statistics), and so does the
  iteration's end (witness ``end``, no operator to name).

The fingerprint (:func:`fingerprint`) is computed on the tensor's own device: the int64
sums of its bit patterns (viewed as integers) and of their squares.  Comparing needs one
host read per check that had a candidate; an iteration where no witness fires costs
one attribute read per watched tensor per trigger and one fingerprint pass at its end.
Blind spot: a write that only permutes values keeps both sums (documented in the README).

Guarantees: nothing here raises into the training thread (a failure is a warning, the
watcher stops for the iteration and its ``watcher.json`` says ``complete: false``); the
training values are never changed (fingerprints read detached tensors).  Watched outputs
are held until the iteration ends (memory: the watched outputs stay alive that long).
"""
from __future__ import annotations

import json
import os
import warnings
import weakref
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..format.layout import WATCHER_JSON
from ..select.kernels import KernelMatcher

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: per session config: ``[watched operators held so far]``, shared by the session's watchers (the
#: eager capture's and the compiled graphs'), so that an iteration whose watched operators all
#: ran in one of them gives no "no operator matched" warning nor an empty ``watcher.json`` from
#: the other
_SESSION_MATCHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fingerprint(t) -> Optional[torch.Tensor]:
    """A 2-element int64 tensor on ``t``'s device (sum of the bit patterns, sum of their
    squares, both mod 2**64); None for what cannot be read as plain memory."""
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        return None
    if t.layout is not torch.strided or t.is_meta or t.is_quantized:
        return None
    d = t.detach()
    if d.is_conj():
        d = d.resolve_conj()
    if d.is_neg():
        d = d.resolve_neg()
    if d.is_complex():
        d = torch.view_as_real(d)
    if d.numel() == 0:
        return torch.zeros(2, dtype=torch.int64, device=d.device)
    kind = _INT_OF_SIZE.get(d.element_size())
    if kind is None:
        return None
    bits = d if d.dtype == kind else d.view(kind)
    wide = bits.to(torch.int64, copy=True)     # a private copy (to() alone may return the tensor itself)
    first = wide.sum()
    wide.mul_(wide)
    return torch.stack((first, wide.sum()))


def _storage(t) -> Optional[int]:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:   # noqa: BLE001 - no storage (subclasses): no write witness
        return None


def _version(t) -> int:
    try:
        return t._version
    except Exception:   # noqa: BLE001 - inference tensors have no version counter
        return -1


def _source(op, lookup) -> tuple:
    src = op.source or getattr(lookup(op.full_name), "source", ()) or ()
    line = src[-1] if src else None       # the innermost visible frame
    return (f"{line.file}:{line.line}", line.code) if line is not None else ("", "")


class _Held:
    """A watched operator's outputs (references), their storages, versions and fingerprints."""

    __slots__ = ("op", "tensors", "storages", "versions", "prints", "snapshots", "folder")

    def __init__(self, op, tensors: Sequence, folder: Optional[str]):
        self.op = op
        self.folder = folder                     # its iteration folder (graph mode; None: the watcher's)
        self.tensors = [t if isinstance(t, torch.Tensor) else None for t in tensors]
        self.storages = [_storage(t) if t is not None else None for t in self.tensors]
        self.versions = [_version(t) if t is not None else -1 for t in self.tensors]
        self.prints = [fingerprint(t) if t is not None else None for t in self.tensors]
        self.snapshots = 0


class Watcher:
    """Watches one eager capture's operators.  ``after(op, outputs, written)`` is called
    after each captured operator ran; ``finish(iteration)`` at each dumped iteration's end.

    ``record(op, tensors, folder)`` dumps ``tensors`` (None: nothing at that slot) as ``op``'s
    outputs into ``folder``; ``recorder()`` is the session's recorder (its clock brackets a
    snapshot's files, its ``forget`` drops a stale copy); ``folder()`` the iteration folder
    (graph mode passes each operator's own folder to :meth:`after`, and ``folder()`` is the
    last one); ``layout()`` the writer's layout; ``lookup(name)`` the listing entry of an
    operator (its source lines).  ``watcher.json`` goes to the folder of the first watched
    operator of the iteration; snapshots in another folder name it relative to that one."""

    def __init__(self, config, record: Callable, recorder: Callable, folder: Callable[[], str],
                 layout: Callable, lookup: Callable):
        self.layer = tuple(config.watcher_layer)
        self.nodes = tuple(config.watcher_nodes)
        self._triggers = KernelMatcher(self.layer) if self.layer else None
        self._watched = KernelMatcher(self.nodes)
        self._record, self._recorder, self._folder = record, recorder, folder
        self._layout, self._lookup = layout, lookup
        self._is: Dict[str, tuple] = {}          # full name -> (watched, trigger)
        self._held: Dict[str, _Held] = {}
        self._changes: List[dict] = []
        self._snapshots: List[dict] = []
        self._broken = False
        self._warned_unmatched = False
        self._ops = 0                            # operators seen this iteration
        try:
            self._shared = _SESSION_MATCHES.setdefault(config, [0])
        except TypeError:                        # a config that cannot be a key: this watcher alone
            self._shared = [0]
        self._seen_matches = self._shared[0]     # the shared count at this watcher's last finish

    # ------------------------------------------------------------------ per operator
    def _roles(self, op) -> tuple:
        name = op.full_name
        roles = self._is.get(name)
        if roles is None:
            if len(self._is) > 1_000_000:
                self._is.clear()
            watched = self._watched.matches(name, op.op_type)
            trigger = self._triggers is None or self._triggers.matches(name, op.op_type)
            roles = self._is[name] = (watched, trigger)
        return roles

    def after(self, op, outputs: Sequence, written: Sequence, folder: Optional[str] = None) -> None:
        """``op`` ran: check the watched outputs if it is a trigger or watched; hold its
        outputs (and dump them, the reference picture) if it is watched."""
        if self._broken:
            return
        self._ops += 1
        try:
            watched, trigger = self._roles(op)
            if (trigger or watched) and self._held:
                self._check(op, written, full=self._triggers is not None and trigger)
            if watched:
                held = self._held[op.full_name] = _Held(op, outputs, folder)
                self._shared[0] += 1
                self._snapshot(held, op, "own run", list(range(len(held.tensors))))
        except Exception as exc:   # noqa: BLE001 - never into the training thread
            self._fail(exc)

    def _check(self, op, written: Sequence, full: bool, witness_all: str = "checksum") -> None:
        stores = {_storage(t) for t in written if isinstance(t, torch.Tensor)}
        stores.discard(None)
        candidates = []                              # (held, slot, witness)
        for held in self._held.values():
            if held.op is op:
                continue
            for slot, t in enumerate(held.tensors):
                if t is None or held.prints[slot] is None:
                    continue
                if held.storages[slot] in stores:
                    candidates.append((held, slot, "write"))
                elif held.versions[slot] != _version(t):
                    candidates.append((held, slot, "version"))
                elif full:
                    candidates.append((held, slot, witness_all))
        if not candidates:
            return
        fresh = [fingerprint(held.tensors[slot]) for held, slot, _ in candidates]
        changed = _differs([held.prints[slot] for held, slot, _ in candidates], fresh)
        slots_of: Dict[str, List[int]] = {}
        for (held, slot, witness), new, moved in zip(candidates, fresh, changed):
            held.versions[slot] = _version(held.tensors[slot])
            if not moved:
                continue
            held.prints[slot] = new
            slots_of.setdefault(held.op.full_name, []).append(slot)
            self._changes.append(self._event(held, slot, op, witness))
        for name, slots in slots_of.items():
            self._snapshot(self._held[name], op, "change", slots)

    def replaced(self, op, watched: str, slot: int, value) -> None:
        """Graph mode: ``op`` computed the new value of output ``slot`` of the watched operator
        ``watched`` -- an in-place write to that output (or to an alias of it, ``.data``) that
        AOTAutograd's functionalisation turned into an operator making a new tensor, which the
        graph's later readers take instead.  From here on that tensor is the watched value;
        when its values differ from the last seen, the change is ``op``'s (witness ``write``)."""
        if self._broken:
            return
        try:
            held = self._held.get(watched)
            if held is None or slot >= len(held.tensors) or held.prints[slot] is None \
                    or not isinstance(value, torch.Tensor) or held.tensors[slot] is None \
                    or value.shape != held.tensors[slot].shape or value.dtype != held.tensors[slot].dtype:
                return                               # not a new value of that output (another shape)
            new = fingerprint(value)
            if new is None or new.device != held.prints[slot].device:
                return
            held.tensors[slot], held.storages[slot], held.versions[slot] = value, _storage(value), _version(value)
            if not _differs([held.prints[slot]], [new])[0]:
                return
            held.prints[slot] = new
            self._changes.append(self._event(held, slot, op, "write"))
            self._snapshot(held, op, "change", [slot])
        except Exception as exc:   # noqa: BLE001 - never into the training thread
            self._fail(exc)

    def _event(self, held: _Held, slot: int, op, witness: str) -> dict:
        w_src, w_code = _source(held.op, self._lookup)
        event = {"watched": held.op.full_name, "watched_type": held.op.op_type, "watched_order": held.op.index,
                 "watched_source": w_src, "slot": slot, "witness": witness,
                 "after": None, "after_type": None, "after_order": None, "source": "", "code": ""}
        if op is not None:
            src, code = _source(op, self._lookup)
            event.update(after=op.full_name, after_type=op.op_type, after_order=op.index, source=src, code=code)
        return event

    def _snapshot(self, held: _Held, op, kind: str, slots: List[int]) -> None:
        """Dump ``slots`` of ``held`` now (files named as its outputs; the recorder's clock
        values before and after bracket their timestamps, so the reader finds them)."""
        recorder = self._recorder()
        tensors = [t if k in slots else None for k, t in enumerate(held.tensors)]
        for t in tensors:
            if t is not None:
                recorder.forget(t)               # a copy taken before the write is stale
        folder = held.folder or self._folder()
        lo = recorder.clock()
        self._record(held.op, tensors, folder)
        hi = recorder.clock()
        held.snapshots += 1
        self._snapshots.append({"watched": held.op.full_name, "kind": kind, "slots": slots,
                                "after": op.full_name if op is not None else None,
                                "after_order": op.index if op is not None else None,
                                "timestamps": [lo, hi], "folder": folder})

    # ------------------------------------------------------------------ iteration end
    def finish(self, iteration: int) -> None:
        """The iteration ended: a last full check (witness ``end``), ``watcher.json``, reset."""
        try:
            if not self._broken and self._held:
                self._check(None, (), full=True, witness_all="end")
        except Exception as exc:   # noqa: BLE001
            self._fail(exc)
        held, self._held = self._held, {}
        changes, self._changes = self._changes, []
        snapshots, self._snapshots = self._snapshots, []
        broken, self._broken = self._broken, False
        ops, self._ops = self._ops, 0
        others = self._shared[0] != self._seen_matches and not held
        self._seen_matches = self._shared[0]
        if not ops and not broken:
            return                               # no captured operator ran: nothing to report
        if others and not broken:
            return                               # the session's other watcher held this iteration's
        try:
            if not held and not self._warned_unmatched:
                self._warned_unmatched = True
                warnings.warn(f"opdump: watcher mode: no operator matched watcher_nodes {list(self.nodes)} in "
                              f"iteration {iteration} (names take the forms of kernels entries)",
                              UserWarning, stacklevel=2)
            watched = []
            for h in held.values():
                src, code = _source(h.op, self._lookup)
                watched.append({"op": h.op.full_name, "op_type": h.op.op_type, "order": h.op.index,
                                "source": src, "code": code, "outputs": len(h.tensors),
                                "snapshots": h.snapshots})
            body = {"iteration": iteration, "complete": not broken, "layer": list(self.layer),
                    "watcher_nodes": list(self.nodes), "watched": watched,
                    "first_change": changes[0] if changes else None, "changes": changes,
                    "snapshots": snapshots}
            target = next((h.folder for h in held.values() if h.folder), None) or self._folder()
            for snap in snapshots:       # relative: the dump stays readable when moved
                snap["folder"] = os.path.relpath(snap["folder"], target)
            layout = self._layout()
            path = layout.place(target, WATCHER_JSON)
            layout.write_small(path, (json.dumps(body, indent=1) + "\n").encode())
        except Exception as exc:   # noqa: BLE001
            self._fail(exc)
            self._broken = False

    def _fail(self, exc: BaseException) -> None:
        self._broken = True
        self._held = {}
        warnings.warn(f"opdump: watcher stopped for this iteration: {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=2)


def _differs(old: Sequence[torch.Tensor], new: Sequence[Optional[torch.Tensor]]) -> List[bool]:
    """Which fingerprints differ: compared on their device, one host read per device."""
    out = [True] * len(old)
    groups: Dict[torch.device, List[int]] = {}
    for k, (a, b) in enumerate(zip(old, new)):
        if b is not None and a.device == b.device:
            groups.setdefault(a.device, []).append(k)
    for idx in groups.values():
        ne = (torch.stack([old[k] for k in idx]) != torch.stack([new[k] for k in idx])).any(dim=1)
        for k, moved in zip(idx, ne.cpu().tolist()):
            out[k] = bool(moved)
    return out
