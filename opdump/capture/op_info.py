"""What opdump knows about one operator, computed once (at compile time in graph
mode, at first sight in eager mode) so that the per-step path only copies and
enqueues."""
from __future__ import annotations

import os
import re
import sysconfig
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

from ..lazy import cached_property


@dataclass(frozen=True)
class SourceLine:
    file: str
    line: int
    code: str
    function: str = ""

    def ir(self) -> str:
        """The ``.ir`` form (README, Output layout): ``# In file <path>(<line>)/ <code>/``."""
        return f"# In file {self.file}({self.line})/ {self.code}/"


@dataclass
class OpInfo:
    index: int                         # position among the graph's operators (execution order)
    op_type: str                       # ATen op name: convolution, addmm, native_layer_norm…
    scope: str                         # Default/AlexNet/conv3-Conv2d  or  Gradients/Default/…
    overload: str = "default"
    module_ids: Tuple[str, ...] = ()   # ids of the nn.Modules on the scope stack (set_dump)
    source: Tuple[SourceLine, ...] = ()
    args: Dict[str, Any] = field(default_factory=dict)   # non-tensor arguments (save_kernel_args)
    input_meta: List[Tuple[Tuple[Any, ...], str]] = field(default_factory=list)   # (shape, dtype)
    output_meta: List[Tuple[Tuple[Any, ...], str]] = field(default_factory=list)
    selected: bool = True
    mutates: bool = False              # writes to an argument (in-place / out=)
    node_name: str = ""
    arg_text: str = ""                 # inputs as written in the .ir line
    nonfinite_args: bool = False       # a non-tensor argument is Inf/NaN or a float type's extreme

    @cached_property
    def full_name(self) -> str:
        return f"{self.scope}/{self.op_type}-op{self.index}"

    @cached_property
    def file_stem(self) -> str:
        """``{op_type}.{op_name}`` as it starts every file name of this operator (sanitized once)."""
        from ..format.names import file_stem
        return file_stem(self.op_type, self.full_name)


# The largest finite magnitudes of float16, bfloat16, float32 and float64: a scalar equal to
# one of them is a ``finfo.min``-style mask value that turns into Inf in a narrower dtype.
_EXTREMES = frozenset((65504.0, 3.3895313892515355e+38, 3.4028234663852886e+38, 1.7976931348623157e+308))


def is_nonfinite_scalar(value: Any) -> bool:
    """Is ``value`` a Python float (or a list/tuple holding one) that is Inf, NaN or a float
    type's extreme (``torch.finfo(dtype).min``/``.max``)?  Such an argument makes an operator's
    inputs non-finite (README, Analysis: overflow): the operator is not an overflow origin."""
    if type(value) is float:
        return value != value or abs(value) == float("inf") or abs(value) in _EXTREMES
    if type(value) in (list, tuple):
        return any(is_nonfinite_scalar(v) for v in value)
    return False


# Where a frame's file belongs (README, Analysis: locate).  An operator's source lines are the
# frames *visible* to the user: their own code and libraries such as ``transformers``; torch,
# the standard library and opdump itself are hidden (opdump's bundled demo models are the
# user's code for this purpose).
VISIBLE, HIDDEN, OPDUMP = 1, 0, 2

_OPDUMP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_DEMO_DIR = _OPDUMP_DIR + "demo" + os.sep
_TORCH_PARTS = tuple(f"{os.sep}{name}{os.sep}" for name in ("torch", "functorch", "torchgen"))
_STDLIB_DIRS = tuple(sorted({os.path.join(p, "") for p in (sysconfig.get_paths().get("stdlib"),
                                                           sysconfig.get_paths().get("platstdlib")) if p}))
_PACKAGES = ("site-packages", "dist-packages")
_STDLIB_RE = re.compile(r"[/\\]lib[/\\]python\d[\d.]*[/\\]")


def frame_kind(path: str) -> int:
    """:data:`VISIBLE`, :data:`HIDDEN` or :data:`OPDUMP` (opdump's own code, also hidden) for a
    frame's file name."""
    if path.startswith("<"):
        return HIDDEN if path.startswith(("<frozen", "<eval_with_key>")) else VISIBLE
    if path.startswith(_OPDUMP_DIR):
        return VISIBLE if path.startswith(_DEMO_DIR) else OPDUMP
    if any(part in path for part in _TORCH_PARTS):
        return HIDDEN
    if any(part in path for part in _PACKAGES):
        return VISIBLE
    if path.startswith(_STDLIB_DIRS) or _STDLIB_RE.search(path):
        return HIDDEN
    return VISIBLE


def visible_frames(frames: Sequence[SourceLine]) -> Tuple[SourceLine, ...]:
    """The user-visible frames of a stack given outermost first: hidden ones dropped, and
    nothing outward of opdump's own code (its launcher runs the user's script)."""
    kept: List[SourceLine] = []
    for frame in reversed(frames):
        kind = frame_kind(frame.file)
        if kind == VISIBLE:
            kept.append(frame)
        elif kind == OPDUMP and kept:
            break
    return tuple(reversed(kept))
