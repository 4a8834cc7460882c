"""statistic.csv writer: header once, whole rows, no interleaving, quoting, failures."""
import csv
import errno
import math
import os
import threading

import pytest
from hypothesis import given, settings, strategies as st

from opdump.stats import statistic_header
from opdump.write import statistic_csv as mod
from opdump.write.statistic_csv import StatisticCsv, format_shape

CATS = ("max", "min", "l2norm")
WIDTH = len(statistic_header(CATS))


def row(op_name="Default/net/Conv-op1", slot=0, shape=(2, 3), extra=("1.0", "-1.0", "2.0")):
    return ["convolution", op_name, "0", "0", "1700000000000000", "output", str(slot), "24",
            "Float32", format_shape(shape), *extra]


def read(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_format_shape():
    assert format_shape((2, 3)) == "(2,3)"
    assert format_shape((5,)) == "(5)"
    assert format_shape(()) == "()"
    assert format_shape([1, 0, 4]) == "(1,0,4)"


def test_header_once_then_rows(tmp_path):
    p = tmp_path / "statistic.csv"
    w = StatisticCsv(str(p), CATS)
    w.append_rows([row(slot=0), row(slot=1)])
    w.append_rows([row(slot=2)])
    w.append_rows([])
    text = p.read_text()
    assert text.startswith("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,"
                           "Data Type,Shape,Max Value,Min Value,L2Norm Value\n")
    assert text.count("Op Type") == 1 and text.endswith("\n")
    assert '"(2,3)"' in text                              # shape quoted like MindSpore
    rows = read(p)
    assert rows[0] == statistic_header(CATS)
    assert [r[6] for r in rows[1:]] == ["0", "1", "2"]
    assert all(len(r) == WIDTH for r in rows)
    assert rows[1][9] == "(2,3)"


def test_reopen_appends_without_second_header(tmp_path):
    p = str(tmp_path / "statistic.csv")
    StatisticCsv(p, CATS).append_rows([row(slot=0)])
    StatisticCsv(p, CATS).append_rows([row(slot=1)])
    rows = read(p)
    assert len(rows) == 3 and rows[0][0] == "Op Type" and rows[2][6] == "1"


def test_reopen_with_other_categories_refuses(tmp_path):
    p = str(tmp_path / "statistic.csv")
    StatisticCsv(p, CATS).append_rows([row()])
    with pytest.raises(ValueError, match="header"):
        StatisticCsv(p, ("max",)).append_rows([row(extra=("1.0",))])
    assert len(read(p)) == 2


def test_quoting_round_trips(tmp_path):
    p = str(tmp_path / "statistic.csv")
    odd = 'Default/a,b/"quoted"op'
    StatisticCsv(p, CATS).append_rows([row(op_name=odd), row(extra=("nan", "", "inf"))])
    rows = read(p)
    assert rows[1][1] == odd
    assert rows[2][10:] == ["nan", "", "inf"]


def test_control_characters_stay_on_one_line(tmp_path):
    """A newline or a NUL in a name is written as an escape: one row per line, no raw NUL."""
    p = tmp_path / "statistic.csv"
    StatisticCsv(str(p), CATS).append_rows([row(op_name="a\nb\x00c\u2028d"), row()])
    data = p.read_bytes()
    assert b"\x00" not in data and data.count(b"\n") == 3
    assert read(str(p))[1][1] == "a\\nb\\x00c\\u2028d"


def test_wrong_width_is_rejected(tmp_path):
    p = tmp_path / "statistic.csv"
    with pytest.raises(ValueError):
        StatisticCsv(str(p), CATS).append_rows([row(), row()[:-1]])
    assert not p.exists()                     # nothing written: the batch is all or nothing


def test_concurrent_appends_never_interleave(tmp_path):
    p = str(tmp_path / "statistic.csv")
    threads, batches, per_batch = 8, 40, 5

    def work(tid):
        w = StatisticCsv(p, CATS)               # one object per thread: the lock is per path
        for b in range(batches):
            w.append_rows([row(op_name=f"t{tid}/b{b}", slot=i) for i in range(per_batch)])

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rows = read(p)
    assert rows[0] == statistic_header(CATS)
    body = rows[1:]
    assert len(body) == threads * batches * per_batch
    assert all(len(r) == WIDTH for r in body)
    for k in range(0, len(body), per_batch):    # each batch is contiguous and in order
        group = body[k:k + per_batch]
        assert len({r[1] for r in group}) == 1
        assert [r[6] for r in group] == [str(i) for i in range(per_batch)]


def test_short_writes_are_continued(tmp_path, monkeypatch):
    p = str(tmp_path / "statistic.csv")
    real = os.write
    monkeypatch.setattr(mod.os, "write", lambda fd, data: real(fd, bytes(data[:7])))
    StatisticCsv(p, CATS).append_rows([row(slot=0), row(slot=1)])
    monkeypatch.undo()
    rows = read(p)
    assert len(rows) == 3 and rows[2][6] == "1"


def test_failed_write_leaves_no_torn_row(tmp_path, monkeypatch):
    p = str(tmp_path / "statistic.csv")
    w = StatisticCsv(p, CATS)
    w.append_rows([row(slot=0)])
    before = open(p, "rb").read()
    real = os.write
    state = {"n": 0}

    def failing(fd, data):
        state["n"] += 1
        if state["n"] == 1:
            return real(fd, bytes(data[:10]))   # half a row reaches the file…
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mod.os, "write", failing)
    with pytest.raises(OSError):
        w.append_rows([row(slot=1)])
    monkeypatch.undo()
    assert open(p, "rb").read() == before       # …and is truncated away
    w.append_rows([row(slot=2)])
    assert [r[6] for r in read(p)[1:]] == ["0", "2"]


