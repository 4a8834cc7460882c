"""The value tie-break's fingerprints from the workers (opdump/analysis/compare/tensor_ahead.py,
``Ahead.tails``): the hash a worker gives for an output file it read whole is
``hash(match._tail(path))`` -- the fingerprint the main process reads otherwise -- for
every output file of the pairs, none for inputs; the column-wise compare then reads no
tail itself, and its results stay those of the per-pair stages (real eager captures whose
equal-signature calls the tie-break re-pairs).
"""
from __future__ import annotations

import multiprocessing

from opdump.analysis.compare import tensor_ahead
from opdump.analysis.compare import tensor_fast
from opdump.analysis.compare.match import _tail
from opdump.analysis.compare.stat_fast import _its, _positions
from opdump.analysis.reader import open_dump

from analysis_fixtures import make_dump
from test_compare_tensor_fast import _both, _capture


def test_worker_tails_are_the_fingerprints(tmp_path):
    ra = open_dump(make_dump(tmp_path / "a", iterations=(0, 1))).records()
    rb = open_dump(make_dump(tmp_path / "b", iterations=(0, 1), weight_delta={"fc1.weight": 1e-3})).records()
    ra, rb = ra[ra["path"].notna()].reset_index(drop=True), rb[rb["path"].notna()].reset_index(drop=True)
    its = [(i, i) for i in sorted(set(_its(ra)))]
    ahead = tensor_ahead.start([(ra, rb)], [tensor_ahead.positions_of(_its(ra), _its(rb), its, _positions)], 2, 1)
    assert ahead is not None
    ahead.layouts(lambda paths, sizes=None: [None] * len(paths))       # waits for the workers
    outputs = set(ra.loc[ra["io"] == "output", "path"]) | set(rb.loc[rb["io"] == "output", "path"])
    assert outputs and set(ahead.tails) == outputs
    for p, h in ahead.tails.items():
        assert h == hash(_tail(p))
    assert ahead.executor is None and not multiprocessing.active_children()


def test_compare_reads_no_tail_itself(monkeypatch, tmp_path):
    plain, swap = _capture(tmp_path / "plain", False), _capture(tmp_path / "swap", True)
    calls = []
    real = tensor_fast._tail_hash

    def spy(path):
        calls.append(path)
        return real(path)
    monkeypatch.setattr(tensor_fast, "_tail_hash", spy)
    _, fast, taken = _both(monkeypatch, tmp_path, swap, plain, workers=2, parallel_min=1)
    assert taken
    muls = fast.table[fast.table["op_type"] == "mul"]
    assert len(muls) and (muls["max_abs_err"] == 0).all()           # re-paired by value, as per pair
    assert calls == []                                               # every fingerprint from the workers
    monkeypatch.setenv("OPDUMP_COMPARE_AHEAD", "0")
    _, _, taken = _both(monkeypatch, tmp_path, swap, plain, workers=2, parallel_min=1)
    assert taken and calls                                           # without the workers: read here
