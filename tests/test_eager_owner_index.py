"""Parameter owners of an eager root (opdump/capture/eager/parameters.py, index_parameters): made
once per root while its module tree stays the same, and made again whenever it changes.

The owners give a parameter's gradient accumulation its scope (``Gradients/<module scope>``);
they are asked at every dumped iteration's root entry, so they are kept per root and reused
while the walk's (path, module, class, parameter identities) sequence is the same.  Proven here
on real modules: a reused answer equals the walk's own in every iteration, and a replaced
parameter, a swapped sub-module (same path, another class), a tied weight and a second root
sharing a parameter each give the owners the walk gives (a stale answer would not).
"""
import torch
from torch import nn

from opdump.capture.eager import parameters
from opdump.capture.eager.parameters import _owners_of, index_parameters, walk_modules
from opdump.capture.eager.state import IterationState


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.norm = nn.LayerNorm(3)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(3, 2)


def owners(root, root_class="Net", before=None):
    """index_parameters' answer for a fresh iteration (``before``: owners already there)."""
    state = IterationState(0, False)
    state.owners.update(before or {})
    index_parameters(state, root, root_class)
    return state.owners


def walked(root, root_class="Net"):
    """The walk's own answer, made from scratch."""
    return _owners_of(walk_modules(root, remove_duplicate=False), root_class)


def test_same_tree_reuses_the_answer_and_it_is_the_walks():
    net = Net()
    first = owners(net)
    kept = parameters._OWNERS[(id(net), "Net")]
    assert owners(net) == first == walked(net)
    assert parameters._OWNERS[(id(net), "Net")] is kept       # reused, not made again
    assert first[id(net.blocks[1].fc.weight)] == (
        id(net.blocks[1].fc), (("blocks.1", "Block"), ("blocks.1.fc", "Linear")), "Net")


def test_a_replaced_parameter_is_owned():
    net = Net()
    owners(net)
    net.head.weight = nn.Parameter(torch.ones(2, 3))
    got = owners(net)
    assert id(net.head.weight) in got and got == walked(net)


def test_a_swapped_submodule_gives_its_class():
    net = Net()
    owners(net)
    net.blocks[0].fc = nn.Bilinear(3, 3, 3)        # same path, another class and parameters
    got = owners(net)
    assert got[id(net.blocks[0].fc.weight)][1][-1] == ("blocks.0.fc", "Bilinear")
    assert got == walked(net)


def test_a_tied_weight_belongs_to_its_first_module_in_the_walk():
    net = Net()
    before = owners(net)
    net.head.weight = net.blocks[0].fc.weight      # no new parameter: the head's own is gone
    got = owners(net)
    assert got != before and got == walked(net)
    assert got[id(net.head.weight)][0] == id(net.blocks[0].fc)


def test_a_parameter_another_root_owns_keeps_that_owner():
    net, other = Net(), Net()
    other.head.weight = net.head.weight
    first = owners(net)
    got = owners(other, "Net@1", before=first)
    assert got[id(net.head.weight)] == first[id(net.head.weight)]
    assert {k: v for k, v in got.items() if k not in first} == {
        k: v for k, v in walked(other, "Net@1").items() if k not in first}
