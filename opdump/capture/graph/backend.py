"""opdump's ``torch.compile`` backend: :func:`backend`.

What a graph goes through is in :mod:`.capture`; this module only finds the
session.  The session is the one given, or the current one (from
:mod:`opdump.active`, which may open one from ``$OPDUMP_CONFIG``) at compile
time.  With no open session — none given or current, or the given one already
closed — the graph is compiled by the real backend alone, with one warning:
a missing dump never breaks the user's compile.
"""
from __future__ import annotations

import warnings
from typing import Callable, List

import torch.fx as fx

from ... import active
from .capture import GraphCapture, Real, compile_real


def backend(real: Real = "inductor", *, session=None, **real_options) -> Callable:
    """A ``torch.compile`` backend that dumps, wrapping the user's ``real`` backend.

    ``real`` is a backend name (``"inductor"``, ``"eager"``, ``"aot_eager"``…) or a
    backend callable; ``session`` defaults to the current session (or one started
    from ``$OPDUMP_CONFIG``) at compile time.
    """
    given: List = []
    explicit = session is not None
    if explicit:                       # held until the session closes, not longer
        given.append(session)
        session.on_close(given.clear)
    del session                        # the closure below must not hold it

    def opdump_backend(gm: fx.GraphModule, example_inputs):
        if explicit:
            sess = given[0] if given else None
        else:
            sess = active.current()
        if sess is None:
            warnings.warn("opdump.backend: no open dump session (set OPDUMP_CONFIG or open "
                          "`with opdump.Session(config):` before the first call of the compiled model); "
                          "this graph is compiled by the real backend and not dumped", RuntimeWarning, stacklevel=2)
            return compile_real(real, real_options, gm, example_inputs)
        return GraphCapture(sess, real, real_options).compile(gm, example_inputs)

    opdump_backend.__name__ = "opdump"
    return opdump_backend
