"""The recorder: where both capture front-ends hand over tensors.

* :mod:`.core`   :class:`Recorder`: copies, files, statistic rows, flushes;
* :mod:`.copies` exact host copies, unique timestamps, what was already recorded;
* :mod:`.rows`   the text of statistic.csv rows (made in the writer thread).
"""
from .core import Recorder

__all__ = ["Recorder"]
