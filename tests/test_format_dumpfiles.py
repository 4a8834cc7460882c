"""The tests' independent reader (tests/dumpfiles.py) and opdump's reader agree with real
dumps: a dump MindSpore 2.10 wrote (tests/data/mindspore_cpu_mlp) and dumps opdump writes
of modules whose names need sanitising (``enc:0``, spaces, unicode, names over 255
bytes).  Every file maps back to its operator's full name in both readers.
"""
import os

import pytest
import torch
import torch.nn as nn

import dumpfiles
import opdump
from analysis_fixtures import MS_SAMPLE
from opdump.analysis.reader import open_dump
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec

needs_sample = pytest.mark.skipif(not MS_SAMPLE.is_dir(), reason=f"MindSpore sample dump not found at {MS_SAMPLE}")


@needs_sample
def test_independent_reader_parses_every_file_of_a_real_mindspore_dump():
    files = dumpfiles.tensor_files(str(MS_SAMPLE))
    on_disk = [f for _, _, fs in os.walk(MS_SAMPLE) for f in fs if f.endswith(".npy")]
    assert len(files) == len(on_disk) == 180
    order = dumpfiles.execution_order(str(MS_SAMPLE), 0)
    assert len(order) == 18
    op_files = {f.op_name for f in files if f.op_type != "Parameter"}
    # MindSpore's own file names are the sanitised full names of its execution order
    assert op_files == {dumpfiles.sanitize(n) for n in order}
    for f in files[:20]:
        assert f.load().dtype.kind in "fiub"
    # opdump's reader sees the same files with the same fields
    theirs = {(f.op_type, f.op_name, f.iteration, f.io, f.slot, f.ts, f.dtype) for f in files}
    ours = {(t.op_type, t.op_file, t.iteration, t.io, t.slot, t.timestamp, t.dtype)
            for t in open_dump(MS_SAMPLE).tensor_files()}
    assert ours == theirs


LONG = "b" * 220


class Odd(nn.Module):
    """Module names that need sanitising: ``:``, a space, unicode, ``*?``, and a name so long
    that every file name of its operators is over 255 bytes (mapping.csv)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({"enc:0": nn.Linear(4, 4), "dec 1": nn.Linear(4, 4), "ü*?": nn.Linear(4, 4),
                                     LONG: nn.Linear(4, 4)})

    def forward(self, x):
        for block in self.blocks.values():
            x = torch.relu(block(x))
        return x.sum()


def test_every_file_of_modules_with_odd_names_maps_back_in_both_readers(tmp_path):
    torch.manual_seed(0)
    model = Odd()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = DumpConfig(path=str(tmp_path), iteration=IterationSpec(ranges=((0, 0),)))
    with opdump.Session(cfg) as session, EagerCapture(session):
        model(torch.randn(2, 4)).backward()
        opt.step()
    root = str(tmp_path)
    files = dumpfiles.tensor_files(root)
    order = dumpfiles.execution_order(root, 0)
    assert any("enc:0" in n for n in order) and any(LONG in n for n in order)
    long_names = [n for n in order if LONG in n]
    assert any("mapping.csv" in fs for _, _, fs in os.walk(root))
    # independent reader: every operator file is one of the execution order's names, sanitised
    known = {dumpfiles.sanitize(n): n for n in order}
    op_files = [f for f in files if f.op_type != "Parameter"]
    assert op_files and all(f.op_name in known for f in op_files)
    assert {known[f.op_name] for f in op_files} >= set(long_names) | {n for n in order if "enc:0" in n}
    # opdump's reader: every file gets its full name (not the file-name form)
    dump = open_dump(root)
    ours = [t for t in dump.tensor_files() if t.kind == "op"]
    assert len(ours) == len(op_files)
    assert all(t.op in order for t in ours), [t.op for t in ours if t.op not in order][:3]
    enc = [t for t in ours if ":" in t.op]
    assert enc and all("enc:0" in t.op for t in enc)
    assert dump.tensor_files()[0].load().shape is not None      # README: dump.tensor_files()[0].load()
