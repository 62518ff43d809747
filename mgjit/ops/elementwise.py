"""Elementwise ops on scalars and register arrays: Unary, Binary, Fma, Compare, Select, Cast.

Each result element comes from the operand elements at the same index, so an op's layout is its operands'
(inference picks one where they differ) and lowering maps a scalar function over the elements a thread holds.
Floating-point math follows Triton's choice: exp/log/rsqrt use the hardware approximations
(ex2/lg2/rsqrt.approx, subnormal results kept; `exp(x, ftz=True)` and exp2 drop the fix-up that costs and flush
them to zero, as a caller may choose where they cannot matter); tanh, erf, sin, cos and ** call libdevice (one
table, `_LIBDEVICE`), which the driver links into exactly the kernels that call it. bf16/f16 math is done in f32 and rounded once. Fma is one fused
multiply-add (fma.rn); clz and popc count bits within the integer's own width.
"""
from __future__ import annotations

import math

import torch

from .. import dtypes, infer, interpret, lower
from ..dtypes import DType
from ..errors import Loc
from ..interpret import numerics
from ..interpret.scheduler import Warpgroup
from ..ir import ArrayType, Op, ScalarType, Value, check, same_shape
from ..layouts import SplatLayout
from .arrays import Broadcast
from ..lower.context import num_elems, splat_to

UNARY_KINDS = ("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos", "not", "clz",
               "popc")
FTZ_UNARY = ("exp", "exp2")  # the ops that take ftz=True
FLOAT_ONLY_UNARY = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos")
INT_ONLY_UNARY = ("clz", "popc")
BINARY_KINDS = ("add", "sub", "mul", "div", "floordiv", "mod", "min", "max", "and", "or", "xor", "shl", "shr", "pow")
COMPARE_KINDS = ("lt", "le", "gt", "ge", "eq", "ne")


class Unary(Op):
    name = "unary"
    elementwise = True

    def __init__(self, kind: str, x: Value, loc: Loc | None, ftz: bool = False):
        super().__init__([x], [x.type], loc)
        self.kind = kind
        self.ftz = ftz  # exp/exp2: results below 2**-126 flush to zero (ex2.approx.ftz: no subnormal fix-up)

    def attrs(self):
        return {"kind": self.kind, "ftz": True} if self.ftz else {"kind": self.kind}

    def verify(self):
        x = self.operands[0]
        check(self.kind in UNARY_KINDS, self, f"unknown unary op {self.kind}")
        check(not self.ftz or (self.kind in FTZ_UNARY and x.dtype != dtypes.float64), self,
              f"ftz=True applies to exp and exp2 of float32 and narrower floats, got {self.kind} of {x.dtype.name}")
        if self.kind in FLOAT_ONLY_UNARY:
            check(x.dtype.is_float, self, f"{self.kind} needs a floating-point operand, got {x.dtype.name}")
        if self.kind in INT_ONLY_UNARY:
            check(x.dtype.is_int and x.dtype != dtypes.bool_, self,
                  f"{self.kind} needs an integer operand, got {x.dtype.name}")
        check(not (self.kind == "neg" and x.dtype == dtypes.bool_), self,
              "negating a bool array is not defined (as in torch): use ~x for logical not, or cast it to a "
              "number type first")


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


class Fma(Op):
    """a * b + c with one rounding."""

    name = "fma"
    elementwise = True

    def __init__(self, a: Value, b: Value, c: Value, loc: Loc | None):
        super().__init__([a, b, c], [a.type], loc)

    def verify(self):
        a, b, c = self.operands
        same_shape(self, [a, b, c])
        check(a.dtype == b.dtype == c.dtype, self,
              f"operand dtypes differ: {a.dtype.name}, {b.dtype.name} and {c.dtype.name}")
        check(a.dtype.is_float, self, f"fma needs floating-point operands, got {a.dtype.name}")


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


@infer.rule(Binary, Fma, Compare, Select)
def _infer_elementwise(op: Op, inf: infer.Inference) -> None:
    # A select's values come first: its result is one of them, and its condition (a mask built from indices and
    # loaded integers, cross-entropy's `cols == target`) adapts to their layout rather than they to its.
    order = [1, 2, 0] if isinstance(op, Select) else list(range(len(op.operands)))
    layout = inf.choose_common(op, order)
    if layout is not None:
        inf.set_layout(op.result, layout, op)


# ---------------------------------------------------------------------------------------------- lowering

