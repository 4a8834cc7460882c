"""Is a live optimizer going to drive the iteration counter of this model?

Until the first ``optimizer.step()`` (or ``session.step()``) the session counts
iterations by top-level model calls: a model called again starts the next iteration
(README, "Iterations": an inference loop has no other boundary).  A training step
that calls its model twice (two inputs, a siamese pair, a consistency loss) would
then split step 0 into iterations 0 and 1 and shift every later step by one, although
the program has an optimizer whose ``step()`` will count.  So, when a call repeats
before any step, the session asks :func:`optimizer_holds`: does a live
``torch.optim.Optimizer`` hold one of the parameters the call reads (the eager root
module's parameters, a compiled graph's parameter inputs) -- or, for a call that reads
no parameter (a criterion module called twice, a compiled loss function), does any live
optimizer exist?  If so the call stays in the current iteration and the optimizer's
step ends it.

Cost: nothing until some optimizer class has been instantiated (torch marks a class's
``step`` as ``hooked`` at its first construction); then one walk of the garbage
collector's objects (~0.1 s for a process holding ``transformers``), done again only
when another optimizer class appears.  Never raises: any failure answers ``False``
(the old rule).

A training step whose ``torch.amp.GradScaler.step(optimizer)`` skips ``optimizer.step()``
(Inf/NaN gradients: the loss-scale overflow step) is a step all the same:
:func:`watch_scaler_steps` has the session count it (hold-out trial 6: it merged with the
next step, and every later step was numbered one lower).
"""
from __future__ import annotations

import functools
import gc
import threading
from typing import Callable, Iterable, Optional, Tuple

import torch


def _optimizer_classes(base=torch.optim.Optimizer):
    for sub in base.__subclasses__():
        yield sub
        yield from _optimizer_classes(sub)


def constructed_classes() -> Tuple[str, ...]:
    """The optimizer classes instantiated at least once in this process (cheap)."""
    return tuple(sorted(c.__qualname__ for c in _optimizer_classes()
                        if getattr(getattr(c, "step", None), "hooked", False)))


def optimizer_holds(tensors: Iterable[object]) -> bool:
    """True when a live optimizer's ``param_groups`` hold one of the parameters among
    ``tensors`` -- or, when there is none (a criterion module, a compiled loss function),
    when any live optimizer holds anything: such a call is part of the step too."""
    try:
        params = [t for t in tensors if isinstance(t, torch.nn.Parameter)]
        held = set()
        for obj in gc.get_objects():
            if issubclass(type(obj), torch.optim.Optimizer):   # type(): no __class__ property runs
                for group in getattr(obj, "param_groups", ()):
                    held.update(id(p) for p in group.get("params", ()))
        if not held:
            return False
        return not params or any(id(t) in held for t in params)
    except Exception:           # a best-effort guess: the old rule on any surprise
        return False


class StepDriverProbe:
    """Answers, for one session, whether a repeated call is part of an optimizer's step.

    ``True`` is kept until the session is driven (the optimizer's step then counts);
    ``False`` is kept until another optimizer class is constructed in the process."""

    def __init__(self) -> None:
        self._answer: Optional[bool] = None
        self._classes: Tuple[str, ...] = ()

    def repeated_call_waits(self, tensors: Iterable[object]) -> bool:
        if self._answer:
            return True
        classes = constructed_classes()
        if not classes or (self._answer is False and classes == self._classes):
            return False
        self._classes = classes
        self._answer = optimizer_holds(tensors)
        return self._answer


# ---------------------------------------------------------------------- GradScaler
_scaler_lock = threading.Lock()
_scaler_watch: Optional[Tuple[Callable[[], int], Callable[[], None]]] = None


def _watched_step(original):
    """``GradScaler.step`` that, when the optimizer's step did not run (``count`` unchanged by
    the call), calls ``skipped``; torch's own otherwise (no watch: a plain call)."""

    @functools.wraps(original)
    def step(scaler, optimizer, *args, **kwargs):
        watch = _scaler_watch
        if watch is None:
            return original(scaler, optimizer, *args, **kwargs)
        count, skipped = watch
        before = count()
        result = original(scaler, optimizer, *args, **kwargs)
        if count() == before:
            skipped()
        return result

    step.opdump_original = original
    return step


def watch_scaler_steps(count: Callable[[], int], skipped: Callable[[], None]) -> Callable[[], None]:
    """Until the returned function is called: a ``torch.amp.GradScaler.step`` (its CUDA and
    FSDP subclasses included) after which ``count()`` (the optimizer steps the session saw)
    has not moved calls ``skipped()``.  The scaler's ``step`` is torch's again afterwards
    (unless something else replaced it meanwhile: ours then stays, a plain call)."""
    global _scaler_watch
    scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler is None:
        return lambda: None
    with _scaler_lock:
        if getattr(scaler.step, "opdump_original", None) is None:
            scaler.step = _watched_step(scaler.step)
        _scaler_watch = watch = (count, skipped)

    def stop() -> None:
        global _scaler_watch
        with _scaler_lock:
            if _scaler_watch is not watch:
                return
            _scaler_watch = None
            original = getattr(scaler.__dict__.get("step"), "opdump_original", None)
            if original is not None:
                scaler.step = original
    return stop
