"""A kernel dump against an operator or eager dump: each kernel output buffer is paired
with the output of the operator it stores (README, "Kernel-level graph dump").

A kernel-level graph dump (``opdump_settings.graph_dump: "kernels"``) names its files
after inductor's kernels (``cpp_fused_add_mul_native_layer_norm_relu_0``, ``addmm``), which
no operator dump has.  Its ``graphs/…kernels.json`` says, per kernel output buffer, which
operator instance's value it holds (``stores``: the full name as an operator dump names
it, ``stores_occurrence``, and ``stores_output``: whether that value leaves the operator or
is a temporary of its decomposition), and per kernel the fused operators with their scope,
type and source lines.  Across two dumps an operator is the same when its scope, type
(:func:`.frontend.canonical_type`), innermost user source line and occurrence (k-th operator
with those three) agree: ``-opN`` numbers differ between the graph inductor was given and
the operator dump's.

:class:`KernelMatcher` (first in the chain after the user's mapping) pairs, for the side
that is a kernel dump, each buffer with a free output of that operator on the other side:

* the slot: a fallback kernel returning a tuple (``convolution_backward``) keeps the
  operator's slots; otherwise the output of the same shape and dtype class (else the same
  element count), and among several (``native_layer_norm``'s mean and rstd) the one whose
  values are nearest (data, else statistics) -- values only choose among slots the rules
  consider interchangeable;
* no such operator at the expected occurrence: the next free one with that key (two
  ``mm`` of a ``linear`` backward that inductor lists as one operator).

What stays unpaired because of the kernel dump is labelled, not left as unmatched noise:

* :data:`RULE_TEMPORARY` -- a buffer that holds no operator output (``stores`` none, or
  a temporary of an operator's decomposition: ``stores_output`` false);
* :data:`RULE_NO_BUFFER` -- on the operator side, an output of an operator fused into a
  kernel that materialises no buffer for it, of a view operator (inductor makes views
  without a kernel), or an operator input when the kernel dump holds no inputs (kernel
  dumps record outputs).

Two kernel dumps compare kernel by kernel (this matcher stays out: names and execution
order pair them, as for any two dumps).

Guarantees: only pairs the listing names are made (a buffer whose operator is not found
stays free for the other matchers); every tensor ends in at most one pair; an unreadable
or missing ``kernels.json`` leaves the dump to the other matchers.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..common import base_op_type
from ..reader import is_library_file, scope_of
from .frontend import canonical_type
from .match import Matcher, Matching
from .pairs import Pair, Tensor, dtype_class

__all__ = ["KernelMatcher", "RULE_KERNEL", "RULE_TEMPORARY", "RULE_NO_BUFFER", "KERNEL_RULES", "with_kernels"]

RULE_KERNEL = "kernel buffer"           # a kernel's buffer paired with the operator output it stores
RULE_TEMPORARY = "kernel temporary"     # a kernel's buffer holding no operator output
RULE_NO_BUFFER = "no kernel buffer"     # an operator-side tensor the kernel dump has no buffer for
#: rules of tensors left on one side by a kernel dump (reported apart from unmatched ones)
KERNEL_RULES = frozenset({RULE_TEMPORARY, RULE_NO_BUFFER})

#: operators inductor turns into views of a buffer (``reinterpret_tensor``), running no kernel
VIEW_OPS = frozenset({"t", "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "permute", "transpose",
                      "unsqueeze", "squeeze", "as_strided", "slice", "select", "alias", "detach", "split",
                      "split_with_sizes", "unbind", "unflatten", "flatten", "numpy_t", "mT", "diagonal",
                      "narrow", "view_as", "expand_as", "chunk", "lift_fresh"})

Key = Tuple[str, str, Optional[Tuple[str, int]]]       # scope, canonical type, innermost user (file, line)


def _user_line(frames) -> Optional[Tuple[str, int]]:
    """Innermost frame that is not framework code, as (file, line); None without frames."""
    frames = list(frames or ())
    if not frames:
        return None
    for f in reversed(frames):
        if not is_library_file(f[0]):
            return f
    return frames[-1]


def _ctype(op_type: str) -> str:
    return canonical_type(base_op_type(op_type))


class _Listing:
    """One rank's kernels.json files: kernel (graph, file name) -> its buffers; fused keys."""

    def __init__(self, docs: Dict[int, dict]):
        from ..reader import sanitize
        self.kernels: Dict[Tuple[int, str], dict] = {}
        self.fused: Dict[Tuple[int, str], dict] = {}          # (graph, operator full name) -> fused entry
        self.keys: set = set()                                 # keys of every fused operator
        for gid, doc in docs.items():
            for k in doc.get("kernels") or ():
                if not isinstance(k, dict) or not k.get("full_name"):
                    continue
                self.kernels[(gid, sanitize(str(k["full_name"])))] = k
                for f in k.get("fused_operators") or ():
                    if isinstance(f, dict) and f.get("full_name"):
                        self.fused.setdefault((gid, f["full_name"]), f)
                        key = self.key_of(f)
                        self.keys.add(key)
                        self.keys.add(key[:2])

    @staticmethod
    def key_of(f: dict) -> Key:
        frames = [(s.get("file"), int(s.get("line") or 0)) for s in f.get("source") or () if isinstance(s, dict)]
        return (str(f.get("scope") or ""), _ctype(str(f.get("op_type") or "")), _user_line(frames))

    def buffer(self, t: Tensor, n_outputs: int) -> Optional[Tuple[dict, Optional[int]]]:
        """The kernels.json entry of tensor ``t``'s buffer and the operator slot it holds
        (a fallback's tuple output: its position; else None, found by shape)."""
        k = self.kernels.get((t.graph, t.op_file))
        if k is None:
            return None
        outs = [o for o in k.get("outputs") or () if isinstance(o, dict)]
        if len(outs) == 1 and n_outputs > 1:
            return outs[0], t.slot
        return (outs[t.slot], None) if t.slot < len(outs) else None


