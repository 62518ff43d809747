"""What the differential fuzzer (tools/fuzz.py) found, each as the minimized kernel it reduced to: compiled for
both targets (these were internal errors) and interpreted against torch (these were wrong numbers)."""
import os
import re
import sys

import pytest
import torch

import mgjit
from mgjit import infer
from mgjit.ops import gmem

TARGETS = ("sm_90a", "sm_100a")
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def compile_both(kernel, *args, **kwargs):
    return [kernel.compile(*args, target=t, **kwargs) for t in TARGETS]


def saturated(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x rounded to an fp8 dtype as cvt.rn.satfinite rounds: finite overflow and infinities to the largest
    finite value, NaN kept."""
    big = torch.finfo(dtype).max
    return torch.where(x.isnan(), x, x.clamp(-big, big)).to(dtype)


# ---------------------------------------------------------------------------------------------- casts

@mgjit.kernel
def half_casts(x, to_bf16, to_f16):
    to_bf16[0:128] = x[0:128].astype(mgjit.float16).astype(mgjit.bfloat16)
    to_f16[0:128] = x[0:128].astype(mgjit.bfloat16).astype(mgjit.float16)


def test_casts_between_float16_and_bfloat16():
    """Were `arith.truncf` between two 16-bit types: an MLIR verifier failure (internal error)."""
    x = torch.randn(128) * 1000
    outs = torch.empty(128, dtype=torch.bfloat16), torch.empty(128, dtype=torch.float16)
    compile_both(half_casts, x, *outs)
    half_casts.interpret[(1,)](x, *outs)
    assert torch.equal(outs[0], x.half().float().bfloat16())
    assert torch.equal(outs[1], x.bfloat16().float().half())


@mgjit.kernel
def byte_casts(x, i8, u8, back):
    v = x[0:128]
    i8[0:128] = v.astype(mgjit.int8)
    u8[0:128] = v.astype(mgjit.uint8)
    back[0:128] = v.astype(mgjit.int8).astype(mgjit.float32) + v.astype(mgjit.uint8).astype(mgjit.float32)


def test_casts_of_8_bit_integers_are_not_fp8_casts():
    """The lowering took every 8-bit float's MLIR type for fp8, and the block-scaling types (e8m0, e2m1 pairs)
    are bytes (i8): casts to and from int8/uint8 became fp8 conversions (an internal KeyError)."""
    x = torch.randn(128) * 100
    outs = torch.empty(128, dtype=torch.int8), torch.empty(128, dtype=torch.uint8), torch.empty(128)
    for c in compile_both(byte_casts, x, *outs):
        assert "e4m3" not in c.ptx and "e5m2" not in c.ptx
    byte_casts.interpret[(1,)](x, *outs)
    assert torch.equal(outs[0], x.clamp(-128, 127).to(torch.int8))
    assert torch.equal(outs[1], x.clamp(0, 255).to(torch.uint8))
    assert torch.equal(outs[2], outs[0].float() + outs[1].float())


@mgjit.kernel
def fp8_casts(x, a, b, to_e4m3, to_e5m2, from_e4m3, from_e5m2, to_int, arithmetic, negated, bigger):
    v = x[0:128]
    to_e4m3[0:128] = v.astype(mgjit.float8_e4m3fn)
    to_e5m2[0:128] = v.astype(mgjit.float8_e5m2)
    from_e4m3[0:128] = a[0:128].astype(mgjit.float32)
    from_e5m2[0:128] = b[0:128].astype(mgjit.bfloat16)
    to_int[0:128] = a[0:128].astype(mgjit.int32)
    arithmetic[0:128] = a[0:128] * 3.0 + a[0:128]
    negated[0:128] = -b[0:128]
    bigger[0:128] = mgjit.where(a[0:128] > b[0:128].astype(mgjit.float8_e4m3fn), 1, 0)


def test_fp8_casts_and_arithmetic_in_registers():
    """Were a CompileError ("casts to and from fp8 in register arrays are not supported yet"), which made fp8
    values loaded from GMEM unusable. Conversions to fp8 are cvt.rn.satfinite (round to nearest even, finite
    overflow and infinities saturate, NaN stays NaN); fp8 arithmetic is done in f32, rounded once per op."""
    x = torch.randn(128) * 200
    x[:6] = torch.tensor([float("inf"), float("-inf"), float("nan"), 1e6, 460.0, 470.0])
    a, b = (torch.randn(128) * 30).to(E4M3), (torch.randn(128) * 30).to(E5M2)
    outs = [torch.empty(128, dtype=E4M3), torch.empty(128, dtype=E5M2), torch.empty(128),
            torch.empty(128, dtype=torch.bfloat16), torch.empty(128, dtype=torch.int32), torch.empty(128, dtype=E4M3),
            torch.empty(128, dtype=E5M2), torch.empty(128, dtype=torch.int32)]
    for c in compile_both(fp8_casts, x, a, b, *outs):
        assert "cvt.rn.satfinite.e4m3x2.f32" in c.ptx and "cvt.rn.f16x2.e5m2x2" in c.ptx
    fp8_casts.interpret[(1,)](x, a, b, *outs)
    assert torch.equal(outs[0].float()[3:], saturated(x, E4M3).float()[3:])
    assert outs[0].float()[:3].tolist()[:2] == [448.0, -448.0] and outs[0].float()[2].isnan()
    assert torch.equal(outs[1].float()[3:], saturated(x, E5M2).float()[3:]) and outs[1].float()[3] == 57344.0
    assert torch.equal(outs[2], a.float()) and torch.equal(outs[3], b.bfloat16())
    assert torch.equal(outs[4], a.float().int())
    assert torch.equal(outs[5].float(), saturated(a.float() + saturated(a.float() * 3, E4M3).float(), E4M3).float())
    assert torch.equal(outs[6].float(), -b.float())
    assert torch.equal(outs[7], (a.float() > saturated(b.float(), E4M3).float()).int())


@mgjit.kernel
def fp8_relayout(x, out):
    rows = x[0:32, 0:32].max(axis=1)  # (32,) in the layout a reduction over columns leaves
    cols = x[0:32, 0:32].max(axis=0)  # (32,) in the layout a reduction over rows leaves
    out[0:32] = mgjit.maximum(rows, cols)  # one of them moves through shared memory


def test_fp8_arrays_relayout_through_shared_memory():
    """Was `llvm.store` of an f8 value (LLVM has no fp8 type): an internal error."""
    x, out = (torch.randn(32, 32) * 8).to(E4M3), torch.empty(32, dtype=E4M3)
    assert all("relayout(" in c.ir for c in compile_both(fp8_relayout, x, out))
    fp8_relayout.interpret[(1,)](x, out)
    assert torch.equal(out.float(), torch.maximum(x.float().amax(1), x.float().amax(0)))


# ---------------------------------------------------------------------------------------------- reductions

@mgjit.kernel
def narrow_int_reductions(x, total, biggest, row_min):
    v = x[0:16, 0:64]
    total[0] = v.sum()
    biggest[0:64] = v.max(axis=0)
    row_min[0:16] = mgjit.min(v, axis=1)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16])
def test_reductions_of_8_and_16_bit_integers(dtype):
    """Were `nvvm.shfl.sync` of an i8/i16 value (shuffles move 32-bit registers): an internal error. They
    combine in int32, extended by signedness; a sum wraps to the dtype."""
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max + 1, (16, 64), dtype=torch.int64).to(dtype)
    outs = torch.empty(1, dtype=dtype), torch.empty(64, dtype=dtype), torch.empty(16, dtype=dtype)
    compile_both(narrow_int_reductions, x, *outs)
    narrow_int_reductions.interpret[(1,)](x, *outs)
    assert outs[0].item() == x.long().sum().to(dtype).item()  # wrapped
    assert torch.equal(outs[1], x.amax(0)) and torch.equal(outs[2], x.amin(1))


# ---------------------------------------------------------------------------------------------- bools

@mgjit.kernel
def bool_arithmetic(a, b, either, both, counted, flag, chosen, ones):
    x = a[0:128]
    y = b[0:128]
    either[0:128] = mgjit.where(x + y, 1.0, -8.0)
    both[0:128] = x * y
    counted[0:128] = x * 3
    chosen[0] = 0
    if flag != -1:
        chosen[0] = 1
    ones[0:128] = True


def test_bool_arithmetic_follows_torch():
    """bool + bool was xor (i1 addition) and an int literal took a bool operand's dtype (`mask * 3` was
    `mask`, `flag != -1` was `flag != True`): silently wrong. Now + is or, * is and, and a Python int meeting a
    bool is an int32, as in torch and numpy."""
    a, b = torch.rand(128) < 0.5, torch.rand(128) < 0.5
    either, both = torch.empty(128), torch.empty(128, dtype=torch.bool)
    counted, chosen, ones = torch.empty(128, dtype=torch.int32), torch.empty(1, dtype=torch.int32), torch.empty(128, dtype=torch.bool)
    compile_both(bool_arithmetic, a, b, either, both, counted, True, chosen, ones)
    bool_arithmetic.interpret[(1,)](a, b, either, both, counted, True, chosen, ones)
    assert torch.equal(either, torch.where(a + b, 1.0, -8.0)) and torch.equal(both, a * b)
    assert torch.equal(counted, (a * 3).int()) and chosen.item() == 1 and bool(ones.all())


@mgjit.kernel
def bool_subtraction(a, out):
    out[0:128] = a[0:128] - a[0:128]  # ERR


def test_bool_subtraction_is_an_error_at_its_line():
    a = torch.zeros(128, dtype=torch.bool)
    with pytest.raises(mgjit.CompileError, match="`-` on bool values is not supported") as info:
        bool_subtraction.compile(a, a)
    assert info.value.loc.line == bool_subtraction.fn.__code__.co_firstlineno + 2


# ---------------------------------------------------------------------------------------------- pow

@mgjit.kernel
def powers(x, y, out):
    out[0:128] = x[0:128] ** y[0:128]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_pow_of_negative_bases_and_zero(dtype):
    """x ** y was exp2(y * log2(x)): NaN for every negative x (even with y = 2.0 or 0.0) and for 0 ** 0. It is
    libdevice's pow now (in f32 for narrow floats)."""
    x = torch.tensor([-2.0, -0.99, -3.0, 0.0, 0.0, 2.0, -8.0, 1.5] * 16, dtype=dtype)
    y = torch.tensor([2.0, 0.0, 3.0, 0.0, 2.0, 0.5, 1 / 3, -1.0] * 16, dtype=dtype)
    out = torch.empty(128, dtype=dtype)
    for c in compile_both(powers, x, y, out):
        assert ("__nv_pow" if dtype == torch.float64 else "__nv_powf") in c.mlir
    powers.interpret[(1,)](x, y, out)
    want = torch.pow(x.double(), y.double()).to(dtype)
    assert torch.allclose(out.double(), want.double(), rtol=1e-6, equal_nan=True)
    assert out[:6].tolist() == want[:6].tolist() and out[6].isnan()  # a negative base, a fractional power: NaN