# names without control characters (Python's csv writer leaves a lone "\r" unquoted, with
# both encodings alike; no module path or operator type holds one)
_NAMES = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=30)


@settings(max_examples=80, deadline=None)
@given(_NAMES, _NAMES,
       st.lists(st.integers(0, 9), max_size=4), st.integers(0, 2**62))
def test_rows_assembled_from_pieces_equal_csv_rows(op_type, op_name, shape, ts):
    """The recorder's device-only rows (cached head/middle text around the timestamp) are the
    bytes the csv module writes for the same cells, whatever the names hold (commas, quotes,
    newlines), and read back to the same cells."""
    import torch
    from opdump.recorder.rows import row_head, row_middle, shape_text
    shape = torch.Size(shape)
    cells = ["1.5", "", "nan"]
    nbytes = str(4 * math.prod(shape))
    fast = (row_head(op_type, op_name, 3) + str(ts)
            + row_middle("input", 1, int(nbytes), torch.float32, shape_text(shape))
            + ",".join(cells) + "\n")
    expected = [op_type, op_name, "0", "3", str(ts), "input", "1", nbytes, "Float32", format_shape(shape), *cells]
    reference = mod.encode_rows([expected])
    assert fast.encode("utf-8") == reference
    import io
    [back] = list(csv.reader(io.StringIO(fast, newline="")))
    assert back == expected


# ---------------------------------------------------------------- native row text
# names with anything (commas, quotes, unicode, control characters: those the native encoder
# leaves to the Python path, which escapes them)
_ANY_NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=20)
_CELLS = st.sampled_from(["1.5", "", "nan", "-inf", "inf", "0.0", "3", "d41d8cd98f00b204e9800998ecf8427e",
                          "1e-05,2", "-1.25e+20"])


def _native_encoder():
    from opdump.stats import native
    mod = native.module()
    return getattr(mod, "encode_rows", None) if mod is not None else None


@pytest.mark.skipif(_native_encoder() is None, reason="the native module is not built here "
                    "(OPDUMP_CPU_KERNEL=0 or no compiler): the Python path is the only one")
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_ANY_NAMES, _ANY_NAMES, st.sampled_from(["input", "output", 'o,"x"']),
                          st.integers(0, 2**62), st.integers(0, 40), st.lists(st.integers(0, 9), max_size=4),
                          st.sampled_from(["float32", "bfloat16", "int64", "bool", "float16", "uint8"]),
                          st.one_of(st.none(), st.integers(0, 2))),
                min_size=1, max_size=6),
       st.lists(_CELLS, min_size=3, max_size=3), st.booleans())
def test_native_row_text_equals_the_python_and_csv_text(items, cells, by_row):
    """``encode_rows`` (cell_text.cpp) writes the bytes of the recorder's Python path and of the
    csv module for every row it takes, and gives None (the Python path) only for a name holding a
    control character."""
    import torch
    from opdump.format.dtypes import dtype_name
    from opdump.format.names import escape_controls
    from opdump.recorder import rows as rows_mod
    encode = _native_encoder()
    batch, expected = [], []
    joined = [",".join(cells[:k + 1]) for k in range(3)]        # per handle: 1, 2, 3 cells
    tails = []
    for op_type, op_name, io, ts, slot, shape, dt, handle in items:
        dtype = getattr(torch, dt)
        nbytes = 4 * math.prod(shape)
        shape_text = format_shape(shape)
        batch.append((op_type, op_name, 0, ts, io, slot, nbytes, dtype, shape_text, handle, None))
        tail = joined[handle] if handle is not None else ",,"
        tails.append(tail)
        expected.append([escape_controls(op_type), escape_controls(op_name), "0", "0", str(ts), io, str(slot),
                         str(nbytes), dtype_name(dtype), shape_text])
    cells_arg = tails if by_row else joined
    got = encode(batch, cells_arg, by_row, ",,", {}, dtype_name)
    # the csv module's bytes: the statistic cells are raw text (never quoted by the recorder)
    reference = b"".join(mod.encode_rows([e]).rstrip(b"\n") + b"," + t.encode() + b"\n"
                         for e, t in zip(expected, tails))
    controls = any(escape_controls(s) != s for it in items for s in it[:2])
    if controls:
        assert got is None
    else:
        assert got == reference
    # the recorder's Python path (rows.py) writes the same bytes
    python = "".join(rows_mod.row_head(b[0], b[1], b[2]) + str(b[3])
                     + rows_mod.row_middle(b[4], b[5], b[6], b[7], b[8]) + t + "\n"
                     for b, t in zip(batch, tails)).encode("utf-8")
    assert python == reference


@pytest.mark.skipif(_native_encoder() is None, reason="the native module is not built here")
def test_native_row_text_leaves_other_fields_to_python():
    """A field that is not an exact int or str, or a handle out of range: None (the Python path)."""
    import torch
    from opdump.format.dtypes import dtype_name
    encode = _native_encoder()
    good = ("relu", "Default/a", 0, 5, "input", 0, 4, torch.float32, "(1)", 0, None)
    assert encode([good], ["1.0"], False, "", {}, dtype_name) == b"relu,Default/a,0,0,5,input,0,4,Float32,(1),1.0\n"
    for field, value in ((1, 3.5), (3, "5"), (3, True), (9, 1), (9, -1), (0, b"x")):
        bad = list(good)
        bad[field] = value
        assert encode([tuple(bad)], ["1.0"], False, "", {}, dtype_name) is None, (field, value)
    assert encode([good], ["1.0", "2.0"], True, "", {}, dtype_name) is None     # by row: one cell per row
