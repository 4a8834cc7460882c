"""Opening a dump's rank folder before the first step: checked, locked, never merged.

:func:`open_rank_folder` runs when a session starts (before ``opdump run`` starts the
script), so that a path that cannot hold a dump is a configuration error (exit 2, one
line naming the field) instead of an exception at the first dumped step:

* lengths: no component over 255 bytes, room for the deepest file under 4096 bytes
  (``path`` and ``net_name`` are named separately);
* the folder is created (``path`` under a regular file, a read-only mount, no
  permission: refused here), then a probe file is written and removed in it;
* the rank folder is locked (``flock``, released by the kernel when the process dies):
  a second process writing the same rank is refused;
* a rank folder that already holds a dump is handled by ``opdump_settings.existing``:
  ``"refuse"`` (the default: a clear error, nothing touched), ``"new-folder"`` (the
  first free ``{path}-1``, ``{path}-2``… is used instead, and a warning names it), or
  ``"overwrite"`` (its contents are removed, under the lock, without following links).
"""
from __future__ import annotations

import os
import warnings
from typing import Optional, Tuple

from ..config import ConfigError, DumpConfig
from ..format import layout as fmt
from .atomic import TMP_PREFIX
from .safe_fs import NAME_MAX, PATH_MAX, DumpLocked, DumpTree, UnsafePath

PATH_FIELD = "common_dump_settings.path"
NET_FIELD = "common_dump_settings.net_name"
EXISTING_FIELD = "opdump_settings.existing"
#: bytes below ``{path}/rank_{r}/{net_name}`` for the deepest file: ``/{graph}/{iteration}/`` and a name
_DEEPEST = 1 + 10 + 1 + 10 + 1 + NAME_MAX
_NEW_FOLDER_TRIES = 1000


def check_lengths(config: DumpConfig, rank: int) -> None:
    """ConfigError when ``path`` or ``net_name`` cannot fit the file system's limits."""
    root = os.fsencode(config.path)
    for part in root.split(b"/"):
        if len(part) > NAME_MAX:
            raise ConfigError(PATH_FIELD, config.path, f"has a component of {len(part)} bytes; "
                              f"a file system name holds at most {NAME_MAX}", config.source_file)
    net = os.fsencode(config.net_name)
    if len(net) > NAME_MAX:
        raise ConfigError(NET_FIELD, config.net_name, f"is {len(net)} bytes long; a folder name holds at most "
                          f"{NAME_MAX}", config.source_file)
    deepest = len(root) + 1 + len(fmt.rank_dir_name(rank)) + 1 + len(net) + _DEEPEST
    if deepest >= PATH_MAX:
        raise ConfigError(PATH_FIELD, config.path, f"is too long: the dump's deepest files would need "
                          f"{deepest} bytes, paths are limited to {PATH_MAX - 1}", config.source_file)


def _refused(config: DumpConfig, path: str, why: str) -> ConfigError:
    return ConfigError(PATH_FIELD, config.path, f"cannot hold a dump ({path}: {why})", config.source_file)


def _probe(tree: DumpTree) -> None:
    """Write and remove a small file in the rank folder: the folder takes files."""
    name = f"{TMP_PREFIX}probe-{os.getpid()}"
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=tree.fd)
    try:
        os.write(fd, b"opdump\n")
    finally:
        os.close(fd)
        try:
            os.unlink(name, dir_fd=tree.fd)
        except OSError:
            pass


def holds_dump(tree: DumpTree) -> bool:
    """Anything in the rank folder but a stale temporary file of a killed run."""
    return any(not name.startswith(TMP_PREFIX) for name in tree.entries())


def _open_locked(config: DumpConfig, root: str, rank: int) -> DumpTree:
    rank_dir = os.path.join(root, fmt.rank_dir_name(rank))
    tree = DumpTree(rank_dir)
    try:
        tree.open(create=True)
    except UnsafePath:
        raise _refused(config, rank_dir, "it is a symbolic link or not a folder") from None
    except OSError as exc:
        raise _refused(config, exc.filename or rank_dir, exc.strerror or str(exc)) from None
    try:
        tree.lock()
    except DumpLocked:
        tree.close()
        raise
    except OSError as exc:
        tree.close()
        raise _refused(config, rank_dir, f"cannot be locked: {exc.strerror or exc}") from None
    return tree


def open_rank_folder(config: DumpConfig, rank: int, existing: Optional[str] = None) -> Tuple[str, DumpTree]:
    """(the dump root used, the rank folder open and locked); ConfigError when it cannot hold a dump."""
    existing = existing or config.existing
    check_lengths(config, rank)
    root = config.path
    for attempt in range(_NEW_FOLDER_TRIES):
        try:
            tree = _open_locked(config, root, rank)
        except DumpLocked:
            if existing == "new-folder":
                root = f"{config.path}-{attempt + 1}"
                continue
            raise ConfigError(PATH_FIELD, config.path, f"another process is writing a dump into "
                              f"{os.path.join(root, fmt.rank_dir_name(rank))} now; use another path",
                              config.source_file) from None
        try:
            if holds_dump(tree):
                if existing == "new-folder":
                    tree.close()
                    root = f"{config.path}-{attempt + 1}"
                    continue
                if existing == "overwrite":
                    tree.clear()
                else:
                    tree.close()
                    raise ConfigError(PATH_FIELD, config.path, f"{tree.path} already holds a dump; choose another "
                                      f"path, or set {EXISTING_FIELD} to \"new-folder\" or \"overwrite\"",
                                      config.source_file)
            _probe(tree)
        except ConfigError:
            raise
        except OSError as exc:
            tree.close()
            raise _refused(config, tree.path, exc.strerror or str(exc)) from None
        if root != config.path:
            warnings.warn(f"opdump: {os.path.join(config.path, fmt.rank_dir_name(rank))} holds a dump; this run "
                          f"writes to {tree.path} ({EXISTING_FIELD}: \"new-folder\")", UserWarning, stacklevel=3)
        return root, tree
    raise ConfigError(EXISTING_FIELD, existing, f"no free folder among {config.path}-1 … "
                      f"{config.path}-{_NEW_FOLDER_TRIES}", config.source_file)


def stale_temporaries(rank_dir: str) -> list:
    """Temporary files a killed run left under ``rank_dir`` (for ``opdump ls``)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(rank_dir):
        out.extend(os.path.join(dirpath, f) for f in filenames if f.startswith(TMP_PREFIX))
    return sorted(out)


__all__ = ["open_rank_folder", "check_lengths", "holds_dump", "stale_temporaries", "DumpLocked"]