# ---------------------------------------------------------------------------------------------- parameters

def test_too_many_parameters_is_an_error_at_the_kernel(tmp_path):
    """ptxas stopped with "uses too much parameter space (0x8160 bytes, 0x7ffc max)": a bare toolchain error
    with no line. Both targets compile at PTX ISA 8.1 or later (sm_90a at 8.3), where a kernel takes 32764 bytes
    of parameters; a rank-5 tensor takes 72 (an address, 5 sizes, 5 strides): 455 fit, 456 do not."""
    import importlib.util
    x = torch.zeros(1, 1, 1, 1, 1)

    def kernel_of(count):
        names = [f"t{i}" for i in range(count)]
        path = tmp_path / f"many_params_{count}.py"
        path.write_text("import mgjit\n\n\n@mgjit.kernel\n"
                        f"def many_params({', '.join(names)}):\n    t0[0, 0, 0, 0, 0] = 1.0\n")
        spec = importlib.util.spec_from_file_location(f"many_params_{count}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.many_params, str(path)

    too_many, path = kernel_of(456)
    for target in ("sm_90a", "sm_100a"):
        with pytest.raises(mgjit.CompileError, match=f"32832 bytes .* more than the 32764 bytes a {target} kernel "
                                                     "can take") as info:
            too_many.compile(*[x] * 456, target=target)
        assert info.value.loc.file == path and info.value.loc.line == 5
    assert kernel_of(455)[0].compile(*[x] * 455, target="sm_90a").ptx


# ---------------------------------------------------------------------------------------------- layouts

@mgjit.kernel
def many_loads_meet_a_reduction(x, y, out, LOADS: mgjit.constexpr):
    acc = x[0:32, 0:32].max(axis=1)  # (32,) in the layout a reduction leaves
    for k in mgjit.static_range(LOADS):
        acc = acc + y[k, 0:32]  # each load is placed in that layout: one restart of inference each
    out[0:32] = acc


def test_layout_inference_places_any_number_of_loads():
    """Inference gave up ("layout inference did not converge") after 16 restarts, though each restart places
    one more load: a kernel with many loads meeting a reduction could not compile."""
    x, y, out = torch.randn(32, 32), torch.randn(24, 32), torch.empty(32)
    for c in compile_both(many_loads_meet_a_reduction, x, y, out, LOADS=24):
        assert "relayout(" not in c.ir
    many_loads_meet_a_reduction.interpret[(1,)](x, y, out, LOADS=24)
    want = x.amax(1)
    for k in range(24):
        want = want + y[k]
    assert torch.equal(out, want)


def test_an_anchor_that_users_pull_back_returns_to_its_first_layout(monkeypatch, tmp_path):
    """Cross-entropy over rows of 300 (8 rows a program, parts of 256 and 128 columns) as it was before its target
    logits were gathered: a masked sum broadcasts the targets against both parts, whose reductions want them in
    two layouts. An anchor may move when a later user needs another layout, but moving back and forth between
    those two ended in the second, which left the loss computed in one layout and selected in the other: 6
    relayouts, where placing the targets once gave 5. Pulled back to a layout it left, the anchor returns to its
    first and stays. The parts are loaded as then (`blocked`: neither held a row a thread nor a warp's rows whole,
    ops/gmem.py ROW_ACCESS_LINES and WARP_ROWS). Held a row a thread, as now, both parts' reductions want the
    targets in one layout, and no relayout is left; so too with the blocked parts, where the 128-column part's load
    is placed to reduce where the 256-column part's rows do (infer.Inference.place_reduced), which is left out here to
    keep the scenario. And the numbers hold (interpreter)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import _rows
    import cross_entropy as ce

    def build():  # a fresh kernel object: its compiles cached apart
        @mgjit.kernel
        def masked_cross_entropy(logits, target, loss, lse, ignore_index, ROWS: mgjit.constexpr,
                                 PARTS: mgjit.constexpr):
            rows, starts = _rows.segment(ROWS, PARTS, 1, 1)
            v = _rows.load_row(logits, rows, starts, PARTS, -float("inf"))
            targets = target[rows]
            t = targets.astype(mgjit.int32)
            e, m, s = _rows.exp_segment(v, 1)
            cols = _rows.columns(starts, PARTS)
            hits = ()
            for p in mgjit.static_range(len(PARTS)):
                hits = hits + (mgjit.where(cols[p][None, :] == t[:, None], v[p], 0.0),)
            row_lse = m + mgjit.log(s)
            _rows.store_stat(lse, rows, row_lse, starts, 1)
            _rows.store_stat(loss, rows, ce.row_loss(targets, ignore_index, logits.shape[1],
                                                     row_lse - _rows.segment_sum(hits)), starts, 1)
        return masked_cross_entropy

    x = torch.randn(64, 300) * 3
    target = torch.randint(0, 300, (64,))
    target[::5] = -100
    loss, lse = torch.full((64,), float("nan")), torch.full((64,), float("nan"))
    args, constexprs = (x, target, loss, lse, -100), {"ROWS": 8, "PARTS": (256, 128)}
    assert str(build().compile(*args, **constexprs, target="sm_90a").ir).count("relayout(") == 0
    monkeypatch.setattr(gmem, "_held_rows_layout", lambda *args: None)
    monkeypatch.setattr(gmem, "_warp_rows_layout", lambda *args: None)
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path / "placed"))
    assert str(build().compile(*args, **constexprs, target="sm_90a").ir).count("relayout(") == 0
    monkeypatch.setattr(infer, "blocked_reducing_to", lambda *args: None)  # the parts' loads left where they were
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    masked_cross_entropy = build()
    assert str(masked_cross_entropy.compile(*args, **constexprs, target="sm_90a").ir).count("relayout(") == 5
    masked_cross_entropy.interpret[(8,)](*args, **constexprs)
    want = torch.nn.functional.cross_entropy(x.double(), target, reduction="none", ignore_index=-100)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- promotion

@mgjit.kernel
def mixed_sign(a, b, ab, ba):
    x = a[0:128]
    y = b[0:128]
    ab[0:128] = x - y
    ba[0:128] = y - x


@mgjit.kernel
def mixed_fp8(a, b, ab):
    ab[0:128] = a[0:128] + b[0:128]


def test_promotion_does_not_depend_on_the_order_of_operands():
    """int8 and uint8 promoted to whichever came first (x - y was int8, y - x uint8: wrapped, and different), and
    the two fp8s likewise: now int16 and float16, as torch has int8 with uint8."""
    a = torch.randint(-128, 128, (128,), dtype=torch.int8)
    b = torch.randint(0, 256, (128,), dtype=torch.int16).to(torch.uint8)
    ab, ba = torch.empty(128, dtype=torch.int16), torch.empty(128, dtype=torch.int16)
    compile_both(mixed_sign, a, b, ab, ba)
    mixed_sign.interpret[(1,)](a, b, ab, ba)
    assert torch.equal(ab, a - b) and torch.equal(ba, b - a) and (a - b).dtype == torch.int16
    e4, e5 = (torch.randn(128) * 10).to(E4M3), (torch.randn(128) * 10).to(E5M2)
    out = torch.empty(128, dtype=torch.float16)
    compile_both(mixed_fp8, e4, e5, out)
    mixed_fp8.interpret[(1,)](e4, e5, out)
    assert torch.equal(out, (e4.float() + e5.float()).half())


# ---------------------------------------------------------------------------------------------- float to int

@mgjit.kernel
def float_to_int(x, i8, u8, i16, i64, i32_of_f64, i64_of_f32):
    v = x[0:128]
    i8[0:128] = v.astype(mgjit.int8)
    u8[0:128] = v.astype(mgjit.uint8)
    i16[0:128] = v.astype(mgjit.float16).astype(mgjit.int16)
    i64[0:128] = v.astype(mgjit.float64).astype(mgjit.int64)
    i32_of_f64[0:128] = v.astype(mgjit.float64).astype(mgjit.int32)
    i64_of_f32[0:128] = v.astype(mgjit.int64)


def _float_to_int_case(device: str):
    x = torch.randn(128, device=device) * 100
    x[:6] = torch.tensor([300.0, -300.0, float("nan"), 1e30, -1e30, 127.9])
    outs = [torch.empty(128, dtype=d, device=device) for d in (torch.int8, torch.uint8, torch.int16, torch.int64,
                                                               torch.int32, torch.int64)]
    return x, outs


def test_float_to_int_saturates_to_the_destination_width():
    """arith.fptosi to i8 became cvt.rzi.s16.f32 and a truncation (300.0 -> 44, where the interpreter, which
    models cvt, gives 127), and is poison out of range: every float to int conversion is now one cvt.rzi of the
    destination's width (saturating, NaN to 0)."""
    x, outs = _float_to_int_case("cpu")
    for c in compile_both(float_to_int, x, *outs):
        assert "cvt.rzi.s8.f32" in c.ptx and "cvt.rzi.u8.f32" in c.ptx and "cvt.rzi.s64.f64" in c.ptx
    float_to_int.interpret[(1,)](x, *outs)
    assert outs[0][:6].tolist() == [127, -128, 0, 127, -128, 127] and outs[1][:6].tolist() == [255, 0, 0, 255, 0, 127]
    assert outs[2][:6].tolist() == [300, -300, 0, 32767, -32768, 127]  # 1e30 is inf in float16
    assert outs[3][:6].tolist() == [300, -300, 0, 2 ** 63 - 1, -2 ** 63, 127]
    assert outs[4][:6].tolist() == [300, -300, 0, 2 ** 31 - 1, -2 ** 31, 127]
    assert outs[5][:6].tolist() == [300, -300, 0, 2 ** 63 - 1, -2 ** 63, 127]


def test_float_to_int_of_nan_is_zero_in_the_ptx():
    """The sm_90a PTX run on the simulator (its cvt gives NaN the most negative integer, as the H100's does)
    agrees with the interpreter: the lowering selects 0 for NaN."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ptx_sim
    x, outs = _float_to_int_case("cpu")
    compiled = float_to_int.compile(x, *outs, target="sm_90a")
    dev = ptx_sim.Device()
    for t in (x, *outs):
        dev.place(t)
    dev.run(compiled, (1,), x, *outs)
    host = [torch.empty(128, dtype=o.dtype) for o in outs]
    float_to_int.interpret[(1,)](x, *host)
    for t, h in zip(outs, host):
        assert torch.equal(dev.fetch(t), h), (t.dtype, dev.fetch(t)[:6].tolist(), h[:6].tolist())


@pytest.mark.gpu
def test_float_to_int_saturates_on_the_gpu():
    x, outs = _float_to_int_case("cuda")
    float_to_int[(1,)](x, *outs)
    host = [torch.empty(128, dtype=o.dtype) for o in outs]
    float_to_int.interpret[(1,)](x.cpu(), *host)
    assert all(torch.equal(o.cpu(), h) for o, h in zip(outs, host))


# ---------------------------------------------------------------------------------------------- integer edges

@mgjit.kernel
def integer_edges(a, b, q, r, shl, shr, by_zero, by_hundred):
    x = a[0:128]
    y = b[0:128]
    q[0:128] = x // y
    r[0:128] = x % y
    shl[0:128] = x << y
    shr[0:128] = x >> y
    by_zero[0:128] = x // 0 + x % 0  # constants LLVM would fold to poison
    by_hundred[0:128] = (x << 100) | (x >> 100)


def _integer_edges_case(dtype: torch.dtype, device: str):
    info = torch.iinfo(dtype)
    a = torch.randint(info.min, info.max, (128,), dtype=torch.int64).to(dtype)
    b = torch.randint(-2, 70, (128,), dtype=torch.int64).to(dtype)
    a[:4], b[:4] = torch.tensor([info.min, 7, -7 if info.min else 7, 5]).to(dtype), torch.tensor([-1, 0, 2, 100]).to(dtype)
    return a.to(device), b.to(device), [torch.empty(128, dtype=dtype, device=device) for _ in range(6)]


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
def test_integer_division_and_shifts_have_ptx_answers_in_the_lowering(dtype):
    """arith's divsi/remsi by 0 or of MIN by -1, and shli/shrsi by the width or more, are poison in LLVM (a
    constant divisor or amount folds to anything); the lowering guards them to the answers the interpreter
    gives: x // 0 == -1, x % 0 == x, MIN // -1 == MIN, shifts past the width shift everything out."""
    a, b, outs = _integer_edges_case(dtype, "cpu")
    compile_both(integer_edges, a, b, *outs)
    integer_edges.interpret[(1,)](a, b, *outs)
    q, r, _, _, by_zero, by_hundred = outs
    info = torch.iinfo(dtype)
    if info.min:
        assert q[0].item() == info.min and r[0].item() == 0
    assert q[1].item() == torch.tensor(-1).to(dtype).item() and r[1].item() == 7
    assert torch.equal(by_zero, (-1 + a.long()).to(dtype))
    assert torch.equal(by_hundred, torch.where(a < 0, -1, 0).to(dtype))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
