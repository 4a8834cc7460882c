"""Operator selection: ``dump_mode`` 0 (all), 1 (``kernels``), 2 (``set_dump`` marks).

Decided once per operator (at compile time in graph mode), never per step.
Parameters and lifted constants follow ``kernels`` too (``dump_mode`` 1, see
:meth:`.KernelMatcher.matches_parameter`); decided once per name.
"""
from __future__ import annotations

from typing import Dict

from ..config import DumpConfig
from ..capture.op_info import OpInfo
from .kernels import KernelMatcher
from .marks import marked


class OpSelector:
    def __init__(self, config: DumpConfig):
        self.mode = config.dump_mode
        self.kernels = KernelMatcher(config.kernels)
        self._parameters: Dict[str, bool] = {}

    def select(self, op: OpInfo) -> bool:
        if self.mode == 1:
            return self.kernels.matches(op.full_name, op.op_type)
        if self.mode == 2:
            return bool(marked(op.module_ids))
        return True

    def select_parameter(self, name: str) -> bool:
        """Is the parameter / constant ``name`` dumped? (all of them outside ``dump_mode`` 1)"""
        if self.mode != 1:
            return True
        hit = self._parameters.get(name)
        if hit is None:
            hit = self._parameters[name] = self.kernels.matches_parameter(name)
        return hit
