"""The dump's open rank folder (opdump/write/safe_fs.py): files land whole where asked,
from many threads and folders at once, descriptors are bounded and all given back, a link
at any depth is refused, and the flock excludes a second holder."""
import os
import threading

import numpy as np
import pytest

from opdump.write.atomic import atomic_save_npy, atomic_write_bytes
from opdump.write.safe_fs import OPEN_FOLDERS, DumpLocked, DumpTree, UnsafePath


def _fds():
    return len(os.listdir("/proc/self/fd"))


def test_many_folders_from_many_threads(tmp_path):
    before = _fds()
    tree = DumpTree(str(tmp_path / "rank_0"))
    tree.open()
    folders = [os.path.join(tree.path, "Net", str(g), str(i)) for g in range(3) for i in range(20)]

    def work(k):
        for n, folder in enumerate(folders):
            atomic_save_npy(os.path.join(folder, f"t{k}_{n}.npy"), np.full(3, k, np.float32), tree)
            assert _fds() < before + OPEN_FOLDERS + 16
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tree.files_written == 4 * len(folders)
    for n, folder in enumerate(folders):
        assert np.load(os.path.join(folder, f"t2_{n}.npy")).tolist() == [2, 2, 2]
    atomic_write_bytes(os.path.join(tree.path, "a.txt"), b"1", tree)
    atomic_write_bytes(os.path.join(tree.path, "a.txt"), b"22", tree)   # rewritten: counted once
    assert tree.files_written == 4 * len(folders) + 1
    tree.close()
    assert _fds() == before


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_link_at_any_depth_is_refused(tmp_path, depth):
    outside = tmp_path / "outside"
    outside.mkdir()
    tree = DumpTree(str(tmp_path / "rank_0"))
    tree.open()
    parts = ["Net", "0", "5"]
    real = os.path.join(tree.path, *parts[:depth])
    os.makedirs(real, exist_ok=True)
    os.symlink(outside, os.path.join(real, parts[depth]))
    with pytest.raises(UnsafePath, match="symbolic link"):
        atomic_write_bytes(os.path.join(tree.path, *parts, "f.txt"), b"x", tree)
    with pytest.raises(UnsafePath):
        tree.parts(os.path.join(tree.path, "..", "x"))
    with pytest.raises(UnsafePath):
        tree.parts(str(outside / "x"))
    assert os.listdir(outside) == []
    tree.close()


def test_the_lock_excludes_a_second_holder(tmp_path):
    first, second = DumpTree(str(tmp_path / "rank_0")), DumpTree(str(tmp_path / "rank_0"))
    first.open()
    first.lock()
    second.open()
    with pytest.raises(DumpLocked):
        second.lock()
    first.close()
    second.lock()                              # released with the descriptor
    second.close()


def test_a_fifo_planted_as_a_file_fails_at_once(tmp_path):
    """A FIFO under statistic.csv's name must not block the writer for ever (O_NONBLOCK)."""
    from opdump.write.statistic_csv import StatisticCsv

    tree = DumpTree(str(tmp_path / "rank_0"))
    tree.open()
    os.mkfifo(os.path.join(tree.path, "statistic.csv"))
    errors = []

    def append():
        try:
            StatisticCsv(os.path.join(tree.path, "statistic.csv"), ("max",), tree).append_encoded(b"x\n")
        except OSError as exc:
            errors.append(exc)
    t = threading.Thread(target=append, daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive() and errors and errors[0].filename.endswith("statistic.csv")
    tree.close()