def test_integer_edges_run_from_the_ptx_match_the_interpreter(dtype):
    """The sm_90a PTX on the simulator (shl/shr clamp their 32-bit amount to the width, as the hardware does),
    with 64-bit amounts whose low word is small: LLVM folded the out-of-range guard of a 64-bit shift into that
    clamp after truncating the amount, so 1 << (1 + INT64_MIN) gave 2, not 0 (the fuzzer's --ptx, seed 20064)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ptx_sim
    a, b, outs = _integer_edges_case(dtype, "cpu")
    if dtype == torch.int64:
        b[4:8] = torch.tensor([1 - 2 ** 63, 2 ** 32 + 1, 2 ** 40 + 3, -2 ** 32 + 2])
    compiled = integer_edges.compile(a, b, *outs, target="sm_90a")
    dev = ptx_sim.Device()
    for t in (a, b, *outs):
        dev.place(t)
    dev.run(compiled, (1,), a, b, *outs)
    host = [torch.empty_like(o) for o in outs]
    integer_edges.interpret[(1,)](a, b, *host)
    for name, t, h in zip(("q", "r", "shl", "shr", "by_zero", "by_hundred"), outs, host):
        assert torch.equal(dev.fetch(t), h), (name, dev.fetch(t)[:8].tolist(), h[:8].tolist())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
def test_integer_edges_on_the_gpu_match_the_interpreter(dtype):
    a, b, outs = _integer_edges_case(dtype, "cuda")
    integer_edges[(1,)](a, b, *outs)
    host = [torch.empty(128, dtype=dtype) for _ in outs]
    integer_edges.interpret[(1,)](a.cpu(), b.cpu(), *host)
    assert all(torch.equal(o.cpu(), h) for o, h in zip(outs, host))


@mgjit.kernel
def shift_by_constants(x, out):
    v = x[0:32]  # a value from memory: only the amount is a constant
    out[0, 0:32] = v << ((-3) | 3)  # -1: read unsigned, past the width
    out[1, 0:32] = v << 64
    out[2, 0:32] = v >> 100
    out[3, 0:32] = (v * 35) << 63
    out[4, 0:32] = v >> 64


def _shift_case(device: str):
    x = torch.randint(-2 ** 40, 2 ** 40, (32,), dtype=torch.int64, device=device)
    return x, torch.full((5, 32), 7, dtype=torch.int64, device=device)


def test_a_64_bit_shift_never_reaches_ptxas_with_an_amount_of_64_or_more():
    """ptxas folds `shl.b64 d, x, 64` with the amount in a register set to the constant 64 as x, not 0 (PTX clamps
    the amount to the width): `(35 * v) << -1` gave 35 * v on an H200 (the fuzzer's --gpu, seed 51045), where the
    PTX simulator and the interpreter gave 0. The lowering shifts by an amount below 64 and selects what a larger
    amount leaves, so no 64-bit shift in the PTX takes a constant of 64 or more."""
    import re
    x, out = _shift_case("cpu")
    ptx = shift_by_constants.compile(x, out, target="sm_90a").ptx
    constants = {m[0]: int(m[1], 0) for m in re.findall(r"mov\.[bu]32\s+(%r\d+), (-?(?:0x)?[0-9a-fA-F]+);", ptx)}
    shifts = re.findall(r"sh[lr]\.[bsu]64\s+%rd\d+, %rd\d+, (%r\d+|\d+);", ptx)
    amounts = [constants.get(a, None) if a.startswith("%") else int(a) for a in shifts]
    assert all(a is None or 0 <= a < 64 for a in amounts), amounts
    shift_by_constants.interpret[(1,)](x, out)
    sign = torch.where(x < 0, -1, 0)
    assert torch.equal(out, torch.stack([0 * x, 0 * x, sign, (x * 35) << 63, sign]))


@pytest.mark.gpu
def test_64_bit_shifts_by_constants_on_the_gpu_match_the_interpreter():
    x, out = _shift_case("cuda")
    shift_by_constants[(1,)](x, out)
    host = torch.empty(5, 32, dtype=torch.int64)
    shift_by_constants.interpret[(1,)](x.cpu(), host)
    assert torch.equal(out.cpu(), host), (out.cpu() != host).nonzero()[:4].tolist()


# ---------------------------------------------------------------------------------------------- division

@mgjit.kernel
def divide_by_one_value(x, d, out):
    out[0:128] = x[0:128] / d[0]  # one divisor for the whole array: a reciprocal and products


@pytest.mark.parametrize("dtype,divisor", [(torch.float16, 1e-5), (E4M3, 0.0), (torch.bfloat16, 3.0)])
def test_division_by_one_value_keeps_its_reciprocal_in_f32(dtype, divisor):
    """The reciprocal was rounded to the array's dtype: 1 / 1e-5 overflowed float16 (x / 1e-5 was inf for every
    x), and 1 / 0 saturated to 448 in fp8 (0 / 0 was 0, 0.002 / 0 was 0.875)."""
    x = (torch.randn(128) * 2).to(dtype)
    x[:2] = torch.tensor([0.0, 2e-3]).to(dtype)
    d, out = torch.tensor([divisor]).to(dtype), torch.empty(128, dtype=dtype)
    compile_both(divide_by_one_value, x, d, out)
    divide_by_one_value.interpret[(1,)](x, d, out)
    want = saturated(x.float() / d.float(), dtype) if dtype == E4M3 else (x.float() / d.float()).to(dtype)
    close = (out.double() - want.double()).abs() <= 2 * want.double().abs() * torch.finfo(dtype).eps
    assert bool((close | (out.isnan() & want.isnan()) | (out.double() == want.double())).all())


# ---------------------------------------------------------------------------------------------- sqrt rounding

@mgjit.kernel
def square_roots(x, x64, r, r64, r16):
    r[0:1024] = mgjit.sqrt(x[0:1024])
    r[0] = mgjit.sqrt(x[0])  # a scalar
    r64[0:1024] = mgjit.sqrt(x64[0:1024])
    r16[0:1024] = mgjit.sqrt(x[0:1024].astype(mgjit.float16))


def test_interpreted_sqrt_is_correctly_rounded():
    """sqrt.rn rounds correctly; the interpreter used torch's CPU sqrt, an ulp off for one value in 150 (GPU
    fuzzer, seed 8274: sqrt(2.0) in float64 gave 1.414213562373095)."""
    import numpy as np
    x = torch.rand(1024) * 100
    x[:3] = torch.tensor([2.0, -1.0, 0.0])
    x64 = x.double() * (1 + 1e-9)
    x64[0] = 2.0
    r, r64, r16 = torch.empty(1024), torch.empty(1024, dtype=torch.float64), torch.empty(1024, dtype=torch.float16)
    square_roots.interpret[(1,)](x, x64, r, r64, r16)
    assert r64[0].item() == 1.4142135623730951 and r[1].isnan()
    rest = slice(2, None)  # numpy's own sqrt(-1) warns
    np.testing.assert_array_equal(r[rest].numpy(), np.sqrt(x[rest].numpy()))
    np.testing.assert_array_equal(r64[rest].numpy(), np.sqrt(x64[rest].numpy()))
    np.testing.assert_array_equal(r16[rest].numpy(), np.sqrt(x[rest].half().float().numpy()).astype(np.float16))


# ---------------------------------------------------------------------------------------------- integer negation

@mgjit.kernel
def negated_row_max(x, out, col):
    v = -x[mgjit.ds(0, 4), mgjit.ds(col, 128)]
    out[0:4, 0:1] = v.max(axis=-1, keepdims=True)
    out[0:4, 1:2] = v.min(axis=-1, keepdims=True)


def _negated_row_max_case(device: str):
    x = torch.randint(-12, 13, (14, 52), dtype=torch.int32)
    return x.to(device), torch.full((4, 2), -999, dtype=torch.int32, device=device)


def test_integer_negation_is_not_a_neg_instruction():
    """ptxas 13.0 fused neg.s32 into a three-way max (VIMNMX3) and dropped one negation: max(-x) over 4 elements
    a thread read one of them as x (GPU fuzzer, seed 8189). The lowering negates as ~x + 1; the numbers are the
    interpreter's (elements past the row read as 0)."""
    x, out = _negated_row_max_case("cpu")
    for c in compile_both(negated_row_max, x, out, 32):
        assert "neg.s32" not in c.ptx and "not.b32" in c.ptx
    negated_row_max.interpret[(1,)](x, out, 32)
    padded = torch.cat([-x[0:4, 32:52], torch.zeros(4, 108, dtype=torch.int32)], dim=1)
    assert out[:, 0].tolist() == padded.max(dim=1).values.tolist()
    assert out[:, 1].tolist() == padded.min(dim=1).values.tolist()


