"""The Ascend bin dump file codec (opdump/format/ascend_bin.py): the byte layout checked by
hand (8-byte length, protobuf parsed with the generated class, field numbers read from the
wire), round trips for every dtype opdump writes, files built the way the toolchain builds
them, and malformed files."""
from __future__ import annotations

import os
import struct
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from opdump.format import ascend_bin as ab
from opdump.format import dump_data_pb2 as pb

NUMPY_DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                "uint32", "uint64", "bool", "complex64", "complex128"]
DT_OF = {"float16": 2, "float32": 1, "float64": 12, "int8": 3, "int16": 5, "int32": 7, "int64": 8, "uint8": 4,
         "uint16": 6, "uint32": 9, "uint64": 10, "bool": 11, "complex64": 16, "complex128": 17}


def write(path, buffers) -> str:
    with open(path, "wb") as f:
        f.write(b"".join(bytes(b) for b in buffers))
    return str(path)


def toolchain_file(path, dd: "pb.DumpData", data: bytes) -> str:
    """What the toolchain writes (msaccucmp's write_dump_data): pack('Q', len) + header + data."""
    header = dd.SerializeToString()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)
    return str(path)


def _varint(buf: bytes, i: int):
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return out, i


def wire_fields(buf: bytes):
    """Top-level (field number, value) pairs of a protobuf message, read by hand."""
    i, out = 0, []
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, i = _varint(buf, i)
        elif wt == 2:
            n, i = _varint(buf, i)
            val, i = buf[i:i + n], i + n
        else:
            raise AssertionError(f"unexpected wire type {wt}")
        out.append((num, val))
    return out


# ---------------------------------------------------------------- the byte layout, by hand

def test_byte_layout_by_hand(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([[1, -2]], dtype=np.int64)
    c = np.array([True, False, True])
    path = write(tmp_path / "f", ab.encode("Default/Add-op7", [a, b], [c], timestamp=1700000000123456,
                                           formats={("input", 1): "NCHW"}, original_shapes={("output", 0): (3, 1)}))
    raw = open(path, "rb").read()
    (h,) = struct.unpack("<Q", raw[:8])
    dd = pb.DumpData()
    dd.ParseFromString(raw[8:8 + h])
    assert dd.op_name == "Default/Add-op7" and dd.dump_time == 1700000000123456 and dd.version == "2.0"
    assert [i.data_type for i in dd.input] == [1, 8] and [o.data_type for o in dd.output] == [11]
    assert [list(i.shape.dim) for i in dd.input] == [[2, 3], [1, 2]]
    assert [i.format for i in dd.input] == [2, 0]          # ND by default, NCHW asked
    assert list(dd.output[0].original_shape.dim) == [3, 1] and list(dd.input[0].original_shape.dim) == [2, 3]
    assert all(t.data == b"" for t in list(dd.input) + list(dd.output))
    assert [t.size for t in list(dd.input) + list(dd.output)] == [24, 16, 3]
    assert raw[8 + h:] == a.tobytes() + b.tobytes() + c.tobytes()
    # field numbers as the toolchain's proto has them, read off the wire
    top = dict(wire_fields(raw[8:8 + h]))
    assert top[1] == b"2.0" and top[2] == 1700000000123456 and top[6] == b"Default/Add-op7"
    nums = [n for n, _ in wire_fields(raw[8:8 + h])]
    assert nums.count(4) == 2 and nums.count(3) == 1      # input = 4, output = 3
    first_input = dict(wire_fields([v for n, v in wire_fields(raw[8:8 + h]) if n == 4][0]))
    assert first_input[1] == 1 and first_input[5] == 24    # OpInput.data_type = 1, size = 5
    assert dict(wire_fields(first_input[3])) == {1: b"\x02\x03"}   # Shape.dim = 1 (packed)
    out0 = dict(wire_fields([v for n, v in wire_fields(raw[8:8 + h]) if n == 3][0]))
    assert out0[6] == 3 and dict(wire_fields(out0[7])) == {1: b"\x03\x01"}   # OpOutput.size 6, original_shape 7


def test_buffers_suit_writev(tmp_path):
    bufs = ab.encode("op", [np.ones((3, 4), np.float16)], [np.zeros(0, np.float32)], timestamp=1)
    fd = os.open(tmp_path / "w", os.O_WRONLY | os.O_CREAT)
    try:
        n = os.writev(fd, bufs)
    finally:
        os.close(fd)
    assert n == sum(memoryview(b).nbytes for b in bufs) == os.path.getsize(tmp_path / "w")
    assert open(tmp_path / "w", "rb").read() == b"".join(bytes(b) for b in bufs)
    assert ab.load(str(tmp_path / "w"), "input", 0).tolist() == np.ones((3, 4)).tolist()


# ---------------------------------------------------------------- round trips

@settings(max_examples=60, deadline=None)
@given(st.data())
def test_round_trip_every_numpy_dtype(data):
    dtypes = data.draw(st.lists(st.sampled_from(NUMPY_DTYPES), min_size=0, max_size=4))
    arrays = [data.draw(hnp.arrays(np.dtype(d), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)))
              for d in dtypes]
    n_in = data.draw(st.integers(0, len(arrays)))
    with tempfile.TemporaryDirectory() as d:
        path = write(os.path.join(d, "Op.op.1.2.3"), ab.encode("op", arrays[:n_in], arrays[n_in:], timestamp=3))
        header = ab.read_header(path)
        assert len(header.inputs) == n_in and len(header.outputs) == len(arrays) - n_in
        got = ab.load_all(path)
        for kind, expected in (("input", arrays[:n_in]), ("output", arrays[n_in:])):
            for i, (e, g) in enumerate(zip(expected, got[kind])):
                info = header.tensors(kind)[i]
                assert info.data_type == DT_OF[e.dtype.name] and info.shape == e.shape
                assert info.size == e.nbytes and g.dtype == e.dtype and g.shape == e.shape
                assert g.tobytes() == e.tobytes()           # bit-exact, NaNs included
                assert ab.load(path, kind, i).tobytes() == e.tobytes()


