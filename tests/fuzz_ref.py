"""The reference semantics of a fuzz program (fuzz_gen.Program), written from the language's definition, not
from mgjit's code: the program's tree evaluated in torch, in the kernel's dtypes, with for every element a
bound on how far a correct implementation may be from it.

Values are `V(x, err, dtype)`: x a tensor of the dtype (0-d for scalars), err a float64 tensor of the same
shape. err 0: every correct implementation gets exactly x (integer ops, casts, loads, and the IEEE float ops
+ - * min max sqrt, computed as the language defines them: narrow floats in f32 and rounded once per op).
err > 0: it may differ by that much (float sums, whose order is free; division, which may be a reciprocal and
a product; exp/log/... which the GPU approximates: ERROR says by how much). err inf: unknown (an inexact value
flowed through a discontinuity: a comparison, a float to int cast, a floor), not compared. A runtime branch,
loop bound or window start that is unknown makes the whole program `Uncertain`.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from fuzz_program import (BF16, BOOL, E4M3, E5M2, F16, F32, F64, I32, I64, Helper, Node, Program, Stmt,
                      promote)
from mgjit.dtypes import DType

F64T = torch.float64
# (precision bits with the hidden one, minimum normal exponent, largest finite value) per float dtype.
FLOAT_FORMAT = {F32: (24, -126, 3.4028234663852886e38), F16: (11, -14, 65504.0),
                BF16: (8, -126, 3.3895313892515355e38), E4M3: (4, -6, 448.0), E5M2: (3, -14, 57344.0),
                F64: (53, -1022, 1.7976931348623157e308)}
# How far the GPU's exp/log/... may be from the true function: (relative, absolute) in units of 2**-23 (f32
# and narrower, whose math is done in f32) or 2**-52 (f64, libdevice). ex2/lg2/rsqrt.approx are within 2 ulp;
# exp(x) is ex2(x * log2(e)) and log(x) is lg2(x) * ln(2), whose f32 product adds x's size in ulps.
ERROR = {"exp": (2, 0), "exp2": (2, 0), "log": (2, 2), "log2": (2, 2), "rsqrt": (2, 0), "tanh": (2, 1),
         "erf": (2, 1), "sin": (2, 1), "cos": (2, 1)}
MATH = {"exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2, "sqrt": torch.sqrt,
        "rsqrt": torch.rsqrt, "tanh": torch.tanh, "erf": torch.erf, "sin": torch.sin, "cos": torch.cos}
# |f'| over an interval [lo, hi] of the argument, for propagating an input's error.
SLOPE = {"exp": lambda lo, hi: torch.exp(hi), "exp2": lambda lo, hi: torch.exp2(hi) * math.log(2),
         "log": lambda lo, hi: 1 / lo, "log2": lambda lo, hi: 1 / (lo * math.log(2)),
         "sqrt": lambda lo, hi: 0.5 / torch.sqrt(lo), "rsqrt": lambda lo, hi: 0.5 * lo ** -1.5,
         "tanh": lambda lo, hi: torch.ones_like(lo), "erf": lambda lo, hi: torch.full_like(lo, 1.13),
         "sin": lambda lo, hi: torch.ones_like(lo), "cos": lambda lo, hi: torch.ones_like(lo)}


class Uncertain(Exception):
    """A branch, loop bound or window start depends on an inexact value: the reference cannot follow it."""


class V:
    __slots__ = ("x", "err", "dtype")

    def __init__(self, x: torch.Tensor, dtype: DType, err: torch.Tensor | None = None):
        self.x = x
        self.dtype = dtype
        self.err = torch.zeros(x.shape, dtype=F64T) if err is None else err

    @property
    def exact(self) -> bool:
        return not bool((self.err != 0).any())


def torch_dtype(d: DType) -> torch.dtype:
    return getattr(torch, d.torch_name)


def ulp(x: torch.Tensor, d: DType) -> torch.Tensor:
    """The spacing of dtype d's values at |x| (inf where x is not finite)."""
    p, emin, _ = FLOAT_FORMAT[d]
    x = x.to(F64T).abs()
    _, e = torch.frexp(x)
    e = torch.clamp(e - 1, min=emin)
    out = torch.ldexp(torch.ones_like(x), (e - (p - 1)).to(torch.int32))
    return torch.where(torch.isfinite(x), out, torch.full_like(x, math.inf))