@pytest.mark.gpu
def test_integer_negation_under_a_max_on_the_gpu():
    x, out = _negated_row_max_case("cuda")
    negated_row_max[(1,)](x, out, 32)
    host = torch.full((4, 2), -999, dtype=torch.int32)
    negated_row_max.interpret[(1,)](x.cpu(), host, 32)
    assert torch.equal(out.cpu(), host)


@mgjit.kernel
def keepdims_stores(x, out):
    v = x[0:4, 0:64]
    out[0:4, 0:1] = v.sum(axis=1, keepdims=True)
    tile = mgjit.smem((4, 1), mgjit.float32)
    tile[...] = v.max(axis=1, keepdims=True)
    out[0:4, 1:2] = tile[...]


def test_a_keepdims_reduction_stores_into_a_window_of_its_shape():
    """out[0:4, 0:1] = v.sum(axis=1, keepdims=True) raised AttributeError ('Expanded' object has no attribute
    'value') in the GMEM and SMEM stores: a keepdims result whose shape is the window's is now stored as is."""
    x, out = torch.randn(4, 64), torch.full((4, 2), float("nan"))
    compile_both(keepdims_stores, x, out)
    keepdims_stores.interpret[(1,)](x, out)
    torch.testing.assert_close(out[:, 0], x.sum(dim=1))
    torch.testing.assert_close(out[:, 1], x.max(dim=1).values)


