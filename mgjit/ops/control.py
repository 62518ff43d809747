"""Structured control flow: For (`for i in range(...)` on runtime bounds, lowered to an scf.for that counts the
iterations from 0, the loop variable computed from the count), If (lowered to scf.if) and Yield, their terminator.

Values carried through a loop or out of an if are the ops' results; their layouts settle by re-inferring a
loop body until the carried layouts stop changing. Carried register arrays travel as their per-thread
elements (a splat as its one value).
"""
from __future__ import annotations

from typing import Generator, Sequence

import torch

from .. import dtypes, infer, interpret, ir, lower
from ..errors import Loc
from ..interpret import numerics
from ..interpret.scheduler import Wait, Warpgroup
from ..ir import Block, Op, ScalarType, Type, Value, check, is_int_scalar
from ..lower.context import num_elems
from .program import Constant


class For(Op):
    """`for iv in range(lower, upper, step)`; the body's block args are (iv, *carried), it ends in Yield."""

    name = "for"

    def __init__(self, lower: Value, upper: Value, step: Value, inits: Sequence[Value], loc: Loc | None):
        body = Block([lower.type, *(v.type for v in inits)])
        super().__init__([lower, upper, step, *inits], [v.type for v in inits], loc, [body])
        body.parent = self

    @property
    def body(self) -> Block:
        return self.regions[0]

    @property
    def inits(self) -> list[Value]:
        return self.operands[3:]

    def verify(self):
        for v in self.operands[:3]:  # the frontend casts them: the lowering counts in int32
            check(is_int_scalar(v) and v.dtype == dtypes.int32, self, f"range bounds must be int32 scalars, "
                  f"got {v.type}")


class If(Op):
    """Two regions, each ending in Yield of the op's results."""

    name = "if"
    joins_yields = True

    def __init__(self, cond: Value, result_types: Sequence[Type], loc: Loc | None):
        super().__init__([cond], result_types, loc, [Block(), Block()])

    def verify(self):
        cond = self.operands[0]
        check(isinstance(cond.type, ScalarType), self,
               "an `if` condition must be a scalar; for arrays use mgjit.where")


class Yield(Op):
    name = "yield"

    def __init__(self, values: Sequence[Value], loc: Loc | None):
        super().__init__(values, [], loc)


def in_loop(kernel: ir.Kernel, op: Op) -> bool:
    """Whether `op` sits in the body of a loop: it may run again, over what its last run wrote or still reads."""
    return any(o is op for loop in kernel.walk() if isinstance(loop, For) for region in loop.regions
               for o in region.walk())


@infer.rule(For)
def _infer_for(op: For, inf: infer.Inference) -> None:
    body = op.body
    carried = [a for a in body.args[1:]]
    layouts = [v.layout for v in op.inits]
    yield_op = body.ops[-1]
    for _ in range(4):
        mark = len(inf.log)
        for arg, layout in zip(carried, layouts):
            if arg.is_array:
                inf.set_layout(arg, layout, op)
        inf.block(body)
        yielded = [v.layout for v in yield_op.operands]
        joined = [infer.join(a, y) if arg.is_array else None for arg, a, y in zip(carried, layouts, yielded)]
        if joined == layouts:
            break
        inf.undo(mark)
        layouts = joined
    else:
        raise op.error("layout inference for the loop-carried arrays does not settle; "
                       "consider initialising them from a load or an explicit layout")
    for i, (arg, layout) in enumerate(zip(carried, layouts)):
        if arg.is_array:
            if yield_op.operands[i].layout != layout:
                inf.relayout(body, yield_op, i, layout)
            if op.inits[i].layout != layout:
                inf.relayout(inf.current_block, op, 3 + i, layout)
            inf.set_layout(op.results[i], layout, op)


@infer.rule(If)
def _infer_if(op: If, inf: infer.Inference) -> None:
    for region in op.regions:
        inf.block(region)
    then_yield, else_yield = op.regions[0].ops[-1], op.regions[1].ops[-1]
    for i, r in enumerate(op.results):
        if not r.is_array:
            continue
        layout = infer.join(then_yield.operands[i].layout, else_yield.operands[i].layout)
        for region, y in zip(op.regions, (then_yield, else_yield)):
            if y.operands[i].layout != layout:
                inf.relayout(region, y, i, layout)
        inf.set_layout(r, layout, op)


infer.rule(Yield)(infer.no_arrays)


# ---------------------------------------------------------------------------------------------- lowering

def _unflatten(v: ir.Value, values: list, pos: int):
    """Rebuild the lowered form of `v` from a flat list starting at `pos`; returns (lowered, next pos)."""
    if not v.is_array:
        return values[pos], pos + 1
    n = num_elems(v.layout, v.type.shape)
    return lower.Frag(v.layout, v.type.shape, v.dtype, list(values[pos:pos + n])), pos + n


