"""Selection: which iterations and which operators dump."""
from .kernels import KernelMatcher
from .marks import set_dump
from .policy import OpSelector

__all__ = ["KernelMatcher", "OpSelector", "set_dump"]
