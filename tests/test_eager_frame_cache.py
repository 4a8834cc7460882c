"""The scope tracker keeps the frames it makes (opdump/capture/eager/scopes.py, "Cost"): a module
called again under the same parent frame, name and call count reuses its frame.  These tests hold
what a kept frame must never change: the scope of a module replaced, renamed or re-classed between
steps, transparent modules, ``@k`` call counts, and that a kept frame does not keep a deleted model
alive."""
from __future__ import annotations

import gc
import weakref

import torch
from torch import nn

import opdump
from opdump.capture.eager import EagerCapture
from opdump.capture.eager.scopes import ScopeTracker
from opdump.config import DumpConfig, IterationSpec


class Leaf(nn.Module):
    def forward(self, x):
        return x + 1


class Other(nn.Module):
    def forward(self, x):
        return x * 2


class Root(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = Leaf()


def _scopes(tracker: ScopeTracker, root: nn.Module, children) -> list:
    """One step: the root, then each child (a module, or (module, [its children]))."""
    tracker.new_iteration()
    tracker.push_root(root)
    out = []

    def visit(items):
        for item in items:
            module, sub = item if isinstance(item, tuple) else (item, [])
            frame = tracker.push(module)
            out.append((frame.scope, frame.transparent, frame.ids[-1]))
            visit(sub)
            tracker.pop(module)

    visit(children)
    tracker.pop(root)
    return out


def test_replaced_module_under_the_same_name_gets_its_own_scope():
    tracker, root = ScopeTracker(), Root()
    assert _scopes(tracker, root, [root.body])[0][0] == "Default/Root/body-Leaf"
    assert _scopes(tracker, root, [root.body])[0][0] == "Default/Root/body-Leaf"   # kept frame
    old = root.body
    root.body = Other()
    got = _scopes(tracker, root, [root.body])[0]
    assert got[0] == "Default/Root/body-Other"
    assert got[2] == str(id(root.body)) and got[2] != str(id(old))


def test_module_moved_to_another_name_and_class_swapped():
    tracker, root = ScopeTracker(), Root()
    _scopes(tracker, root, [root.body])
    leaf = root.body
    del root.body
    root.moved = leaf
    assert _scopes(tracker, root, [leaf])[0][0] == "Default/Root/moved-Leaf"
    leaf.__class__ = Other            # same object, another class: the scope says so
    assert _scopes(tracker, root, [leaf])[0][0] == "Default/Root/moved-Other"


def test_call_counts_and_unregistered_modules_with_kept_frames():
    tracker, root = ScopeTracker(), Root()
    inline = Other()                  # not registered under the root: adds no segment
    for _ in range(3):
        got = _scopes(tracker, root, [root.body, root.body, (inline, [root.body])])
        # body inside the unregistered module: not registered under it either (its name is looked up
        # in the module calling it), so it adds no segment
        assert [g[0] for g in got] == ["Default/Root/body-Leaf", "Default/Root/body@1-Leaf", "Default/Root",
                                       "Default/Root"]
        assert [g[1] for g in got] == [False, False, True, True]
    # the root called twice in one iteration
    tracker.new_iteration()
    assert tracker.push_root(root).scope == "Default/Root"
    tracker.pop(root)
    assert tracker.push_root(root).scope == "Default/Root@1"
    tracker.pop(root)


def test_a_kept_frame_does_not_keep_a_deleted_model_alive(tmp_path):
    cfg = DumpConfig(path=str(tmp_path), iteration=IterationSpec(ranges=((0, 10),)), saved_data="statistic",
                     stat_calc_mode="device")
    with opdump.Session(cfg) as session, EagerCapture(session) as cap:
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            session.step()
        gone = weakref.ref(model)
        del model
        gc.collect()
        assert gone() is None
