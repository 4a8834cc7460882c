"""Native eager capture: the statistics of every operator recorded from C++, with no Python
per operator (README, "Eager mode", native statistics path).

``observer.cpp`` (built into opdump's native module, :mod:`opdump.stats.native`) observes
operators through ``RecordFunction`` callbacks; :mod:`.path` decides which iterations it
serves and gives it what only Python knows (module scopes, the listing, the recorder's
rows).  It is opt-in (``OPDUMP_NATIVE_EAGER=1``): see :mod:`.path` for what still differs.  The Python capture (:mod:`opdump.capture.eager.dispatch`) stays the reference: it
serves the first dumped iteration (which writes the listing) and every case the native
path is not proven equal on.
"""
from .path import ENV_SWITCH, NativeEager, native_enabled

__all__ = ["ENV_SWITCH", "NativeEager", "native_enabled"]