def test_big_endian_and_non_contiguous_arrays(tmp_path):
    a = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2]
    path = write(tmp_path / "f", ab.encode("op", [a], [], timestamp=0))
    assert ab.load(path, "input", 0).tolist() == a.tolist()


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype, dt", [(torch.bfloat16, 27), (torch.float8_e4m3fn, 35), (torch.float8_e5m2, 34),
                                       (torch.float8_e8m0fnu, 36), (torch.complex32, 32)])
def test_torch_only_dtypes_read_as_torch_converts_them(tmp_path, dtype, dt):
    """Every bit pattern of the 1- and 2-byte types: the decoded float32 equals torch's own
    conversion (NaN where torch gives NaN)."""
    if dtype.itemsize == 1:
        t = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    elif dtype == torch.bfloat16:
        t = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    else:
        t = torch.randn(5, 3, dtype=torch.complex64).to(dtype)
    raw = t.view(torch.uint8).numpy() if dtype.itemsize == 1 else t.view(torch.int16 if dtype.itemsize == 2 else
                                                                        torch.int32).numpy()
    name = str(dtype).replace("torch.", "")
    path = write(tmp_path / "f", ab.encode("op", [], [ab.RawTensor(raw, name, tuple(t.shape))], timestamp=0))
    info = ab.read_header(path).outputs[0]
    assert info.data_type == dt and info.dtype == name and info.size == t.numel() * dtype.itemsize
    got = ab.load(path, "output", 0)
    want = t.to(torch.complex64 if dtype == torch.complex32 else torch.float32).numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)              # NaN == NaN here


def test_int4_packed_two_per_byte_low_nibble_first(tmp_path):
    values = np.array([-8, 7, -1, 0, 3, -5, 1], dtype=np.int8)
    packed = ab.pack_int4(values)
    by_hand = [((int(values[i]) & 0xF) | ((int(values[i + 1]) & 0xF) << 4)) if i + 1 < len(values)
               else int(values[i]) & 0xF for i in range(0, len(values), 2)]
    assert packed.tolist() == by_hand
    path = write(tmp_path / "f", ab.encode("op", [ab.RawTensor(packed, "int4", (7,))], [], timestamp=0))
    info = ab.read_header(path).inputs[0]
    assert info.data_type == 28 and info.size == 4
    got = ab.load(path, "input", 0)
    assert got.dtype == np.int8 and got.tolist() == values.tolist()
    assert ab.load(path, "input", 0, raw=True).tolist() == by_hand


def test_raw_tensor_overrides_and_dt_names(tmp_path):
    dev = np.zeros((1, 1, 2, 2, 16), np.float16)
    t = ab.RawTensor(dev, "DT_FLOAT16", dev.shape, format="FORMAT_NC1HWC0", original_shape=(1, 3, 2, 2),
                     sub_format=2)
    path = write(tmp_path / "f", ab.encode("op", [t], [], timestamp=0, formats={("input", 0): "ND"}))
    info = ab.read_header(path).inputs[0]
    assert (info.format, info.format_name, info.original_shape, info.groups) == (3, "NC1HWC0", (1, 3, 2, 2), 2)
    assert info.data_type_name == "DT_FLOAT16"
    with pytest.raises(ValueError, match="no Ascend DT_"):
        ab.encode("op", [np.array(["a"])], [], timestamp=0)
    with pytest.raises(ValueError, match="unknown Ascend format"):
        ab.encode("op", [np.ones(2)], [], timestamp=0, formats={("input", 0): "NOPE"})


# ---------------------------------------------------------------- files as the toolchain writes them

