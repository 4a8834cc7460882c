"""Statistics carried from one graph call to the next of the same iteration (``StatsMemo.carry`` /
``enter``, called by the native graph taps: ``GraphTaps.close``/``open`` in row_sink.cpp): a
backward reads the tensors its forward saved without reading them again, and the values are the
ones a new read gives — each guard (same version, still alive, same iteration, entered, not
forgotten) has a test that fails without it; and the integer kernel's exact fast path gives the
float64 loop's values bit for bit, falling back where the bound does not hold."""
import csv
import gc
import glob
import os
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import opdump
from opdump.stats import native
from conftest import write_config

mod = native.module()
pytestmark = pytest.mark.skipif(mod is None or not hasattr(mod.StatsMemo, "carry"),
                                reason="the native module is not built here (OPDUMP_CPU_KERNEL=0 or no compiler)")


def _carried_memo(x, tag=3):
    """A memo that read ``x`` as entry 0 of a batch, carried it for iteration ``tag`` and was cleared."""
    m = native.new_stats_memo()
    value = m.stats(x, 0)
    assert isinstance(value, tuple)
    assert m.carry([value], tag) == 1
    m.clear()
    return m, value


def test_a_carried_value_is_given_back_as_a_new_entry_without_a_read():
    x = torch.randn(300, 40)
    m, value = _carried_memo(x)
    m.enter(3)
    assert m.stats(x, 5) == value and m.reads == 1          # no second read
    assert m.stats(x.t(), 6) == 5                            # and now an entry of this batch


def test_a_written_tensor_is_read_again():
    x = torch.randn(300, 40)
    m, value = _carried_memo(x)
    x.mul_(2)
    m.enter(3)
    again = m.stats(x, 0)
    assert again[0] == 2 * value[0] and m.reads == 2


def test_a_dead_tensor_is_not_matched():
    m, _ = _carried_memo(torch.ones(1000) * 3)
    gc.collect()
    y = torch.ones(1000) * 5                                 # often at the same address
    m.enter(3)
    assert m.stats(y, 0) == (5.0, 5.0, 5000.0, 25000.0, 1000)


def test_values_are_used_only_after_enter_of_the_same_iteration():
    x = torch.randn(500)
    m, _ = _carried_memo(x)
    assert isinstance(m.stats(x, 0), tuple) and m.reads == 2    # not entered (between carry and enter)
    m.clear()
    m.enter(4)                                                    # another iteration: dropped
    assert m.carried == 0
    assert isinstance(m.stats(x, 0), tuple) and m.reads == 3


def test_a_forgotten_tensor_is_read_again():
    x = torch.randn(500)
    m, _ = _carried_memo(x)
    m.forget(x)
    m.enter(3)
    assert isinstance(m.stats(x, 0), tuple) and m.reads == 2


class Lin(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


def _dump(tmp_path, native_taps: bool):
    """statistic.csv rows (timestamps apart) of each iteration's files, and the memo's reads; the
    input is written through ``.data`` between iterations (no version counter moves)."""
    tmp_path.mkdir()
    os.environ["OPDUMP_GRAPH_NATIVE_TAPS"] = "1" if native_taps else "0"
    try:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = Lin()
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        cfg = write_config(tmp_path, common={"saved_data": "statistic"}, e2e={"stat_calc_mode": "device"})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with opdump.Session(cfg) as session:
                compiled = torch.compile(model, backend=session.backend("eager"))
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for _ in range(3):
                    nn.functional.cross_entropy(compiled(x), y).backward()
                    opt.step()
                    opt.zero_grad()
                    x.data.mul_(2)                     # the same tensor, other values, same version
                reads = session.recorder.stats._batch._memo.reads
    finally:
        os.environ.pop("OPDUMP_GRAPH_NATIVE_TAPS", None)
        torch._dynamo.reset()
    rows = {}
    for path in sorted(glob.glob(str(tmp_path / "dump" / "**" / "statistic.csv"), recursive=True)):
        with open(path, newline="") as f:
            rows[os.path.relpath(path, tmp_path)] = [r[:4] + r[5:] for r in csv.reader(f)]
    return rows, reads


def test_a_backward_reuses_its_forwards_reads_and_nothing_crosses_an_iteration(tmp_path):
    python_rows, python_reads = _dump(tmp_path / "python", False)
    native_rows, native_reads = _dump(tmp_path / "native", True)
    assert len(python_rows) == 6 and native_rows == python_rows   # 3 iterations x (forward, backward)
    assert native_reads < python_reads                             # the backward's saved tensors
    inputs = [r for rows in python_rows.values() for r in rows[1:] if "addmm" in r[1] and r[4] == "input"
              and r[5] == "1"]
    assert len({r[-3] for r in inputs}) == 3                       # x's max doubled every iteration


# ---------------------------------------------------------------------- integer kernel
def _lane_sums(values: np.ndarray):
    """reduce_int_all's float64 sums: 16 lanes over each 65536-element chunk, the chunk's tail,
    the chunks in order (cpu_kernel.cpp; the host mode's order, opdump/stats/host.py)."""
    total, total_sq = 0.0, 0.0
    for start in range(0, len(values), 1 << 16):
        chunk = values[start:start + (1 << 16)].astype(np.float64)
        full = len(chunk) - len(chunk) % 16
        lanes = np.zeros(16)
        lanes_sq = np.zeros(16)
        for i in range(0, full, 16):
            lanes += chunk[i:i + 16]
            lanes_sq += chunk[i:i + 16] * chunk[i:i + 16]
        s, q = 0.0, 0.0
        for j in range(16):
            s += lanes[j]
            q += lanes_sq[j]
        for v in chunk[full:]:
            s += v
            q += v * v
        total += s
        total_sq += q
    return total, total_sq


@pytest.mark.parametrize("dtype,low,high", [(torch.int64, 0, 3025), (torch.int64, -3000, 3000),
                                            (torch.int32, -10 ** 4, 10 ** 4), (torch.uint8, 0, 255),
                                            (torch.bool, 0, 1), (torch.int16, -300, 300)])
def test_integer_sums_from_integer_lanes_are_the_float64_loops(dtype, low, high):
    torch.manual_seed(0)
    t = torch.randint(low, high + 1, (70001,)).to(dtype)
    mx, mn, s, q = mod.fused_stats(t)
    values = t.numpy().astype(np.int64)
    assert (mx, mn) == (int(values.max()), int(values.min()))
    assert (s, q) == _lane_sums(values)


def test_integer_sums_past_the_exact_bound_take_the_float64_loop():
    # n * max**2 > 2**53: integer lanes would give the exact sum of squares, rounded once; the
    # float64 loop rounds at each step — the kernel must give the loop's value
    torch.manual_seed(1)
    t = torch.randint(2 ** 30, 2 ** 31, (20000,), dtype=torch.int64)
    values = t.numpy()
    exact_sq = float(sum(int(v) * int(v) for v in values))
    s, q = _lane_sums(values)
    assert q != exact_sq                              # the case is exercised
    assert mod.fused_stats(t)[2:] == (s, q)
