"""Elementwise ops on scalars and register arrays: Unary, Binary, Compare, Select, Cast.

Each result element comes from the operand elements at the same index, so an op's layout is its operands'
(inference picks one where they differ) and lowering maps a scalar function over the elements a thread holds.
Floating-point math follows Triton's choice: exp/log/rsqrt use the hardware approximations
(ex2/lg2/rsqrt.approx); tanh, erf, sin and cos call libdevice (one table, `_LIBDEVICE`), which the driver
links into exactly the kernels that call it. bf16/f16 math is done in f32 and rounded once.
"""
from __future__ import annotations

import collections
import math

from .. import dtypes, infer, lower
from ..dtypes import DType
from ..errors import Loc
from ..ir import ArrayType, Op, ScalarType, Value, check, same_shape
from ..layouts import SplatLayout
from ..lower.context import num_elems, splat_to

UNARY_KINDS = ("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos", "not")
FLOAT_ONLY_UNARY = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos")
BINARY_KINDS = ("add", "sub", "mul", "div", "floordiv", "mod", "min", "max", "and", "or", "xor", "shl", "shr", "pow")
COMPARE_KINDS = ("lt", "le", "gt", "ge", "eq", "ne")


class Unary(Op):
    name = "unary"
    elementwise = True

    def __init__(self, kind: str, x: Value, loc: Loc | None):
        super().__init__([x], [x.type], loc)
        self.kind = kind

    def attrs(self):
        return {"kind": self.kind}

    def verify(self):
        x = self.operands[0]
        check(self.kind in UNARY_KINDS, self, f"unknown unary op {self.kind}")
        if self.kind in FLOAT_ONLY_UNARY:
            check(x.dtype.is_float, self, f"{self.kind} needs a floating-point operand, got {x.dtype.name}")


class Binary(Op):
    name = "binary"
    elementwise = True

    def __init__(self, kind: str, a: Value, b: Value, loc: Loc | None):
        super().__init__([a, b], [a.type], loc)
        self.kind = kind

    def attrs(self):
        return {"kind": self.kind}

    def verify(self):
        a, b = self.operands
        check(self.kind in BINARY_KINDS, self, f"unknown binary op {self.kind}")
        same_shape(self, [a, b])
        check(a.dtype == b.dtype, self, f"operand dtypes differ: {a.dtype.name} and {b.dtype.name}")
        if self.kind in ("and", "or", "xor", "shl", "shr"):
            check(a.dtype.is_int, self, f"{self.kind} needs integer operands, got {a.dtype.name}")


class Compare(Op):
    name = "compare"
    elementwise = True

    def __init__(self, kind: str, a: Value, b: Value, loc: Loc | None):
        rtype = ArrayType(a.type.shape, dtypes.bool_) if a.is_array else ScalarType(dtypes.bool_)
        super().__init__([a, b], [rtype], loc)
        self.kind = kind

    def attrs(self):
        return {"kind": self.kind}

    def verify(self):
        a, b = self.operands
        check(self.kind in COMPARE_KINDS, self, f"unknown comparison {self.kind}")
        same_shape(self, [a, b])
        check(a.dtype == b.dtype, self, f"operand dtypes differ: {a.dtype.name} and {b.dtype.name}")


class Select(Op):
    name = "select"
    elementwise = True

    def __init__(self, cond: Value, a: Value, b: Value, loc: Loc | None):
        super().__init__([cond, a, b], [a.type], loc)

    def verify(self):
        cond, a, b = self.operands
        check(cond.dtype == dtypes.bool_, self, f"the condition of where must be bool, got {cond.dtype.name}")
        same_shape(self, [cond, a, b])
        check(a.dtype == b.dtype, self, f"where's branches differ in dtype: {a.dtype.name} and {b.dtype.name}")


class Cast(Op):
    name = "cast"
    elementwise = True

    def __init__(self, x: Value, dtype: DType, loc: Loc | None):
        rtype = ArrayType(x.type.shape, dtype) if x.is_array else ScalarType(dtype)
        super().__init__([x], [rtype], loc)

    def attrs(self):
        return {"to": self.results[0].dtype.name}


