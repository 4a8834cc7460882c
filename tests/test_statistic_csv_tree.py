"""statistic.csv inside a dump's open folder (opdump/write/statistic_csv.py through
opdump/write/safe_fs.py ``DumpTree.append``): one open and one fstat per append, the header
once, the counts the manifest reports, links and non-files refused; a folder not yet open is
made from its nearest open ancestor."""
import os

import pytest

from opdump.write.safe_fs import DumpTree, UnsafePath
from opdump.write.statistic_csv import StatisticCsv

CATS = ["max", "min", "avg", "l2norm"]
ROW = b"Conv2D,f.0,0,0,7,input,0,16,float32,\"(2,2)\",1.0,0.0,0.5,1.5\n"


@pytest.fixture
def tree(tmp_path):
    t = DumpTree(str(tmp_path / "rank_0"))
    t.open()
    yield t
    t.close()


def test_header_once_and_counts(tree):
    path = os.path.join(tree.path, "Net", "0", "3", "statistic.csv")
    csv = StatisticCsv(path, CATS, tree)
    csv.append_encoded(ROW * 2, 2)
    assert (tree.files_written, tree.rows_written) == (1, 2)
    header = b"Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,Avg Value,L2Norm Value\n"
    assert tree.bytes_written == len(header) + 2 * len(ROW)
    csv.append_encoded(ROW)                                      # rows counted from the text
    again = StatisticCsv(path, CATS, tree)                        # a new object on the same file
    again.append_encoded(ROW * 3, 3)
    assert (tree.files_written, tree.rows_written) == (1, 6)
    with open(path, "rb") as f:
        assert f.read() == header + ROW * 6
    other = StatisticCsv(path, ["max"], tree)
    with pytest.raises(ValueError, match="another header"):
        other.append_encoded(ROW)


def test_headers_of_other_categories_are_their_own(tree):
    a = StatisticCsv(os.path.join(tree.path, "a.csv"), ["max"], tree)
    b = StatisticCsv(os.path.join(tree.path, "b.csv"), ["max", "md5"], tree)
    a2 = StatisticCsv(os.path.join(tree.path, "c.csv"), ["max"], tree)
    assert a.header[-1] == "Max Value" and b.header[-1] != "Max Value" and a2.header == a.header
    a.header.append("x")                                          # a caller's copy: the next file is unchanged
    assert StatisticCsv(os.path.join(tree.path, "d.csv"), ["max"], tree).header[-1] == "Max Value"


def test_a_link_or_a_folder_as_statistic_csv_is_refused(tree, tmp_path):
    outside = tmp_path / "outside.csv"
    outside.write_bytes(b"")
    folder = os.path.join(tree.path, "Net", "0", "1")
    os.makedirs(folder)
    os.symlink(outside, os.path.join(folder, "statistic.csv"))
    with pytest.raises(UnsafePath):
        StatisticCsv(os.path.join(folder, "statistic.csv"), CATS, tree).append_encoded(ROW, 1)
    assert outside.read_bytes() == b""
    os.makedirs(os.path.join(folder, "x.csv"))
    with pytest.raises(OSError):
        StatisticCsv(os.path.join(folder, "x.csv"), CATS, tree).append_encoded(ROW, 1)
    assert tree.rows_written == 0


def test_a_new_folder_is_made_in_its_open_ancestor(tree):
    """The graph folder is open (the session ensures it once); iteration folders are made from
    that descriptor, not by a new walk from the rank folder: moved away on disk, the folder
    still receives them (as files of an open folder always did)."""
    graph = os.path.join(tree.path, "Net", "0")
    tree.ensure_folder(graph)
    os.rename(graph, os.path.join(tree.path, "Net", "moved"))
    csv = StatisticCsv(os.path.join(graph, "7", "statistic.csv"), CATS, tree)
    csv.append_encoded(ROW)
    assert os.path.isfile(os.path.join(tree.path, "Net", "moved", "7", "statistic.csv"))
    assert not os.path.exists(graph)


def test_a_link_below_an_open_ancestor_is_refused(tree, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    graph = os.path.join(tree.path, "Net", "0")
    tree.ensure_folder(graph)
    os.symlink(outside, os.path.join(graph, "9"))
    with pytest.raises(UnsafePath, match="symbolic link"):
        StatisticCsv(os.path.join(graph, "9", "statistic.csv"), CATS, tree).append_encoded(ROW)
    assert os.listdir(outside) == []
