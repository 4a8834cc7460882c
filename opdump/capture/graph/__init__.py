"""Graph mode: opdump as a ``torch.compile`` backend (SPEC F10)."""
from .backend import backend

__all__ = ["backend"]