@infer.rule(Unary, Cast)
def _infer_same_as_operand(op: Op, inf: infer.Inference) -> None:
    if op.result.is_array:
        inf.set_layout(op.result, op.operands[0].layout, op)


@infer.rule(Binary, Compare, Select)
def _infer_elementwise(op: Op, inf: infer.Inference) -> None:
    layout = inf.choose_common(op, list(range(len(op.operands))))
    if layout is not None:
        inf.set_layout(op.result, layout, op)


# ---------------------------------------------------------------------------------------------- lowering

# libdevice functions by (unary kind, float width); a kind missing here is computed inline.
_LIBDEVICE = {("tanh", 32): "__nv_tanhf", ("erf", 32): "__nv_erff", ("sin", 32): "__nv_sinf",
              ("cos", 32): "__nv_cosf",
              ("exp", 64): "__nv_exp", ("exp2", 64): "__nv_exp2", ("log", 64): "__nv_log", ("log2", 64): "__nv_log2",
              ("rsqrt", 64): "__nv_rsqrt", ("tanh", 64): "__nv_tanh", ("erf", 64): "__nv_erf", ("sin", 64): "__nv_sin",
              ("cos", 64): "__nv_cos"}


def _float_unary(e, kind: str, x, dtype: DType):
    """A float unary op; narrow floats are computed in f32."""
    f32 = dtypes.float32
    if dtype == dtypes.float64:
        if kind in ("neg", "abs", "sqrt"):
            return _exact_unary(e, kind, x)
        return e.libdevice(_LIBDEVICE[(kind, 64)], [x], e.type(dtype))
    if kind in ("neg", "abs"):
        return _exact_unary(e, kind, x)
    wide = e.cast(x, dtype, f32) if dtype != f32 else x
    if kind == "exp":
        y = e.f32_asm("ex2.approx.f32", e.fbinary("mul", wide, e.const(math.log2(math.e), f32)))
    elif kind == "exp2":
        y = e.f32_asm("ex2.approx.f32", wide)
    elif kind == "log":
        y = e.fbinary("mul", e.f32_asm("lg2.approx.f32", wide), e.const(math.log(2.0), f32))
    elif kind == "log2":
        y = e.f32_asm("lg2.approx.f32", wide)
    elif kind == "rsqrt":
        y = e.f32_asm("rsqrt.approx.f32", wide)
    elif kind == "sqrt":
        y = _exact_unary(e, "sqrt", wide)
    else:
        y = e.libdevice(_LIBDEVICE[(kind, 32)], [wide], e.type(f32))
    return e.cast(y, f32, dtype) if dtype != f32 else y


def _exact_unary(e, kind: str, x):
    if kind == "neg":
        return e.m.arith.negf(x)
    bits = e.ir.FloatType(x.type).width
    if kind == "abs":  # clear the sign bit: exact for every float width, NaN payloads kept
        as_int = e.bitcast(x, e.int_type(bits))
        mask = e.m.arith.constant(e.int_type(bits), (1 << (bits - 1)) - 1)
        return e.bitcast(e.andi(as_int, mask), x.type)
    reg = {32: "f", 64: "d"}[bits]
    return e.asm(f"sqrt.rn.f{bits} $0, $1;", f"={reg},{reg}", [x], [x.type])[0]


def _map(ctx: lower.Context, op: Op, fn) -> None:
    """Apply `fn(*scalars)` elementwise over the op's operands (scalars or arrays) to make its result."""
    out = op.results[0]
    lowered = [ctx.get(v) for v in op.operands]
    if not out.is_array:
        ctx.set(out, fn(*lowered))
        return
    layout = out.layout
    if isinstance(layout, SplatLayout):
        ctx.set(out, lower.Frag(layout, out.type.shape, out.dtype, [fn(*(f.elems[0] for f in lowered))]))
        return
    frags = [splat_to(ctx, f, layout) if f.is_splat else f for f in lowered]
    for f in frags:
        assert f.layout == layout, f"internal error: {op.name} operand layout {f.layout} != {layout}"
    n = num_elems(layout, out.type.shape)
    ctx.set(out, lower.Frag(layout, out.type.shape, out.dtype, [fn(*(f.elems[i] for f in frags)) for i in range(n)]))