def finish(x: torch.Tensor, d: DType, err: torch.Tensor) -> V:
    """A float result: where it is inexact and near overflow (or not finite), unknown."""
    if d.is_float:
        x64 = x.to(F64T)
        risky = (err > 0) & (~torch.isfinite(x64) | (x64.abs() + err >= FLOAT_FORMAT[d][2]) | torch.isnan(err))
        err = torch.where(risky, torch.full_like(err, math.inf), err)
    return V(x, d, err)


def round_to(x: torch.Tensor, d: DType) -> torch.Tensor:
    """A float tensor rounded to float dtype d (nearest even; fp8 saturates all but NaN, infinities too, as
    cvt.rn.satfinite does: the only conversion to fp8 there is)."""
    if d in (E4M3, E5M2):
        big = FLOAT_FORMAT[d][2]
        x = torch.where(torch.isnan(x), x, x.clamp(-big, big))
    return x.to(torch_dtype(d))


def wrap(x: torch.Tensor, d: DType) -> torch.Tensor:
    """int64 values as dtype d keeps them (two's complement wrap-around; bool: nonzero)."""
    if d == BOOL:
        return x != 0
    if d.bits < 64:
        x = x & ((1 << d.bits) - 1)
        if d.is_signed:
            x = torch.where(x >= 1 << (d.bits - 1), x - (1 << d.bits), x)
    return x.to(torch_dtype(d))


def unknown_where(v: V, mask: torch.Tensor) -> V:
    return V(v.x, v.dtype, torch.where(mask, torch.full_like(v.err, math.inf), v.err))


# ---------------------------------------------------------------------------------------------- casts

def weak_to(value: Any, like: DType) -> V:
    """A Python number in an operation with an array of dtype `like`: it takes `like` within its kind (a
    float literal with an integer array is float32; an int with a bool array int32)."""
    if isinstance(value, bool):
        d = BOOL
    elif isinstance(value, int):
        d = like if like != BOOL else (I32 if -2 ** 31 <= value < 2 ** 31 else I64)
    else:
        d = like if like.is_float else F32
    if d.is_float:
        return V(round_to(torch.tensor(float(value), dtype=F64T), d), d)
    return V(wrap(torch.tensor(int(value)), d), d)


def cast(v: V, d: DType) -> V:
    s = v.dtype
    if s == d:
        return v
    if d == BOOL:
        out = V(v.x != 0, d)
        return unknown_where(out, (v.err > 0) & (v.x.to(F64T).abs() <= v.err)) if s.is_float else \
            unknown_where(out, v.err > 0)
    if s.is_float and not d.is_float:
        x64 = v.x.to(F64T)
        out = V(float_to_int(x64, d), d)
        spread = float_to_int(x64 - v.err, d) != float_to_int(x64 + v.err, d)
        return unknown_where(out, (v.err > 0) & (spread | torch.isnan(v.err)))
    if d.is_float:
        x64 = v.x.to(F64T) if s.is_float else v.x.to(torch.int64).to(F64T)
        out = round_to(x64, d)
        # f64 and wide integers reach narrow floats through f32 in places: one rounding more, half an ulp.
        double = (s == F64 or not s.is_float) and d.bits < 32 or (not s.is_float and s.bits == 64 and d == F32)
        err = torch.where(v.err > 0, v.err + ulp(out, d), v.err)
        if double:
            err = err + ulp(out, d)
        return finish(out, d, torch.where(torch.isnan(out.to(F64T)) & (v.err == 0), torch.zeros_like(err), err))
    return V(wrap(v.x.to(torch.int64), d), d, v.err.clone())


def float_to_int(x: torch.Tensor, d: DType) -> torch.Tensor:
    """Toward zero, saturating, NaN to 0 (cvt.rzi.sat)."""
    lo, hi = (-2 ** (d.bits - 1), 2 ** (d.bits - 1) - 1) if d.is_signed else (0, 2 ** d.bits - 1)
    t = torch.nan_to_num(x.trunc(), nan=0.0)
    out = torch.where(t >= float(hi), torch.tensor(hi), torch.where(t <= float(lo), torch.tensor(lo),
                                                                     t.clamp(-2.0 ** 63, 2.0 ** 63 - 1024).to(torch.int64)))
    return out.to(torch_dtype(d))


