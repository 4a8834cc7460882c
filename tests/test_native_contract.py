"""The layouts and codes Python shares with the C++ module are exported by the module and checked
at load (opdump/stats/contract.py against contract.h): a mismatch is one warning and the exact
Python path, never a misread tuple."""
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from opdump.stats import contract, native
from opdump.stats.device import DeviceStatsBatch

pytestmark = pytest.mark.skipif(native.module() is None,
                                reason="the native module could not be built here (a warning says why)")

CATS = ["max", "min", "avg", "l2norm", "count"]


def test_the_module_exports_the_contract_this_python_has():
    mod = native.module()
    assert native.contract_problem(mod) is None
    for attr, want in contract.EXPORTED.items():
        got = getattr(mod, attr)
        assert (tuple(got) if isinstance(got, (list, tuple)) else got) == want, attr


def test_a_module_that_differs_is_named_by_field():
    class Stale:
        pass
    stale = Stale()
    for attr, value in contract.EXPORTED.items():
        setattr(stale, attr, value)
    stale.ROW_FIELDS = contract.ROW_FIELDS[:-1]
    problem = native.contract_problem(stale)
    assert problem is not None and "ROW_FIELDS" in problem


def test_native_rows_have_the_contract_layout():
    from opdump.stats.device import RowRecorder
    batch = DeviceStatsBatch(CATS)
    sink = batch.row_sink()
    assert isinstance(sink, RowRecorder)
    rows = []
    x = torch.randn(3, 4)
    assert sink.record(rows, "MatMul", "Default/mm-op0", "input", 1000, [x, None, x.t()]) == 2
    named = [dict(zip(contract.ROW_FIELDS, r)) for r in rows]
    assert all(len(r) == len(contract.ROW_FIELDS) for r in rows)
    assert named[0] == {"op_type": "MatMul", "op_name": "Default/mm-op0", "stream": 0, "timestamp": 1000,
                        "io": "input", "slot": 0, "nbytes": 48, "dtype": torch.float32, "shape": "(3,4)",
                        "device_handle": 0, "host_future": None}
    assert named[1]["slot"] == 2 and named[1]["timestamp"] == 1002 and named[1]["device_handle"] == 0
    assert len(batch) == 1                      # x.t() reads x's memory: one entry, appended by Python
    entry = batch.gather().entries()[0]
    assert len(entry) == len(contract.FUSED_FIELDS) and entry[contract.F_NUMEL] == 12


def test_a_contract_mismatch_at_load_falls_back_to_python_with_one_warning():
    """Run in a real process where this Python's contract differs from the built module's."""
    script = textwrap.dedent("""
        import warnings
        warnings.simplefilter("always")
        import torch
        from opdump.stats import contract, native
        from opdump.stats.device import DeviceStatsBatch
        contract.EXPORTED["ROW_FIELDS"] = contract.ROW_FIELDS[::-1]
        batch = DeviceStatsBatch(["max", "min", "avg", "l2norm", "count"])
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        batch.add(x)
        print(native.module() is None, batch.row_sink() is None, batch.collect())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    want = [[11.0, 0.0, 5.5, math.sqrt(sum(i * i for i in range(12))), 12]]
    assert proc.stdout.strip() == f"True True {want}"
    assert proc.stderr.count("opdump: the native module") == 1
    assert "ROW_FIELDS" in proc.stderr


def test_the_recorders_python_rows_have_the_same_layout(tmp_path):
    """The Python twin of the row sink (Recorder.record_all's loop) builds the same named fields."""
    import opdump
    from opdump.capture.op_info import OpInfo
    from conftest import write_config
    cfg = write_config(tmp_path, common={"iteration": "0", "saved_data": "statistic", "statistic_category": CATS},
                       e2e={"stat_calc_mode": "device"})
    with opdump.Session(cfg) as session:
        rec = session.recorder
        rec._sink = None                                    # the Python path
        folder = session.iteration_dir(0)
        op = OpInfo(0, "MatMul", "Default", "default", (), ())
        x = torch.randn(3, 4)
        rec.record_all(folder, op, "input", [x, None, x.t()])
        rows = rec._pending.pop(folder)
    named = [dict(zip(contract.ROW_FIELDS, r)) for r in rows]
    assert all(len(r) == len(contract.ROW_FIELDS) for r in rows)
    assert [(n["op_type"], n["op_name"], n["io"], n["slot"], n["nbytes"], n["dtype"], n["shape"], n["host_future"])
            for n in named] == [("MatMul", op.full_name, "input", 0, 48, torch.float32, "(3,4)", None),
                                ("MatMul", op.full_name, "input", 2, 48, torch.float32, "(4,3)", None)]
    assert named[1]["timestamp"] - named[0]["timestamp"] == 2 and named[0]["device_handle"] == named[1]["device_handle"]
