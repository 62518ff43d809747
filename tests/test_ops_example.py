"""The worked example of adding ops (ARCHITECTURE.md, "How to add an op"): `mgjit.fma(a, b, c)`, a new op class
(Fma) with its verifier, inference, lowering and interpreter rules in ops/elementwise.py, and `mgjit.clz` /
`mgjit.popc`, new kinds of an existing op (Unary). Each is checked in the IR it traces to, the PTX it lowers
to, the values the interpreter computes, and its errors."""
import inspect
from fractions import Fraction

import pytest
import torch

import mgjit


@mgjit.kernel
def fused(a, b, c, out, BLOCK: mgjit.constexpr):
    out[0:BLOCK] = mgjit.fma(a[0:BLOCK], b[0:BLOCK], c[0:BLOCK])


@mgjit.kernel
def fused_mixed(a, out, BLOCK: mgjit.constexpr):
    x = a[0:BLOCK]
    out[0:BLOCK] = mgjit.fma(x, 2, x.astype(mgjit.float32))  # a weak 2, a bf16 x: the f32 operand wins


@mgjit.kernel
def bits(x, leading, ones):
    v = x[0:128]
    leading[0:128] = mgjit.clz(v)
    ones[0:128] = mgjit.popc(v)


def test_fma_is_one_instruction_rounded_once():
    a = torch.full((128,), 1 + 2 ** -12)
    c = torch.full((128,), 2.0 ** -80)
    c[1:] = -1.0
    out = torch.empty(128)
    for target in ("sm_90a", "sm_100a"):
        compiled = fused.compile(a, a, c, out, BLOCK=128, target=target)
        assert "= fma(" in compiled.ir and "fma.rn.f32" in compiled.ptx
    fused.interpret[(1,)](a, a, c, out, BLOCK=128)
    # a * a = 1 + 2**-11 + 2**-24 exactly: one rounding keeps the 2**-24 that a rounded product would lose
    assert out[1].item() == 2 ** -11 + 2 ** -24
    # ... and the tiny c makes the exact sum lie just above a tie: rounding twice (through f64) would go to even
    assert out[0].item() == 1 + 2 ** -11 + 2 ** -23


def test_fma_f64_and_narrow_and_mixed_operands():
    a, b, c = (torch.randn(128, dtype=torch.float64) for _ in range(3))
    out = torch.empty(128, dtype=torch.float64)
    assert "fma.rn.f64" in fused.compile(a, b, c, out, BLOCK=128).ptx
    fused.interpret[(1,)](a, b, c, out, BLOCK=128)
    # a * b + c in rationals, rounded once: torch's a * b + c rounds twice and can differ by an ulp
    exact = [float(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in zip(a.tolist(), b.tolist(), c.tolist())]
    assert out.tolist() == exact
    x, y = torch.randn(128, dtype=torch.bfloat16), torch.empty(128)
    fused_mixed.interpret[(1,)](x, y, BLOCK=128)
    assert torch.equal(y, x.float() * 2 + x.float())


def test_clz_and_popc_count_within_the_dtype():
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        x = torch.randint(info.min, info.max, (128,), dtype=torch.int64).to(dtype)
        x[:3] = torch.tensor([0, 1, -1 if info.min < 0 else info.max]).to(dtype)
        leading, ones = torch.empty_like(x), torch.empty_like(x)
        ptx = bits.compile(x, leading, ones, target="sm_90a").ptx
        assert "clz.b" in ptx and "popc.b" in ptx
        bits.interpret[(1,)](x, leading, ones)
        width = 8 * x.element_size()
        unsigned = [v & (2 ** width - 1) for v in x.tolist()]
        assert leading.tolist() == [width - u.bit_length() for u in unsigned]
        assert ones.tolist() == [bin(u).count("1") for u in unsigned]


@mgjit.kernel
def clz_of_float(x, out):
    out[0:128] = mgjit.clz(x[0:128])  # ERR


def test_clz_of_a_float_is_an_error_at_its_line():
    x = torch.zeros(128)
    with pytest.raises(mgjit.CompileError, match="mgjit.clz needs an integer") as info:
        clz_of_float.compile(x, x)
    lines, first = inspect.getsourcelines(clz_of_float.fn)
    assert info.value.loc.line == first + next(i for i, t in enumerate(lines) if t.rstrip().endswith("# ERR"))