def operands(a: Any, b: Any) -> tuple[V, V]:
    if not isinstance(a, V):
        a = weak_to(a, b.dtype)
    if not isinstance(b, V):
        b = weak_to(b, a.dtype)
    d = promote(a.dtype, b.dtype)
    return cast(a, d), cast(b, d)


def compute(v: V) -> torch.Tensor:
    """The value as arithmetic on its dtype works on it: f32 for narrow floats, int64 for integers."""
    if v.dtype.is_float:
        return v.x.to(F64T if v.dtype == F64 else torch.float32)
    return v.x.to(torch.int64)


# ---------------------------------------------------------------------------------------------- arithmetic

def binary(kind: str, a: Any, b: Any) -> Any:
    if not isinstance(a, V) and not isinstance(b, V):
        return {"add": a + b, "sub": a - b, "mul": a * b}[kind]
    if kind == "cdiv":
        return binary("floordiv", binary("sub", binary("add", a, b), 1), b)
    a, b = operands(a, b)
    d = a.dtype
    if kind == "div" and not d.is_float:
        a, b = cast(a, F32), cast(b, F32)
        d = F32
    if d == BOOL:
        kind = {"add": "or", "mul": "and", "min": "and", "max": "or"}.get(kind, kind)
        x = {"and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor}[kind](a.x, b.x)
        return unknown_where(V(x, d), (a.err > 0) | (b.err > 0))
    if not d.is_float:
        return unknown_where(V(int_binary(kind, compute(a), compute(b), d), d), (a.err > 0) | (b.err > 0))
    return float_binary(kind, a, b, d)


def int_binary(kind: str, a: torch.Tensor, b: torch.Tensor, d: DType) -> torch.Tensor:
    """Wrapping integer arithmetic; // and % truncate toward zero, x // 0 is all ones and x % 0 is x (PTX);
    a shift amount is unsigned, and one of the width or more shifts everything out."""
    a, b = torch.broadcast_tensors(a, b)
    if kind in ("floordiv", "mod"):
        zero, minus_one = b == 0, (b == -1) & torch.tensor(d.is_signed)
        safe = torch.where(zero | minus_one, torch.ones_like(b), b)
        q = torch.div(a, safe, rounding_mode="trunc")
        if kind == "floordiv":
            return wrap(torch.where(zero, torch.full_like(a, -1), torch.where(minus_one, -a, q)), d)
        return wrap(torch.where(zero, a, torch.where(minus_one, torch.zeros_like(a), a - q * safe)), d)
    if kind in ("shl", "shr"):
        amount = b if not d.is_signed else torch.where(b < 0, torch.full_like(b, 1 << 62), b)
        out_of_range = amount >= d.bits
        amount = amount.clamp(0, d.bits - 1)
        if kind == "shl":
            return wrap(torch.where(out_of_range, torch.zeros_like(a), a << amount), d)
        if d.is_signed:
            return wrap(a >> torch.where(out_of_range, torch.full_like(amount, d.bits - 1), amount), d)
        unsigned = a & ((1 << d.bits) - 1) if d.bits < 64 else a
        shifted = torch.where(amount > 0, (unsigned >> amount) & ((1 << (64 - amount.clamp(min=1))) - 1), unsigned)
        return wrap(torch.where(out_of_range, torch.zeros_like(a), shifted), d)
    table = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "and": torch.bitwise_and,
             "or": torch.bitwise_or, "xor": torch.bitwise_xor, "min": torch.minimum, "max": torch.maximum}
    return wrap(table[kind](a, b), d)


