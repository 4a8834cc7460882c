"""What opdump knows about one operator, computed once (at compile time in graph
mode, at first sight in eager mode) so that the per-step path only copies and
enqueues."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple


class cached_property:
    """``functools.cached_property`` without its lock (Python < 3.12 takes one lock, shared by
    every instance, on each first access: ~0.5 us per operator on the eager path).  Two
    threads computing the same name at once store the same string."""

    def __init__(self, func):
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value


@dataclass(frozen=True)
class SourceLine:
    file: str
    line: int
    code: str
    function: str = ""

    def ir(self) -> str:
        """The seed's form: ``# In file <path>(<line>)/ <code>/``."""
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

    @cached_property
    def full_name(self) -> str:
        return f"{self.scope}/{self.op_type}-op{self.index}"

    @cached_property
    def file_stem(self) -> str:
        """``{op_type}.{op_name}`` as it starts every file name of this operator (sanitized once)."""
        from ..write.names import file_stem
        return file_stem(self.op_type, self.full_name)

    def user_source(self) -> Optional[SourceLine]:
        """The innermost frame of the user's own code (not torch or site-packages)."""
        for src in reversed(self.source):
            if not _is_library(src.file):
                return src
        return self.source[-1] if self.source else None


_LIBRARY_MARKERS = ("site-packages", "dist-packages", "/torch/", "/lib/python")


def _is_library(path: str) -> bool:
    return any(marker in path for marker in _LIBRARY_MARKERS)
