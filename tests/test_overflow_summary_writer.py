"""The overflow watch's iteration end off the training thread (README "Debug dumps"):

* the per-iteration ``overflow.json``/``overflow.csv`` are rendered and written in a writer
  job, not on the training thread, and are on disk once the writer has run the jobs queued
  at the iteration's end (the session's ``writer.flush()``, its close);
* the manifest's ``dumped_iterations`` is kept as ranges updated per iteration
  (:class:`opdump.write.iteration_set.IterationSet`), text equal to
  :func:`opdump.write.manifest.iteration_ranges` of the same iterations.
"""
import json
import random
import threading

import torch
import torch.nn as nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.write.iteration_set import IterationSet
from opdump.write.layout import Layout
from opdump.write.manifest import iteration_ranges
from conftest import write_config


def _train(tmp_path, steps, check=None):
    """A tiny model trained ``steps`` steps under the eager overflow watch (one overflow at
    step 1); ``check(session, i)`` runs after step ``i``'s optimizer step."""
    torch.manual_seed(0)
    cfg = write_config(tmp_path, common={"op_debug_mode": 3})
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 3)
    with opdump.Session(cfg) as s, EagerCapture(s):
        for i in range(steps):
            out = model(x)
            if i == 1:
                out = out.half() * 1e5          # fp16 overflow: the origin of step 1
            out.float().sum().backward()
            opt.step()
            opt.zero_grad()
            if check is not None:
                check(s, i)
    return tmp_path / "dump" / "rank_0" / "Net" / "0"


def test_summaries_are_written_by_the_writer_not_the_training_thread(tmp_path, monkeypatch):
    threads = []
    real = Layout.write_small

    def spy(self, path, data):
        if path.endswith(("overflow.json", "overflow.csv")):
            threads.append(threading.current_thread().name)
        return real(self, path, data)
    monkeypatch.setattr(Layout, "write_small", spy)
    folder = _train(tmp_path, 3)
    assert len(threads) >= 6, threads                 # two files per iteration
    assert all(t.startswith("opdump-writer") for t in threads), threads
    assert threading.main_thread().name not in threads
    body = json.loads((folder / "1" / "overflow.json").read_text())
    assert body["iteration"] == 1 and [e["op_type"] for e in body["overflows"]] == ["mul"]
    assert json.loads((folder / "0" / "overflow.json").read_text())["overflows"] == []
    assert (folder / "1" / "overflow.csv").read_text().count("\n") == 2      # header + one output


def test_an_ended_iterations_summary_is_on_disk_after_the_writer_flush(tmp_path):
    seen = {}

    def check(session, i):
        session.writer.flush()              # the jobs queued so far, the ended iteration's summary among them
        path = session.layout.net_dir + f"/0/{i}/overflow.json"
        with open(path, encoding="utf-8") as f:
            seen[i] = json.load(f)["iteration"]
    _train(tmp_path, 3, check)
    assert seen == {0: 0, 1: 1, 2: 2}


def _reference(added):
    return iteration_ranges(set(added))


def test_iteration_set_text_is_iteration_ranges():
    rng = random.Random(0)
    cases = [[], [0], [0, 1, 2, 5], [5, 0, 1, 2], [3, 3, 3], list(range(0, 5000)),
             list(range(0, 3000, 2)),                 # scattered: the 1024-character cut
             list(range(0, 3000, 3))[::-1]]          # added backwards
    for _ in range(200):
        n = rng.randint(0, 60)
        cases.append([rng.randint(0, 80) for _ in range(n)])
    for _ in range(20):                               # long, mostly increasing, some gaps and repeats
        its, i = [], 0
        for _ in range(rng.randint(200, 900)):
            i += rng.choice((0, 1, 1, 1, 2, 7))
            its.append(i if rng.random() > 0.05 else rng.randint(0, i))
        cases.append(its)
    for added in cases:
        s = IterationSet()
        for k, i in enumerate(added):
            s.add(i)
            if k % 97 == 0:       # asked in between too (the text is cached until the set changes)
                assert s.text() == _reference(added[:k + 1])
        assert s.text() == _reference(added), added
        assert len(s) == len(set(added))
        assert all(i in s for i in added) and -1 not in s


def test_manifest_lists_the_dumped_iterations(tmp_path):
    folder = _train(tmp_path, 4)
    manifest = json.loads((folder.parent.parent / ".dump_metadata" / "manifest.json").read_text())
    assert manifest["dumped_iterations"] == "0-3", manifest