def _assign(ctx: lower.Context, targets: list[ir.Value], values: list) -> None:
    pos = 0
    for t in targets:
        lowered, pos = _unflatten(t, values, pos)
        ctx.set(t, lowered)


def _trip_count(op: For, ctx: lower.Context):
    """How many times `range(start, stop, step)` runs its body, as an unsigned int32: (stop - start - 1) // step
    + 1 where start < stop, else 0. A step that is not a constant is checked first: one that is not positive traps
    (the launch fails) where scf.for would loop without end."""
    e = ctx.e
    start, stop, step = (ctx.get(v) for v in op.operands[:3])
    if not isinstance(op.operands[2].owner, Constant):
        e.asm_void("@!$0 trap;", "b", [e.cmpi("sgt", step, e.i32(0))])
    # stop - start wraps to the true distance (below 2**32) where start < stop: an unsigned division counts it
    count = e.addi(e.divui(e.subi(e.subi(stop, start), e.i32(1)), step), e.i32(1))
    return e.select(e.cmpi("slt", start, stop), count, e.i32(0))


@lower.rule(For)
def _for(op: For, ctx: lower.Context) -> None:
    # The loop counts 0, 1, ... with an unsigned test and computes the induction variable from the count. scf.for's
    # own test, `i + step < stop` signed, never ends where i + step passes 2**31; and a loop whose variable runs
    # through negative values (range(-4, -1, 2)) may have LLVM test it unsigned, which ptxas (13.0 and 13.5) then
    # moves past the step, where -2 + 2 wraps to 0 and the loop never ends (fuzz seed 50175 hung an H200). A count
    # from 0 never wraps.
    e = ctx.e
    scf = e.m.scf
    inits = [x for v in op.inits for x in lower.flatten(ctx.get(v))]
    start, step = ctx.get(op.operands[0]), ctx.get(op.operands[2])
    count = _trip_count(op, ctx)
    before = ctx.enter_loop(op.body)
    loop = scf.ForOp(e.i32(0), count, e.i32(1), inits)
    loop.operation.attributes["unsignedCmp"] = e.ir.UnitAttr.get()
    body = loop.body
    e.push(e.ir.InsertionPoint(body))
    try:
        ctx.set(op.body.args[0], e.addi(start, e.muli(loop.induction_variable, step)))
        _assign(ctx, op.body.args[1:], list(loop.inner_iter_args))
        scf.yield_(lower.lower_block(ctx, op.body))
    finally:
        e.pop()
    ctx.leave_loop(before)
    _assign(ctx, op.results, list(loop.results))


@lower.rule(If)
def _if(op: If, ctx: lower.Context) -> None:
    e = ctx.e
    then_region, else_region = op.regions
    # The result types are those of the flat yielded values; lower the then-branch to learn them.
    result_types = []
    for r in op.results:
        t = e.type(r.dtype)
        result_types.extend([t] * (num_elems(r.layout, r.type.shape) if r.is_array else 1))
    with ctx.branches() as start:
        def branch(region):
            start()
            return lower.lower_block(ctx, region)
        results = e.if_else(ctx.get(op.operands[0]), result_types, lambda: branch(then_region),
                            lambda: branch(else_region))
    _assign(ctx, op.results, results)


@lower.rule(Yield)
def _yield(op: Yield, ctx: lower.Context) -> None:
    # A Yield is lowered by the For or If whose region it ends (lower.lower_block); anywhere else the IR is broken.
    raise op.error("internal error: a yield that does not end a loop or if region")


# ---------------------------------------------------------------------------------------------- interpreter
# Values carried through a loop or out of an if pass as they are: an MMA result still in flight may be carried
# (to the next MMA of its chain) without being read.

@interpret.rule(For)
def _interp_for(op: For, wg: Warpgroup) -> Generator[Wait, None, None]:
    start, stop, step = (int(wg.scalar(v, op)) for v in op.operands[:3])
    if step <= 0:
        raise op.error(f"this loop's step is {step} at run time: a step must be positive (the loop would not end)")
    iv_dtype = numerics.torch_dtype(op.operands[0].dtype)
    carried = [wg.raw(v) for v in op.inits]
    for i in range(start, stop, step):  # scf.for: a signed `iv < upper` test, a positive step
        carried = yield from wg.region(op.body, [torch.tensor(i, dtype=iv_dtype), *carried])
    for r, x in zip(op.results, carried):
        wg.set(r, x)


@interpret.rule(If)
def _interp_if(op: If, wg: Warpgroup) -> Generator[Wait, None, None]:
    taken = op.regions[0] if wg.scalar(op.operands[0], op) else op.regions[1]
    for r, x in zip(op.results, (yield from wg.region(taken, []))):
        wg.set(r, x)


@interpret.rule(Yield)
def _interp_yield(op: Yield, wg: Warpgroup) -> None:
    # A Yield ends a region and is read by the For or If that runs it (Warpgroup.region); anywhere else the IR
    # is broken.
    raise op.error("internal error: a yield that does not end a loop or if region")