@lower.rule(Unary)
def _unary(op: Unary, ctx: lower.Context) -> None:
    e, dtype = ctx.e, op.operands[0].dtype
    if dtype.is_float:
        _map(ctx, op, lambda x: _float_unary(e, op.kind, x, dtype))
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


@lower.rule(Binary)
def _binary(op: Binary, ctx: lower.Context) -> None:
    e, dtype, kind = ctx.e, op.operands[0].dtype, op.kind
    if dtype.is_float:
        if kind == "div" and op.result.is_array:
            _map(ctx, op, _divide(e, ctx.frag(op.operands[1]), dtype))
        elif kind in ("add", "sub", "mul", "div", "min", "max"):
            _map(ctx, op, lambda a, b: e.fbinary(kind, a, b))
        elif kind == "floordiv":
            _map(ctx, op, lambda a, b: _floor(e, e.fbinary("div", a, b), dtype))
        elif kind == "mod":
            _map(ctx, op, lambda a, b: e.fbinary("sub", a, e.fbinary("mul", _floor(e, e.fbinary("div", a, b), dtype), b)))
        elif kind == "pow":
            _map(ctx, op, lambda a, b: _float_unary(e, "exp2", e.fbinary("mul", b, _float_unary(e, "log2", a, dtype)),
                                                    dtype))
        else:
            raise op.error(f"{kind} is not defined for {dtype.name}")
    else:
        _map(ctx, op, lambda a, b: e.ibinary(kind, a, b, dtype.is_signed))


def _divide(e, divisor: lower.Frag, dtype: DType):
    """Elementwise division that divides once per divisor value shared by several elements (a splat, the
    broadcast of a row's reduction, as in x / x.sum(axis=1, keepdims=True)): one IEEE reciprocal, then
    multiplies, within 1.5 ulp of division; a divide per element is a long instruction sequence. A divisor used
    by one element only is divided by as written."""
    uses = collections.Counter(id(v) for v in divisor.elems)
    shared = divisor.is_splat or max(uses.values()) > 1
    inverses: dict[int, object] = {}

    def divide(a, b):
        if not shared or uses[id(b)] == 1 and not divisor.is_splat:
            return e.fbinary("div", a, b)
        inverse = inverses.get(id(b))
        if inverse is None:
            inverse = inverses[id(b)] = e.fbinary("div", e.const(1.0, dtype), b)
        return e.fbinary("mul", a, inverse)

    return divide


def _floor(e, x, dtype: DType):
    f32 = dtypes.float32
    wide = e.cast(x, dtype, f32) if dtype != f32 else x
    y = e.f32_asm("cvt.rmi.f32.f32", wide)
    return e.cast(y, f32, dtype) if dtype != f32 else y


_FLOAT_PRED = {"lt": "OLT", "le": "OLE", "gt": "OGT", "ge": "OGE", "eq": "OEQ", "ne": "UNE"}


@lower.rule(Compare)
def _compare(op: Compare, ctx: lower.Context) -> None:
    e, dtype = ctx.e, op.operands[0].dtype
    if dtype.is_float:
        _map(ctx, op, lambda a, b: e.cmpf(_FLOAT_PRED[op.kind], a, b))
    else:
        prefix = "s" if dtype.is_signed else "u"
        pred = op.kind if op.kind in ("eq", "ne") else prefix + op.kind
        _map(ctx, op, lambda a, b: e.cmpi(pred, a, b))


@lower.rule(Select)
def _select(op: Select, ctx: lower.Context) -> None:
    _map(ctx, op, ctx.e.select)


@lower.rule(Cast)
def _cast(op: Cast, ctx: lower.Context) -> None:
    src, dst = op.operands[0].dtype, op.result.dtype
    for d in (src, dst):
        if d.bits == 8 and d.is_float:
            raise op.error(f"casts to and from {d.name} in register arrays are not supported yet")
    _map(ctx, op, lambda x: ctx.e.cast(x, src, dst))
