"""``statistic.csv``: append-only, one ``write()`` per batch of complete rows.

Crash safety (README, "Reliability"): the rows of a batch are formatted into one bytes object
first, then appended with ``os.open(O_WRONLY|O_APPEND|O_CREAT)`` and a single
``os.write``.  A process killed between two batches therefore leaves only whole
rows: the kernel copies the buffer into the file in one system call, it never
contains half a row that Python was still assembling.  (A fatal signal during a
multi-page write, or a power loss, may still cut the *last* line in the page
cache; readers should ignore a final line without its newline.)  A short write
(e.g. a signal, or a quota) is continued in a loop with the rest of the same
bytes.  If a write fails (disk full), the file is truncated back to its size
before the batch, so the torn tail never stays, and the error is raised.

The header is written, in the same ``write`` as the first rows, when the file
is empty; re-opening an existing file appends without a second header (and a
file whose header differs — other categories — is an error rather than a
mixed table).  Appends to one path are serialised by a per-path lock shared by
every :class:`StatisticCsv` of the process, so rows of concurrent writer
threads never interleave.  Quoting is the csv module's (minimal quoting: the
shape ``(2,3)`` is written ``"(2,3)"`` as MindSpore does); lines end with ``\\n``;
control characters in a name (a NUL, a newline) are written as backslash escapes
(:mod:`.text`), so every row is one line of valid CSV whatever a model names.

Inside a dump the file is reached through the dump's open folder (``tree``,
:mod:`.safe_fs`): a symbolic link planted as ``statistic.csv`` or as one of its
folders is refused, never appended through.  A dump makes a new file per iteration
folder, in the writer thread: an append there is one ``open``, one ``fstat`` (the
regular-file check gives the size the header test needs) and one ``write``
(:meth:`~.safe_fs.DumpTree.append`), and the header's text is made once per set of
categories.
"""
from __future__ import annotations

import contextlib
import csv
import functools
import io
import os
import threading
from typing import TYPE_CHECKING, Iterable, List, Optional, Sequence, Tuple

from ..format.names import escape_controls
from ..format.statistics import statistic_header
from ..stats.formatting import format_shape

if TYPE_CHECKING:
    from .safe_fs import DumpTree

__all__ = ["StatisticCsv", "format_shape", "encode_rows", "encode_fields"]

# Striped: a fixed set of locks, chosen by the file's path, so that a run writing one
# statistic.csv per graph and iteration for days does not grow a lock per file.
_LOCKS = tuple(threading.Lock() for _ in range(64))


def _lock_for(path: str) -> threading.Lock:
    # abspath, not realpath: no system call (realpath stats every component, ~30 us, in the
    # writer thread at every new iteration); opdump names each file by one path only, an
    # absolute one (a dump's paths are), which is taken as it is
    return _LOCKS[hash(path if path.startswith(os.sep) else os.path.abspath(path)) % len(_LOCKS)]


@functools.lru_cache(maxsize=64)
def _header(categories: Tuple[str, ...]) -> Tuple[Tuple[str, ...], bytes]:
    """The header cells and their CSV line, made once per set of categories (a dump makes a new
    statistic.csv per iteration folder, in the writer thread)."""
    header = tuple(statistic_header(categories))
    return header, encode_rows([header])


def encode_rows(rows: Iterable[Sequence]) -> bytes:
    """CSV lines (``\\n``-terminated, UTF-8) of ``rows``; None cells become empty."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for row in rows:
        w.writerow(["" if c is None else escape_controls(c) if isinstance(c, str) else c for c in row])
    return buf.getvalue().encode("utf-8")


def encode_fields(cells: Sequence[str]) -> str:
    """The CSV text of some consecutive cells of a row, without a line end: rows can be
    assembled from such pieces joined by ``,`` (each piece quoted as :func:`encode_rows` does)."""
    return encode_rows([cells]).decode("utf-8")[:-1]


class StatisticCsv:
    """One ``statistic.csv`` file, for the statistic ``categories`` of the config."""

    def __init__(self, path: str, categories: Sequence[str], tree: Optional["DumpTree"] = None):
        self.path = os.fspath(path)
        self._tree = tree
        header, self._header_bytes = _header(tuple(categories))
        self.header: List[str] = list(header)
        self._lock = _lock_for(self.path)
        self._header_ok = False         # the file's header was written or checked by us

    def append_rows(self, rows: List[Sequence]) -> None:
        """Append complete rows (each as long as the header) in one write."""
        rows = list(rows)
        width = len(self.header)
        for row in rows:
            if len(row) != width:
                raise ValueError(f"statistic.csv row has {len(row)} cells, the header {width}: {list(row)!r}")
        if not rows:
            return
        self.append_encoded(encode_rows(rows))

    def append_encoded(self, body: bytes, rows: Optional[int] = None) -> None:
        """Append rows already encoded as CSV lines (each complete and ``\\n``-terminated:
        the caller guarantees the width, see :func:`encode_fields`) in one write; ``rows``:
        how many lines ``body`` holds, when the caller knows (else they are counted)."""
        if not body:
            return
        try:
            self._append(body, body.count(b"\n") if rows is None else rows)
        except OSError as exc:
            if exc.filename is None:
                exc.filename = self.path           # name the file in the warning and the manifest
            raise

    def _append(self, body: bytes, rows: int) -> None:
        tree = self._tree
        with self._lock:
            if tree is None:
                with self._open() as fd:
                    self._write_at(fd, os.fstat(fd).st_size, body)
                return
            # one open, one fstat (the regular-file check gives the size), one write
            size = tree.append(self.path, lambda fd, start: self._write_at(fd, start, body))
            tree.note_appended(rows, size, size > len(body))    # the header written: a new file

    def _write_at(self, fd: int, start: int, body: bytes) -> int:
        """Write ``body`` (after the header when the file is empty) at the end of ``fd``, whose
        length is ``start``; the bytes written."""
        if start == 0:
            data = self._header_bytes + body
        else:
            if not self._header_ok:
                self._check_header()
            data = body
        self._write_all(fd, data, start)
        self._header_ok = True
        return len(data)

    @contextlib.contextmanager
    def _open(self):
        if self._tree is not None:
            with self._tree.open_append(self.path) as fd:
                yield fd
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            yield fd
        finally:
            os.close(fd)

    def _check_header(self) -> None:
        if self._tree is not None:
            first = self._tree.read_head(self.path, len(self._header_bytes) + 1)
            first = first[:first.find(b"\n") + 1] if b"\n" in first else first
        else:
            with open(self.path, "rb") as f:
                first = f.readline(1 << 16)
        if first != self._header_bytes:
            raise ValueError(f"{self.path}: existing statistic.csv has another header "
                             f"({first.decode('utf-8', 'replace').strip()!r}); not appending")

    @staticmethod
    def _write_all(fd: int, data: bytes, start: int) -> None:
        view = memoryview(data)
        try:
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except BaseException:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            raise
