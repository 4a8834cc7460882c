"""Files the analysis side writes (reports, tables, converted ``.npy``, triage configs), each
written whole: to a temporary file beside the target, then renamed onto it.

Why one module: the writer's own :mod:`opdump.write.atomic` writes through the dump's open
folder (:class:`~opdump.write.safe_fs.DumpTree`), which the analysis side does not hold and
must not import (README, "Development": data flows one way).  Guarantee: after a failure (a
full disk, an exception while rendering) the target is untouched and no temporary is left."""
from __future__ import annotations

import os
import threading
from typing import Callable, Union

import numpy as np

PathLike = Union[str, os.PathLike]


def replace_whole(path: PathLike, write: Callable[[str], None]) -> str:
    """``write(tmp)`` fills a temporary path in ``path``'s folder, which then replaces ``path``."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".opdump-tmp-{name}.{os.getpid()}.{threading.get_ident()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_text(path: PathLike, text: str) -> str:
    """``text`` as UTF-8 at ``path``, whole."""
    def fill(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return replace_whole(path, fill)


def save_npy(path: PathLike, array: np.ndarray) -> str:
    """``numpy.save`` (no pickle) at ``path``, whole."""
    def fill(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.lib.format.write_array(f, array, allow_pickle=False)
    return replace_whole(path, fill)
