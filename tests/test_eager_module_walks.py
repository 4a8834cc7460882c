"""The eager capture's module walks (opdump/capture/eager/parameters.py, scopes.py): the loop
walks taken at each root entry and module call give exactly what torch's own recursive
walks give (README, Eager mode: parameters, scopes), and fall back to torch's where a module
class has its own version."""
import torch

from opdump.capture.eager.parameters import _named_members, walk_modules
from opdump.capture.eager.scopes import ScopeTracker, _resolve


class Block(torch.nn.Module):
    def __init__(self, shared):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.shared = shared               # the same module under two parents
        self.none = None                   # a child slot holding None
        self.register_buffer("scale", torch.ones(3))
        self.register_parameter("missing", None)

    def forward(self, x):
        return self.shared(self.fc(x)) * self.scale


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        shared = torch.nn.Linear(3, 3)
        self.blocks = torch.nn.ModuleList([Block(shared), Block(shared)])
        self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(3, 2))
        self.tied = torch.nn.Linear(3, 2)
        self.tied.weight = self.head[1].weight          # one parameter, two names
        self.register_buffer("step", torch.zeros(()))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x) + self.tied(x)


def _ids(pairs):
    return [(name, id(value)) for name, value in pairs]


def test_walk_is_named_modules_with_and_without_duplicates():
    net = Net()
    for remove in (False, True):
        assert _ids(walk_modules(net, remove)) == _ids(net.named_modules(remove_duplicate=remove))
    # the duplicate really is walked twice without removal (the test would pass on a walk that never saw it)
    assert len(walk_modules(net, False)) > len(walk_modules(net, True))


def test_members_are_named_parameters_and_buffers():
    net = Net()
    modules = walk_modules(net, True)
    assert _ids(_named_members(net, modules, "_parameters")) == _ids(net.named_parameters())
    assert _ids(_named_members(net, modules, "_buffers")) == _ids(net.named_buffers())


class Custom(torch.nn.Module):
    """A module class with its own ``named_modules``/``named_parameters``: torch's are not used
    by the loop walk, which must hand over to them."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(2, 2)
        self.hidden = torch.nn.Linear(2, 2)

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        yield prefix, self
        yield (prefix + "." if prefix else "") + "inner", self.inner

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        yield "only", self.inner.weight


def test_own_walks_are_used_where_a_class_has_them():
    outer = torch.nn.Sequential(Custom())
    for remove in (False, True):
        assert _ids(walk_modules(outer, remove)) == _ids(outer.named_modules(remove_duplicate=remove))
    custom = outer[0]
    assert _ids(walk_modules(custom, True)) == _ids(custom.named_modules())
    assert _named_members(custom, walk_modules(custom, True), "_parameters") is None


def test_resolve_follows_registered_children_only():
    net = Net()
    assert _resolve(net, "blocks.1.fc") is net.blocks[1].fc
    assert _resolve(net, "blocks.2") is None and _resolve(net, "blocks.0.none") is None
    assert _resolve(net, "blocks.0.fc.weight") is None          # a parameter is no module


def test_scope_follows_a_module_registered_under_a_new_name():
    """The tracker remembers a child's name per (parent, child) and checks it at each call: a
    module moved to another attribute is named by its new place."""
    net = Net()
    tracker = ScopeTracker()

    def scope_of_head_linear():
        tracker.new_iteration()
        tracker.push_root(net)
        tracker.push(net.head)
        frame = tracker.push(net.head[-1])
        scope = frame.scope
        tracker.pop(net.head[-1])
        tracker.pop(net.head)
        tracker.pop(net)
        return scope

    assert scope_of_head_linear().endswith("head-Sequential/1-Linear")
    linear = net.head[1]
    net.head._modules["last"] = net.head._modules.pop("1")     # same parent, same child, new name
    assert net.head.last is linear
    assert scope_of_head_linear().endswith("head-Sequential/last-Linear")
