"""Lowering rules for scalars, kernel geometry and elementwise ops on scalars and register arrays."""
from __future__ import annotations

from .. import dtypes, ir
from ..dtypes import DType
from ..layouts import SplatLayout, TiledLayout
from .core import Context, Frag, element_offsets, num_elems, rule, splat_to


def _map(ctx: Context, op: ir.Op, fn) -> None:
    """Apply `fn(*scalars)` elementwise over the op's operands (scalars or arrays) to make its result."""
    out = op.results[0]
    lowered = [ctx.get(v) for v in op.operands]
    if not out.is_array:
        ctx.set(out, fn(*lowered))
        return
    layout = out.layout
    if isinstance(layout, SplatLayout):
        ctx.set(out, Frag(layout, out.type.shape, out.dtype, [fn(*(f.elems[0] for f in lowered))]))
        return
    frags = [splat_to(ctx, f, layout) if f.is_splat else f for f in lowered]
    for f in frags:
        assert f.layout == layout, f"internal error: {op.name} operand layout {f.layout} != {layout}"
    n = num_elems(layout, out.type.shape)
    ctx.set(out, Frag(layout, out.type.shape, out.dtype, [fn(*(f.elems[i] for f in frags)) for i in range(n)]))


@rule(ir.Constant)
def _constant(op: ir.Constant, ctx: Context) -> None:
    ctx.set(op.result, ctx.e.const(op.value, op.result.dtype))


@rule(ir.ProgramId)
def _program_id(op: ir.ProgramId, ctx: Context) -> None:
    ctx.set(op.result, ctx.e.ctaid(op.axis))


@rule(ir.NumPrograms)
def _num_programs(op: ir.NumPrograms, ctx: Context) -> None:
    ctx.set(op.result, ctx.e.nctaid(op.axis))


@rule(ir.WarpgroupId)
def _warpgroup_id(op: ir.WarpgroupId, ctx: Context) -> None:
    ctx.set(op.result, ctx.wg_id)


@rule(ir.RefDim)
def _ref_dim(op: ir.RefDim, ctx: Context) -> None:
    ctx.set(op.result, ctx.get(op.operands[0]).sizes[op.axis])


@rule(ir.Unary)
def _unary(op: ir.Unary, ctx: Context) -> None:
    e, dtype = ctx.e, op.operands[0].dtype
    if dtype.is_float:
        if op.kind in ("tanh", "erf", "sin", "cos") or dtype == dtypes.float64:
            ctx.uses_libdevice = True
        _map(ctx, op, lambda x: e.unary_float(op.kind, x, dtype))
    elif op.kind == "neg":
        _map(ctx, op, lambda x: e.subi(e.const(0, dtype), x))
    elif op.kind == "abs":
        if dtype.is_signed:
            _map(ctx, op, lambda x: e.select(e.cmpi("slt", x, e.const(0, dtype)), e.subi(e.const(0, dtype), x), x))
        else:
            _map(ctx, op, lambda x: x)
    elif op.kind == "not":
        _map(ctx, op, lambda x: e.m.arith.xori(x, e.const(-1 if dtype != dtypes.bool_ else 1, dtype)))
    else:
        raise op.error(f"{op.kind} is not defined for {dtype.name}")


