"""Graph mode: opdump as a ``torch.compile`` backend (README, "How it works")."""
from .backend import backend

__all__ = ["backend"]
