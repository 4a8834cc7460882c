"""``python -m opdump.stats.build_native [build [DIR] | where]``: build opdump's native module now
(``scripts/setup.sh`` does, so that no run builds it) or say where the built library is; see
:mod:`opdump.stats.native`.  Exit 0 when the library is there."""
import sys

from .native import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["build"]))
