"""compare across front ends (README, "Analysis" > compare; issue 17 item 3): the
tie-break of equal-signature calls by value identity, twins (an in-place operator and its
functional form, functionalization's batch norm) paired as one computation, operators only
one front end runs reported as front-end rather than unmatched, and graph mode's
gradient-sum ``add`` scoped as eager scopes it.

Every dump is a real capture of a tiny model (eager, and one torch.compile run)."""
import pytest
import torch
import torch.nn as nn

import opdump
from opdump.analysis.compare import compare
from opdump.capture.eager import EagerCapture
from opdump.config import DumpConfig, IterationSpec


class Twice(nn.Module):
    """Two equal-signature ``mul`` calls in one scope, run in either order; ``inplace``
    adds 1 in place or not; ``extra`` computes one more ``exp`` and adds a zeros to it."""

    def __init__(self, swap=False, inplace=False, extra=False):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.swap, self.inplace, self.extra = swap, inplace, extra

    def forward(self, x):
        h = self.fc(x)
        if self.swap:
            b = h * 3.0
            a = h * 2.0
        else:
            a = h * 2.0
            b = h * 3.0
        c = a - b
        c = c.add_(1.0) if self.inplace else c.add(1.0)
        if self.extra:
            c = c.exp() + torch.zeros_like(c)
        return c.sum()


