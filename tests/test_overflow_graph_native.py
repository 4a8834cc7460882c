"""The graph-mode overflow watch's native tap (``opdump/debug/graph_watch.cpp``; README "Debug
dumps"): a compiled model with a planted fp16 overflow (forward and backward), an operator that
only carries a NaN along, an attention ``-inf`` mask made by ``full(-inf)`` (on purpose, not
reported) and an on-purpose ``-inf`` passed through a view and an expand into a softmax whose
row is all ``-inf`` (its NaN is an origin: the on-purpose Inf must still be known as such after
the finite-preserving operators the native tap does not read) gives the same overflow.json,
overflow.csv and dumped tensors with the native tap as with the Python taps
(``OPDUMP_GRAPH_NATIVE_WATCH=0``), and the native tap took the finite operators itself."""
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.debug import overflow_graph
from opdump.stats import native
from dumpfiles import tensor_files
from conftest import write_config

#: the tests of the native tap itself (without the module both runs use the Python taps)
needs_native = pytest.mark.skipif(getattr(native.module(), "GraphWatchTaps", None) is None,
                                  reason="the native module (with graph_watch.cpp) is not built on this machine")

BAD_STEP = 1
STEPS = 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(()))
        self.register_buffer("carrier", torch.zeros(4))

    def forward(self, x):
        h = self.fc(x).half() * 100.0
        h = h * self.scale.half()                        # the origin at BAD_STEP (fp16 overflow)
        h = (h + 1).float() * 2                          # only carries the Inf along
        c = (x + self.carrier).relu()                    # carries the buffer's NaN along (BAD_STEP)
        n = x.shape[0]
        mask = torch.full((n, n), float("-inf")).triu(1)     # on purpose: not reported
        attn = (x @ x.t() + mask).softmax(-1)
        row = torch.full((n,), float("-inf")).view(1, n).expand(n, n)     # on purpose, through views
        dead = (x @ x.t() * 0.5 + row).softmax(-1)       # all -inf rows: NaN, an origin every step
        return h.sum() + attn.sum() + c.sum() + torch.nansum(dead)


def _run(root, env: str):
    """Train Net compiled with opdump's backend under the watch, ``OPDUMP_GRAPH_NATIVE_WATCH``
    set to ``env``; the dump path and the native taps' counts (None: Python taps)."""
    cfg = write_config(root, common={"op_debug_mode": 3})
    old = os.environ.get(overflow_graph.ENV_SWITCH)
    os.environ[overflow_graph.ENV_SWITCH] = env
    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        model = Net()
        x = torch.randn(4, 4) + 2.0
        with opdump.Session(cfg) as session:
            compiled = torch.compile(model, backend=session.backend())
            for step in range(STEPS):
                model.scale.fill_(1e4 if step == BAD_STEP else 1.0)
                model.carrier.fill_(float("nan") if step == BAD_STEP else 0.0)
                compiled(x).backward()
                session.step()
            counts = overflow_graph.native_counts(session)
    finally:
        torch._dynamo.reset()
        if old is None:
            os.environ.pop(overflow_graph.ENV_SWITCH, None)
        else:
            os.environ[overflow_graph.ENV_SWITCH] = old
    return str(root / "dump"), counts


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {env: _run(tmp_path_factory.mktemp(f"native{env}"), env) for env in ("1", "0")}


def _summaries(root):
    """{(graph, iteration): (overflow.json text, overflow.csv text)} of the dump under ``root``."""
    out = {}
    for dirpath, _, names in os.walk(root):
        if "overflow.json" in names:
            parts = dirpath.split(os.sep)
            with open(os.path.join(dirpath, "overflow.json")) as fj, open(os.path.join(dirpath, "overflow.csv")) as fc:
                out[(parts[-2], parts[-1])] = (fj.read(), fc.read())
    return out