def float_binary(kind: str, a: V, b: V, d: DType) -> V:
    wa, wb = compute(a), compute(b)
    ea, eb = a.err, b.err
    fa, fb = wa.to(F64T).abs(), wb.to(F64T).abs()
    if kind in ("add", "sub", "mul", "min", "max"):
        fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "min": torch.minimum, "max": torch.maximum}[kind]
        x = round_to(fn(wa, wb), d)
        err = {"mul": fa * eb + fb * ea + ea * eb}.get(kind, ea + eb if kind in ("add", "sub") else torch.maximum(ea, eb))
        if kind not in ("min", "max"):
            err = torch.where(err > 0, err + ulp(x, d), err)
        else:  # min(+0, -0) is either zero: an order (or instruction) picks its sign, which a division shows
            err = torch.where((wa == 0) & (wb == 0) & (torch.signbit(wa) != torch.signbit(wb)), math.inf, err)
        return finish(x, d, err)
    if kind == "pow":
        y = torch.pow(wa.to(F64T), wb.to(F64T))
        x = round_to(y, d)
        eps = 2.0 ** (-52 if d == F64 else -23)
        log = torch.log2(fa)
        op = y.abs() * (torch.nan_to_num((wb.to(F64T) * log).abs(), posinf=math.inf) * eps + 2 * eps) + ulp(x, d)
        prop = y.abs() * ((wb.to(F64T) / wa.to(F64T)).abs() * ea + log.abs() * math.log(2) * eb)
        err = torch.where(torch.isnan(y) & (ea == 0) & (eb == 0), torch.zeros_like(op), op + prop)
        return finish(x, d, torch.nan_to_num(err, nan=math.inf))
    q64 = wa.to(F64T) / wb.to(F64T)
    qerr = torch.where((ea > 0) | (eb > 0), (ea + q64.abs() * eb) / (fb - eb).clamp(min=0), torch.zeros_like(ea))
    qerr = torch.nan_to_num(qerr, nan=math.inf)
    if kind == "div":  # possibly one rounded reciprocal and a product: within 2 ulp of the quotient
        x = round_to(wa / wb, d)
        err = qerr + torch.where(torch.isnan(x.to(F64T)), torch.zeros_like(qerr), 2 * ulp(x, d))
        return finish(x, d, err)
    q = round_to(wa / wb, d)  # floor and mod: the IEEE quotient, floored in f32 (f64 in f64)
    fq = round_to(q.to(wa.dtype).floor(), d)
    known = (qerr == 0) | ((q.to(F64T) - qerr - ulp(q, d)).floor() == (q.to(F64T) + qerr + ulp(q, d)).floor())
    if kind == "floordiv":
        return finish(fq, d, torch.where(known, torch.zeros_like(qerr), torch.full_like(qerr, math.inf)))
    prod = round_to(fq.to(wa.dtype) * wb, d)
    x = round_to(wa - prod.to(wa.dtype), d)
    err = ea + fq.to(F64T).abs() * eb
    err = torch.where(err > 0, err + ulp(prod, d) + ulp(x, d), err)
    return finish(x, d, torch.where(known, err, torch.full_like(err, math.inf)))


def compare(kind: str, a: Any, b: Any) -> Any:
    if not isinstance(a, V) and not isinstance(b, V):  # compile-time numbers: Python decides
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[kind]
    a, b = operands(a, b)
    fn = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}[kind]
    wa, wb = compute(a), compute(b)
    out = V(fn(wa, wb), BOOL)
    err = a.err + b.err
    if a.dtype.is_float:
        close = (wa.to(F64T) - wb.to(F64T)).abs() <= err
        return unknown_where(out, (err > 0) & (close | torch.isnan(err)))
    return unknown_where(out, err > 0)


def where(c: V, a: Any, b: Any) -> V:
    a, b = operands(a, b)
    x = torch.where(c.x, a.x, b.x)
    both = (a.x.to(F64T) - b.x.to(F64T)).abs() + torch.maximum(a.err, b.err) if a.dtype.is_float else \
        torch.where(a.x == b.x, torch.maximum(a.err, b.err), torch.full_like(a.err, math.inf))
    err = torch.where(c.err > 0, torch.nan_to_num(both, nan=math.inf), torch.where(c.x, a.err, b.err))
    return V(x, a.dtype, err)


