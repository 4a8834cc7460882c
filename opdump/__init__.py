"""opdump: dump what every operator of a PyTorch model received and produced.

Quick use::

    with opdump.Session("/abs/data_dump.json") as dump:
        model = torch.compile(model, backend=opdump.backend())
        for x, y in data:
            loss_fn(model(x), y).backward(); opt.step()   # opt.step() advances the iteration

or, with no code change, ``opdump run --config data_dump.json train.py``.

Importing the package imports no torch: ``Session``, ``current_session``, ``set_dump`` and
the configuration names are resolved on first use (PEP 562 ``__getattr__``), so the analysis
commands (``opdump compare``, ``ls``, ``overflow``…), which never touch torch, start in a
fraction of a second (README, "Analysis").

``opdump.session`` is the function :func:`session`, as it always was, even though
``opdump/session.py`` is also a submodule: importing that submodule (``import
opdump.session``, ``from opdump.session import Session``) does not rebind the package's
``session`` to the module (see :class:`_Package`); the module stays reachable as
``sys.modules["opdump.session"]``.
"""
from __future__ import annotations

import sys
import types
from importlib import import_module

from . import active as _active
from .version import __version__

__all__ = ["Session", "session", "backend", "set_dump", "step", "load_config", "ConfigError",
           "DumpConfig", "load", "current_session", "__version__"]

#: package attribute -> submodule that defines it, imported on first access
_LAZY = {
    "Session": ".session", "current_session": ".session",
    "set_dump": ".select",
    "ConfigError": ".config", "DumpConfig": ".config", "load_config": ".config",
}


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def session(config=None, **kwargs) -> "Session":
    """``with opdump.session("data_dump.json"):`` — same as :class:`Session`."""
    from .session import Session
    return Session(config, **kwargs)


def backend(real="inductor", *, session: "Session" = None, **real_options):
    """A ``torch.compile`` backend that dumps and otherwise runs ``real`` (default inductor)."""
    from .capture.graph.backend import backend as _backend
    return _backend(real, session=session, **real_options)


def step() -> None:
    """Mark a training-step boundary in the current session (when no optimizer does)."""
    from .session import current_session
    current = current_session(create=False)
    if current is None:
        raise RuntimeError("opdump.step(): no active session")
    current.step()


def load(path):
    """Open a dump (opdump's or MindSpore's) for analysis; needs pandas."""
    from .analysis.reader import open_dump
    return open_dump(path)


def _session_factory() -> None:
    """:mod:`.active`'s factory until ``opdump/session.py`` is imported: a capture front end
    asking for the current session (``$OPDUMP_CONFIG`` set, no session open) imports it, which
    registers its own factory in place of this one, and asks again."""
    import_module(".session", __name__)
    _active.current(create=True)


_active.set_factory(_session_factory)


class _Package(types.ModuleType):
    """The package's module type: the import system binds a submodule to its parent's
    attribute once loaded (``opdump.session = <module opdump.session>``), which would hide
    the function :func:`session` once anything imports ``opdump/session.py`` lazily.  That one
    binding is dropped; every other attribute is set as usual."""

    def __setattr__(self, name, value):
        if name == "session" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