# libdevice functions by (unary kind, float width); a kind missing here is computed inline.
_LIBDEVICE = {("tanh", 32): "__nv_tanhf", ("erf", 32): "__nv_erff", ("sin", 32): "__nv_sinf",
              ("cos", 32): "__nv_cosf", ("pow", 32): "__nv_powf", ("pow", 64): "__nv_pow",
              ("exp", 64): "__nv_exp", ("exp2", 64): "__nv_exp2", ("log", 64): "__nv_log", ("log2", 64): "__nv_log2",
              ("rsqrt", 64): "__nv_rsqrt", ("tanh", 64): "__nv_tanh", ("erf", 64): "__nv_erf", ("sin", 64): "__nv_sin",
              ("cos", 64): "__nv_cos"}


def _float_unary(e, kind: str, x, dtype: DType, ftz: bool = False):
    """A float unary op; narrow floats are computed in f32. ex2.approx.f32 keeps subnormal results with a fix-up
    ptxas emits around it (a compare and two multiplies: 6 instructions an exp instead of 3); ftz drops it."""
    f32 = dtypes.float32
    if dtype == dtypes.float64:
        if kind in ("neg", "abs", "sqrt"):
            return _exact_unary(e, kind, x)
        return e.libdevice(_LIBDEVICE[(kind, 64)], [x], e.type(dtype))
    if kind in ("neg", "abs"):
        return _exact_unary(e, kind, x)
    wide = e.cast(x, dtype, f32) if dtype != f32 else x
    ex2 = "ex2.approx.ftz.f32" if ftz else "ex2.approx.f32"
    if kind == "exp":
        y = e.f32_asm(ex2, e.fbinary("mul", wide, e.const(math.log2(math.e), f32)))
    elif kind == "exp2":
        y = e.f32_asm(ex2, wide)
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


def _pow(e, a, b, dtype: DType):
    """libdevice's pow (in f32 for narrow floats): negative bases with integer exponents, 0 ** 0 and the other
    special cases as C's pow has them (exp2(b * log2(a)) would make them NaN)."""
    f32 = dtypes.float32
    bits = 64 if dtype == dtypes.float64 else 32
    wide = [e.cast(x, dtype, f32) for x in (a, b)] if bits == 32 and dtype != f32 else [a, b]
    y = e.libdevice(_LIBDEVICE[("pow", bits)], wide, wide[0].type)
    return e.cast(y, f32, dtype) if bits == 32 and dtype != f32 else y


def _exact_unary(e, kind: str, x):
    if kind == "neg" and e.fp8_of(x) is None:
        return e.m.arith.negf(x)
    bits = e.ir.FloatType(x.type).width
    if kind in ("abs", "neg"):  # clear or flip the sign bit: exact for every float width, NaN payloads kept
        as_int = e.bitcast(x, e.int_type(bits))
        sign = 1 << (bits - 1)
        if kind == "neg":  # fp8 only (arith.negf has no fp8 lowering); -sign is the sign bit as a signed int
            return e.bitcast(e.m.arith.xori(as_int, e.m.arith.constant(e.int_type(bits), -sign)), x.type)
        mask = e.m.arith.constant(e.int_type(bits), sign - 1)
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
        _map(ctx, op, lambda x: _float_unary(e, op.kind, x, dtype, op.ftz))
    elif op.kind == "neg":
        _map(ctx, op, lambda x: _int_neg(e, x, dtype))
    elif op.kind == "abs":
        if dtype.is_signed:
            _map(ctx, op, lambda x: e.select(e.cmpi("slt", x, e.const(0, dtype)), e.subi(e.const(0, dtype), x), x))
        else:
            _map(ctx, op, lambda x: x)
    elif op.kind == "not":
        _map(ctx, op, lambda x: e.m.arith.xori(x, e.const(-1 if dtype != dtypes.bool_ else 1, dtype)))
    elif op.kind in INT_ONLY_UNARY:
        _map(ctx, op, lambda x: _bit_count(e, op.kind, x, dtype))
    else:
        raise op.error(f"{op.kind} is not defined for {dtype.name}")


def _int_neg(e, x, dtype: DType):
    """-x as ~x + 1 in inline PTX. ptxas 13.0 (-O3, sm_90a) drops the negation of one of three operands when it
    fuses neg.s32 (or 0 - x) into a VIMNMX3 of a max reduction: max(-x) over 4 elements per thread read one of
    them as x (GPU fuzzer, seed 8189; the SASS shows it). Written as not + add it is not fused that way."""
    width = 64 if dtype.bits == 64 else 32
    wide = x if dtype.bits == width else e.cast(x, dtype, dtypes.int64 if width == 64 else dtypes.int32)
    reg = "l" if width == 64 else "r"
    y = e.asm(f"not.b{width} $0, $1; add.s{width} $0, $0, 1;", f"={reg},{reg}", [wide], [e.int_type(width)])[0]
    return y if dtype.bits == width else e.trunc(y, dtype.bits)


