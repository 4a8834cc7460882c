"""Speed-path guarantees of the tensor compare (issue 25, many small tensors): the ``.npy``
header memo gives numpy's own layout for every header, the collector freeze around the
metric stage leaves the caller's own frozen objects alone, and the compare of generated
tensor dumps (NaN/Inf, bf16 vs fp32, empty, 0-d, repeated shapes) gives the same table
as the per-pair reference path."""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from opdump.analysis.reader import npy as N


# ------------------------------------------------------------------ .npy header memo
_DTYPES = ["<f4", "<f8", "<f2", "<i8", "<i4", "|u1", "|b1", "<c8", ">f4", "<u2"]


@settings(max_examples=150, deadline=None)
@given(shape=st.lists(st.integers(0, 70000), min_size=0, max_size=5), dtype=st.sampled_from(_DTYPES),
       fortran=st.booleans())
def test_header_memo_matches_numpy(tmp_path_factory, shape, dtype, fortran):
    """Every header parses to numpy's own (shape, dtype, fortran), first read and memo hit alike."""
    import io
    hdr = {"descr": dtype, "fortran_order": fortran, "shape": tuple(shape)}
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, hdr)
    raw = buf.getvalue()
    first = N._fast_header(raw + b"\0" * 8)
    again = N._fast_header(raw)               # served by the memo (same header bytes)
    f = io.BytesIO(raw)
    np.lib.format.read_magic(f)
    want_shape, want_fortran, want_dtype = np.lib.format.read_array_header_1_0(f)
    for got in (first, again):
        assert got is not None
        assert got[0] == tuple(want_shape) and type(got[0]) is tuple
        assert got[1] is bool(want_fortran)
        assert got[2] == want_dtype
        assert got[3] == len(raw)


def test_header_memo_keys_on_the_whole_header(tmp_path):
    """Two files whose headers differ only in the shape's last digit get their own layouts
    (the memo is keyed on every header byte), and the file-size check still runs per file."""
    a = np.zeros((3, 7), np.float32)
    b = np.zeros((3, 8), np.float32)
    pa, pb = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(pa, a)
    np.save(pb, b)
    assert N.npy_layout(str(pa))[0] == (3, 7)
    assert N.npy_layout(str(pb))[0] == (3, 8)
    assert N.npy_layout(str(pa))[0] == (3, 7)
    with open(pb, "r+b") as f:                  # truncated: same header bytes, shorter file
        f.truncate(os.path.getsize(pb) - 4)
    with pytest.raises(ValueError, match="truncated"):
        N.npy_layout(str(pb))


# ------------------------------------------------------------------ collector freeze
def test_gc_running_freezes_only_for_its_block():
    from opdump.analysis.compare.gcpause import gc_paused, gc_running
    seen = []
    keep = [object() for _ in range(10)]          # objects that exist before the block

    def body():
        seen.append(gc.get_freeze_count())
        with gc_running():
            seen.append((gc.isenabled(), gc.get_freeze_count() > 0))
        seen.append(gc.get_freeze_count())
    assert gc.get_freeze_count() == 0
    gc_paused(body)()
    assert seen == [0, (True, True), 0] and keep
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_gc_running_leaves_a_callers_freeze_alone():
    from opdump.analysis.compare.gcpause import gc_paused, gc_running
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        assert before > 0
        young = [[] for _ in range(1000)]       # would be frozen too if gc_running froze
        seen = []

        def body():
            with gc_running():
                seen.append(gc.get_freeze_count())
        gc_paused(body)()
        # frozen objects may die meanwhile (the count only falls by itself); a freeze would
        # add the 1,000 young lists, an unfreeze would drop the count to 0
        assert len(young) == 1000 and len(seen) == 1
        assert 0 < seen[0] <= before and 0 < gc.get_freeze_count() <= before
    finally:
        gc.unfreeze()


# ------------------------------------------------------------------ value tie-break fingerprint
@pytest.mark.parametrize("size", [0, 1, 100, (1 << 16) - 1, 1 << 16, (1 << 16) + 1, 300_000])
def test_fingerprint_tail_is_the_last_64k(tmp_path, size):
    """``match._tail`` reads the bytes open/seek/read gave (the last 64 KiB, or all)."""
    from opdump.analysis.compare.match import _FINGERPRINT_BYTES, _tail
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    with open(p, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - _FINGERPRINT_BYTES))
        want = f.read()
    assert _tail(str(p)) == want == data[-_FINGERPRINT_BYTES:] if size else _tail(str(p)) == b""
    with pytest.raises(OSError):
        _tail(str(tmp_path / "missing.bin"))
    with pytest.raises(OSError):
        _tail(str(tmp_path))                    # a folder: an OSError, as open() gave


