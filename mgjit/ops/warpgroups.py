"""Warpgroups of a CTA: WarpgroupId (which warpgroup this thread is in) and SetMaxRegisters (setmaxnreg: hand
registers between warpgroups with different roles, as warp-specialized kernels do).
"""
from __future__ import annotations

from .. import dtypes, infer, lower
from ..errors import Loc, Rule
from ..ir import Op, ScalarType


class WarpgroupId(Op):
    name = "warpgroup_id"

    def __init__(self, loc: Loc | None):
        super().__init__([], [ScalarType(dtypes.int32)], loc)


class SetMaxRegisters(Op):
    name = "set_max_registers"
    requires = "setmaxnreg"

    def __init__(self, count: int, increase: bool, loc: Loc | None):
        super().__init__([], [], loc)
        self.count = count
        self.increase = increase

    def attrs(self):
        return {"count": self.count, "increase": self.increase}

    def verify(self):
        if not (24 <= self.count <= 256 and self.count % 8 == 0):
            raise self.error(f"set_max_registers takes a multiple of 8 in 24..256, got {self.count}",
                             rule=Rule.REGISTERS)


infer.rule(WarpgroupId, SetMaxRegisters)(infer.no_arrays)


@lower.rule(WarpgroupId)
def _warpgroup_id(op: WarpgroupId, ctx: lower.Context) -> None:
    ctx.set(op.result, ctx.wg_id)


@lower.rule(SetMaxRegisters)
def _set_max_registers(op: SetMaxRegisters, ctx: lower.Context) -> None:
    ctx.e.asm_void(f"setmaxnreg.{'inc' if op.increase else 'dec'}.sync.aligned.u32 {op.count};", "", [])
