"""Values in the interpreter: mgjit dtypes as torch dtypes, casts with the lowering's semantics, and elements
as the bits memory holds.

A scalar is a 0-d tensor and a register array a tensor of its logical shape, both of the IR's dtype, so that
integer arithmetic wraps and floats round exactly as in that dtype. Casts follow `lower.emit.Emitter.cast`
(round to nearest even between floats, truncation toward zero between float and integer, sign or zero
extension by the source's signedness between integers) with what the PTX conversions add: a float to integer
conversion saturates and turns NaN into 0.
"""
from __future__ import annotations

import torch

from .. import dtypes
from ..dtypes import DType

_STORAGE = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def torch_dtype(dtype: DType) -> torch.dtype:
    return getattr(torch, dtype.torch_name)


def storage_dtype(dtype: DType) -> torch.dtype:
    """The integer torch dtype of an element's bits in memory (a bool is a byte)."""
    return _STORAGE[dtype.storage_bits]


def compute_dtype(dtype: DType) -> torch.dtype:
    """What arithmetic on `dtype` is done in: float32 for the narrow floats (rounded once after), else itself."""
    return torch.float32 if dtype.is_float and dtype.bits < 32 else torch_dtype(dtype)


def widen(x: torch.Tensor, dtype: DType) -> torch.Tensor:
    return x.to(compute_dtype(dtype))


def round_float(x: torch.Tensor, dtype: DType) -> torch.Tensor:
    """A float tensor rounded to float `dtype`, to nearest even; fp8 saturates everything but NaN to its
    largest finite value (cvt.rn.satfinite, the only conversion to fp8 PTX has)."""
    if dtype.bits == 8:
        x = torch.where(torch.isnan(x), x, x.clamp(-dtype.max_finite, dtype.max_finite))
    return x.to(torch_dtype(dtype))


def constant(value: int | float | bool, dtype: DType) -> torch.Tensor:
    """A scalar of `dtype`; a float constant is rounded to the dtype as the lowering's constant is."""
    if dtype.is_float:
        return round_float(torch.tensor(float(value), dtype=torch.float64), dtype)
    return torch.tensor(value, dtype=torch_dtype(dtype))


def to_bits(x: torch.Tensor, dtype: DType) -> torch.Tensor:
    """The elements as the integers of their storage width that memory holds."""
    x = x.to(torch_dtype(dtype))
    if dtype == dtypes.bool_:
        return x.to(torch.uint8)
    return x.view(storage_dtype(dtype))


def from_bits(bits: torch.Tensor, dtype: DType) -> torch.Tensor:
    if dtype == dtypes.bool_:
        return bits != 0
    return bits.to(storage_dtype(dtype)).view(torch_dtype(dtype))


def cast(x: torch.Tensor, src: DType, dst: DType) -> torch.Tensor:
    """`x` of dtype `src` converted to `dst` as the lowering converts it."""
    if src == dst:
        return x
    if dst == dtypes.bool_:
        return x != 0  # a float NaN is true, as `cmpf une` makes it
    if src.is_float and not dst.is_float:
        return _float_to_int(x, dst)
    if dst.is_float and dst.bits == 8 and src != dtypes.float32:  # the lowering converts through f32
        x = cast(x, src, dtypes.float32)
    return round_float(x, dst) if dst.is_float else x.to(torch_dtype(dst))


def _float_to_int(x: torch.Tensor, dst: DType) -> torch.Tensor:
    """cvt.rzi with saturation: toward zero, clamped to the destination's range, NaN to 0."""
    lo, hi = dst.int_range
    wide = torch.nan_to_num(x.to(torch.float64).trunc(), nan=0.0)
    out = wide.clamp(lo, hi).to(torch.int64) if dst.bits < 64 else wide.to(torch.int64)
    if dst.bits == 64:  # float64 cannot hold 2**63 - 1: saturate by comparison instead of clamping
        out = torch.where(wide >= 2.0 ** 63, torch.tensor(hi), torch.where(wide < -2.0 ** 63, torch.tensor(lo), out))
    return out.to(torch_dtype(dst))


def fused_multiply_add(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, dtype: DType) -> torch.Tensor:
    """a * b + c rounded once to f32 (f64 for f64), then to `dtype`: fma.rn as the lowering emits it.

    f32 operands: the product is exact in f64 and the f64 sum is rounded to odd (a sticky last bit where it
    was inexact), after which rounding to f32 is the correctly rounded fma. f64 operands: exactly, in rationals
    (fuzzing and tests use small arrays)."""
    if dtype == dtypes.float64:
        return _fma_exact_f64(a, b, c)
    wa, wb, wc = (x.to(torch.float64) for x in (a, b, c))
    p = wa * wb
    s = p + wc
    bb = s - p
    error = (p - (s - bb)) + (wc - bb)  # s + error == p + c exactly (TwoSum)
    mantissa_even = (s.view(torch.int64) & 1) == 0
    toward = torch.where(error > 0, torch.full_like(s, float("inf")), torch.full_like(s, float("-inf")))
    odd = torch.where(torch.isfinite(s) & (error != 0) & mantissa_even, torch.nextafter(s, toward), s)
    return round_float(odd.to(torch.float32), dtype)


def _fma_exact_f64(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    from fractions import Fraction
    a, b, c = torch.broadcast_tensors(a, b, c)
    out = []
    for x, y, z in zip(a.reshape(-1).tolist(), b.reshape(-1).tolist(), c.reshape(-1).tolist()):
        finite = all(v == v and abs(v) != float("inf") for v in (x, y, z))
        if not finite:
            out.append(x * y + z)
            continue
        exact = Fraction(x) * Fraction(y) + Fraction(z)
        try:
            out.append(float(exact))
        except OverflowError:
            out.append(float("inf") if exact > 0 else float("-inf"))
    return torch.tensor(out, dtype=torch.float64).reshape(a.shape)


# e2m1 by its 4 bits: sign, two exponent bits (bias 1), one mantissa bit; no infinities or NaN.
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mma_input(x: torch.Tensor) -> torch.Tensor:
    """An MMA operand as the tensor cores take it, exactly in f32: float32 storage is read as tf32 (the low 13
    mantissa bits ignored), narrower floats widen exactly, and each e2m1 pair becomes its two values (the low
    nibble first), doubling the last dimension."""
    if x.dtype == torch.float32:
        return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)
    if x.dtype == torch.float4_e2m1fn_x2:
        pairs = x.view(torch.uint8).to(torch.int64)
        return torch.stack([E2M1_VALUES[pairs & 0xF], E2M1_VALUES[pairs >> 4]], dim=-1).flatten(-2)
    return x.to(torch.float32)