def unary(kind: str, v: V) -> V:
    d = v.dtype
    if kind in MATH and not d.is_float:
        v, d = cast(v, F32), F32
    if kind == "not":
        return V(~v.x, d, v.err.clone())
    if kind in ("neg", "abs"):
        if d.is_float:  # the sign bit: exact, an fp8 infinity kept (not saturated as a rounding would)
            w = compute(v)
            return V((-w if kind == "neg" else w.abs()).to(torch_dtype(d)), d, v.err.clone())
        w = compute(v)
        y = -w if kind == "neg" or d.is_signed else w
        return V(wrap(torch.where((w < 0) | torch.tensor(kind == "neg"), y, w), d), d, v.err.clone())
    w = compute(v)
    if kind == "sqrt":  # IEEE in f32 (f64), then rounded. torch's sqrt on the CPU is not always correctly rounded
        # (f32 99.20155334472656: 9.959997177, where sqrt.rn.f32 gives 9.959998131; f64 1953444704: one ulp off);
        # numpy's f64 sqrt is, and rounded to f32 it is f32's
        x = round_to(torch.from_numpy(np.asarray(np.sqrt(w.to(F64T).numpy()))).to(w.dtype), d)
        y64 = x.to(F64T)
    else:
        y64 = MATH[kind](w.to(F64T))
        x = round_to(y64, d)
    x64 = w.to(F64T)
    lo, hi = x64 - v.err, x64 + v.err
    lo_c = torch.where(lo > 0, lo, torch.full_like(lo, math.nan)) if kind in ("log", "log2", "sqrt", "rsqrt") else lo
    slope = torch.nan_to_num(SLOPE[kind](lo_c, hi).abs(), nan=math.inf)
    if kind == "sqrt":
        prop = torch.minimum(slope * v.err, torch.sqrt(v.err))
        op = torch.zeros_like(prop)
    else:
        prop = slope * v.err
        rel, ab = ERROR[kind]
        eps = 2.0 ** (-52 if d == F64 else -23)
        op = (rel * y64.abs() + ab) * eps + ulp(x, d)
        if kind == "exp":
            op = op + y64.abs() * x64.abs() * eps
        if kind in ("log", "log2"):
            op = op + x64.abs().log2().abs() * eps
        op = torch.where(torch.isnan(y64) | (torch.isinf(y64) & torch.isinf(x64)), torch.zeros_like(op), op)
    err = torch.where(v.err > 0, prop + op, op)
    return finish(x, d, torch.nan_to_num(err, nan=math.inf))


def reduce(kind: str, v: V, axis: Any, keepdims: bool) -> V:
    d, rank = v.dtype, v.x.dim()
    axes = tuple(range(rank)) if axis is None else tuple(a % rank for a in (axis if isinstance(axis, tuple) else (axis,)))
    if kind == "sum" and not d.is_float:
        out = V(wrap(compute(v).sum(dim=axes), d), d, v.err.amax(dim=axes))
    elif kind == "sum":
        w = v.x.to(F64T)
        total, magnitude = w.sum(dim=axes), w.abs().sum(dim=axes)
        x = round_to(total, d)
        n = math.prod(v.x.shape[a] for a in axes)
        whole = (w == w.round()).all(dim=axes) & (magnitude < 2 ** 24)  # exact in any order
        err = v.err.sum(dim=axes) + torch.where(whole, torch.zeros_like(magnitude),
                                                n * magnitude * 2.0 ** (-52 if d == F64 else -23) + ulp(x, d))
        # zeros alone, one of them -0: IEEE adds keep -0 where every addend is -0, torch's sum (from +0) does not,
        # and a lowering may or may not start from +0 (a row's sum of -0 is -0, a tuple's is +0): either zero
        negative = ((w == 0) & torch.signbit(w)).any(dim=axes) & (magnitude == 0)
        out = finish(x, d, torch.where(negative, math.inf, err))
    else:
        w = compute(v)
        x = (torch.amax if kind == "max" else torch.amin)(w, dim=axes)
        err = v.err.amax(dim=axes)
        if d.is_float:  # an extreme of +0 and -0 is either zero: the reduction's order picks its sign
            both = ((w == 0) & torch.signbit(w)).any(dim=axes) & ((w == 0) & ~torch.signbit(w)).any(dim=axes)
            err = torch.where((x == 0) & both, math.inf, err)
        out = V(round_to(x, d) if d.is_float else x.to(torch_dtype(d)), d, err)
    if keepdims and len(axes) < rank:
        for a in sorted(axes):
            out = V(out.x.unsqueeze(a), d, out.err.unsqueeze(a))
    return out


def fma(a: V, b: V, c: V) -> V:
    d = promote(promote(a.dtype, b.dtype), c.dtype)
    a, b, c = cast(a, d), cast(b, d), cast(c, d)
    wa, wb, wc = (x.x.to(F64T) for x in (a, b, c))
    y = wa * wb + wc
    x = round_to(y, d)
    op = ulp(x, d) + (ulp(wa * wb, F64) if d == F64 else 0)
    prop = wa.abs() * b.err + wb.abs() * a.err + a.err * b.err + c.err
    return finish(x, d, torch.where(torch.isnan(y) & (prop == 0), torch.zeros_like(op), op + prop))