class _OtherSide:
    """The free operator calls of the side that is not the kernel dump, by key."""

    def __init__(self, m: Matching, side: int, dump):
        tensors = m.B if side == 1 else m.A
        used = m.used_b if side == 1 else m.used_a
        self.by_key: Dict[tuple, List[Dict[Tuple[str, int], int]]] = {}
        self.calls: List[Tuple[tuple, Dict[Tuple[str, int], int]]] = []
        index: Dict[tuple, Dict[Tuple[str, int], int]] = {}
        order: List[tuple] = []
        for i, t in enumerate(tensors):
            if i in used or t.kind != "op":
                continue
            if t.call_key not in index:
                index[t.call_key] = {}
                order.append(t.call_key)
            index[t.call_key][t.tensor_key] = i
        infos: Dict[tuple, Any] = {}
        for ck in order:
            slots = index[ck]
            t = tensors[next(iter(slots.values()))]
            name_key = (t.graph, t.op)
            if name_key not in infos:
                infos[name_key] = dump.op_info(t.op, rank=t.rank, graph=t.graph) if dump is not None else None
            info = infos[name_key]
            scope = info.scope if info is not None else (scope_of(t.op) if "/" in t.op else "")
            fr = info.user_frame if info is not None else None
            key: Key = (scope, _ctype(t.op_type), (fr.file, int(fr.line)) if fr is not None else None)
            self.calls.append((key, slots))
            for k in (key, key[:2]):
                self.by_key.setdefault(k + (t.call,), []).append(slots)


def _stats(row: Dict[str, Any]) -> List[float]:
    out = []
    for k in ("max", "min", "avg", "l2norm"):
        try:
            out.append(float(row.get(k)))
        except (TypeError, ValueError):
            out.append(0.0)
    return out


def _nearest(t: Tensor, cands: List[Tensor]) -> int:
    """Position in ``cands`` of the tensor whose values are nearest ``t``'s (max abs difference of
    the data when every file is there, else of the statistics); 0 when nothing tells."""
    import numpy as np
    try:
        if t.path and all(c.path for c in cands):
            x = np.load(t.path, mmap_mode="r").astype(np.float64).ravel()
            d = [float(np.max(np.abs(x - np.load(c.path, mmap_mode="r").astype(np.float64).ravel())))
                 if x.size else 0.0 for c in cands]
            return int(np.nanargmin(d)) if not all(v != v for v in d) else 0
        if t.has_stats and all(c.has_stats for c in cands):
            s = _stats(t.row)
            d = [sum(abs(a - b) for a, b in zip(s, _stats(c.row))) for c in cands]
            return min(range(len(d)), key=lambda n: d[n])
    except Exception:  # noqa: BLE001 - an unreadable file only loses the tie-break
        pass
    return 0