def test_toolchain_file_with_buffers_and_workspace(tmp_path):
    dd = pb.DumpData(version="2.0", dump_time=1612434212345678, op_name="trans_Cast_0")
    x = np.arange(24, dtype=np.float16)
    i = dd.input.add(data_type=pb.DT_FLOAT16, format=pb.FORMAT_NC1HWC0, size=x.nbytes, sub_format=0)
    i.shape.dim.extend([1, 1, 1, 1, 24])
    i.original_shape.dim.extend([1, 24, 1, 1])
    o = dd.output.add(data_type=pb.DT_FLOAT, format=pb.FORMAT_ND, size=8)
    o.shape.dim.extend([2])
    o.original_op.name = "Cast"
    dd.buffer.add(buffer_type=pb.L1, size=5)
    dd.space.add(size=3)
    dd.attr.add(name="k", value="v")
    path = toolchain_file(tmp_path / "Cast.trans_Cast_0.2.3.1612434212345678", dd,
                          x.tobytes() + np.array([1.5, -2], np.float32).tobytes() + b"\0" * 8)
    h = ab.read_header(path)
    assert h.op_name == "trans_Cast_0" and h.timestamp == 1612434212345678
    assert h.inputs[0].format_name == "NC1HWC0" and h.inputs[0].original_shape == (1, 24, 1, 1)
    assert h.inputs[0].offset == 8 + h.header_length and h.outputs[0].offset == h.inputs[0].offset + 48
    assert ab.load(path, "input", 0).reshape(-1).tolist() == x.tolist()
    assert h.load("output", 0).tolist() == [1.5, -2.0]
    with pytest.raises(IndexError, match="no output 1"):
        ab.load(path, "output", 1)


def test_unknown_enum_values_are_kept(tmp_path):
    """A newer toolchain's dtype or format: the header reads, the bytes come back as uint8."""
    dd = pb.DumpData(op_name="x")
    o = dd.output.add(data_type=99, format=77, size=3)
    o.shape.dim.extend([3])
    path = toolchain_file(tmp_path / "f", dd, b"abc")
    info = ab.read_header(path).outputs[0]
    assert (info.data_type, info.dtype, info.data_type_name, info.format_name) == (99, None, "DT_99", "77")
    assert ab.load(path, "output", 0).tobytes() == b"abc"


# ---------------------------------------------------------------- malformed files

def _good(tmp_path) -> bytes:
    return b"".join(bytes(b) for b in ab.encode("op", [np.arange(4, dtype=np.float32)], [np.ones(2)], timestamp=1))


@pytest.mark.parametrize("case, reason", [
    ("truncated", "sizes do not add up"),
    ("extra byte", "sizes do not add up"),
    ("header too long", "beyond the file"),
    ("short", "too short"),
    ("empty", "too short"),
    ("garbage", "not a DumpData protobuf|beyond the file|sizes do not add up"),
    ("bad protobuf", "not a DumpData protobuf"),
])
def test_malformed_files_raise_one_error_naming_the_file(tmp_path, case, reason):
    good = _good(tmp_path)
    (h,) = struct.unpack("<Q", good[:8])
    content = {
        "truncated": good[:-1],
        "extra byte": good + b"\0",
        "header too long": struct.pack("<Q", len(good)) + good[8:],
        "short": good[:7],
        "empty": b"",
        "garbage": bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)),
        "bad protobuf": struct.pack("<Q", 3) + b"\xff\xff\xff" + b"\0" * 10,
    }[case]
    path = tmp_path / f"Op.{case.replace(' ', '_')}.1.2.3"
    path.write_bytes(content)
    for call in (lambda: ab.read_header(path), lambda: ab.load(path, "input", 0), lambda: ab.load_all(path)):
        with pytest.raises(ab.BinFormatError, match=reason) as err:
            call()
        assert str(path) in str(err.value) and err.value.path == str(path)
        assert isinstance(err.value, ValueError)


def test_size_not_matching_shape_is_an_error_on_load(tmp_path):
    dd = pb.DumpData(op_name="x")
    i = dd.input.add(data_type=pb.DT_FLOAT, size=8)
    i.shape.dim.extend([3])                                # 3 floats need 12 bytes
    path = toolchain_file(tmp_path / "f", dd, b"\0" * 8)
    assert ab.read_header(path).inputs[0].expected_size == 12
    with pytest.raises(ab.BinFormatError, match=r"input 0: size 8 bytes, but shape \[3\] of DT_FLOAT needs 12"):
        ab.load(path, "input", 0)
    assert ab.load(path, "input", 0, raw=True).size == 8


def test_missing_file_is_the_same_error(tmp_path):
    with pytest.raises(ab.BinFormatError, match="cannot read"):
        ab.read_header(tmp_path / "nope")


def test_generated_code_has_no_runtime_version_pin():
    """dump_data_pb2.py imports with every protobuf since 4.21 (docs/design.md): the
    generated runtime-version check, which would demand the generator's version, is gone."""
    src = open(pb.__file__, encoding="utf-8").read()
    assert "_runtime_version.ValidateProtobufRuntimeVersion(" not in src
    assert pb.DESCRIPTOR.package == "opdump.dumpdata"
    import subprocess
    import sys
    subprocess.run([sys.executable, "-W", "error", "-c", "import opdump.format.dump_data_pb2"], check=True)
