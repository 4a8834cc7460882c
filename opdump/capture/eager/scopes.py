"""Module scopes of eager operators, from global module pre/post forward hooks.

The tracker keeps a stack of the modules whose ``forward`` is running.  The
outermost one is the *root* (shown as its class name, ``Default/<Root>``); every
module inside it contributes ``<name>-<Class>``, its name being its path below
the enclosing module on the stack, exactly as the graph front-end names them
(both go through :func:`opdump.capture.naming.module_scope`):
``Default/Net/blocks.0-Block/attn-Attention/proj-Linear``.

Rules (README-ready):

* a module called again under the same enclosing call in the same iteration gets
  ``@<k>`` after its name on its k-th extra call: ``blk-Blk``, then ``blk@1-Blk``
  (the form of Dynamo's ``nn_module_stack`` keys); a root called twice in one
  iteration (gradient accumulation) becomes ``Default/Net@1``;
* a module that is not registered under the module calling it (created inline,
  kept in a plain list) adds no segment: its operators belong to the caller, its
  ``set_dump`` mark still applies;
* ``torch.compile(module)`` wrappers (``OptimizedModule``) show the class of the
  module they wrap, and the wrapped module itself adds no segment;
* the ids of the modules on the stack (``str(id(module))``, outermost first) are
  the ``module_ids`` of the operator, which ``set_dump`` marks are keyed by.

Cost: a module call pushes a :class:`Frame` (its path, scope text and ids).  A training
loop calls the same modules under the same parents every step, so a frame is made once
and kept by its parent frame (a root's by the tracker), keyed by the module's registered
name and call count (or, for a module adding no segment, by the module itself), and reused
while the module found there is the same object: what a frame holds is a function of its
parent frame, the module, its name and its count.  Frames hold their module weakly (a kept
frame never keeps a deleted model alive).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import sys
import weakref

from ..naming import module_scope


_wrapper_class = None     # OptimizedModule, once torch._dynamo is imported (it stays imported)


def is_compiled_wrapper(module) -> bool:
    """Is ``module`` the ``OptimizedModule`` that ``torch.compile(module)`` returns?"""
    global _wrapper_class
    wrapper = _wrapper_class
    if wrapper is None:
        eval_frame = sys.modules.get("torch._dynamo.eval_frame")    # not imported: nothing is compiled
        wrapper = _wrapper_class = getattr(eval_frame, "OptimizedModule", None)
        if wrapper is None:
            return False
    return isinstance(module, wrapper)


def display_class(module) -> str:
    if is_compiled_wrapper(module):
        module = getattr(module, "_orig_mod", module)
    return type(module).__name__


class Frame:
    """One running module call on the stack."""

    __slots__ = ("_module", "cls", "path", "pairs", "ids", "root", "transparent", "_scope", "children")

    def __init__(self, module, path: str, pairs: Tuple[Tuple[str, str], ...], ids: Tuple[str, ...],
                 root: str, transparent: bool):
        self._module = weakref.ref(module)
        self.cls = type(module)     # its display class is the same while the type is (but for a compiled wrapper)
        self.path = path            # dotted path below the root, with @k suffixes ("" for the root)
        self.pairs = pairs          # (path, class) of the named modules from the root, outermost first
        self.ids = ids              # str(id(m)) of every module on the stack, outermost first
        self.root = root            # root class (with its @k suffix)
        self.transparent = transparent
        self._scope: Optional[str] = None
        self.children: Optional[Dict] = None     # frames made under this one (ScopeTracker.push)

    @property
    def module(self):
        """The module (None once it is deleted: only a kept frame outlives its module)."""
        return self._module()

    @property
    def scope(self) -> str:
        if self._scope is None:
            self._scope = _scope_of(self.pairs, self.root)
        return self._scope


_scope_cache: Dict[Tuple, str] = {}


def _scope_of(pairs, root: str) -> str:
    key = (pairs, root)
    scope = _scope_cache.get(key)
    if scope is None:
        if len(_scope_cache) > 100_000:
            _scope_cache.clear()
        scope = _scope_cache[key] = module_scope((("", root),) + pairs, root)
    return scope


class ScopeTracker:
    """The stack of running module calls and the per-iteration call counts."""

    #: called after every push and pop with the scope of the stack's top (None: empty), the
    #: native eager capture's ``set_scope`` itself (see .native.path: no Python frame between)
    on_scope = None

    def __init__(self):
        self.stack: List[Frame] = []
        self._calls: Dict[Tuple[str, int], int] = {}
        self._names: Dict[Tuple[int, int], Optional[str]] = {}
        self._roots: Dict[Tuple[int, int], Frame] = {}      # (id(root), call count) -> its kept frame
        self._again: List[Tuple[int, Dict]] = []            # push_again: (stack depth, the counts it set aside)

    def new_iteration(self) -> None:
        self._calls.clear()

    def _count(self, parent_path: str, module) -> int:
        key = (parent_path, id(module))
        k = self._calls.get(key, 0)
        self._calls[key] = k + 1
        return k

    def _name_in(self, parent, child) -> Optional[str]:
        """``child``'s dotted path below ``parent`` (None when not registered there)."""
        key = (id(parent), id(child))
        name = self._names.get(key, "")
        if name != "" and (name is None or parent._modules.get(name) is child or _resolve(parent, name) is child):
            return name
        name = None
        for attr, sub in parent._modules.items():
            if sub is child:
                name = attr
                break
        if name is None:
            for path, sub in parent.named_modules(remove_duplicate=False):
                if sub is child and path:
                    name = path
                    break
        if len(self._names) > 100_000:
            self._names.clear()
        self._names[key] = name
        return name

    def push_root(self, module) -> Frame:
        k = self._count(None, module)   # apart from the root's children, whose parent path is ""
        key = (id(module), k)
        frame = self._roots.get(key)
        root = display_class(module) + (f"@{k}" if k else "")
        if frame is None or frame.module is not module or frame.root != root:
            frame = Frame(module, "", (), (str(id(module)),), root, False)
            if len(self._roots) > 1024:
                self._roots.clear()
            self._roots[key] = frame
        self.stack.append(frame)
        if self.on_scope is not None:
            self.on_scope(frame.scope)
        return frame

    def push(self, module) -> Frame:
        # every module call of a step comes here: the common case (a registered child called
        # again, its kept frame valid) is inlined -- _name_in's cached name, _count, display_class
        # only for a compiled wrapper -- the rest goes the long way (same answers)
        stack = self.stack
        parent = stack[-1]
        owner = parent._module()
        if is_compiled_wrapper(owner) and getattr(owner, "_orig_mod", None) is module:
            name = None
        else:
            name = self._names.get((id(owner), id(module)), "")
            if name == "" or (name is not None and owner._modules.get(name) is not module):
                name = self._name_in(owner, module)
        if name is None:
            key = id(module)
        else:
            calls, counted = self._calls, (parent.path, id(module))
            k = calls.get(counted, 0)
            calls[counted] = k + 1
            key = (name, k)
        children = parent.children
        if children is None:
            children = parent.children = {}
        frame = children.get(key)
        if (frame is None or frame._module() is not module
                or (name is not None and (type(module) is not frame.cls or is_compiled_wrapper(module))
                    and frame.pairs[-1][1] != display_class(module))):
            frame = self._make(parent, module, name, key)
            if len(children) > 4096:
                children.clear()
            children[key] = frame
        stack.append(frame)
        if self.on_scope is not None:
            scope = frame._scope
            self.on_scope(scope if scope is not None else frame.scope)
        return frame

    def push_again(self, frame: Frame) -> None:
        """Push ``frame``, a module call of this iteration made again while autograd runs a
        backward (activation checkpointing's recomputation): its sub-modules are counted afresh,
        so they get the frames -- the scopes -- of their first calls; the counts set aside come
        back when ``frame`` is popped."""
        self._again.append((len(self.stack), self._calls))
        self._calls = {}
        self.stack.append(frame)
        if self.on_scope is not None:
            self.on_scope(frame.scope)

    @property
    def again(self) -> bool:
        """Whether a call made again (:meth:`push_again`) is on the stack."""
        return bool(self._again)

    @staticmethod
    def _make(parent: Frame, module, name: Optional[str], key) -> Frame:
        ids = parent.ids + (str(id(module)),)
        if name is None:
            return Frame(module, parent.path, parent.pairs, ids, parent.root, True)
        if key[1]:
            name = f"{name}@{key[1]}"
        path = f"{parent.path}.{name}" if parent.path else name
        return Frame(module, path, parent.pairs + ((path, display_class(module)),), ids, parent.root, False)

    def pop(self, module) -> None:
        stack = self.stack
        if stack and stack[-1]._module() is module:
            stack.pop()
        else:
            for i in range(len(stack) - 1, -1, -1):     # an exception skipped some post hooks
                if stack[i].module is module:
                    del stack[i:]
                    break
        if self._again and len(stack) <= self._again[-1][0]:
            self._calls = self._again.pop()[1]
        if self.on_scope is not None:
            self.on_scope(stack[-1].scope if stack else None)


def _resolve(parent, dotted: str):
    """The module registered at ``dotted`` below ``parent`` (its ``_modules`` chain, where
    :meth:`ScopeTracker._name_in` found it), or None."""
    module = parent
    for part in dotted.split("."):
        modules = getattr(module, "_modules", None)
        module = modules.get(part) if modules is not None else None
        if module is None:
            return None
    return module