def bit_count(kind: str, v: V) -> V:
    """clz / popc within the operand's width, as its dtype."""
    d = v.dtype
    bits = (v.x.to(torch.int64) & ((1 << d.bits) - 1)) if d.bits < 64 else v.x.to(torch.int64)
    ones = [(bits >> i) & 1 for i in range(d.bits)]
    if kind == "popc":
        n = sum(ones)
    else:
        n = torch.full_like(bits, d.bits)
        for i, bit in enumerate(ones):
            n = torch.where(bit == 1, torch.full_like(n, d.bits - 1 - i), n)
    return V(wrap(n, d), d, v.err.clone())


# ---------------------------------------------------------------------------------------------- programs

class Run:
    """One evaluation of a program: its outputs and their error bounds."""

    def __init__(self, p: Program, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]):
        self.p = p
        self.refs = {**inputs, **outputs}
        self.out_err = {n: torch.zeros(t.shape, dtype=F64T) for n, t in outputs.items()}
        self.dtypes = {t.name: t.dtype for t in p.inputs + p.outputs}
        self.helpers: dict[str, Helper] = {h.name: h for h in p.helpers}

    def execute(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        for pid in range(self.p.grid):
            for wg in range(self.p.num_warpgroups):
                self.pid, self.wg = pid, wg
                env: dict[str, Any] = dict(self.p.consts)
                env.update((name, scalar(value)) for name, value in self.p.scalars)
                self.block(self.p.body, env)
        return {n: (self.refs[n], self.out_err[n]) for n in self.out_err}

    # -- statements
    def block(self, stmts: list[Stmt], env: dict[str, Any]) -> None:
        for s in stmts:
            getattr(self, "stmt_" + s.kind)(s, env)

    def nested(self, stmts: list[Stmt], env: dict[str, Any]) -> None:
        """A block whose new names end with it (what the generator relies on, for every kind of block)."""
        before = set(env)
        self.block(stmts, env)
        for n in set(env) - before:
            del env[n]

    def stmt_assign(self, s: Stmt, env: dict[str, Any]) -> None:
        value = self.ev(s.attrs["value"], env)
        (name,) = s.attrs["names"]
        env[name] = binary(s.attrs["aug"], env[name], value) if s.attrs["aug"] else value

    def stmt_atomic(self, s: Stmt, env: dict[str, Any]) -> None:
        """An int32 atomic add, min or max on the part of the window inside the output (in any order: they commute)."""
        at = s.attrs
        v = self.ev(at["value"], env)
        value_shape = tuple(n for n in at["sizes"] if n is not None)
        ref = self.refs[at["out"]]
        inner, outer, shape = self.window(ref, at["starts"], at["sizes"], env)
        if inner is None:
            return
        new = v.x.to(torch.int64).expand(value_shape).reshape(shape)[outer]
        old = ref[inner].to(torch.int64)
        out = {"add": old + new, "min": torch.minimum(old, new), "max": torch.maximum(old, new)}[at["kind"]]
        ref[inner] = wrap(out, I32)
        # The value's uncertainty reaches the output (an inexact float cast to int32 is unknown where it may round
        # to either side: `cast`); it had been dropped, so an exp's last bits decided the expected sum.
        err, new_err = self.out_err[at["out"]], v.err.expand(value_shape).reshape(shape)[outer]
        err[inner] = err[inner] + new_err if at["kind"] == "add" else torch.maximum(err[inner], new_err)

    def stmt_smem(self, s: Stmt, env: dict[str, Any]) -> None:
        """An array through SMEM and back is itself."""
        env[s.attrs["name"]] = self.ev(s.attrs["value"], env)

    def stmt_store(self, s: Stmt, env: dict[str, Any]) -> None:
        at = s.attrs
        d = self.dtypes[at["out"]]
        v = self.ev(at["value"], env)
        if not isinstance(v, V):  # a Python number: converted to the output's dtype
            v = cast(weak_to(v, d), d)
        value_shape = tuple(n for n in at["sizes"] if n is not None)
        if at.get("aug"):  # out[...] op= v: the window as loaded, then stored
            v = binary(at["aug"], self.load_window(at["out"], at["starts"], at["sizes"], value_shape, env), v)
        ref, err = self.refs[at["out"]], self.out_err[at["out"]]
        inner, outer, shape = self.window(ref, at["starts"], at["sizes"], env)
        if inner is None:
            return
        ref[inner] = v.x.expand(value_shape).reshape(shape)[outer]
        err[inner] = v.err.expand(value_shape).reshape(shape)[outer]

    def stmt_if(self, s: Stmt, env: dict[str, Any]) -> None:
        self.nested(s.body if self.condition(self.ev(s.attrs["cond"], env)) else s.orelse, env)

    def stmt_for(self, s: Stmt, env: dict[str, Any]) -> None:
        bounds = [self.scalar_int(self.ev(b, env)) for b in s.attrs["bounds"]]
        lo, hi, step = (0, bounds[0], 1) if len(bounds) == 1 else (bounds + [1])[:3]
        for name, d in s.attrs.get("carried", {}).items():  # a Python number enters as the dtype the loop keeps
            env[name] = cast(weak_to(env[name], d), d)
        for i in range(lo, hi, step):
            env[s.attrs["name"]] = V(torch.tensor(i, dtype=torch.int32), I32)
            self.nested(s.body, env)
        env.pop(s.attrs["name"], None)

    def stmt_static_for(self, s: Stmt, env: dict[str, Any]) -> None:
        for j in range(s.attrs["count"]):
            env[s.attrs["name"]] = j
            self.nested(s.body, env)
        env.pop(s.attrs["name"], None)

    def stmt_const_if(self, s: Stmt, env: dict[str, Any]) -> None:
        self.nested(s.body if eval(s.attrs["cond"], {}, dict(self.p.consts)) else s.orelse, env)

    def condition(self, c: Any) -> bool:
        if not isinstance(c, V):
            return bool(c)
        if not c.exact:
            raise Uncertain("a runtime `if` on an inexact value")
        return bool(c.x.item() != 0) if c.dtype.is_float else bool(c.x.item())

    def scalar_int(self, v: Any) -> int:
        """An int32 scalar (loop bounds, window starts)."""
        if not isinstance(v, V):
            return int(v)
        if not v.exact:
            raise Uncertain("a loop bound or window start from an inexact value")
        return int(wrap(v.x.to(torch.int64), I32))

    def window(self, ref: torch.Tensor, starts: list[Node], sizes: list, env: dict[str, Any]):
        """(slices in the tensor, slices in the window, the window's shape) of the part inside the tensor."""
        inner, outer, shape = [], [], []
        for n, start, size in zip(ref.shape, starts, sizes):
            s = self.scalar_int(self.ev(start, env))
            k = 1 if size is None else size
            lo, hi = max(s, 0), min(s + k, n)
            if lo >= hi:
                return None, None, None
            inner.append(slice(lo, hi))
            outer.append(slice(lo - s, hi - s))
            shape.append(k)
        return tuple(inner), tuple(outer), tuple(shape)

    # -- expressions
    def ev(self, n: Node, env: dict[str, Any]) -> Any:
        at = n.attrs
        args = [self.ev(a, env) for a in n.args] if n.op not in ("load",) else []
        op = n.op
        if op == "var":
            return env[at["name"]]
        if op == "lit":
            return at["value"]
        if op in ("pid", "nprog", "wgid"):
            return V(torch.tensor({"pid": self.pid, "nprog": self.p.grid, "wgid": self.wg}[op], dtype=torch.int32), I32)
        if op == "refdim":
            return V(torch.tensor(self.refs[at["ref"]].shape[at["axis"]], dtype=torch.int32), I32)
        if op == "full":
            v = cast(weak_to(at["value"], n.ty.dtype), n.ty.dtype)
            return V(v.x.expand(n.ty.shape).clone(), v.dtype)
        if op == "arange":
            return V(torch.arange(at["start"], at["start"] + n.ty.shape[0], dtype=torch.int32), I32)
        if op == "load":
            return self.load(n, env)
        if op == "cast":
            return cast(args[0], n.ty.dtype)
        if op == "unary":
            return unary(at["kind"], args[0])
        if op == "binary":
            return binary(at["kind"], *args)
        if op == "compare":
            return compare(at["kind"], *args)
        if op == "where":
            return where(*args)
        if op == "reduce":
            return reduce(at["kind"], args[0], at["axis"], at["keepdims"])
        if op == "expand":
            return V(args[0].x.unsqueeze(at["axis"]), args[0].dtype, args[0].err.unsqueeze(at["axis"]))
        if op == "slice":
            block = tuple(slice(s, s + k) for s, k in zip(at["starts"], n.ty.shape))
            return V(args[0].x[block].clone(), args[0].dtype, args[0].err[block].clone())
        if op == "fma":
            return fma(*args)
        if op in ("clz", "popc"):
            return bit_count(op, args[0])
        if op == "call":
            return self.call(self.helpers[at["helper"]], args)
        if op == "gather":
            return self.gather(n, args)
        raise ValueError(op)

    def load(self, n: Node, env: dict[str, Any]) -> V:
        return self.load_window(n.attrs["ref"], n.args, n.attrs["sizes"], n.ty.shape, env, n.attrs.get("other", 0))

    def load_window(self, name: str, starts: list[Node], sizes: list, shape: tuple, env: dict[str, Any],
                    other: Any = 0) -> V:
        """The window of a tensor at `starts` (elements outside it read as `other`; err: what is known of them)."""
        ref = self.refs[name]
        inner, outer, _ = self.window(ref, starts, sizes, env)
        x = torch.full([1 if s is None else s for s in sizes], other, dtype=ref.dtype)
        err = torch.zeros(x.shape, dtype=F64T)
        if inner is not None:
            x[outer] = ref[inner]
            if name in self.out_err:
                err[outer] = self.out_err[name][inner]
        return V(x.reshape(shape), self.dtypes[name], err.reshape(shape))

    def gather(self, n: Node, index: list[Any]) -> V:
        """ref[index] with integer arrays among the indices: each index as int32 (a launch's int64 wraps, as
        the kernel casts it), broadcast to one shape; an element whose index lies outside on any axis reads
        `other`."""
        name = n.attrs["ref"]
        ref = self.refs[name]
        idx = []
        for i in index:
            if isinstance(i, V) and not i.exact:
                raise Uncertain("a gather index from an inexact value")
            idx.append(wrap(i.x.to(torch.int64), I32) if isinstance(i, V) else torch.tensor(int(i)))
        idx = torch.broadcast_tensors(*[i.to(torch.int64) for i in idx])
        inside = torch.ones(n.ty.shape, dtype=torch.bool)
        for i, size in zip(idx, ref.shape):
            inside &= (i >= 0) & (i < size)
        picked = tuple(i[inside] for i in idx)
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[ref.element_size()]
        x = torch.tensor([n.attrs.get("other", 0)], dtype=ref.dtype).view(bits).expand(n.ty.shape).clone()
        x[inside] = ref.view(bits)[picked]  # as bits: torch indexes no float8 tensor by a mask
        x = x.view(ref.dtype)
        err = torch.zeros(n.ty.shape, dtype=F64T)
        if name in self.out_err:
            err[inside] = self.out_err[name][picked]
        return V(x, self.dtypes[name], err)

    def call(self, h: Helper, args: list[Any]) -> Any:
        env = {name: a for (name, _), a in zip(h.params, args)}
        self.block(h.body, env)
        values = [self.ev(r, env) for r in h.returns]
        return values[0] if len(values) == 1 else tuple(values)


def scalar(value: Any) -> V:
    """A launch's int/float/bool argument as the kernel receives it: int32 (int64 if it does not fit), f32, bool."""
    if isinstance(value, bool):
        return V(torch.tensor(value), BOOL)
    if isinstance(value, float):
        return V(torch.tensor(value, dtype=torch.float32), F32)
    return V(torch.tensor(value), I64) if not -2 ** 31 <= value < 2 ** 31 else V(torch.tensor(value, dtype=torch.int32), I32)


def evaluate(p: Program, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]):
    """Run the program on copies of the launch's tensors: {output name: (values, error bounds)}."""
    return Run(p, inputs, {n: t.clone() for n, t in outputs.items()}).execute()


def mismatches(got: torch.Tensor, want: torch.Tensor, err: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Where `got` is not within err * scale of `want` (elements of unknown value excluded; NaN matches NaN)."""
    known = torch.isfinite(err)
    if not want.dtype.is_floating_point:
        return known & (got != want)
    g, w = got.to(F64T), want.to(F64T)
    same = (g == w) | (torch.isnan(g) & torch.isnan(w))
    return known & ~same & ~((g - w).abs() <= err * scale)
