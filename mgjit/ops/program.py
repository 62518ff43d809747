"""The program's identity and its constants: Constant, ProgramId, NumPrograms, RefDim (a tensor's size).

All are scalars, the same in every thread of the CTA.
"""
from __future__ import annotations

import torch

from .. import dtypes, infer, interpret, lower
from ..errors import Loc
from ..interpret import numerics
from ..ir import Op, ScalarType, Value, check
from ..dtypes import DType


class Constant(Op):
    name = "constant"

    def __init__(self, value: int | float | bool, dtype: DType, loc: Loc | None):
        super().__init__([], [ScalarType(dtype)], loc)
        self.value = value

    def attrs(self):
        return {"value": self.value}

    def verify(self):
        dtype = self.result.dtype
        if dtype.is_int and dtype != dtypes.bool_:
            lo, hi = dtype.int_range
            check(lo <= self.value <= hi, self, f"the constant {self.value} does not fit in {dtype.name} "
                  f"({lo}..{hi}); use a wider type or a smaller value")


class ProgramId(Op):
    name = "program_id"

    def __init__(self, axis: int, loc: Loc | None):
        super().__init__([], [ScalarType(dtypes.int32)], loc)
        self.axis = axis

    def attrs(self):
        return {"axis": self.axis}

    def verify(self):
        check(self.axis in (0, 1, 2), self, f"program_id axis must be 0, 1 or 2, got {self.axis}")


class NumPrograms(ProgramId):
    name = "num_programs"


class RefDim(Op):
    """The runtime size of one dimension of a GMEM reference."""

    name = "ref_dim"

    def __init__(self, ref: Value, axis: int, loc: Loc | None):
        super().__init__([ref], [ScalarType(dtypes.int32)], loc)
        self.axis = axis

    def attrs(self):
        return {"axis": self.axis}

    def verify(self):
        rank = self.operands[0].type.rank
        check(0 <= self.axis < rank, self, f"axis {self.axis} is out of range for a reference of rank {rank}")


infer.rule(Constant, ProgramId, NumPrograms, RefDim)(infer.no_arrays)


@lower.rule(Constant)
def _constant(op: Constant, ctx: lower.Context) -> None:
    ctx.set(op.result, ctx.e.const(op.value, op.result.dtype))


@lower.rule(ProgramId)
def _program_id(op: ProgramId, ctx: lower.Context) -> None:
    ctx.set(op.result, ctx.e.ctaid(op.axis))


@lower.rule(NumPrograms)
def _num_programs(op: NumPrograms, ctx: lower.Context) -> None:
    ctx.set(op.result, ctx.e.nctaid(op.axis))


@lower.rule(RefDim)
def _ref_dim(op: RefDim, ctx: lower.Context) -> None:
    ctx.set(op.result, ctx.get(op.operands[0]).sizes[op.axis])


# ---------------------------------------------------------------------------------------------- interpreter

@interpret.rule(Constant)
def _interp_constant(op: Constant, wg) -> None:
    wg.set(op.result, numerics.constant(op.value, op.result.dtype))


@interpret.rule(ProgramId)
def _interp_program_id(op: ProgramId, wg) -> None:
    wg.set(op.result, torch.tensor(wg.cta.program_id[op.axis], dtype=torch.int32))


@interpret.rule(NumPrograms)
def _interp_num_programs(op: NumPrograms, wg) -> None:
    wg.set(op.result, torch.tensor(wg.run.grid[op.axis], dtype=torch.int32))


@interpret.rule(RefDim)
def _interp_ref_dim(op: RefDim, wg) -> None:
    wg.set(op.result, torch.tensor(wg.get(op.operands[0], op).shape[op.axis], dtype=torch.int32))
