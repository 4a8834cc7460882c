"""The inert dispatch mode the native eager observer serves an iteration under (see .path).

Why a mode at all: torch's C++ takes other branches while any dispatch mode is active
(``isTensorSubclassLike``: ``linear`` adds its bias out of place, ``reshape`` is a ``view``,
autograd sums gradients out of place…), so the Python capture's operators are those of a
program running under a mode.  With this mode on the stack and the thread's Python dispatch
keys off, torch takes the same branches at C++ speed and no operator reaches the mode, except
the ``detach`` autograd makes of a saved output under any mode (the Python capture drops it,
dispatch.observation_only) and the one operator after it (observer.cpp, python_keys_off): the
mode's ``__torch_dispatch__`` (the observer's C++ ``inert_dispatch``) forwards both to their C++
operators with no Python frame.
"""
from __future__ import annotations

from types import MethodType

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from ..dispatch import _AD_INPLACE_OR_VIEW, _DETACH, _excluded, observation_only

_PYTHON_KEYS = (torch._C.DispatchKey.Python, torch._C.DispatchKey.PythonTLSSnapshot)
_PLAIN = torch.Tensor.__torch_dispatch__
_DETACH_OP = _DETACH._op          # the C++ operator behind the OpOverload (no Python frame)


class InertMode(TorchDispatchMode):
    """On the dispatch stack while the observer serves an iteration, with the thread's Python
    dispatch keys switched off, so that no operator reaches it: torch then takes every branch
    it takes under the Python capture's dispatch mode ("a mode is active": ``linear`` adds its
    bias out of place, ``reshape`` is a ``view``, autograd sums gradients out of place…) at
    C++ speed.  An operator of a tensor subclass with its own ``__torch_dispatch__`` that
    reaches it is noted: the observer does not model it; the iteration is dropped.

    ``__torch_dispatch__`` is the observer's ``inert_dispatch`` (observer_api.cpp) bound to the
    mode: autograd's detaches (the most frequent call here, ~16 a step on the bench's AlexNet)
    go to the C++ operator with no Python frame; anything else comes to :meth:`forward`."""

    def __init__(self, capture):
        super().__init__()
        self.capture = capture
        obs = capture._native_obs
        obs.set_inert_detach(_DETACH, _PLAIN)
        # an instance attribute: what torch calls (a bound method, as it requires: ``__self__`` is the mode)
        self.__torch_dispatch__ = MethodType(obs.inert_dispatch, self)

    @torch._disable_dynamo
    def forward(self, func, types, args=(), kwargs=None):
        """Every call ``inert_dispatch`` does not forward itself, forwarded (no Python frame of
        Dynamo's here, as TorchDispatchMode wraps a mode's own ``__torch_dispatch__``)."""
        # autograd saving/unpacking an output detaches it through any mode on the stack: plain
        # eager makes no call there, the Python capture drops it (dispatch.observation_only)
        if func is _DETACH and not kwargs and not _excluded(_AD_INPLACE_OR_VIEW):
            return _DETACH_OP(*args)
        # an operator whose keys were computed while a detach had the Python keys back on (see
        # observer.cpp, python_keys_off) arrives here too: forwarded; only a tensor subclass's
        # own dispatch is one the observer does not model
        if (self.capture._native_stray is None and not observation_only(func)
                and any(getattr(t, "__torch_dispatch__", None) is not _PLAIN for t in types)):
            self.capture._native_stray = str(func)
        return func(*args, **(kwargs or {}))

    def push(self) -> None:
        self.__enter__()
        for key in _PYTHON_KEYS:
            torch._C._dispatch_tls_set_dispatch_key_included(key, False)

    def pop(self) -> bool:
        if _get_current_dispatch_mode() is not self:
            return False
        self.__exit__(None, None, None)
        return True
