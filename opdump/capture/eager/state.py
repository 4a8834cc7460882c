"""What the eager capture keeps: the listing (every operator seen in any dumped
iteration) and the state of the dumped iteration in progress.

Why the listing spans iterations (README, Eager mode): eager code has no fixed graph --
a branch taken at step 5 only, a NaN guard that fires once -- so the ``.ir``/``.json``
listing is the union of the operators of every dumped iteration, in first-seen order, and
each iteration keeps its own execution order in its folder.
"""
from __future__ import annotations

import enum
import threading
from typing import Dict, List, Optional, Tuple

from torch.utils.weak import WeakIdKeyDictionary

from ..op_info import OpInfo

#: (scope, module ids, source lines) of code outside every module
TOP: Tuple[str, Tuple[str, ...], Tuple] = ("Default", (), ())


class Phase(enum.IntEnum):
    """Where an operator runs, which decides its scope."""

    OUTSIDE = 0        # no module, no backward, no optimizer: ``Default`` (``eager_capture: "all"`` only)
    MODULE = 1         # inside a module's forward (or its forward hooks): the module's scope
    BACKWARD = 2       # autograd's backward: ``Gradients/<scope of the forward operator>``
    OPTIMIZER = 3      # inside ``optimizer.step()``: ``Default/optimizer-<Class>``
    RECOMPUTE = 4      # a module's forward made again in the backward (activation checkpointing):
                       # ``Gradients/<scope of that module's call>``


class Listing:
    """The operators and parameters of the ``.ir``/``.json`` listing, across dumped iterations.

    ``dirty`` is set when something was added or changed since the files were last written."""

    def __init__(self):
        self.ops: Dict[str, OpInfo] = {}                 # full name -> first description
        self.params: List[Tuple[str, Tuple]] = []        # (name, (shape, dtype))
        self.param_names: set = set()
        self.producers = WeakIdKeyDictionary()           # tensor -> "%N" / "%paraK_name" in .ir lines
        self.dirty = False
        self.version = 0                                 # bumped at every write of the files
        self.lock = threading.Lock()                     # one writer thread writes them at a time
        self.order_written = False                       # the graph-level execution order (first iteration)

    def add(self, op: OpInfo) -> None:
        self.ops[op.full_name] = op
        self.dirty = True

    def add_param(self, name: str, value) -> None:
        if name in self.param_names:
            return
        from .values import meta
        self.param_names.add(name)
        self.params.append((name, meta(value)))
        self.producers[value] = f"%para{len(self.params)}_{name}"
        self.dirty = True


class IterationState:
    """What the capture collects during one dumped iteration."""

    def __init__(self, number: int, first: bool):
        self.number = number
        self.first = first                         # first dumped iteration: every operator is new
        self.n = 0
        self.names: List[str] = []                 # full names in execution order
        self.seq: Dict[int, Tuple[str, Tuple[str, ...], Tuple]] = {}   # autograd seq nr -> forward (scope, ids, sources)
        self.seq_hi = -1                           # the highest number in seq (dispatch._register)
        self.before: Dict[int, Tuple] = {}         # the previous iteration's seq, when it was dumped too
        self.modules: Dict[int, Tuple[str, Tuple[str, ...]]] = {}  # id(module) -> first (scope, ids)
        self.frames: Dict[int, object] = {}        # id(module) -> its first call's scopes.Frame (a recomputation's)
        self.owners: Dict[int, Tuple] = {}         # id(parameter) -> (id(module), (path, class) pairs, root)
        self.roots_done: set = set()
        self.param_names: set = set()              # parameters dumped in this iteration
        self.folder: Optional[str] = None
