"""Files are written whole or not at all (SPEC F38).

Each file is written under a short hidden temporary name in its final folder and
renamed into place; a crash leaves at most a ``.opdump-tmp-*`` file that readers
ignore, never a truncated dump file.  No fsync per file: a dump survives a kill
of the process; surviving a power cut is not promised (it would cost a disk
flush per operator).
"""
from __future__ import annotations

import os
import threading
from typing import Callable, BinaryIO

import numpy as np

TMP_PREFIX = ".opdump-tmp-"
_counter = iter(range(1 << 62))
_counter_lock = threading.Lock()


def _tmp_path(folder: str) -> str:
    with _counter_lock:
        n = next(_counter)
    return os.path.join(folder, f"{TMP_PREFIX}{os.getpid()}-{n}")


def atomic_write(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Run ``write(f)`` on a temporary file next to ``path``, then rename it to ``path``."""
    folder = os.path.dirname(path)
    tmp = _tmp_path(folder)
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def atomic_save_npy(path: str, array: np.ndarray) -> None:
    """``numpy.save`` semantics (no pickle), written atomically."""
    if not array.flags.c_contiguous:
        array = array.copy(order="C")      # not np.ascontiguousarray: it turns 0-d arrays into 1-d
    atomic_write(path, lambda f: np.lib.format.write_array(f, array, allow_pickle=False))
