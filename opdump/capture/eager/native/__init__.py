"""Native eager capture: the statistics of every operator recorded from C++, with no Python
per operator (README, "Eager mode", native statistics path).

``observer.cpp`` (built into opdump's native module, :mod:`opdump.stats.native`) observes
operators through ``RecordFunction`` callbacks; :mod:`.path` decides which iterations it
serves and gives it what only Python knows (module scopes, the listing, the recorder's
rows); :mod:`.inert` is the dispatch mode a served iteration runs under, :mod:`.callbacks`
what the observer calls Python for, :mod:`.watch` (with ``watch.cpp``) the overflow watch
(``op_debug_mode`` 3) served the same way.  It is on by default (``OPDUMP_NATIVE_EAGER=0`` turns it off).  The Python
capture (:mod:`opdump.capture.eager.dispatch`) stays the reference: it serves the first
dumped iteration (which writes the listing, with the observer probing beside it) and every
case the native path is not proven equal on; tests/test_native_eager.py compares the two
paths' dumps.
"""
from .path import ENV_SWITCH, NativeEager, native_enabled

__all__ = ["ENV_SWITCH", "NativeEager", "native_enabled"]
