"""Graph mode on a model where a CPU kernel's real strides differ from its meta: the dumped
iteration must train like an undumped one (opdump.capture.graph.strides)."""
import copy
import csv
import glob

import numpy as np
import torch
import torch.nn as nn

import opdump
from opdump.capture.graph import strides
from conftest import write_config


def test_view_or_reshape_views_when_it_can_and_copies_when_it_must():
    x = torch.arange(24.0).reshape(4, 6)
    v = strides.view_or_reshape(x, [6, 4])
    assert v.data_ptr() == x.data_ptr()                      # a real view
    before = strides.fallbacks
    t = x.t()
    r = strides.view_or_reshape(t, [24])                     # not viewable: reshape, same values
    assert strides.fallbacks == before + 1
    assert torch.equal(r, t.reshape(24))
    try:
        strides.view_or_reshape(x, [5, 5])
    except RuntimeError as exc:
        assert "invalid" in str(exc) or "shape" in str(exc)
    else:
        raise AssertionError("a wrong size must still fail")


class Decoder(nn.Module):
    """Two pre-norm decoder layers with a causal mask: on torch 2.13 CPU the backward's
    native_layer_norm_backward returns a transposed gradient that its meta calls
    contiguous, and a later aten.view of it fails under backend="aot_eager"."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.blocks = nn.ModuleList(nn.TransformerDecoderLayer(d, heads, 2 * d, batch_first=True, norm_first=True)
                                    for _ in range(2))
        self.out = nn.Linear(d, 5)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        for block in self.blocks:
            x = block(x, x, tgt_mask=mask, tgt_is_causal=True)
        return self.out(x)


def test_dumped_iteration_of_a_decoder_trains(tmp_path):
    torch.manual_seed(0)
    model = Decoder()
    reference = copy.deepcopy(model)
    x = torch.randn(2, 6, 16)
    before = strides.fallbacks
    cfg = write_config(tmp_path, common={"saved_data": "statistic", "net_name": "Decoder"})
    with opdump.Session(cfg) as session:
        compiled = torch.compile(model, backend=session.backend())
        torch.manual_seed(1)                # the dropout masks: the same random stream as below
        compiled(x).sum().backward()
    assert strides.fallbacks > before, "the decoder no longer exercises a stride mismatch on this torch"
    torch.manual_seed(1)
    reference(x).sum().backward()           # plain eager, undumped
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    rows = []
    for path in glob.glob(str(tmp_path / "dump" / "rank_0" / "Decoder" / "*" / "0" / "statistic.csv")):
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))
    views = [r for r in rows if r["Op Type"] == "view" and r["Op Name"].startswith("Gradients/")]
    assert views, "backward view operators are dumped"
    assert all(np.isfinite(float(r["Max Value"])) for r in views)
