"""Files written whole or not at all (SPEC F38), with numpy.save's bytes."""
import errno
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from opdump.write import atomic
from opdump.write.atomic import TMP_PREFIX, atomic_save_npy

_DTYPES = st.one_of(hnp.boolean_dtypes(), hnp.integer_dtypes(endianness="="), hnp.unsigned_integer_dtypes(endianness="="),
                    hnp.floating_dtypes(endianness="="), hnp.complex_number_dtypes(endianness="="),
                    hnp.integer_dtypes(endianness=">"), hnp.floating_dtypes(endianness=">", sizes=(32, 64)))


def _numpy_save_bytes(tmp_path, array) -> bytes:
    ref = tmp_path / "ref.npy"
    np.save(ref, np.require(array, requirements="C"), allow_pickle=False)
    return ref.read_bytes()


@settings(max_examples=150, deadline=None)
@given(array=hnp.arrays(_DTYPES, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)))
def test_same_bytes_as_numpy_save(tmp_path_factory, array):
    tmp_path = tmp_path_factory.mktemp("npy")
    path = tmp_path / "t.npy"
    atomic_save_npy(str(path), array)
    assert path.read_bytes() == _numpy_save_bytes(tmp_path, array)
    back = np.load(path)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == np.ascontiguousarray(array).tobytes()
    assert sorted(os.listdir(tmp_path)) == ["ref.npy", "t.npy"]


def test_transposed_and_structured_arrays(tmp_path):
    transposed = np.arange(12, dtype=np.float32).reshape(3, 4).T      # F-contiguous: written in C order
    atomic_save_npy(str(tmp_path / "a.npy"), transposed)
    assert (tmp_path / "a.npy").read_bytes() == _numpy_save_bytes(tmp_path, transposed.copy(order="C"))
    structured = np.zeros(3, dtype=[("a", "<f4"), ("b", "<i8")])        # numpy's own path
    atomic_save_npy(str(tmp_path / "s.npy"), structured)
    assert (tmp_path / "s.npy").read_bytes() == _numpy_save_bytes(tmp_path, structured)


def test_short_writes_are_continued(tmp_path, monkeypatch):
    """``writev`` may write less than asked (a signal, the 2 GiB per-call cap on Linux):
    the rest follows, in order.  The short write is simulated at each boundary case."""
    array = np.arange(1000, dtype=np.float64)
    expected = _numpy_save_bytes(tmp_path, array)
    for short in (1, 64, 127, 128, 129, 4000):     # inside the header, at its end, inside the data
        def writev(fd, buffers, short=short):
            joined = b"".join(bytes(b) for b in buffers)
            return os.write(fd, joined[:short])
        monkeypatch.setattr(atomic.os, "writev", writev)
        path = tmp_path / f"short{short}.npy"
        atomic_save_npy(str(path), array)
        assert path.read_bytes() == expected, short


def test_full_disk_leaves_no_file(tmp_path, monkeypatch):
    def full(fd, buffers):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(atomic.os, "writev", full)
    with pytest.raises(OSError) as err:
        atomic_save_npy(str(tmp_path / "t.npy"), np.ones(10, np.float32))
    assert err.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []          # neither the file nor its temporary


def test_existing_file_replaced_whole(tmp_path):
    path = tmp_path / "t.npy"
    atomic_save_npy(str(path), np.ones(100, np.float32))
    atomic_save_npy(str(path), np.zeros(3, np.int8))
    assert np.load(path).tolist() == [0, 0, 0]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(TMP_PREFIX)]
