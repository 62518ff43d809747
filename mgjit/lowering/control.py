"""Lowering rules for structured control flow: For → scf.for, If → scf.if.

Carried register arrays travel as their per-thread elements (a splat as its one value)."""
from __future__ import annotations

from .. import ir
from .core import Context, Frag, num_elems, rule


def _flatten(lowered) -> list:
    return list(lowered.elems) if isinstance(lowered, Frag) else [lowered]


def _unflatten(v: ir.Value, values: list, pos: int):
    """Rebuild the lowered form of `v` from a flat list starting at `pos`; returns (lowered, next pos)."""
    if not v.is_array:
        return values[pos], pos + 1
    n = num_elems(v.layout, v.type.shape)
    return Frag(v.layout, v.type.shape, v.dtype, list(values[pos:pos + n])), pos + n


def _assign(ctx: Context, targets: list[ir.Value], values: list) -> None:
    pos = 0
    for t in targets:
        lowered, pos = _unflatten(t, values, pos)
        ctx.set(t, lowered)


def lower_block(ctx: Context, block: ir.Block) -> list:
    """Lower a region's ops (all but its Yield); returns the flat values it yields."""
    from . import lower_ops
    lower_ops(ctx, block.ops[:-1])
    terminator = block.ops[-1]
    assert isinstance(terminator, ir.Yield)
    return [x for v in terminator.operands for x in _flatten(ctx.get(v))]


@rule(ir.For)
def _for(op: ir.For, ctx: Context) -> None:
    e = ctx.e
    scf = e.m.scf
    inits = [x for v in op.inits for x in _flatten(ctx.get(v))]
    lower, upper, step = (ctx.get(v) for v in op.operands[:3])
    loop = scf.ForOp(lower, upper, step, inits)
    body = loop.body
    e.push(e.ir.InsertionPoint(body))
    try:
        ctx.set(op.body.args[0], loop.induction_variable)
        _assign(ctx, op.body.args[1:], list(loop.inner_iter_args))
        scf.yield_(lower_block(ctx, op.body))
    finally:
        e.pop()
    _assign(ctx, op.results, list(loop.results))


@rule(ir.If)
def _if(op: ir.If, ctx: Context) -> None:
    e = ctx.e
    scf = e.m.scf
    then_region, else_region = op.regions
    # The result types are those of the flat yielded values; lower the then-branch to learn them.
    result_types = []
    for r in op.results:
        t = e.type(r.dtype)
        result_types.extend([t] * (num_elems(r.layout, r.type.shape) if r.is_array else 1))
    if_op = scf.IfOp(ctx.get(op.operands[0]), result_types, has_else=True)
    for region, block in ((then_region, if_op.then_block), (else_region, if_op.else_block)):
        e.push(e.ir.InsertionPoint(block))
        try:
            scf.yield_(lower_block(ctx, region))
        finally:
            e.pop()
    _assign(ctx, op.results, list(if_op.results))