def test_same_summaries_both_ways(runs):
    (native_root, _), (python_root, _) = runs["1"], runs["0"]
    got, want = _summaries(native_root), _summaries(python_root)
    assert set(got) == {(str(g), str(i)) for g in (0, 1) for i in range(STEPS)}
    assert got == want
    import json
    fwd = json.loads(got[("0", str(BAD_STEP))][0])["overflows"]
    # the fp16 mul and the dead rows' softmax; not the carriers, not the masks
    assert sorted(e["op_type"] for e in fwd) == ["_softmax", "mul"], fwd
    quiet = json.loads(got[("0", "0")][0])["overflows"]
    assert [e["op_type"] for e in quiet] == ["_softmax"], quiet


def test_same_tensor_files_both_ways(runs):
    (native_root, _), (python_root, _) = runs["1"], runs["0"]

    def files(root):
        return {(f.graph, f.iteration, f.op_type, f.op_name, f.io, f.slot): f for f in tensor_files(root)}

    got, want = files(native_root), files(python_root)
    assert got.keys() == want.keys() and got
    for key, f in got.items():
        a, b = f.load(), want[key].load()
        assert a.dtype == b.dtype and a.shape == b.shape, key
        np.testing.assert_array_equal(a, b, err_msg=str(key))


@needs_native
def test_native_tap_takes_the_finite_operators(runs):
    (_, counts), (_, python_counts) = runs["1"], runs["0"]
    assert python_counts == (0, 0, 0), "OPDUMP_GRAPH_NATIVE_WATCH=0: the Python taps"
    read, handed, spared = counts
    assert read > 0 and spared > 0
    # handed: the operators with a non-finite output (and those of the on-purpose chains), the
    # in-place and uninitialized ones -- fewer than those the native tap finished itself
    assert 0 < handed < read + spared, counts


class _PythonTap:
    def __init__(self):
        self.calls = []

    def after(self, index, inputs, value):
        self.calls.append(index)


def _tap(kinds):
    """A native tap over ``kinds`` (graph_watch.cpp's bits) handing to a recording Python tap."""
    import weakref
    mod = native.module()
    shared = mod.GraphWatch()
    python = _PythonTap()
    taps = mod.GraphWatchTaps(shared, kinds, weakref.WeakMethod(python.after))
    taps.open(True)
    return taps.fast(), shared, python, taps


@needs_native
def test_tap_reads_skips_and_hands_over_as_the_python_watch_would():
    P, A, N, Y = overflow_graph._PRESERVING, overflow_graph._ALWAYS, 0, overflow_graph._PYTHON
    after, shared, python, keep = _tap([N, P, A, Y])
    x = torch.randn(3, 3)
    y = x * 2
    after(0, [x], y)                                  # read, finite: no Python
    after(1, [x], x.t())                              # preserving, input never read: not read either
    after(1, [y], y.t())                              # preserving, input known finite: not read
    after(2, [], torch.zeros(3))                      # always finite: not read
    after(1, [], torch.ones(3).t())                   # preserving without floating input: read
    assert python.calls == [] and shared.counts() == (2, 0, 3)
    after(3, [y], y)                                  # in-place / uninitialized kinds: Python's
    inf = torch.full((3,), float("-inf"))
    after(0, [], inf)                                 # a non-finite output: Python's...
    after(1, [inf], inf.view(1, 3))                   # ...and a preserving operator of it
    after(0, [x], x.expand(2, 3, 3).transpose(0, 1)[0])   # not dense: Python reads it
    after(0, [x], (x.long(), y * 3))                  # integer outputs are not judged
    assert python.calls == [3, 0, 1, 0] and shared.counts()[1] == 4
    keep.close()
    after(0, [], inf)                                 # closed: nothing, as without a folder
    assert python.calls == [3, 0, 1, 0]
    keep.open(True)
    read = shared.counts()[0]
    after(0, [x], y)                                  # y known finite: not read again
    assert shared.counts()[0] == read
    shared.clear()                                    # a new iteration: read again
    after(0, [x], y)
    assert shared.counts()[0] == read + 1 and python.calls == [3, 0, 1, 0]
