"""What the native eager observer calls back into Python for (rare: once per operator overload,
per new operator name, per tensor the native memo does not read, per parameter owner)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from ...op_info import OpInfo
from ...naming import backward_scope
from ..schema import facts_of
from ..scopes import _scope_of
from ..sources import walk
from ..state import Phase
from ..values import flat_tensors, has_nonfinite_arg, non_tensor_args


_NO_DEFAULT = object()
#: per operator overload, its schema's arguments as (kwarg_only, name, default or _NO_DEFAULT):
#: ``func._schema.arguments`` builds new Python objects at every access (~30 us a call, and the
#: watch's proofs split arguments hundreds of times a step)
_SPECS: Dict[Any, Tuple[Tuple[bool, str, Any], ...]] = {}


def _specs(func) -> Tuple[Tuple[bool, str, Any], ...]:
    specs = _SPECS.get(func)
    if specs is None:
        specs = _SPECS[func] = tuple((a.kwarg_only, a.name, a.default_value if a.has_default_value() else _NO_DEFAULT)
                                     for a in func._schema.arguments)
    return specs


def split_args(func, values: List[Any]):
    """``(args, kwargs)`` as a dispatch mode receives them from the full argument list: kwarg-only
    arguments by name unless they hold their default, trailing defaulted positional ones left out."""
    positional, kwargs = [], {}
    for spec, value in zip(_specs(func), values):
        if spec[0]:
            if not _is_default(spec[2], value):
                kwargs[spec[1]] = value
        else:
            positional.append((spec[2], value))
    while positional and _is_default(*positional[-1]):
        positional.pop()
    return [v for _, v in positional], kwargs


def _is_default(default, value) -> bool:
    if default is _NO_DEFAULT:
        return False
    if isinstance(value, torch.Tensor) or isinstance(default, torch.Tensor):
        return False
    return type(default) is type(value) and default == value


class NativeCallbacks:
    """Mixed into :class:`.path.NativeEager`: the methods ``observer.cpp`` calls."""
    @staticmethod
    def _native_info(name: str, overload: str):
        """Per operator overload, once: (op type, written positions, writes a list, returns nothing),
        or None when it is not dumped as an operator."""
        ns, _, op = name.partition("::")
        func = getattr(getattr(getattr(torch.ops, ns), op), overload or "default")
        facts = facts_of(func)
        if facts.types is None:
            return None
        return facts.types[0], [i for i, _ in facts.written], facts.writes_list, bool(facts.mutated)

    def _native_bind(self):
        """(the rows list of the iteration's folder, the clock's last stamp), or
        None when no dumped iteration is in progress."""
        state = self._state
        if state is None or not self._dumping:
            return None
        self._native_new_state()
        recorder = self.session.recorder
        if self._overflow is not None:      # the watch records through the Python recorder (.watch)
            return True, recorder.clock._last
        folder = state.folder or self._folder(state)
        with recorder._lock:
            rows = recorder._rows_of(folder)
        return rows, recorder.clock._last

    def _native_owner(self, var) -> Optional[str]:
        """``Gradients/<scope>`` of the module owning parameter ``var`` (gradient accumulation)."""
        state = self._state
        owner = state.owners.get(id(var)) if state is not None else None
        if owner is None:
            return None
        module_id, pairs, root = owner
        info = state.modules.get(module_id) or (_scope_of(pairs, root), ())
        return backward_scope(info[0])

    def _native_slow(self, op_type, name, io, tensors, ts):
        """One operator side with a tensor the native memo does not read: the Python recorder."""
        recorder = self.session.recorder
        if ts > recorder.clock._last:
            recorder.clock._last = ts
        op = OpInfo(0, op_type, "", "", (), ())
        op.__dict__["full_name"] = name
        recorder.record_all(self._folder(self._state), op, io, self._on_allowed_devices(tensors))
        return recorder.clock._last

    def _native_describe_start(self, index, op_type, overload, scope, phase, forward, var, qualname, values):
        """A new operator (not in the listing): its listing entry, as the Python capture makes it."""
        ns, _, op_name = qualname.partition("::")
        func = getattr(getattr(getattr(torch.ops, ns), op_name), overload or "default")
        args, kwargs = split_args(func, values)
        state, listing = self._state, self.listing
        ids, sources = (), ()
        if phase == Phase.BACKWARD:
            fwd = listing.ops.get(forward) if forward is not None else None
            if fwd is not None:
                ids, sources = fwd.module_ids, fwd.source
            elif var is not None and state is not None:
                owner = state.owners.get(id(var))
                if owner is not None:
                    ids = (state.modules.get(owner[0]) or ("", ()))[1]
        elif phase == Phase.MODULE and self.tracker.stack:
            ids = self.tracker.stack[-1].ids
        if not sources:
            sources = walk(1, True)[1]
        op = OpInfo(index, op_type, scope, overload or "default", ids, sources)
        op.nonfinite_args = has_nonfinite_arg(args, kwargs)
        op.selected = True
        op.args = non_tensor_args(func, args, kwargs)
        inputs = flat_tensors(args, [])
        if kwargs:
            flat_tensors(kwargs.values(), inputs)
        return op, args, kwargs, inputs

    def _native_describe_end(self, token, outputs) -> None:
        op, args, kwargs, inputs = token
        self._describe(op, args, kwargs, inputs, outputs)
        self.listing.add(op)