def _bit_count(e, kind: str, x, dtype: DType):
    """clz.b32/b64 or popc.b32/b64 (a u32 count); narrower integers are zero-extended to 32 bits first, which
    adds 32 - width leading zeros."""
    width = 64 if dtype.bits == 64 else 32
    wide = x if dtype.bits == width else e.zext(x, 32)
    reg = "l" if width == 64 else "r"
    count = e.asm(f"{kind}.b{width} $0, $1;", f"=r,{reg}", [wide], [e.int_type(32)])[0]
    if kind == "clz" and dtype.bits < 32:
        count = e.subi(count, e.i32(32 - dtype.bits))
    return e.cast(count, dtypes.int32, dtype)


@lower.rule(Fma)
def _fma(op: Fma, ctx: lower.Context) -> None:
    e, dtype = ctx.e, op.operands[0].dtype
    f32 = dtypes.float32
    bits = 64 if dtype == dtypes.float64 else 32

    def fused(a, b, c):
        wide = [e.cast(x, dtype, f32) for x in (a, b, c)] if bits == 32 and dtype != f32 else [a, b, c]
        y = e.fma(*wide, bits=bits)
        return e.cast(y, f32, dtype) if bits == 32 and dtype != f32 else y

    _map(ctx, op, fused)


@lower.rule(Binary)
def _binary(op: Binary, ctx: lower.Context) -> None:
    e, dtype, kind = ctx.e, op.operands[0].dtype, op.kind
    if dtype.is_float:
        if kind == "div" and _divides_by_shared_values(op):
            _map(ctx, op, _divide(e, dtype))
        elif kind in ("add", "sub", "mul", "div", "min", "max"):
            _map(ctx, op, lambda a, b: e.fbinary(kind, a, b))
        elif kind == "floordiv":
            _map(ctx, op, lambda a, b: _floor(e, e.fbinary("div", a, b), dtype))
        elif kind == "mod":
            _map(ctx, op, lambda a, b: e.fbinary("sub", a, e.fbinary("mul", _floor(e, e.fbinary("div", a, b), dtype), b)))
        elif kind == "pow":
            _map(ctx, op, lambda a, b: _pow(e, a, b, dtype))
        else:
            raise op.error(f"{kind} is not defined for {dtype.name}")
    else:
        _map(ctx, op, lambda a, b: e.ibinary(kind, a, b, dtype.is_signed))


def _divide(e, dtype: DType):
    """Division by values each shared by many elements: one IEEE reciprocal per distinct value, then multiplies
    (within 1.5 ulp of division; a divide per element is a long instruction sequence). Narrow floats keep the
    reciprocal and the product in f32 and round once: a reciprocal rounded to f16 overflows for divisors under
    1/65504, and one rounded to fp8 saturates (x / 0 would be 448 * x)."""
    inverses: dict[int, object] = {}
    wide = dtypes.float32 if dtype.bits < 32 else dtype

    def divide(a, b):
        inverse = inverses.get(id(b))
        if inverse is None:
            inverse = inverses[id(b)] = e.fbinary("div", e.const(1.0, wide), e.cast(b, dtype, wide))
        return e.cast(e.fbinary("mul", e.cast(a, dtype, wide), inverse), wide, dtype)

    return divide


def _floor(e, x, dtype: DType):
    """Round toward -inf: f64 in f64 (through f32 it would lose every bit past 2**24), narrow floats in f32."""
    if dtype == dtypes.float64:
        return e.asm("cvt.rmi.f64.f64 $0, $1;", "=d,d", [x], [x.type])[0]
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
    _map(ctx, op, lambda x: ctx.e.cast(x, src, dst))


def _divides_by_shared_values(op: Binary) -> bool:
    """An array divided by values each shared by many of its elements: a scalar, a splat, or a broadcast (the
    row sums of x / x.sum(axis=1, keepdims=True)). The lowering takes one reciprocal per value and multiplies;
    the interpreter rounds the same way."""
    divisor = op.operands[1]
    return op.result.is_array and (not divisor.is_array or isinstance(divisor.layout, SplatLayout)
                                   or isinstance(divisor.owner, Broadcast))


