"""The interpreter's arithmetic is the lowering's: in the IR's dtypes, narrow floats computed in f32 and rounded
once per operation, integers wrapping, PTX's answers where arith has none, GMEM windows masked at the edges."""
import sys
from pathlib import Path

import pytest
import torch

import mgjit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_sim  # noqa: E402

BF16 = torch.bfloat16


@mgjit.kernel
def int_edges(a, b, q, r, shl, shr, BLOCK: mgjit.constexpr):
    x = a[0:BLOCK]
    y = b[0:BLOCK]
    q[0:BLOCK] = x // y
    r[0:BLOCK] = x % y
    shl[0:BLOCK] = x << y
    shr[0:BLOCK] = x >> y


def test_integer_division_shifts_and_wrap_around():
    """// and % truncate toward zero; x // 0 is all ones and x % 0 is x (PTX's div/rem); INT_MIN // -1 wraps;
    a shift by the width or more (or by a negative amount, read unsigned) is clamped to the width."""
    imin = -2**31
    a = torch.tensor([7, -7, 7, -7, 5, imin, imin, 1, -1, 3, 12345, -8] + [0] * 116, dtype=torch.int32)
    b = torch.tensor([2, 2, -2, -2, 0, -1, 1, 31, 31, 32, 40, -1] + [1] * 116, dtype=torch.int32)
    outs = [torch.empty_like(a) for _ in range(4)]
    int_edges.interpret[(1,)](a, b, *outs, BLOCK=128)
    q, r, shl, shr = (o[:12].tolist() for o in outs)
    assert q == [3, -3, -3, 3, -1, imin, imin, 0, 0, 0, 308, 8]
    assert r == [1, -1, 1, -1, 5, 0, 0, 1, -1, 3, 25, 0]
    assert shl == [28, -28, 0, 0, 5, 0, 0, imin, imin, 0, 0, 0]
    assert shr == [1, -2, 0, -1, 5, -1, imin // 2, 0, -1, 0, 0, -1]


@mgjit.kernel
def convert(x, i32, u8, i8, b, BLOCK: mgjit.constexpr):
    v = x[0:BLOCK]
    i32[0:BLOCK] = v.astype(mgjit.int32)
    u8[0:BLOCK] = v.astype(mgjit.uint8)
    i8[0:BLOCK] = v.astype(mgjit.int32).astype(mgjit.int8)
    b[0:BLOCK] = v.astype(mgjit.bool_)


def test_casts_saturate_truncate_and_wrap():
    x = torch.tensor([2.7, -2.7, 3e9, -3e9, float("nan"), 300.0, -1.0, 0.0] + [0.0] * 120)
    i32, u8 = torch.empty(128, dtype=torch.int32), torch.empty(128, dtype=torch.uint8)
    i8, b = torch.empty(128, dtype=torch.int8), torch.empty(128, dtype=torch.bool)
    convert.interpret[(1,)](x, i32, u8, i8, b, BLOCK=128)
    assert i32[:8].tolist() == [2, -2, 2**31 - 1, -2**31, 0, 300, -1, 0]  # toward zero, saturated, NaN -> 0
    assert u8[:8].tolist() == [2, 0, 255, 0, 0, 255, 0, 0]
    assert i8[:8].tolist() == [2, -2, -1, 0, 0, 44, -1, 0]  # int32 -> int8 keeps the low byte
    assert b[:8].tolist() == [True, True, True, True, True, True, True, False]  # NaN != 0


@mgjit.kernel
def narrow(x, y, add, mul, by_scalar, by_array, S: mgjit.constexpr, BLOCK: mgjit.constexpr):
    a = x[0:BLOCK]
    c = y[0:BLOCK]
    add[0:BLOCK] = a + c
    mul[0:BLOCK] = a * c
    by_scalar[0:BLOCK] = a / S
    by_array[0:BLOCK] = a / c


def test_narrow_floats_round_once_and_division_by_one_value_is_a_reciprocal():
    x, y = torch.randn(1024, dtype=BF16), torch.randn(1024, dtype=BF16)
    outs = [torch.empty(1024, dtype=BF16) for _ in range(4)]
    narrow.interpret[(1,)](x, y, *outs, S=3.0, BLOCK=1024)
    add, mul, by_scalar, by_array = outs
    assert torch.equal(add, (x.float() + y.float()).to(BF16))
    assert torch.equal(mul, (x.float() * y.float()).to(BF16))
    assert torch.equal(by_array, (x.float() / y.float()).to(BF16))
    inverse = 1.0 / torch.tensor(3.0)  # one f32 reciprocal, then products rounded once
    assert torch.equal(by_scalar, (x.float() * inverse).to(BF16))


@mgjit.kernel
def window(x, y, R: mgjit.constexpr, C: mgjit.constexpr):
    r0 = mgjit.program_id(0) * R - 3
    y[mgjit.ds(r0, R), mgjit.ds(-2, C)] = x[mgjit.ds(r0, R), mgjit.ds(-2, C)] + 1.0


def test_gmem_windows_read_zeros_outside_and_drop_stores_there():
    x = torch.randn(20, 10)
    y = torch.full((20, 10), -5.0)
    window.interpret[(3,)](x, y, R=8, C=16)
    # Rows -3..20 and columns -2..13 are touched; inside the tensor that is everything but nothing more.
    torch.testing.assert_close(y, x + 1.0, rtol=0, atol=0)


@mgjit.kernel
def f64_floor(x, y, q, BLOCK: mgjit.constexpr):
    q[0:BLOCK] = x[0:BLOCK] // y[0:BLOCK]


def test_float64_floor_division():
    """`//` of doubles past 2**24 (it used to floor through float32)."""
    x = torch.tensor([1e9 + 7.0] + [1.0] * 127, dtype=torch.float64)
    y = torch.tensor([3.0] + [1.0] * 127, dtype=torch.float64)
    q = torch.empty_like(x)
    f64_floor.interpret[(1,)](x, y, q, BLOCK=128)
    assert q[0].item() == 333333335.0
    assert "cvt.rmi.f64.f64" in f64_floor.compile(x, y, q, BLOCK=128, target="sm_90a").ptx  # what the GPU runs


@mgjit.device
def _offset(v):
    return v + 1.0


@mgjit.kernel
def uses_helper(x, y):
    y[0:128] = _offset(x[0:128])


def test_a_redefined_helper_is_interpreted_anew(monkeypatch):
    """The interpreter keeps a kernel's IR like the compiler keeps its cubin: until something it reads changes."""
    x, y = torch.zeros(128), torch.empty(128)
    uses_helper.interpret[(1,)](x, y)
    assert torch.equal(y, torch.ones(128))
    def offset_by_two(v):
        return v + 2.0

    monkeypatch.setitem(globals(), "_offset", mgjit.device(offset_by_two))
    uses_helper.interpret[(1,)](x, y)
    assert torch.equal(y, torch.full((128,), 2.0))


@mgjit.kernel
def exps(x, out, out2, FTZ: mgjit.constexpr, BLOCK: mgjit.constexpr):
    v = x[0:BLOCK]
    out[0:BLOCK] = mgjit.exp(v, ftz=FTZ)
    out2[0:BLOCK] = mgjit.exp2(v, ftz=FTZ)


@pytest.mark.parametrize("ftz", [False, True])
def test_exp_ftz_flushes_subnormal_results_in_the_interpreter_and_the_ptx(ftz):
    """exp(x, ftz=True) is ex2.approx.ftz: results below 2**-126 (exp of -87.4 to -103.3, exp2 of -126 to -149)
    are zero; without ftz they are subnormal. The interpreter and the compiled PTX (run by tests/ptx_sim.py) agree
    within an ulp (torch's exp2 in f32 against numpy's in f64, rounded); elsewhere ftz changes nothing."""
    x = torch.cat([torch.linspace(-110.0, -80.0, 64), torch.linspace(-150.0, -120.0, 32), torch.randn(32) * 4])
    outs = [torch.full((128,), 7.0), torch.full((128,), 7.0)]
    exps.interpret[(1,)](x, *outs, FTZ=ftz, BLOCK=128)
    compiled = exps.compile(x, *outs, FTZ=ftz, BLOCK=128, target="sm_90a")
    assert ("ex2.approx.ftz.f32" in compiled.ptx) == ftz and ("ex2.approx.f32" in compiled.ptx) != ftz
    dev = ptx_sim.Device()
    sims = [torch.full((128,), 7.0), torch.full((128,), 7.0)]
    for t in (x, *sims):
        dev.place(t)
    dev.run(compiled, (1,), x, *sims)
    tiny = torch.finfo(torch.float32).tiny
    for got, sim, exact in zip(outs, sims, (torch.exp(x.double()), torch.exp2(x.double()))):
        assert torch.allclose(got, dev.fetch(sim), rtol=3e-7, atol=0)
        subnormal = (exact < tiny) & (exact > 2.0 ** -148)  # results that f32 holds as subnormals
        assert subnormal.sum() > 10
        assert (got[subnormal] == 0).all() if ftz else (got[subnormal] > 0).all()
        normal = exact >= tiny
        assert torch.allclose(got[normal].double(), exact[normal], rtol=2e-5, atol=0)  # x * log2(e) rounded


@mgjit.kernel
def exp_ftz_of_f64(x, out):
    out[0:128] = mgjit.exp(x[0:128], ftz=True)


@mgjit.kernel
def log_with_ftz(x, out):
    out[0:128] = mgjit.log(x[0:128], ftz=True)


@mgjit.kernel
def exp_with_runtime_ftz(x, out):
    out[0:128] = mgjit.exp(x[0:128], ftz=x[0] > 0)


@pytest.mark.parametrize("kernel, dtype, message", [
    (exp_ftz_of_f64, torch.float64, "applies to float32 and narrower floats, got float64"),
    (log_with_ftz, torch.float32, "mgjit.log takes no keywords, got \\['ftz'\\]"),
    (exp_with_runtime_ftz, torch.float32, "ftz must be a static True or False"),
], ids=lambda k: getattr(k, "name", ""))
def test_exp_ftz_errors(kernel, dtype, message):
    x = torch.zeros(128, dtype=dtype)
    with pytest.raises(mgjit.CompileError, match=message):
        kernel.compile(x, x, target="sm_90a")


@mgjit.kernel
def trig(x, out, BLOCK: mgjit.constexpr):
    v = x[0:BLOCK]
    out[0:BLOCK] = mgjit.sin(v) * 3.0 + mgjit.cos(v)


def test_sin_and_cos_from_their_ptx_agree_with_the_interpreter():
    """libdevice's sinf and cosf reduce large arguments through a multiword product (mad.lo.cc and madc.hi, the
    carry flag between them), which tests/ptx_sim.py runs: from small arguments to 1e30, the PTX agrees with the
    interpreter within an ulp of the result's scale."""
    x = torch.cat([torch.randn(64) * 3, torch.randn(32) * 1e5, torch.logspace(6, 30, 32) * torch.randn(32).sign()])
    want = torch.full((128,), float("nan"))
    trig.interpret[(1,)](x, want, BLOCK=128)
    compiled = trig.compile(x, want, BLOCK=128, target="sm_90a")
    assert "madc.hi.u32" in compiled.ptx
    dev = ptx_sim.Device()
    got = torch.full((128,), float("nan"))
    dev.run(compiled, (1,), x, got)
    assert torch.allclose(dev.fetch(got), want, rtol=0, atol=1e-6)
    assert torch.allclose(want.double(), 3 * x.double().sin() + x.double().cos(), rtol=0, atol=2e-6)
