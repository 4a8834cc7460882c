"""``cached_property`` without a lock, for the per-operator and per-tensor objects of capture
and compare.

Why: Python < 3.12's ``functools.cached_property`` takes one lock shared by every instance on
each first access (~0.5 µs per operator on the eager path; half of compare's matching time on
270,000 tensors).  This one computes on first access and stores an instance attribute; two
threads computing the same value at once store equal values.  No dependencies (the analysis
side imports it without torch)."""
from __future__ import annotations


class cached_property:  # noqa: N801 - functools' name
    def __init__(self, func):
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value
