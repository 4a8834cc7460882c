"""Every file of a dump is created beneath one open directory, never through a link.

The dump's rank folder (``{path}/rank_{r}``) is opened once when the session starts;
every folder and file below it is then reached from that descriptor one component at
a time with ``O_NOFOLLOW`` (``os.open(name, dir_fd=parent)``), folders created with
``mkdir(dir_fd=…)``.  A symbolic link planted anywhere inside the dump (an iteration
folder, ``statistic.csv``, ``mapping.csv``, ``.dump_metadata``) therefore fails with
:class:`UnsafePath` — a write error like a full disk (README, "Reliability") — instead
of sending data outside ``path``.  Renaming a finished temporary file onto a name
replaces whatever entry had that name (a link included) without following it.

The same descriptor carries the run's lock: ``flock(LOCK_EX|LOCK_NB)`` on the rank
folder, which the kernel releases when the process dies (no stale lock file), so a
second process writing the same rank is refused while the first one runs.  The
descriptor is ``O_CLOEXEC``; a forked child closes its copy (see the session).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterator, Optional, Tuple

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: a FIFO planted under a file's name fails at once (ENXIO) instead of blocking the
# writer for ever; a regular file ignores the flag, anything else is then refused by its type
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
#: folders kept open by a DumpTree (the iteration folders being written, the metadata folder…)
OPEN_FOLDERS = 32
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)

def close_quietly(fd: Optional[int]) -> None:
    """Close ``fd`` (None: nothing), ignoring an error: for descriptors given up on teardown."""
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


#: Linux limits: one name, one whole path (bytes)
NAME_MAX = 255
PATH_MAX = 4096


class UnsafePath(OSError):
    """A link (or a non-folder) where the dump expects its own folder or file."""


class DumpLocked(OSError):
    """Another process holds the dump folder."""


def _walk_error(exc: OSError, where: str) -> OSError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return UnsafePath(exc.errno, f"opdump refuses a symbolic link (or a non-folder) inside the dump: {where}")
    exc.filename = where                    # the full path, not the name relative to its folder
    return exc


class DumpTree:
    """The rank folder of a dump, open; paths handed in are absolute and must lie under it."""

    def __init__(self, rank_dir: str):
        self.path = os.path.abspath(rank_dir)
        self._prefix = self.path + os.sep
        self._fd: Optional[int] = None
        self._lock = threading.Lock()
        self._open_dirs: "OrderedDict[str, list]" = OrderedDict()     # folder -> [descriptor, users]
        #: what is on disk: files renamed into place, their bytes, statistic rows appended
        self.files_written = 0
        self.bytes_written = 0
        self.rows_written = 0

    # ------------------------------------------------------------------ open / lock / close
    def open(self, *, create: bool = True) -> None:
        """Open the rank folder (created with its parents when missing); the folder
        itself must not be a link.  Its parents are the user's ``path``: links there
        are the user's choice and are followed."""
        parent, name = os.path.split(self.path)
        if create:
            os.makedirs(parent, exist_ok=True)
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        try:
            self._fd = _open_child_dir(pfd, name, create, self.path)
        finally:
            os.close(pfd)

    def lock(self) -> None:
        """Hold the rank folder for this process (non-blocking); :class:`DumpLocked` if
        another process holds it."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DumpLocked(errno.EWOULDBLOCK, f"another process is writing this dump: {self.path}") from None

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"opdump: dump folder {self.path} is closed")
        return self._fd

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        """Close the folder (this releases the lock once no forked copy holds it)."""
        self._close_folders()
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def forget_in_child(self) -> None:
        """In a forked child: drop this process's copy of the descriptor (the parent keeps
        its lock; the child never writes)."""
        self._close_folders()
        fd, self._fd = self._fd, None
        close_quietly(fd)

    # ------------------------------------------------------------------ paths
    def parts(self, path: str) -> Tuple[str, ...]:
        """``path``'s components below the rank folder (no ``..``, no empty part)."""
        path = os.fspath(path)
        if path == self.path:
            return ()
        if not path.startswith(self._prefix):
            raise UnsafePath(errno.EXDEV, f"opdump refuses to write outside the dump folder {self.path}: {path}")
        parts = tuple(path[len(self._prefix):].split(os.sep))
        if any(p in ("", ".", "..") for p in parts):
            raise UnsafePath(errno.EINVAL, f"opdump refuses an unusual path inside the dump: {path}")
        return parts

    @contextlib.contextmanager
    def folder(self, path: str, *, create: bool = True) -> Iterator[int]:
        """A descriptor of folder ``path`` (created, component by component, when missing).

        The last :data:`OPEN_FOLDERS` folders stay open (a dump writes many files into one
        iteration folder: one ``open`` per file instead of a walk of four components)."""
        path = os.fspath(path)
        parts = self.parts(path)
        if not parts:
            yield self.fd
            return
        entry = self._checkout(path, parts, create)
        try:
            yield entry[0]
        finally:
            with self._lock:
                entry[1] -= 1

    def _checkout(self, path: str, parts: Tuple[str, ...], create: bool) -> list:
        """[descriptor, users] of an open folder, one more user counted.

        A folder not open yet is reached from its nearest open ancestor (a new iteration
        folder from its graph folder: one ``open`` instead of a walk from the rank folder),
        that ancestor counted as used meanwhile so that it is not closed under the walk."""
        with self._lock:
            entry = self._open_dirs.get(path)
            if entry is not None:
                entry[1] += 1
                self._open_dirs.move_to_end(path)
                return entry
            fd, start, base = self.fd, 0, None
            for i in range(len(parts) - 1, 0, -1):
                base = self._open_dirs.get(self._prefix + os.sep.join(parts[:i]))
                if base is not None:
                    base[1] += 1
                    fd, start = base[0], i
                    break
        owned = False
        try:
            for part in parts[start:]:
                nxt = _open_child_dir(fd, part, create, path)
                if owned:
                    os.close(fd)
                fd, owned = nxt, True
        except BaseException:
            if owned:
                os.close(fd)
            raise
        finally:
            if base is not None:
                with self._lock:
                    base[1] -= 1
        with self._lock:
            other = self._open_dirs.get(path)
            if other is not None:               # opened by another thread meanwhile
                os.close(fd)
                other[1] += 1
                return other
            entry = self._open_dirs[path] = [fd, 1]
            if len(self._open_dirs) > OPEN_FOLDERS:
                for key, (old_fd, users) in list(self._open_dirs.items()):
                    if users == 0:              # the least recently used folder nobody writes to
                        del self._open_dirs[key]
                        os.close(old_fd)
                        break
            return entry

    def _close_folders(self) -> None:
        with self._lock:
            fds = [fd for fd, _ in self._open_dirs.values()]
            self._open_dirs.clear()
        for fd in fds:
            close_quietly(fd)

    @contextlib.contextmanager
    def parent(self, path: str, *, create: bool = True) -> Iterator[Tuple[int, str]]:
        """(descriptor of ``path``'s folder, ``path``'s last component)."""
        folder, name = os.path.split(os.fspath(path))
        if name in ("", ".", ".."):
            raise UnsafePath(errno.EINVAL, f"opdump refuses an unusual file name inside the dump: {path}")
        with self.folder(folder, create=create) as dfd:
            yield dfd, name

    def ensure_folder(self, path: str) -> None:
        with self.folder(path):
            pass

    # ------------------------------------------------------------------ files
    def write_file(self, path: str, write: Callable[[int], None], tmp_name: Callable[[], str],
                   fresh: bool = False) -> None:
        """Create ``path`` whole: ``write(fd)`` fills a new temporary file in the same
        folder (``O_EXCL|O_NOFOLLOW``), which is then renamed onto ``path``; on any
        failure the temporary file is removed.  ``fresh``: the name is new (a tensor
        file's timestamp is unique), so no check whether it replaces a counted file.

        The per-file path (thousands of files per step) avoids context managers: the
        open folder is looked up by its path first."""
        entry, name = self._hold(path)
        try:
            self._write_in(entry[0], name, path, write, tmp_name, fresh)
        finally:
            self._release(entry)

    def _hold(self, path: str) -> Tuple[list, str]:
        """The open folder of ``path`` (its ``[fd, users]`` entry, counted: give it back with
        :meth:`_release`) and the file's name: the per-file path looks the folder up by its
        path first, with no context manager (thousands of files per step)."""
        folder, _, name = os.fspath(path).rpartition(os.sep)
        if name in ("", ".", ".."):
            raise UnsafePath(errno.EINVAL, f"opdump refuses an unusual file name inside the dump: {path}")
        with self._lock:                        # looked up and counted at once: never evicted meanwhile
            entry = self._open_dirs.get(folder)
            if entry is not None:
                entry[1] += 1
        if entry is None:
            parts = self.parts(folder)
            entry = self._checkout(folder, parts, True) if parts else [self.fd, 1]
        return entry, name

    def _release(self, entry: list) -> None:
        with self._lock:
            entry[1] -= 1

    def _write_in(self, dfd: int, name: str, path: str, write: Callable[[int], None],
                  tmp_name: Callable[[], str], fresh: bool) -> None:
        tmp = tmp_name()
        fd = os.open(tmp, _CREATE_FLAGS, 0o644, dir_fd=dfd)
        try:
            try:
                write(fd)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            old = None
            if not fresh:                   # a file written again (a listing) counts once
                try:
                    old = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_size
                except FileNotFoundError:
                    pass
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            with self._lock:
                self.files_written += old is None
                self.bytes_written += size - (old or 0)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            if isinstance(exc, OSError) and exc.filename is None:
                exc.filename = path             # name the file in the warning and the manifest
            raise

    @contextlib.contextmanager
    def open_append(self, path: str) -> Iterator[int]:
        """``path`` opened for appending (created when missing); a link there is refused."""
        with self.parent(path) as (dfd, name):
            try:
                fd = os.open(name, _APPEND_FLAGS, 0o644, dir_fd=dfd)
            except OSError as exc:
                raise _walk_error(exc, path) from None
            try:
                _check_regular(fd, path)
                yield fd
            finally:
                os.close(fd)

    def append(self, path: str, write: Callable[[int, int], Any]) -> Any:
        """``write(fd, size)`` (its result returned) on ``path`` opened for appending (created when missing; ``size``:
        its length before, from the one ``fstat`` that also refuses anything but a regular
        file); a link there is refused, as by :meth:`open_append`.

        The per-iteration path of statistic.csv (a new file per iteration folder): the open
        folder is looked up by its path first, with no context manager, as :meth:`write_file` does."""
        entry, name = self._hold(path)
        try:
            try:
                fd = os.open(name, _APPEND_FLAGS, 0o644, dir_fd=entry[0])
            except OSError as exc:
                raise _walk_error(exc, path) from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise UnsafePath(errno.EINVAL, f"opdump refuses a non-regular file inside the dump: {path}")
                return write(fd, st.st_size)
            finally:
                os.close(fd)
        finally:
            self._release(entry)

    def note_appended(self, rows: int, nbytes: int, new_file: bool) -> None:
        """Count rows appended to a text file (a new file counts as one file written)."""
        with self._lock:
            self.rows_written += rows
            self.bytes_written += nbytes
            self.files_written += int(new_file)

    def read_head(self, path: str, limit: int = 1 << 16) -> bytes:
        """The first ``limit`` bytes of ``path`` (never through a link)."""
        with self.parent(path, create=False) as (dfd, name):
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
            except OSError as exc:
                raise _walk_error(exc, path) from None
            try:
                _check_regular(fd, path)
                return os.read(fd, limit)
            finally:
                os.close(fd)

    def entries(self) -> list:
        """Names in the rank folder."""
        return os.listdir(self.fd)

    def clear(self) -> None:
        """Remove everything inside the rank folder (``existing: "overwrite"``); links are
        removed, never followed (``shutil.rmtree`` works from descriptors here)."""
        for name in os.listdir(self.fd):
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(name, dir_fd=self.fd)
                else:
                    os.unlink(name, dir_fd=self.fd)
            except FileNotFoundError:
                pass


def _open_child_dir(parent_fd: int, name: str, create: bool, where: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:
        raise _walk_error(exc, where) from None
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    except FileExistsError:
        pass                                # made by another thread meanwhile (or a link: refused below)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        raise _walk_error(exc, where) from None


def _check_regular(fd: int, where: str) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise UnsafePath(errno.EINVAL, f"opdump refuses a non-regular file inside the dump: {where}")


def check_lengths(path: str, field: str = "path") -> Optional[str]:
    """Why ``path`` is too long for the file system (a component over 255 bytes, the
    whole over 4096), or None."""
    data = os.fsencode(path)
    if len(data) >= PATH_MAX:
        return f"is {len(data)} bytes long; paths are limited to {PATH_MAX - 1}"
    for part in data.split(b"/"):
        if len(part) > NAME_MAX:
            return f"has a component of {len(part)} bytes ({part[:40].decode(errors='replace')}…); names are limited to {NAME_MAX}"
    return None