# ---------------------------------------------------------------------------------------------- interpreter
# The same arithmetic as the lowering, in the IR's dtypes: narrow floats computed in f32 and rounded once per
# operation the lowering emits (so x / y by one value is a reciprocal, then a product, rounded once); the
# approximate ex2/lg2/rsqrt are computed exactly in f32 (the hardware's are within 2 ulp of that).

_LOG2E, _LN2 = math.log2(math.e), math.log(2.0)
_F32_NORMAL = 2.0 ** -126  # the smallest normal float32


def _sqrt_rn(w: torch.Tensor) -> torch.Tensor:
    """sqrt.rn: correctly rounded, as IEEE and the GPU's sqrt are. torch's CPU sqrt is not (one f32 or f64 value
    in 150 is an ulp off: sqrt(2.0) gives 1.414213562373095); numpy's is the processor's."""
    import numpy as np
    with np.errstate(invalid="ignore"):
        return torch.from_numpy(np.asarray(np.sqrt(w.contiguous().numpy())))  # a scalar's is a numpy scalar

_F32_UNARY = {
    "exp": lambda w: torch.exp2(w * numerics.constant(_LOG2E, dtypes.float32)),
    "exp2": torch.exp2, "log": lambda w: torch.log2(w) * numerics.constant(_LN2, dtypes.float32),
    "log2": torch.log2, "rsqrt": torch.rsqrt, "sqrt": _sqrt_rn, "tanh": torch.tanh, "erf": torch.erf,
    "sin": torch.sin, "cos": torch.cos}
_F64_UNARY = {**_F32_UNARY, "exp": torch.exp, "log": torch.log}
_FLOAT_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "min": torch.minimum,
                 "max": torch.maximum}


def _float_unary_value(kind: str, x: torch.Tensor, dtype: DType, ftz: bool = False) -> torch.Tensor:
    if kind in ("neg", "abs"):
        # The sign bit, as the lowering flips or clears it: exact, an e5m2 infinity kept (not saturated as a
        # rounding to fp8 is). fp8 goes through f32, which torch has arithmetic for.
        w = numerics.widen(x, dtype) if dtype.bits == 8 else x
        return (-w if kind == "neg" else w.abs()).to(numerics.torch_dtype(dtype))
    table = _F64_UNARY if dtype == dtypes.float64 else _F32_UNARY
    y = table[kind](numerics.widen(x, dtype))
    if ftz:  # ex2.approx.ftz: a subnormal f32 result is +0
        y = torch.where(y < _F32_NORMAL, torch.zeros_like(y), y)
    return numerics.round_float(y, dtype)


def _float_op(kind: str, a: torch.Tensor, b: torch.Tensor, dtype: DType) -> torch.Tensor:
    return numerics.round_float(_FLOAT_BINARY[kind](numerics.widen(a, dtype), numerics.widen(b, dtype)), dtype)


def _floor_value(x: torch.Tensor, dtype: DType) -> torch.Tensor:
    if dtype == dtypes.float64:
        return x.floor()  # cvt.rmi.f64.f64
    return numerics.round_float(x.to(torch.float32).floor(), dtype)  # cvt.rmi.f32.f32, as `_floor` lowers it


def _wrap(x: torch.Tensor, dtype: DType) -> torch.Tensor:
    """An int64 result as the `dtype`-wide integer the hardware keeps (two's complement wrap-around)."""
    if dtype.bits < 64:
        x = x & ((1 << dtype.bits) - 1)
        if dtype.is_signed:
            x = torch.where(x >= 1 << (dtype.bits - 1), x - (1 << dtype.bits), x)
    return x.to(numerics.torch_dtype(dtype))


def _int_binary_value(kind: str, a: torch.Tensor, b: torch.Tensor, dtype: DType) -> torch.Tensor:
    """arith's integer ops on `dtype` (signed ops for signed types), with PTX's answers where arith has none: a
    shift by the width or more clamps to the width, a division by zero gives all ones and leaves the dividend
    as the remainder."""
    a, b = a.to(torch.int64), b.to(torch.int64)
    bits = dtype.bits
    if kind in ("floordiv", "mod"):
        special = (b == 0) | (b == -1)
        q = torch.div(a, torch.where(special, 1, b), rounding_mode="trunc")  # divsi/divui: toward zero
        if kind == "floordiv":
            return _wrap(torch.where(b == 0, -1, torch.where(b == -1, 0 - a, q)), dtype)
        return _wrap(torch.where(b == 0, a, torch.where(b == -1, 0, a - q * b)), dtype)
    if kind in ("shl", "shr"):
        amount = torch.where((b < 0) | (b >= bits), bits, b)
        if kind == "shl":
            return _wrap(torch.where(amount >= bits, 0, a << amount.clamp(max=63)), dtype)
        if dtype.is_signed:
            return _wrap(a >> amount.clamp(max=bits - 1), dtype)
        return _wrap(torch.where(amount >= bits, 0, a >> amount.clamp(max=63)), dtype)
    table = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "and": torch.bitwise_and,
             "or": torch.bitwise_or, "xor": torch.bitwise_xor, "min": torch.minimum, "max": torch.maximum}
    return _wrap(table[kind](a, b), dtype)