@rule(ir.Binary)
def _binary(op: ir.Binary, ctx: Context) -> None:
    e, dtype, kind = ctx.e, op.operands[0].dtype, op.kind
    if dtype.is_float:
        divisor = ctx.get(op.operands[1])
        if kind == "div" and op.result.is_array and (not op.operands[1].is_array or divisor.is_splat):
            # Dividing an array by one value: one IEEE reciprocal, then multiplies (within 1.5 ulp of
            # division; a divide per element is a long instruction sequence).
            scalar = divisor if not op.operands[1].is_array else divisor.elems[0]
            inverse = e.fbinary("div", e.const(1.0, dtype), scalar)
            _map(ctx, op, lambda a, b: e.fbinary("mul", a, inverse))
        elif kind in ("add", "sub", "mul", "div", "min", "max"):
            _map(ctx, op, lambda a, b: e.fbinary(kind, a, b))
        elif kind == "floordiv":
            _map(ctx, op, lambda a, b: _floor(e, e.fbinary("div", a, b), dtype))
        elif kind == "mod":
            _map(ctx, op, lambda a, b: e.fbinary("sub", a, e.fbinary("mul", _floor(e, e.fbinary("div", a, b), dtype), b)))
        elif kind == "pow":
            ctx.uses_libdevice = ctx.uses_libdevice or dtype == dtypes.float64
            _map(ctx, op, lambda a, b: e.unary_float("exp2", e.fbinary("mul", b, e.unary_float("log2", a, dtype)), dtype))
        else:
            raise op.error(f"{kind} is not defined for {dtype.name}")
    else:
        _map(ctx, op, lambda a, b: e.ibinary(kind, a, b, dtype.is_signed))


def _floor(e, x, dtype: DType):
    f32 = dtypes.float32
    wide = e.cast(x, dtype, f32) if dtype != f32 else x
    y = e.f32_asm("cvt.rmi.f32.f32", wide)
    return e.cast(y, f32, dtype) if dtype != f32 else y


_FLOAT_PRED = {"lt": "OLT", "le": "OLE", "gt": "OGT", "ge": "OGE", "eq": "OEQ", "ne": "UNE"}


@rule(ir.Compare)
def _compare(op: ir.Compare, ctx: Context) -> None:
    e, dtype = ctx.e, op.operands[0].dtype
    if dtype.is_float:
        _map(ctx, op, lambda a, b: e.cmpf(_FLOAT_PRED[op.kind], a, b))
    else:
        prefix = "s" if dtype.is_signed else "u"
        pred = op.kind if op.kind in ("eq", "ne") else prefix + op.kind
        _map(ctx, op, lambda a, b: e.cmpi(pred, a, b))


@rule(ir.Select)
def _select(op: ir.Select, ctx: Context) -> None:
    _map(ctx, op, ctx.e.select)


@rule(ir.Cast)
def _cast(op: ir.Cast, ctx: Context) -> None:
    src, dst = op.operands[0].dtype, op.result.dtype
    for d in (src, dst):
        if d.bits == 8 and d.is_float:
            raise op.error(f"casts to and from {d.name} in register arrays are not supported yet")
    _map(ctx, op, lambda x: ctx.e.cast(x, src, dst))


@rule(ir.Splat)
def _splat(op: ir.Splat, ctx: Context) -> None:
    ctx.set(op.result, Frag(op.result.layout, op.result.type.shape, op.result.dtype, [ctx.get(op.operands[0])]))


@rule(ir.Iota)
def _iota(op: ir.Iota, ctx: Context) -> None:
    out = op.result
    layout, shape, e = out.layout, out.type.shape, ctx.e
    base = e.addi(ctx.thread_index(layout, shape)[0], e.i32(op.start))
    elems = [e.addi(base, e.i32(off[0])) for off in element_offsets(layout, shape)]
    ctx.set(out, Frag(layout, shape, out.dtype, elems))


@rule(ir.Broadcast)
def _broadcast(op: ir.Broadcast, ctx: Context) -> None:
    """The operand's layout is the result's layout reduced over the new axes (inference guarantees it), so
    each result element is found among the thread's own operand elements: no data moves."""
    src = ctx.frag(op.operands[0])
    out = op.result
    if src.is_splat:
        ctx.set(out, Frag(out.layout, out.type.shape, out.dtype, [src.elems[0]]))
        return
    layout: TiledLayout = out.layout
    shape = out.type.shape
    src_shape = src.shape
    position = {off: i for i, off in enumerate(element_offsets(src.layout, src_shape))}
    elems = []
    for off in element_offsets(layout, shape):
        src_off = tuple(off[d] for d in op.dims)
        i = position.get(src_off)
        if i is None:
            raise op.error(f"internal error: broadcast source layout {src.layout} does not hold element {src_off}")
        elems.append(src.elems[i])
    ctx.set(out, Frag(layout, shape, out.dtype, elems))