@mgjit.kernel
def byte_mask(x, out):
    m = mgjit.max(x[mgjit.ds(0, 8), mgjit.ds(4, 16)], axis=-1, keepdims=True)
    full, none = mgjit.full((8, 16), 255, dtype=mgjit.uint8), mgjit.full((8, 16), 0, dtype=mgjit.uint8)
    out[0, mgjit.ds(-1, 8), mgjit.ds(-1, 16)] = mgjit.where(m == 0, full, none)


@mgjit.kernel
def byte_quotient(x, out):
    m = mgjit.max(x[mgjit.ds(0, 8), mgjit.ds(4, 16)], axis=-1, keepdims=True)
    out[0, mgjit.ds(-1, 8), mgjit.ds(-1, 16)] = 0 // mgjit.where(m > 100, mgjit.full((8, 16), 2, dtype=mgjit.uint8), m)


@pytest.mark.parametrize("kernel", [byte_mask, byte_quotient], ids=lambda k: k.name)
def test_bytes_of_sign_extended_compares_pack_into_words(kernel):
    """uint8 values 255 or 0 from a compare (`where(m == 0, 255, 0)`, and `0 // d`, all ones where d is 0) stored
    as packed words: LLVM's NVPTX backend aborted the process ("Cannot select: i8 = sign_extend", fuzz seed 88218)
    on the vector of bytes they were packed through; bytes are or'ed into words now. Both targets compile, and the
    sm_90a PTX on the simulator agrees with the interpreter and torch."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ptx_sim
    x = torch.randint(0, 256, (24, 34), dtype=torch.uint8)  # rows of 34 bytes
    x[2] = 0
    x[3, 4:100:7] = 0
    compiled = compile_both(kernel, x, torch.zeros(6, 3, 16, dtype=torch.uint8))[0]
    m = x[:8, 4:20].long().max(dim=1, keepdim=True).values
    d = m if kernel is byte_mask else torch.where(m > 100, 2, m)
    want = torch.zeros(6, 3, 16, dtype=torch.uint8)
    want[0, :, :15] = torch.where(d == 0, 255, 0).expand(8, 16)[1:4, 1:]
    out = torch.zeros(6, 3, 16, dtype=torch.uint8)
    kernel.interpret[(1,)](x, out)
    assert torch.equal(out, want)
    dev = ptx_sim.Device()
    out = torch.zeros(6, 3, 16, dtype=torch.uint8)
    dev.run(compiled, (1,), x, out)
    assert torch.equal(dev.fetch(out), want)



@mgjit.kernel
def mask_or_max(x, out, MASK: mgjit.constexpr, SHIFT: mgjit.constexpr):
    """byte_mask (MASK) or shifted row maxima: configs of which only some pack compare results into words."""
    m = mgjit.max(x[mgjit.ds(0, 8), mgjit.ds(4, 16)], axis=-1, keepdims=True)
    full, none = mgjit.full((8, 16), 255, dtype=mgjit.uint8), mgjit.full((8, 16), 0, dtype=mgjit.uint8)
    out[0, mgjit.ds(-1, 8), mgjit.ds(-1, 16)] = mgjit.where(m == 0, full, none) if MASK else (m >> SHIFT) + none


def bytes_through_a_vector(self, parts):
    """Emitter.pack_i32 before 0fc588e: bytes packed through a vector<4 x i8>, on which LLVM's NVPTX backend
    aborts for bytes from a sign-extended compare ("Cannot select: i8 = sign_extend")."""
    vec = self.m.llvm.mlir_undef(self.ir.VectorType.get([len(parts)], parts[0].type))
    for i, x in enumerate(parts):
        vec = self.m.llvm.insertelement(vec, x, self.i32(i))
    return self.m.llvm.bitcast(self.int_type(32), vec)


def test_an_llvm_fatal_error_is_a_compile_error_and_the_process_goes_on(monkeypatch, capfd, tmp_path):
    """An LLVM fatal error in the pipeline (its NVPTX backend's "Cannot select") aborted the Python process, a
    notebook's kernel with it. The pipeline runs under LLVM's crash recovery now: the compile raises a CompileError
    naming the kernel's line, LLVM's reason and a file holding the module it failed on, and the same process
    compiles on (the lowering that is right, then the planted one again). Planted: the byte packing LLVM aborted
    on; a cache of its own, so that nothing compiled before stands in for the planted compile."""
    from mgjit.lower.emit import Emitter
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    right = Emitter.pack_i32
    x, out = torch.randint(0, 256, (24, 34), dtype=torch.uint8), torch.zeros(6, 3, 16, dtype=torch.uint8)
    for shift in (5, 6):
        monkeypatch.setattr(Emitter, "pack_i32", bytes_through_a_vector)
        with pytest.raises(mgjit.CompileError, match=r"test_fuzz_regressions.py:\d+ \(in mask_or_max\): internal "
                           r"error while lowering kernel mask_or_max to PTX: LLVM stopped with a fatal error: Cannot "
                           r"select: .* = sign_extend .*\(the module it failed on is at \S+;") as caught:
            mask_or_max.compile(x, out, MASK=True, SHIFT=shift, target="sm_90a")
        module = re.search(r"is at (\S+);", str(caught.value)).group(1)
        with open(module) as f:
            assert f.read().startswith("module attributes {gpu.container_module}")
        os.remove(module)
        assert "LLVM ERROR: Cannot select" in capfd.readouterr().err  # as LLVM prints it, for the whole DAG
        monkeypatch.setattr(Emitter, "pack_i32", right)
        compiled = mask_or_max.compile(x, out, MASK=True, SHIFT=shift, target="sm_90a")
        assert "st.global" in compiled.files["kernel.ptx"].decode()


@mgjit.kernel
def f64_row_sums(x, out):
    out[mgjit.ds(0, 4)] = x[mgjit.ds(0, 4), mgjit.ds(0, 64)].sum(axis=1)


def test_a_pass_that_fails_under_crash_recovery_still_says_why(monkeypatch, tmp_path):
    """The crash recovery writes its reproducer for any pass that fails, not only for a crash: an invalid op the
    lowering emitted was reported as "LLVM crashed (its report went to stderr...)" with nothing on stderr. A pass
    failure raises MLIR's diagnostic again. Planted: a shuffle of a float64 value bitcast to 32 bits (the
    transposed butterfly's select did so before 64-bit reductions)."""
    from mgjit.lower.emit import Emitter
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(Emitter, "shfl_bfly", lambda self, x, offset: self.bitcast(x, self.int_type(32)))
    x, out = torch.zeros(4, 64, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    with pytest.raises(mgjit.CompileError, match=r"(?s)internal error while lowering kernel f64_row_sums to PTX: .*"
                       r"'arith.bitcast' op operand type 'f64' and result type 'i32' are cast incompatible") as info:
        f64_row_sums.compile(x, out, target="sm_90a")
    assert "LLVM crashed" not in str(info.value)
    reproducer = re.search(r"reproducer generated at `(\S+)`", str(info.value))
    if reproducer:
        os.remove(reproducer.group(1))

# ---------------------------------------------------------------------------------------------- branches

@mgjit.kernel
def same_value_on_both_branches(x, out, s, flag, inner):
    v = 5
    a = x[0:128]
    b = a + 1.0
    u = a
    if flag:
        v = s
        u = b
    else:
        if inner:
            v = s
        else:
            v = s
        u = b
    out[0:128] = u + v


@pytest.mark.parametrize("flag,inner", [(True, False), (False, True), (False, False)])
def test_a_variable_given_the_same_value_on_both_branches_keeps_it(flag, inner):
    """`if c: v = s` / `else: v = s` left v at what it held before the `if` (seed 770526): the branches' scopes
    held one object, taken for "unchanged", and the kernel stored 5 where it should have stored s. A silently
    wrong result, in the interpreter and in the compiled kernel alike (the IR stored the constant)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ptx_sim
    x = torch.randn(128)
    out = torch.full((128,), float("nan"))
    same_value_on_both_branches.interpret[(1,)](x, out, 2, flag, inner)
    torch.testing.assert_close(out, x + 3.0)
    compiled = compile_both(same_value_on_both_branches, x, out, 2, flag, inner)[0]
    dev = ptx_sim.Device()
    for t in (x, out):
        dev.place(t)
    dev.run(compiled, (1,), x, out, 2, flag, inner)
    torch.testing.assert_close(dev.fetch(out), x + 3.0)


# ---------------------------------------------------------------------------------------------- fp8 signs

@mgjit.kernel
def fp8_signs(x, neg, mag):
    v = x[0:128]
    neg[0:128] = (-v).astype(mgjit.float32)
    mag[0:128] = abs(v).astype(mgjit.float32)


def test_the_sign_of_an_fp8_infinity_flips_and_clears_exactly():
    """-x and abs(x) of e5m2 flip or clear the sign bit (the lowering's xor/and): an infinity stays one. The
    interpreter went through a rounding to fp8, which saturates, and gave -57344 where the PTX gave -inf (the
    fuzzer's --ptx, seed 83)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ptx_sim
    x = (torch.randn(128) * 100).to(E5M2)
    x[:4] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0]).to(E5M2)
    want = (-x.float(), x.float().abs())
    outs = torch.empty(128), torch.empty(128)
    fp8_signs.interpret[(1,)](x, *outs)
    compiled = fp8_signs.compile(x, *outs, target="sm_90a")
    dev = ptx_sim.Device()
    simulated = torch.empty(128), torch.empty(128)
    for t in (x, *simulated):
        dev.place(t)
    dev.run(compiled, (1,), x, *simulated)
    for got, sim, ref in zip(outs, simulated, want):
        torch.testing.assert_close(got, ref, equal_nan=True, rtol=0, atol=0)
        torch.testing.assert_close(dev.fetch(sim), ref, equal_nan=True, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- shared memory

@mgjit.kernel
def smem_rewritten(x, out, n):
    v = x[0:256]
    buf = mgjit.smem((256,), mgjit.float32)
    buf[...] = v
    first = buf[mgjit.ds(64, 64)][...]
    buf[...] = v * 2.0
    second = buf[mgjit.ds(64, 64)][...]
    acc = first + second
    for i in range(n):  # stored, read back in another layout, stored again next iteration
        buf[...] = v + i
        acc = acc + buf[mgjit.ds(64, 64)][...]
    out[0:64] = acc


@pytest.mark.parametrize("n", [0, 1, 3, 4])
def test_a_tile_stored_again_is_read_again_and_after_every_thread_read_it(n):
    """Two bugs of SMEM tiles, run from the PTX on the simulator (which now reports a read or store that no
    bar.sync orders after another warp's store or read):
    - the tile reads were inline asm without side effects, which LLVM may merge or move: a loop unrolled by two
      read the first iteration's values again in the second (the sum came out x + 2 short of x + 3);
    - a store that follows reads of the warpgroup (the next iteration's store, another layout's reads) had no
      barrier before it: a fast warp overwrote what a slow one had yet to read."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ptx_sim
    x = torch.randn(256)
    want = torch.empty(64)
    smem_rewritten.interpret[(1,)](x, want, n)
    torch.testing.assert_close(want, 3 * x[64:128] + sum(x[64:128] + i for i in range(n)), rtol=1e-5, atol=1e-5)
    compiled = smem_rewritten.compile(x, want, n, target="sm_90a")
    dev = ptx_sim.Device()
    out = torch.full((64,), float("nan"))
    for t in (x, out):
        dev.place(t)
    dev.run(compiled, (1,), x, out, n)
    assert torch.equal(dev.fetch(out), want)



# ---------------------------------------------------------------------------------------------- signed zeros

def test_a_zero_sum_with_a_negative_zero_may_take_either_sign():
    """Fuzz seed 99654: `1 // x.sum(1)` over a masked window of -0.0 gave -inf from the PTX (a row's adds keep -0
    where every addend is -0) and inf from the interpreter (torch's sum starts from +0; a tuple's lowered sum does
    too). The reference leaves a sum of zeros with a -0 among them either sign; other sums, exact ones and zero
    ones of +0, it pins down."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fuzz_ref
    from fuzz_program import F32
    x = torch.tensor([[-0.0, -0.0], [0.0, -0.0], [0.0, 0.0], [1.0, -1.0], [2.0, 3.0]])
    out = fuzz_ref.reduce("sum", fuzz_ref.V(x, F32), 1, False)
    assert out.err[:2].isinf().all() and torch.equal(out.err[2:], torch.zeros(3, dtype=torch.float64))
    assert out.x[2:].tolist() == [0.0, 0.0, 5.0]
