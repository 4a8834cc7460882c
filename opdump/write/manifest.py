"""``.dump_metadata/manifest.json``: the dump's own account of itself, kept true.

The manifest says whether the run finished cleanly (``complete``), which iterations
dumped, up to which iteration every file is on disk (``on_disk_through``), what was
written (``files_written``, ``bytes_written``, ``rows_written``: counted as files are
renamed into place and rows appended) and the write errors met.  The session updates
it at the end of every iteration that dumped, and when an iteration writes its first file
(before that file can reach the disk), so a killed run leaves a manifest that is still
right about what it claims.

Why it is updated in place: on a full disk, a new temporary copy could not be
written, and the manifest must still record the error that stopped the dump.  The
file is created whole (temporary + rename) at its full reserved size of one page
(JSON, then spaces); every update rewrites that page with one ``pwrite`` at offset
0, which needs no new disk blocks and cannot be torn by a kill (the kernel copies a
single page at once).  A document larger than the page (never in practice: lists
are bounded) is written whole instead.
"""
from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING, Any, Dict, Optional

from .atomic import _tmp_name
from .safe_fs import close_quietly

if TYPE_CHECKING:
    from .safe_fs import DumpTree

PAGE = 4096
_OPEN_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def encode(doc: Dict[str, Any], size: int = PAGE) -> bytes:
    """The manifest's bytes: JSON padded with spaces to ``size`` (a JSON reader ignores them).
    One key per line, rendered by json's C encoder (``indent`` would select its pure-Python
    encoder: 52 µs of the training thread per write against ~15 µs)."""
    data = json.dumps(doc, separators=(",\n ", ": ")).encode("utf-8")
    return data + b" " * max(0, size - len(data) - 1) + b"\n"


class Manifest:
    def __init__(self, tree: "DumpTree", path: str):
        self.tree = tree
        self.path = path
        self._fd: Optional[int] = None
        self._lock = threading.Lock()

    def write(self, doc: Dict[str, Any]) -> None:
        """Record ``doc`` (raises OSError; the caller reports it)."""
        data = encode(doc)
        with self._lock:
            if self._fd is not None and len(data) == PAGE:
                os.pwrite(self._fd, data, 0)
                return
            self._close_fd()
            self.tree.write_file(self.path, lambda fd: _write_all(fd, data), _tmp_name)
            if len(data) == PAGE:
                with self.tree.parent(self.path) as (dfd, name):
                    self._fd = os.open(name, _OPEN_FLAGS, dir_fd=dfd)

    def close(self) -> None:
        with self._lock:
            self._close_fd()

    def forget_in_child(self) -> None:
        self._close_fd()

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        close_quietly(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def iteration_ranges(iterations) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2|5"`` (the config's ``iteration`` syntax; bounded size).

    The definition of ``dumped_iterations``' text; the session keeps it incrementally with
    :class:`opdump.write.iteration_set.IterationSet` (tested equal to this function)."""
    out = []
    its = sorted(iterations)
    i = 0
    while i < len(its):
        j = i
        while j + 1 < len(its) and its[j + 1] == its[j] + 1:
            j += 1
        out.append(str(its[i]) if i == j else f"{its[i]}-{its[j]}")
        i = j + 1
    text = "|".join(out)
    if len(text) > 1024:                    # thousands of scattered iterations: keep the page
        text = text[:1000].rsplit("|", 1)[0] + "|…"
    return text


def describe(manifest: Optional[Dict[str, Any]], rank_dir: str) -> str:
    """What ``opdump ls`` adds after "INCOMPLETE": the interrupted iteration, the last
    iteration whose files are all on disk, the first error, the stale temporary files a
    killed run left (they are never read; ``existing: "overwrite"`` removes them)."""
    from .dump_folder import stale_temporaries

    parts = []
    if manifest:
        if manifest.get("iteration_in_progress") is not None:
            parts.append(f"interrupted in iteration {manifest['iteration_in_progress']}")
        if "on_disk_through" in manifest:
            through = manifest.get("on_disk_through")
            parts.append("no iteration known complete on disk" if through is None
                         else f"files through iteration {through} on disk")
        if manifest.get("errors"):
            parts.append(f"error: {manifest['errors'][0]}")
    stale = stale_temporaries(rank_dir)
    if stale:
        parts.append(f"{len(stale)} stale temporary file(s), e.g. {stale[0]}")
    return f" ({'; '.join(parts)})" if parts else ""
