"""Kernel-level graph dump (``graph_dump: "kernels"``): inductor's compiled kernels, observed
(README, "Kernel-level graph dump")."""
from .compile import compile_kernels, is_inductor

__all__ = ["compile_kernels", "is_inductor"]