@interpret.rule(Unary)
def _interp_unary(op: Unary, wg: Warpgroup) -> None:
    x, dtype = wg.get(op.operands[0], op), op.operands[0].dtype
    if dtype.is_float:
        y = _float_unary_value(op.kind, x, dtype, op.ftz)
    elif op.kind == "neg":
        y = _int_binary_value("sub", torch.zeros_like(x), x, dtype)
    elif op.kind == "abs":
        y = _int_binary_value("sub", torch.zeros_like(x), x, dtype).where(x < 0, x) if dtype.is_signed else x
    elif op.kind == "not":
        y = torch.bitwise_not(x)
    elif op.kind in INT_ONLY_UNARY:
        y = _bit_count_value(op.kind, x, dtype)
    else:
        raise op.error(f"{op.kind} is not defined for {dtype.name}")
    wg.set(op.result, y)


def _bit_count_value(kind: str, x: torch.Tensor, dtype: DType) -> torch.Tensor:
    bits = x.to(torch.int64)
    if dtype.bits < 64:
        bits = bits & ((1 << dtype.bits) - 1)
    ones = [(bits >> i) & 1 for i in range(dtype.bits)]  # lowest first
    if kind == "popc":
        count = torch.stack(ones).sum(0)
    else:  # leading zeros: the width minus one past the highest set bit
        highest = torch.full_like(bits, -1)
        for i, bit in enumerate(ones):
            highest = torch.where(bit == 1, i, highest)
        count = dtype.bits - 1 - highest
    return count.to(numerics.torch_dtype(dtype))


@interpret.rule(Fma)
def _interp_fma(op: Fma, wg: Warpgroup) -> None:
    a, b, c = (wg.get(v, op) for v in op.operands)
    wg.set(op.result, numerics.fused_multiply_add(a, b, c, op.operands[0].dtype))


@interpret.rule(Binary)
def _interp_binary(op: Binary, wg: Warpgroup) -> None:
    a, b = (wg.get(v, op) for v in op.operands)
    dtype, kind = op.operands[0].dtype, op.kind
    if not dtype.is_float:
        wg.set(op.result, _int_binary_value(kind, a, b, dtype))
        return
    if kind == "div" and _divides_by_shared_values(op):
        w = numerics.widen(b, dtype)  # the reciprocal and the product in f32 (f64), rounded once
        y = numerics.round_float(numerics.widen(a, dtype) * (torch.ones_like(w) / w), dtype)
    elif kind in _FLOAT_BINARY:
        y = _float_op(kind, a, b, dtype)
    elif kind == "floordiv":
        y = _floor_value(_float_op("div", a, b, dtype), dtype)
    elif kind == "mod":
        y = _float_op("sub", a, _float_op("mul", _floor_value(_float_op("div", a, b, dtype), dtype), b, dtype), dtype)
    elif kind == "pow":
        y = numerics.round_float(torch.pow(numerics.widen(a, dtype), numerics.widen(b, dtype)), dtype)
    else:
        raise op.error(f"{kind} is not defined for {dtype.name}")
    wg.set(op.result, y)


_COMPARE = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}


@interpret.rule(Compare)
def _interp_compare(op: Compare, wg: Warpgroup) -> None:
    dtype = op.operands[0].dtype
    wg.set(op.result, _COMPARE[op.kind](*(numerics.widen(wg.get(v, op), dtype) for v in op.operands)))


@interpret.rule(Select)
def _interp_select(op: Select, wg: Warpgroup) -> None:
    cond, a, b = (wg.get(v, op) for v in op.operands)
    wg.set(op.result, torch.where(cond, a, b))


@interpret.rule(Cast)
def _interp_cast(op: Cast, wg: Warpgroup) -> None:
    wg.set(op.result, numerics.cast(wg.get(op.operands[0], op), op.operands[0].dtype, op.result.dtype))
