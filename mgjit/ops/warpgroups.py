"""Warpgroups of a CTA: WarpgroupId (which warpgroup this thread is in) and SetMaxRegisters (setmaxnreg: hand
registers between warpgroups with different roles, as warp-specialized kernels do).
"""
from __future__ import annotations

from typing import Generator

import torch

from .. import dtypes, infer, interpret, lower
from ..errors import Check, Loc, Rule
from ..interpret.scheduler import Wait, Warpgroup
from ..ir import Op, ScalarType
from ..layouts import THREADS_PER_WARPGROUP


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


# ---------------------------------------------------------------------------------------------- interpreter

@interpret.rule(WarpgroupId)
def _interp_warpgroup_id(op: WarpgroupId, wg: Warpgroup) -> None:
    wg.set(op.result, torch.tensor(wg.index, dtype=torch.int32))


@interpret.rule(SetMaxRegisters)
def _interp_set_max_registers(op: SetMaxRegisters, wg: Warpgroup) -> Generator[Wait, None, None]:
    """setmaxnreg changes no value, but it is checked: .dec may not raise the warpgroup's count nor .inc lower
    it, and .inc waits until the CTA's pool (what the CTA launched with, less what the other warpgroups hold)
    can pay for it, so that asking for more than the register file has is a deadlock naming this line."""
    pool = wg.cta.registers
    current = pool.counts[wg.index]
    if (op.count < current) if op.increase else (op.count > current):
        verb, way = ("increase", "fewer") if op.increase else ("decrease", "more")
        raise wg.error(op, Check.REGISTERS, f"set_max_registers({op.count}, increase={op.increase}) would "
                       f"{verb} this warpgroup to {way} registers than the {current} it has")

    def describe() -> str:
        more = (op.count - pool.counts[wg.index]) * THREADS_PER_WARPGROUP
        return (f"set_max_registers({op.count}) for {more} more registers; the CTA's pool has {pool.free} free "
                f"(the warpgroups hold {pool.counts} per thread)")

    yield Wait(op.loc, lambda: pool.available(wg.index, op.count), describe, lambda: pool.set(wg.index, op.count))
