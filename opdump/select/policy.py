"""Operator selection: ``dump_mode`` 0 (all), 1 (``kernels``), 2 (``set_dump`` marks).

Decided once per operator (at compile time in graph mode), never per step.
"""
from __future__ import annotations

from ..config import DumpConfig
from ..capture.op_info import OpInfo
from .kernels import KernelMatcher
from .marks import marked


class OpSelector:
    def __init__(self, config: DumpConfig):
        self.mode = config.dump_mode
        self.kernels = KernelMatcher(config.kernels)

    def select(self, op: OpInfo) -> bool:
        if self.mode == 1:
            return self.kernels.matches(op.full_name, op.op_type)
        if self.mode == 2:
            return bool(marked(op.module_ids))
        return True
