"""``opdump convert``: bin dump files (opdump's and ones built the way the toolchain builds
them) to ``.npy``, as a real subprocess on a folder.  Device-format arrays are built here
element by element from the index formulas (docs/design.md, "Ascend bin files"), not with
opdump's converter."""
from __future__ import annotations

import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from opdump.analysis.convert import convert, output_name
from opdump.format import ascend_bin as ab
from opdump.format import dump_data_pb2 as pb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(7)


def cdiv(a, b):
    return -(-a // b)


# ---------------------------------------------------------------- reference device layouts, by loops

def ref_nc1hwc0(x, c0=16):
    n_, c_, h_, w_ = x.shape
    dev = np.zeros((n_, cdiv(c_, c0), h_, w_, c0), x.dtype)
    for n, c, h, w in np.ndindex(x.shape):
        dev[n, c // c0, h, w, c % c0] = x[n, c, h, w]
    return dev


def ref_ndc1hwc0(x, c0=16):
    n_, c_, d_, h_, w_ = x.shape
    dev = np.zeros((n_, d_, cdiv(c_, c0), h_, w_, c0), x.dtype)
    for n, c, d, h, w in np.ndindex(x.shape):
        dev[n, d, c // c0, h, w, c % c0] = x[n, c, d, h, w]
    return dev


def ref_fractal_z(x, c0=16):
    n_, c_, h_, w_ = x.shape
    c1 = cdiv(c_, c0)
    dev = np.zeros((c1 * h_ * w_, cdiv(n_, 16), 16, c0), x.dtype)
    for n, c, h, w in np.ndindex(x.shape):
        dev[(c // c0) * h_ * w_ + h * w_ + w, n // 16, n % 16, c % c0] = x[n, c, h, w]
    return dev


def ref_fractal_z_3d(x, c0=16):
    n_, c_, d_, h_, w_ = x.shape
    c1 = cdiv(c_, c0)
    dev = np.zeros((d_ * c1 * h_ * w_, cdiv(n_, 16), 16, c0), x.dtype)
    for n, c, d, h, w in np.ndindex(x.shape):
        dev[((d * c1 + c // c0) * h_ + h) * w_ + w, n // 16, n % 16, c % c0] = x[n, c, d, h, w]
    return dev


def ref_fractal_z_groups(x, groups, c0=16):
    """MindSpore's NCHW_TO_FRAC_Z_WITH_GROUPS (D = 1)."""
    n_, cin, h_, w_ = x.shape
    cout = n_ // groups
    lcm = lambda a, b: a * b // math.gcd(a, b)   # noqa: E731
    e = min(lcm(lcm(cin, c0) // cin, lcm(cout, 16) // cout), groups)
    cin_opt, cout_opt = cdiv(e * cin, c0) * c0, cdiv(e * cout, 16) * 16
    c1 = cin_opt // c0
    dev = np.zeros((cdiv(groups, e) * c1 * h_ * w_, cout_opt // 16, 16, c0), x.dtype)
    for g in range(groups):
        for c, h, w, n in np.ndindex(cin, h_, w_, cout):
            ci, co = (g % e) * cin + c, (g % e) * cout + n
            row = (((g // e) * c1 + ci // c0) * h_ + h) * w_ + w
            dev[row, co // 16, co % 16, ci % c0] = x[g * cout + n, c, h, w]
    return dev


def ref_fractal_nz(x, w0=16):
    *lead, h_, w_ = x.shape
    dev = np.zeros((*lead, cdiv(w_, w0), cdiv(h_, 16), 16, w0), x.dtype)
    for idx in np.ndindex(x.shape):
        *b, h, w = idx
        dev[(*b, w // w0, h // 16, h % 16, w % w0)] = x[idx]
    return dev


def ref_c1hwncoc0(x, c0=16):
    n_, c_, h_, w_ = x.shape
    dev = np.zeros((cdiv(c_, c0), h_, w_, n_, c0, c0), x.dtype)
    for n, c, h, w in np.ndindex(x.shape):
        dev[c // c0, h, w, n, c % c0, c % c0] = x[n, c, h, w]
    return dev


def toolchain_file(path, op_name, inputs, outputs):
    """A file built the way the toolchain builds it: DumpData header (data empty), then the
    bytes.  ``inputs``/``outputs``: (dt, format, device array, original shape, sub_format)."""
    dd = pb.DumpData(version="2.0", dump_time=1612434212345678, op_name=op_name)
    data = b""
    for repeated, items in ((dd.input, inputs), (dd.output, outputs)):
        for dt, fmt, arr, orig, sub in items:
            raw = arr.tobytes() if isinstance(arr, np.ndarray) else arr
            t = repeated.add(data_type=dt, format=fmt, size=len(raw), sub_format=sub)
            t.shape.dim.extend(arr.shape if isinstance(arr, np.ndarray) else [len(raw)])
            t.original_shape.dim.extend(orig)
            data += raw
    header = dd.SerializeToString()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)
    return path


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "opdump", "convert", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def npys(folder):
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            out[os.path.relpath(os.path.join(root, f), folder)] = os.path.join(root, f)
    return out


# ---------------------------------------------------------------- a folder through the real CLI

@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    src = tmp_path_factory.mktemp("dump")
    x = RNG.standard_normal((2, 20, 3, 3)).astype(np.float16)
    wt = RNG.standard_normal((18, 5, 2, 2)).astype(np.float16)
    wg = RNG.standard_normal((6, 3, 2, 2)).astype(np.float16)          # groups 2: cout 3, cin 3
    x5 = RNG.standard_normal((1, 17, 2, 2, 3)).astype(np.float32)
    w5 = RNG.standard_normal((17, 3, 2, 1, 2)).astype(np.float16)
    mm = RNG.standard_normal((3, 20, 33)).astype(np.float16)
    c1 = RNG.standard_normal((4, 18, 2, 1)).astype(np.float16)
    bf = torch.randn(4, 5).to(torch.bfloat16)
    i4 = np.array([-8, 7, -1, 0, 3, -5, 1], np.int8)
    d = str(src)
    toolchain_file(os.path.join(d, "sub", "Conv2D.conv1.1.2.100"), "conv1",
                   [(pb.DT_FLOAT16, pb.FORMAT_NC1HWC0, ref_nc1hwc0(x), x.shape, 0),
                    (pb.DT_FLOAT16, pb.FORMAT_FRACTAL_Z, ref_fractal_z(wt), wt.shape, 0),
                    (pb.DT_FLOAT16, pb.FORMAT_FRACTAL_Z, ref_fractal_z_groups(wg, 2), wg.shape, 2)],
                   [(pb.DT_FLOAT16, pb.FORMAT_C1HWNCoC0, ref_c1hwncoc0(c1), c1.shape, 0)])
    toolchain_file(os.path.join(d, "Conv3D.c3.1.2.101"), "c3",
                   [(pb.DT_FLOAT, pb.FORMAT_NDC1HWC0, ref_ndc1hwc0(x5), x5.shape, 0),
                    (pb.DT_FLOAT16, pb.FORMAT_FRACTAL_Z_3D, ref_fractal_z_3d(w5), w5.shape, 0)], [])
    # opdump's own writer path: the codec
    bufs = ab.encode("Default/MatMul-op3", [ab.RawTensor(ref_fractal_nz(mm), "float16", ref_fractal_nz(mm).shape,
                                                         format="FRACTAL_NZ", original_shape=mm.shape)],
                     [ab.RawTensor(bf.view(torch.int16).numpy(), "bfloat16", (4, 5)),
                      ab.RawTensor(ab.pack_int4(i4), "int4", (7,)), np.float32(2.5), np.zeros((0, 3), np.int64)],
                     timestamp=102)
    with open(os.path.join(d, "MatMul.Default_MatMul-op3.0.0.102"), "wb") as f:
        f.write(b"".join(bytes(b) for b in bufs))
    toolchain_file(os.path.join(d, "Lstm.l.1.2.103"), "l",
                   [(pb.DT_FLOAT, pb.FORMAT_FRACTAL_ZN_LSTM, np.arange(6, dtype=np.float32), (2, 3), 0),
                    (pb.DT_FLOAT, 77, np.arange(4, dtype=np.float32), (4,), 0)],
                   [(pb.DT_HIFLOAT8, pb.FORMAT_ND, b"\x01\x02\x03", (3,), 0)])
    for name, text in (("notes.txt", "x"), ("statistic.csv", "a,b\n"), ("README", "not a dump")):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    np.save(os.path.join(d, "x.npy"), x)
    out = str(tmp_path_factory.mktemp("out")) + "/converted"
    proc = run_cli("-d", d, "-out", out, "-f", "NCHW", "-t", "npy")
    refs = dict(x=x, wt=wt, wg=wg, x5=x5, w5=w5, mm=mm, c1=c1, bf=bf.float().numpy(), i4=i4)
    return proc, out, refs


def test_cli_folder_converts_every_file_and_names_outputs(converted):
    proc, out, _ = converted
    assert proc.returncode == 0, proc.stderr
    assert "converted 4 file(s) into 14 .npy file(s)" in proc.stdout
    assert "1 file(s) skipped" in proc.stdout                  # README: not a bin file
    assert sorted(npys(out)) == sorted([
        "Conv3D.c3.1.2.101.input.0.1x17x2x2x3.npy", "Conv3D.c3.1.2.101.input.1.17x3x2x1x2.npy",
        "Lstm.l.1.2.103.input.0.6.npy", "Lstm.l.1.2.103.input.1.4.npy", "Lstm.l.1.2.103.output.0.3.npy",
        "MatMul.Default_MatMul-op3.0.0.102.input.0.3x20x33.npy", "MatMul.Default_MatMul-op3.0.0.102.output.0.4x5.npy",
        "MatMul.Default_MatMul-op3.0.0.102.output.1.7.npy", "MatMul.Default_MatMul-op3.0.0.102.output.2..npy",
        "MatMul.Default_MatMul-op3.0.0.102.output.3.0x3.npy",
        os.path.join("sub", "Conv2D.conv1.1.2.100.input.0.2x20x3x3.npy"),
        os.path.join("sub", "Conv2D.conv1.1.2.100.input.1.18x5x2x2.npy"),
        os.path.join("sub", "Conv2D.conv1.1.2.100.input.2.6x3x2x2.npy"),
        os.path.join("sub", "Conv2D.conv1.1.2.100.output.0.4x18x2x1.npy")])
    assert not [f for f in npys(out) if ".opdump-tmp" in f]


@pytest.mark.parametrize("name, ref", [
    ("sub/Conv2D.conv1.1.2.100.input.0.2x20x3x3.npy", "x"), ("sub/Conv2D.conv1.1.2.100.input.1.18x5x2x2.npy", "wt"),
    ("sub/Conv2D.conv1.1.2.100.input.2.6x3x2x2.npy", "wg"), ("sub/Conv2D.conv1.1.2.100.output.0.4x18x2x1.npy", "c1"),
    ("Conv3D.c3.1.2.101.input.0.1x17x2x2x3.npy", "x5"), ("Conv3D.c3.1.2.101.input.1.17x3x2x1x2.npy", "w5"),
    ("MatMul.Default_MatMul-op3.0.0.102.input.0.3x20x33.npy", "mm"),
])
def test_device_formats_back_to_host_layout(converted, name, ref):
    _, out, refs = converted
    got = np.load(os.path.join(out, name))
    assert got.dtype == refs[ref].dtype
    np.testing.assert_array_equal(got, refs[ref])


def test_bf16_to_float32_int4_to_int8_scalars_and_empty(converted):
    _, out, refs = converted
    stem = os.path.join(out, "MatMul.Default_MatMul-op3.0.0.102.output.")
    bf = np.load(stem + "0.4x5.npy")
    assert bf.dtype == np.float32 and np.array_equal(bf, refs["bf"])
    i4 = np.load(stem + "1.7.npy")
    assert i4.dtype == np.int8 and i4.tolist() == refs["i4"].tolist()
    scalar = np.load(stem + "2..npy")
    assert scalar.shape == () and scalar == np.float32(2.5)
    assert np.load(stem + "3.0x3.npy").shape == (0, 3)


def test_unknown_formats_and_dtypes_saved_as_is_with_one_warning_each(converted):
    proc, out, _ = converted
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 3, proc.stderr
    assert any("Lstm.l.1.2.103 input 0: format FRACTAL_ZN_LSTM is not converted" in w for w in warnings)
    assert any("Lstm.l.1.2.103 input 1: format 77 is not converted" in w for w in warnings)
    assert any("Lstm.l.1.2.103 output 0: dtype DT_HIFLOAT8 has no numpy equivalent" in w for w in warnings)
    assert np.load(os.path.join(out, "Lstm.l.1.2.103.input.0.6.npy")).tolist() == list(range(6))
    raw = np.load(os.path.join(out, "Lstm.l.1.2.103.output.0.3.npy"))
    assert raw.dtype == np.uint8 and raw.tolist() == [1, 2, 3]


# ---------------------------------------------------------------- malformed files, single files

def test_malformed_file_in_folder_is_named_and_nothing_of_it_written(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    good = toolchain_file(str(src / "Add.a.1.2.3"), "a", [(pb.DT_FLOAT, pb.FORMAT_ND, np.ones(3, np.float32), (3,), 0)],
                          [])
    bad = toolchain_file(str(src / "Add.b.1.2.4"), "b", [(pb.DT_FLOAT, pb.FORMAT_ND, np.ones(3, np.float32), (3,), 0),
                                                          (pb.DT_FLOAT, pb.FORMAT_ND, np.ones(3, np.float32), (3,), 0)],
                         [])
    with open(bad, "r+b") as f:
        f.truncate(os.path.getsize(bad) - 1)              # the last tensor is cut short
    liar = src / "Add.c.1.2.5"
    liar.write_bytes(struct.pack("<Q", 10 ** 6) + b"\0" * 20)   # header length beyond the file
    proc = run_cli("-d", str(src), "-out", str(out))
    assert proc.returncode == 2
    assert f"{bad}: not a valid Ascend bin dump file: sizes do not add up" in proc.stderr
    assert f"{liar}: not a valid Ascend bin dump file: header length 1000000 is beyond the file (28 bytes)" \
        in proc.stderr
    assert sorted(npys(out)) == ["Add.a.1.2.3.input.0.3.npy"]   # the good one only, nothing of b or c
    assert os.path.exists(good)


def test_single_file_malformed_writes_nothing(tmp_path):
    path = tmp_path / "garbage"
    path.write_bytes(b"\x00" * 3)
    proc = run_cli("-d", str(path), "-out", str(tmp_path / "o"))
    assert proc.returncode == 2 and f"{path}: not a valid Ascend bin dump file: 3 bytes, too short" in proc.stderr
    assert npys(tmp_path / "o") == {}


def test_missing_path_and_empty_folder_exit_2(tmp_path):
    proc = run_cli("-d", str(tmp_path / "nope"), "-out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "no such file or folder" in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = run_cli("-d", str(tmp_path / "empty"), "-out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "no bin dump file found" in proc.stderr


def test_device_layout_kept_on_request(tmp_path):
    x = np.arange(2 * 3 * 2 * 2, dtype=np.float16).reshape(2, 3, 2, 2)
    path = toolchain_file(str(tmp_path / "d" / "Relu.r.1.2.3"), "r",
                          [(pb.DT_FLOAT16, pb.FORMAT_NC1HWC0, ref_nc1hwc0(x), x.shape, 0)], [])
    report = convert(path, str(tmp_path / "o"), layout="device")
    assert report.errors == [] and report.warnings == []
    got = np.load(os.path.join(tmp_path, "o", "Relu.r.1.2.3.input.0.2x1x2x2x16.npy"))
    np.testing.assert_array_equal(got, ref_nc1hwc0(x))
    report = convert(path, str(tmp_path / "h"))
    np.testing.assert_array_equal(np.load(report.written[0]), x)


def test_empty_original_shape_keeps_device_layout_with_warning(tmp_path):
    dev = ref_nc1hwc0(np.ones((1, 2, 1, 1), np.float16))
    path = toolchain_file(str(tmp_path / "Op.o.1.2.3"), "o", [(pb.DT_FLOAT16, pb.FORMAT_NC1HWC0, dev, (), 0)], [])
    report = convert(path, str(tmp_path / "out"))
    assert len(report.warnings) == 1 and "empty original shape" in report.warnings[0]
    assert report.written[0].endswith(".input.0.1x1x1x1x16.npy")


def test_long_names_are_mapped(tmp_path):
    name = "Op." + "n" * 240 + ".1.2.3"
    path = toolchain_file(str(tmp_path / name), "o", [(pb.DT_FLOAT, pb.FORMAT_ND, np.ones(2, np.float32), (2,), 0)],
                          [])
    report = convert(path, str(tmp_path / "out"))
    mapped = os.path.basename(report.written[0])
    assert len(mapped) < 60 and mapped.endswith(".npy")
    lines = open(tmp_path / "out" / "mapping.csv", encoding="utf-8").read().splitlines()
    assert lines == [f"{mapped},{output_name(name, 'input', 0, (2,))}"]
    assert len(output_name(name, "input", 0, (2,)).encode()) > 255 >= len(name)   # the setup


def test_slot_without_tensor_gets_no_file_and_no_warning(tmp_path):
    """opdump's bin writer marks a None argument as DT_UNDEFINED with no bytes."""
    path = str(tmp_path / "Op.o.1.2.3")
    with open(path, "wb") as f:
        f.write(b"".join(bytes(b) for b in ab.encode("o", [ab.RawTensor(b"", 0, ()), np.ones(2, np.float32)], [],
                                                      timestamp=3)))
    report = convert(path, str(tmp_path / "out"))
    assert report.warnings == [] and report.errors == []
    assert [os.path.basename(p) for p in report.written] == ["Op.o.1.2.3.input.1.2.npy"]


def test_bin_dump_of_a_run_converts_to_the_npy_dump_of_the_same_run(tmp_path):
    """One seeded bfloat16 model dumped twice (eager sessions in one real process), file_format
    bin and npy: every converted tensor equals the .npy dump's, bit for bit (bf16 -> float32
    on both sides), and the None slot of convolution_backward is absent from both."""
    script = tmp_path / "t.py"
    script.write_text("import sys, torch, opdump\nfrom opdump.capture.eager import EagerCapture\n"
                      "for cfg in sys.argv[1:]:\n"
                      "    torch.manual_seed(0)\n"
                      "    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).to(torch.bfloat16)\n"
                      "    x = torch.randn(1, 3, 6, 6, dtype=torch.bfloat16)\n"
                      "    with opdump.Session(cfg) as session, EagerCapture(session):\n"
                      "        m(x).sum().backward()\n")
    trees, cfgs = {}, []
    for fmt in ("bin", "npy"):
        cfg = tmp_path / f"{fmt}.json"
        cfg.write_text('{"common_dump_settings": {"dump_mode": 0, "path": "%s", "net_name": "Net", '
                       '"iteration": "0", "saved_data": "tensor", "input_output": 0, "kernels": [], '
                       '"support_device": [0], "file_format": "%s"}}' % (tmp_path / fmt, fmt))
        cfgs.append(str(cfg))
    subprocess.run([sys.executable, str(script), *cfgs], check=True, cwd=ROOT, timeout=300)   # both runs, one process
    proc = run_cli("-d", str(tmp_path / "bin"), "-out", str(tmp_path / "conv"))
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    for root in ("conv", "npy"):
        trees[root] = {}
        for rel, path in npys(tmp_path / root).items():
            if rel.endswith(".npy"):
                t = os.path.basename(rel).split(".")           # op_type, op_name, task, stream, ts, io, slot
                trees[root][(t[0], t[1], t[5], t[6])] = np.load(path)
    assert len(trees["conv"]) >= 20 and trees["conv"].keys() == trees["npy"].keys()
    for key, a in trees["conv"].items():
        b = trees["npy"][key]
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape and np.array_equal(a, b), key


def test_convert_does_not_import_torch(tmp_path):
    """Like the analysis commands, `opdump convert` starts without torch (seconds saved)."""
    path = toolchain_file(str(tmp_path / "Add.a.1.2.3"), "a",
                          [(pb.DT_BF16, pb.FORMAT_ND, np.zeros(2, np.uint16), (2,), 0)], [])
    code = ("import sys\nfrom opdump.cli.main import main\n"
            f"rc = main(['convert', '-d', {path!r}, '-out', {str(tmp_path / 'o')!r}])\n"
            "print('RESULT', rc, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert "RESULT 0 False" in out.stdout, out.stdout + out.stderr