class BnNet(nn.Module):
    """BatchNorm (functionalized under compile), a dropout with p=0 (a clone in AOT's
    graph) and a tensor used twice (a gradient sum in the backward)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.0)
        self.head = nn.Linear(6, 6)

    def forward(self, x):
        h = self.drop(self.bn(self.fc(x)))
        return (h + self.head(h)).pow(2).mean()


def _loss(logits, y):
    """A loss outside any module, with a graph break (as transformers' loss_function has)."""
    torch._dynamo.graph_break()
    return ((logits - y) ** 2).mean()


class BreakNet(nn.Module):
    """Its loss function is compiled as a frame of its own after a graph break."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return _loss(self.fc(x), x[:, :3])


class TwoOut(nn.Module):
    """Returns the loss and the logits (the loss alone is backpropagated: AOTAutograd adds
    the logits' zero tangent to their gradient); holds a buffer the forward never reads."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("unused", torch.ones(2))

    def forward(self, x):
        logits = self.fc(x)
        return ((logits - x[:, :3]) ** 2).mean(), logits


def _run(root, model, compiled=False):
    torch.manual_seed(0)
    cfg = DumpConfig(path=str(root), iteration=IterationSpec(ranges=((0, 0),)))
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    with opdump.Session(cfg) as s, EagerCapture(s):
        m = torch.compile(model, backend=s.backend("inductor"), dynamic=False) if compiled else model
        out = m(x)
        (out[0] if isinstance(out, tuple) else out).backward()
    torch._dynamo.reset()
    return root


def _twice(root, **kw):
    torch.manual_seed(0)
    return _run(root, Twice(**kw))


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("equiv")
    out = {k: _twice(root / k, **kw) for k, kw in {
        "plain": {}, "swap": {"swap": True}, "inplace": {"inplace": True}, "extra": {"extra": True}}.items()}
    torch.manual_seed(0)
    out["bn_eager"] = _run(root / "bn_eager", BnNet())
    torch.manual_seed(0)
    out["bn_graph"] = _run(root / "bn_graph", BnNet(), compiled=True)
    for name, cls in (("break", BreakNet), ("two", TwoOut)):
        for mode in ("eager", "graph"):
            torch.manual_seed(0)
            out[f"{name}_{mode}"] = _run(root / f"{name}_{mode}", cls(), compiled=mode == "graph")
    return out


def test_equal_signature_calls_in_another_order_pair_by_value(dumps):
    """``h*2`` and ``h*3`` run in the other order: same scope, type and signature; order
    alone pairs ``h*2`` with ``h*3`` (diverged). Value identity pairs each with its own."""
    r = compare(dumps["swap"], dumps["plain"], progress=False, workers=1)
    t = r.table
    muls = t[t["op_type"] == "mul"]          # two forward, two backward calls, inputs and outputs
    assert len(muls) == 8 and set(muls["verdict"]) == {"pass"} and (muls["max_abs_err"] == 0).all(), \
        muls[["op", "op_b", "io", "max_abs_err"]]
    assert not r.unmatched_a and not r.unmatched_b
    # what does differ is real: autograd sums h's two gradients in the other order (the
    # sum's inputs swap places, its output is the same)
    diverged = t[t["verdict"] == "diverged"]
    assert set(diverged["op_type"]) <= {"add"} and set(diverged["io"]) <= {"input"}, diverged


def test_a_real_difference_still_shows_through_the_tie_break(dumps):
    """Values only break ties: a mul whose value has no counterpart is still compared
    against the call its order gives it, and reported."""
    torch.manual_seed(0)
    model = Twice()
    with torch.no_grad():
        model.fc.weight.mul_(1.5)
    root = _run(dumps["plain"].parent / "scaled", model)
    r = compare(root, dumps["plain"], progress=False, workers=1)
    assert r.first_difference is not None and r.diverged


def test_inplace_and_functional_twins_pair(dumps):
    """``add_`` (eager, in place) and ``add`` are one computation: paired, bit-equal."""
    r = compare(dumps["inplace"], dumps["plain"], progress=False, workers=1)
    t = r.table
    adds = t[t["op_type"].isin(["add_", "add"]) & t["op"].notna() & t["op_b"].notna()]
    assert len(adds) and not r.unmatched_a and not r.unmatched_b, r.summary()
    assert set(t["verdict"]) == {"pass"}, r.summary()


def test_computing_operator_stays_unmatched_allocation_is_front_end(dumps):
    """An extra ``exp`` computes something: unmatched (with its backward ``mul``). The
    ``zeros_like`` only allocates and adding it changes no bit: front-end, listed apart."""
    r = compare(dumps["extra"], dumps["plain"], progress=False, workers=1)
    types = lambda ops: sorted(o.rsplit("/", 1)[1].split("-")[0] for o in ops)   # noqa: E731
    assert types(r.unmatched_a) == ["exp", "mul"], r.unmatched_a
    # (no detach: autograd saving exp's result is no operator, tests/test_eager_observed_ops.py)
    assert set(types(r.front_end_a)) == {"add", "zeros_like"}, r.front_end_a
    assert "front-end operators" in r.summary()
    assert r.to_dict()["front_end_a"] == r.front_end_a


def test_eager_vs_graph_batch_norm_every_operator_matched(dumps):
    """Eager ``native_batch_norm`` + ``add_`` against the graph's functionalized
    ``_native_batch_norm_legit_functional`` + ``add`` (+ ``copy_`` write-backs), the
    dropout's ``clone`` and the graph inputs: everything either side computes is paired and
    bit-equal; what is left is front-end only. The backward gradient sum of ``h`` carries
    the same scope in both dumps (graph mode: its input computed last)."""
    r = compare(dumps["bn_eager"], dumps["bn_graph"], progress=False, workers=1)
    t = r.table
    assert not r.unmatched_a and not r.unmatched_b, r.summary() + f"\n{r.unmatched_a}\n{r.unmatched_b}"
    assert "diverged" not in r.counts and r.first_difference is None, r.summary()
    compared = t[~t["verdict"].isin(["skipped", "unmatched"])]
    assert (compared["max_abs_err"].fillna(0) == 0).all()
    bn = t[t["op_type"] == "native_batch_norm"]
    assert len(bn) and bn["op_b"].str.contains("_native_batch_norm_legit_functional").all()
    kinds = {o.rsplit("/", 1)[-1].split("-")[0].split(".")[0] for o in r.front_end_b}
    assert kinds <= {"copy_", "clone", "Parameter", "detach", "empty", "_native_batch_norm_legit_functional"}, \
        r.front_end_b
    extra = t[(t["match"] == "front-end") & (t["op_type"] == "_native_batch_norm_legit_functional")]
    assert set(extra["io"]) == {"output"} and set(extra["slot"]) == {3, 4}    # the new running statistics
    sums = t[t["op"].fillna("").str.startswith("Gradients/") & (t["op_type"] == "add")]
    assert len(sums) and (sums["op"].str.rsplit("/", n=1).str[0] == sums["op_b"].str.rsplit("/", n=1).str[0]).all()


def test_function_compiled_after_a_graph_break_keeps_the_module_scope(dumps):
    """``_loss`` runs inside ``BreakNet.forward``: eager scopes its operators
    ``Default/BreakNet/``; graph mode compiles it as a frame of its own (no module ``self``)
    and must say the same, so the two dumps pair every operator."""
    r = compare(dumps["break_eager"], dumps["break_graph"], progress=False, workers=1)
    assert not r.unmatched_a and not r.unmatched_b, f"{r.unmatched_a}\n{r.unmatched_b}"
    t = r.table
    pow_ops = t[t["op_type"] == "pow"]
    assert len(pow_ops) and pow_ops["op_b"].str.contains("Default/BreakNet/pow").all(), pow_ops["op_b"]
    assert "diverged" not in r.counts and r.first_difference is None


def test_zero_tangent_sum_and_unread_buffer_are_front_end(dumps):
    """Graph mode sums the returned logits' zero tangent into their gradient (an ``add``
    eager autograd never runs: its output is its input's bytes); eager dumps a buffer the
    compiled graph never reads. Both are front-end, nothing is unmatched."""
    r = compare(dumps["two_eager"], dumps["two_graph"], progress=False, workers=1)
    assert not r.unmatched_a and not r.unmatched_b, f"{r.unmatched_a}\n{r.unmatched_b}"
    assert "Parameter.unused" in r.front_end_a, r.front_end_a
    assert any(o.startswith("Gradients/") and "/add-op" in o for o in r.front_end_b), r.front_end_b
    assert "diverged" not in r.counts and r.first_difference is None