# ------------------------------------------------------------------ verdict memos
@pytest.mark.parametrize("op_type", ["empty", "empty_like.default", "aten.fill_.Scalar", "zero_", "copy_",
                                     "add", "DropoutGenMask", "bernoulli_", "native_dropout", None, float("nan")])
@pytest.mark.parametrize("io,slot", [("input", 0), ("input", 1), ("output", 0), ("output", 2)])
def test_verdict_memos_answer_as_the_functions(op_type, io, slot):
    from opdump.analysis.common import is_garbage, is_random_op
    from opdump.analysis.compare import verdict as V
    for _ in range(2):                          # first call and memo hit
        assert V._garbage(op_type, io, slot) == is_garbage(op_type, io, slot)
        assert V._is_random(op_type) == is_random_op(op_type)
    for d in ("float32", "Float32", "BFloat16", "bf16", "Float16", "half", "Int64", None, "complex64"):
        assert V._tolerance(d, V.Thresholds()) == V.same_dtype_tolerance(d, V.Thresholds())
        assert V._tolerance(d, V.Thresholds(same_rtol=1e-3)) == V.same_dtype_tolerance(d, V.Thresholds(same_rtol=1e-3))


# ------------------------------------------------------------------ tensor file names
_TOKEN = st.one_of(
    st.sampled_from(["input", "output", "Conv2D", "Default", "DefaultFormat", "Float32", "BFloat16", "Parameter",
                     "0", "1", "12", "-3", "--4", "007", "", "²", "٣", "x-1", "op12", "npy", "\n", "a\nb"]),
    st.text(alphabet="ab-_/0123456789²٣\n", min_size=0, max_size=6),
    st.integers(-20, 10 ** 16).map(str))


_INT = st.one_of(st.integers(-20, 10 ** 16).map(str), _TOKEN)
_IO = st.one_of(st.sampled_from(["input", "output"]), _TOKEN)