class KernelMatcher(Matcher):
    """Kernel buffers paired with the operator outputs they store (module doc)."""

    rule = RULE_KERNEL

    def __init__(self, dump_a, dump_b):
        self.dumps = (dump_a, dump_b)
        self._listings: Dict[Tuple[int, int], Optional[_Listing]] = {}

    def listing(self, side: int, rank: int) -> Optional[_Listing]:
        if (side, rank) not in self._listings:
            dump = self.dumps[side]
            docs = {}
            try:
                docs = dump.kernel_listings(rank) if dump is not None else {}
            except Exception:  # noqa: BLE001 - a bad listing leaves the dump to the other matchers
                docs = {}
            self._listings[(side, rank)] = _Listing(docs) if docs else None
        return self._listings[(side, rank)]

    def __call__(self, m: Matching) -> None:
        listings = [self.listing(side, ts[0].rank) if ts else None for side, ts in ((0, m.A), (1, m.B))]
        if all(listings):
            return                   # two kernel dumps: kernels pair with kernels (names, order)
        for side, listing in enumerate(listings):
            if listing is not None:
                self._pair(m, side, listing)

    def _pair(self, m: Matching, side: int, listing: _Listing) -> None:
        mine, theirs = (m.A, m.B) if side == 0 else (m.B, m.A)
        used_mine = m.used_a if side == 0 else m.used_b
        used_theirs = m.used_b if side == 0 else m.used_a
        other = _OtherSide(m, 1 - side, self.dumps[1 - side])
        outputs_per_call: Dict[tuple, int] = {}
        for t in mine:
            if t.kind == "op" and t.io == "output":
                outputs_per_call[t.call_key] = outputs_per_call.get(t.call_key, 0) + 1
        has_inputs = False
        for i, t in enumerate(mine):
            if i in used_mine or t.kind != "op":
                continue
            if t.io != "output":
                has_inputs = has_inputs or (t.graph, t.op_file) in listing.kernels
                continue
            found = listing.buffer(t, outputs_per_call.get(t.call_key, 1))
            if found is None:
                continue
            buf, slot = found
            stores = buf.get("stores")
            if not stores or buf.get("stores_output") is False:
                self._alone(m, side, i, RULE_TEMPORARY)
                continue
            f = listing.fused.get((t.graph, stores))
            if f is None:
                continue
            key = listing.key_of(f)
            j = self._find(t, key, int(buf.get("stores_occurrence") or 0), slot, other, theirs, used_theirs)
            if j is not None:
                if side == 0:
                    m.take(i, j, self.rule)
                else:
                    m.take(j, i, self.rule)
        self._no_buffer(m, side, listing, other, theirs, used_theirs, has_inputs)

    @staticmethod
    def _find(t: Tensor, key: Key, occurrence: int, slot: Optional[int], other: _OtherSide,
              theirs: Sequence[Tensor], used: set) -> Optional[int]:
        calls = other.by_key.get(key + (t.call,)) or other.by_key.get(key[:2] + (t.call,)) or []
        order = ([calls[occurrence]] if occurrence < len(calls) else []) + calls
        if slot is not None:                 # a fallback's tuple: the operator's own slots
            for slots in order:
                j = slots.get(("output", slot))
                if j is not None and j not in used:
                    return j
            return None
        cls = dtype_class(t.dtype)
        exact: List[int] = []
        loose: List[int] = []
        for slots in order:
            for (io, _), j in sorted(slots.items()):
                if io != "output" or j in used or j in exact or j in loose or dtype_class(theirs[j].dtype) not in (cls, ""):
                    continue
                if theirs[j].shape == t.shape:
                    exact.append(j)
                elif t.shape is not None and theirs[j].shape is not None and _numel(theirs[j].shape) == _numel(t.shape):
                    loose.append(j)
        same = exact or loose
        if len(same) > 1:
            return same[_nearest(t, [theirs[j] for j in same])]
        return same[0] if same else None

    @staticmethod
    def _alone(m: Matching, side: int, i: int, rule: str) -> None:
        if side == 0:
            m.pairs.append(Pair(m.A[i], None, rule))
            m.used_a.add(i)
        else:
            m.pairs.append(Pair(None, m.B[i], rule))
            m.used_b.add(i)

    def _no_buffer(self, m: Matching, side: int, listing: _Listing, other: _OtherSide,
                   theirs: Sequence[Tensor], used: set, kernel_inputs: bool) -> None:
        """The other side's free tensors the kernel dump can have no buffer for (module doc)."""
        for key, slots in other.calls:
            fused = key in listing.keys or (key[2] is None and key[:2] in listing.keys)
            view = key[1] in VIEW_OPS
            for (io, _), j in slots.items():
                if j in used:
                    continue
                if (io == "output" and (fused or view)) or (io == "input" and not kernel_inputs):
                    self._alone(m, 1 - side, j, RULE_NO_BUFFER)


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= int(x)
    return n


def with_kernels(matchers: List[Matcher], dump_a, dump_b) -> List[Matcher]:
    """``matchers`` with a :class:`KernelMatcher` after the user's mapping when either dump is a
    kernel-level graph dump; unchanged otherwise."""
    if not any(d is not None and any(g.kernels_path is not None for r in d.ranks.values()
                                     for g in r.graphs.values()) for d in (dump_a, dump_b)):
        return matchers
    from .match import MappingMatcher
    at = 1 if matchers and isinstance(matchers[0], MappingMatcher) else 0
    return matchers[:at] + [KernelMatcher(dump_a, dump_b)] + matchers[at:]
