"""Capture front-ends (graph: torch.compile backend; eager: dispatch mode) and the
naming they share.  Both hand tensors to :class:`opdump.recorder.Recorder`.

The front-ends are imported on first attribute access, so the spelling the README
uses after a plain ``import opdump`` works: ``opdump.capture.eager.EagerCapture(s)``.
"""
from importlib import import_module

_SUBMODULES = ("eager", "graph", "kernels", "naming", "aten_ops", "op_info")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