@st.composite
def _names(draw):
    """Mostly the full form with each field valid or not, sometimes a free token list."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.lists(_TOKEN, min_size=0, max_size=14))
    toks = [draw(_TOKEN)] + draw(st.lists(_TOKEN, min_size=0, max_size=3))       # op_type, op_name (dots)
    toks += [draw(_INT), draw(_INT), draw(_INT), draw(_IO), draw(_INT), draw(_TOKEN)]
    if draw(st.booleans()):
        toks.append(draw(_TOKEN))                                                 # the dtype field
    return toks


@settings(max_examples=600, deadline=None)
@given(toks=_names(), ext=st.sampled_from([".npy", ".npy", ".npy", ".json", "", ".NPY"]))
def test_name_fields_equal_parse_tensor_name(toks, ext):
    """The scan's regular-expression parse gives parse_tensor_name's fields for any name, or
    raises where it raises (generated names: every token form the format and other tools use,
    dots inside op names, signs, non-ASCII digits, newlines)."""
    from opdump.analysis.reader.names_fast import fields_of, tensor_name_fields
    from opdump.format.files import parse_tensor_name
    name = ".".join(toks) + ext
    try:
        want = fields_of(parse_tensor_name(name))
    except ValueError as e:
        with pytest.raises(type(e)):
            tensor_name_fields(name)
        return
    assert tensor_name_fields(name) == want


@settings(max_examples=200, deadline=None)
@given(op=st.text(alphabet="abc._-/0123456789", min_size=1, max_size=30), task=st.integers(-5, 10 ** 6),
       stream=st.integers(-5, 99), ts=st.integers(0, 10 ** 18), io=st.sampled_from(["input", "output"]),
       slot=st.integers(0, 300), dtype=st.sampled_from(["Float32", "BFloat16", "Int64", "Bool", ""]),
       mapped=st.booleans())
def test_resolved_fields_equal_resolve_mapped(op, task, stream, ts, io, slot, dtype, mapped):
    """Well-formed names (dotted op names included), directly or through mapping.csv."""
    from opdump.analysis.reader.names_fast import fields_of, resolved_fields
    from opdump.format.files import resolve_mapped
    name = f"Add.{op}.{task}.{stream}.{ts}.{io}.{slot}.DefaultFormat.{dtype}.npy"
    mapping = {"123456.npy": name, "777": name} if mapped else {}
    for n in (name, "123456.npy", "777.npy", "9.npy"):
        assert resolved_fields(n, mapping) == fields_of(resolve_mapped(n, mapping))


# ------------------------------------------------------------------ generated tensor dumps, end to end
def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded down to bfloat16's precision (stored as float32, named BFloat16)."""
    return (np.ascontiguousarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def _write_pair_dumps(root) -> tuple:
    """Two bare folders of tensor files (read as graph 0, iteration 0) covering the cases the
    metric paths treat apart: many small pairs (batched), NaN/Inf at the same and at different
    places, bf16 against fp32, empty, 0-d, identical bytes, a pair larger than one metric chunk
    (streamed), integers, and an element-count mismatch."""
    rng = np.random.default_rng(25)
    a_dir, b_dir = root / "a", root / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    cases = []
    for k in range(90):                                         # small pairs: batches in the workers
        x = rng.standard_normal(int(rng.integers(1, 300))).astype(np.float32)
        y = x * np.float32(1 + 1e-6) if k % 3 else x.copy()
        cases.append((x, y, "Float32", "Float32"))
    x = rng.standard_normal(64).astype(np.float32)
    y = x.copy()
    x[3], y[3] = np.nan, np.nan                                 # NaN at the same place
    x[5], y[9] = np.inf, -np.inf                                # Inf at different places
    cases.append((x, y, "Float32", "Float32"))
    x = rng.standard_normal(500).astype(np.float32)
    cases.append((_bf16(x), x, "BFloat16", "Float32"))           # bf16 against fp32
    cases.append((np.zeros((0,), np.float32), np.zeros((0,), np.float32), "Float32", "Float32"))
    cases.append((np.array(2.5, np.float32), np.array(2.5000002, np.float32), "Float32", "Float32"))   # 0-d
    big = rng.standard_normal(200_000).astype(np.float32)       # more than one metric chunk
    cases.append((big, big + np.float32(1e-4), "Float32", "Float32"))
    cases.append((np.arange(40, dtype=np.int64), np.arange(40, dtype=np.int64)[::-1].copy(), "Int64", "Int64"))
    cases.append((np.zeros(8, np.float32), np.ones(8, np.float32), "Float32", "Float32"))
    cases.append((np.zeros(8, np.float32), np.zeros(9, np.float32), "Float32", "Float32"))   # counts differ
    for k, (x, y, da, db) in enumerate(cases):
        for d, arr, dt in ((a_dir, x, da), (b_dir, y, db)):
            np.save(d / f"Add.Default_add-op{k}.0.0.{1000 + k}.output.0.DefaultFormat.{dt}.npy", arr)
    return a_dir, b_dir, len(cases)


def _same(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float) and x != x and y != y:
        return True
    return x == y or (x is None and y != y) or (y is None and x != x)


def test_generated_dumps_pool_and_in_process_agree_with_pair_metrics(tmp_path):
    """The whole compare, in process and through the worker pool (forked inside the collector
    freeze), gives the same table, and every tensor pair's metrics are pair_metrics' of its two
    files to the last digit (the per-pair reference path)."""
    import pandas as pd
    from opdump.analysis.compare import compare
    from opdump.analysis.compare.verdict import verdict_for_metrics
    from opdump.analysis.metrics import pair_metrics
    a_dir, b_dir, n = _write_pair_dumps(tmp_path)
    one = compare(str(a_dir), str(b_dir), workers=1, progress=False).table
    pool = compare(str(a_dir), str(b_dir), workers=2, parallel_min=1, progress=False).table
    pd.testing.assert_frame_equal(one, pool)
    assert len(one) == n + 1 and gc.get_freeze_count() == 0     # the count mismatch: unpaired on each side
    keys = ["cosine", "max_abs_err", "max_rel_err", "mean_abs_err", "rmse", "euclidean", "within_1e-3",
            "within_5e-3", "nonfinite_mismatch"]
    seen = set()
    for row in one.to_dict("records"):
        seen.add(row["verdict"])
        if not isinstance(row["path_a"], str) or not isinstance(row["path_b"], str):
            assert row["verdict"] == "unmatched"          # shapes of different counts: never paired
            continue
        m = pair_metrics(row["path_a"], row["path_b"])
        for k in keys:
            assert _same(row[k], m[k]), (row["op"], k, row[k], m[k])
        assert row["verdict"] == verdict_for_metrics(m)[0], row["op"]
    assert {"pass", "diverged", "unmatched"} <= seen
