"""The overflow watch's private pre-write copies (``op_debug_mode`` 3; README "Debug dumps").

Why: the eager watch copies every tensor an operator writes in place before it runs (the
values an origin's recorded inputs must have).  In a training step most of those are the
optimizer's parameters and state (AdamW's for-loop on CPU writes ~420 tensors a step), and
a fresh allocation of a large tensor is page-faulted in again on every copy.  The pool
keeps the copies of judged batches and copies into them instead.

Guarantees: a buffer is reused only after the batch that held it was judged and only if
its operator was not recorded (the recorder may still be writing a recorded one); only
plain tensors and parameters (the optimizer's writes), contiguous and floating, are pooled
(others are cloned, as before); at most
:data:`POOL_BYTES` of free buffers (and 4 per shape) are kept.
"""
from __future__ import annotations

from typing import Dict, Iterable, List

import torch

#: bytes of free copy buffers kept for reuse
POOL_BYTES = 256 << 20
_PER_SHAPE = 4
_FLOATS = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_PARAMETER = torch.nn.Parameter     # copied as its plain data (the optimizer's writes)


class CopyPool:
    """``copy(t)`` a private copy of ``t``; ``batch()`` the pooled copies made since the last
    call (their batch is being judged); ``recycle(copies, kept)`` frees them for reuse."""

    def __init__(self):
        self._free: Dict[tuple, List[torch.Tensor]] = {}    # (shape, dtype, device) -> free buffers
        self._bytes = 0
        self._batch: List[torch.Tensor] = []                # pooled copies the batch holds

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        if ((type(t) is not torch.Tensor and type(t) is not _PARAMETER) or t.dtype not in _FLOATS or t.layout is not torch.strided
                or not t.is_contiguous() or t.is_conj() or t.is_neg()):
            return t.detach().clone()
        free = self._free.get((t.shape, t.dtype, t.device))
        if free:
            c = free.pop()
            self._bytes -= c.nbytes
            c.copy_(t.detach())
        else:
            c = t.detach().clone()
        self._batch.append(c)
        return c

    def batch(self) -> List[torch.Tensor]:
        copies, self._batch = self._batch, []
        return copies

    def recycle(self, copies: Iterable[torch.Tensor], kept) -> None:
        """Free ``copies`` for reuse, except those whose id is in ``kept`` (recorded)."""
        free = self._free
        for c in copies:
            if id(c) in kept or self._bytes + c.nbytes > POOL_BYTES:
                continue
            slot = free.setdefault((c.shape, c.dtype, c.device), [])
            if len(slot) < _PER_SHAPE:
                slot.append(c)
                self._bytes += c.nbytes
