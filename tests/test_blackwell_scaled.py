"""Block-scaled tcgen05 MMAs (mxfp8, mxfp4, nvfp4) and tcgen05_copy, on the CPU: interpreted against a torch
reference that dequantizes (data times its block's scale, in float64), compiled for sm_100a (ptxas, no
spills, the instructions and descriptors in the PTX), and the mistakes a kernel can make with them.

The interpreter reads the scales where the lowering tells the tensor cores to: each instruction's scale
addresses and the scale factor IDs decoded from its descriptor, in the TMEM scale layout `tcgen05_copy` writes
(tmem_layouts.ScaleLayout), so a wrong address, ID or chunk order gives wrong numbers here.
"""
import re

import pytest
import torch

import mgjit
from mgjit.interpret import numerics
from mgjit.mma_descriptors import Major, Tcgen05ScaledInstrDescriptor
from test_blackwell import line_of

E4M3, E5M2, E8M0, E2M1 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2


@mgjit.kernel
def scaled_mma(a, b, sfa, sfb, c, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr,
               S: mgjit.constexpr, COLLECTIVE: mgjit.constexpr):
    """c = (a * sfa) @ (b * sfb).T for one tile: BM rows of A per CTA, BN columns (of the pair, for 2 CTAs)."""
    CTAS = 2 if COLLECTIVE else 1
    rank = mgjit.program_id(0) % 2 if COLLECTIVE else 0
    a_s = mgjit.smem((BM, BK), a.dtype, swizzle=128)
    b_s = mgjit.smem((BN // CTAS, BK), b.dtype, swizzle=128)
    sfa_s = mgjit.smem((BM // 128, S // 4 * 32, 16), sfa.dtype)
    sfb_s = mgjit.smem((BN // 128, S // 4 * 32, 16), sfb.dtype)
    bar = mgjit.barrier(1, arrivals=4 * CTAS)
    done = mgjit.barrier(1)
    acc = mgjit.tmem((BM, BN), mgjit.float32, collective=COLLECTIVE)
    sfa_t = mgjit.tmem((BM, S), sfa.dtype, scales=True, collective=COLLECTIVE)
    sfb_t = mgjit.tmem((BN, S), sfb.dtype, scales=True, collective=COLLECTIVE)
    mgjit.copy_async(a, (rank * BM, 0), a_s, barrier=bar[0], collective=COLLECTIVE)
    mgjit.copy_async(b, (rank * (BN // CTAS), 0), b_s, barrier=bar[0], collective=COLLECTIVE)
    mgjit.copy_async(sfa, (rank, 0, 0), sfa_s, barrier=bar[0], collective=COLLECTIVE)
    mgjit.copy_async(sfb, (0, 0, 0), sfb_s, barrier=bar[0], collective=COLLECTIVE)
    if rank == 0:
        bar[0].wait()
        mgjit.tcgen05_copy(sfa_t, sfa_s)
        mgjit.tcgen05_copy(sfb_t, sfb_s)
        mgjit.tcgen05_mma(acc, a_s, b_s.T, accumulate=False, a_scale=sfa_t, b_scale=sfb_t)
        mgjit.tcgen05_commit(done[0])
    done[0].wait()
    for j in mgjit.static_range(BN // 64):
        c[mgjit.ds(rank * BM, BM), j * 64:(j + 1) * 64] = acc[:, j * 64:(j + 1) * 64].load()


FORMATS = {  # name -> (data dtype, scale dtype, values per scale)
    "mxfp8-e4m3": (E4M3, E8M0, 32), "mxfp8-e5m2": (E5M2, E8M0, 32), "mxfp4": (E2M1, E8M0, 32),
    "nvfp4": (E2M1, E4M3, 16)}


def random_scaled(rows: int, k: int, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random data (rows, k values) and scales (rows, k // block): every e2m1 code, e8m0 scales 2^-7..2^6,
    positive e4m3 scales."""
    dtype, scale_dtype, block = FORMATS[fmt]
    if dtype == E2M1:
        data = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8).view(E2M1)
    else:
        data = (torch.randn(rows, k) * 4).to(dtype)
    if scale_dtype == E8M0:
        scales = torch.randint(120, 134, (rows, k // block), dtype=torch.uint8).view(E8M0)
    else:
        scales = (torch.rand(rows, k // block) * 4 + 0.05).to(E4M3)
    return data, scales


def dequantize(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    values = numerics.mma_input(data).double()
    return values * scales.double().repeat_interleave(values.shape[1] // scales.shape[1], dim=1)


def run_scaled(fmt: str, m: int, n: int, collective: bool):
    k = 256 if FORMATS[fmt][0] == E2M1 else 128  # one 128-byte swizzle row of K
    block = FORMATS[fmt][2]
    a, sa = random_scaled(m, k, fmt)
    b, sb = random_scaled(n, k, fmt)
    c = torch.full((m, n), float("nan"))
    ctas = 2 if collective else 1
    args = (a, b, mgjit.blocked_scales(sa), mgjit.blocked_scales(sb), c)
    consts = dict(BM=m // ctas, BN=n, BK=a.shape[1], S=k // block, COLLECTIVE=collective)
    scaled_mma.interpret[(ctas,)](*args, **consts, cluster=(2, 1, 1) if collective else None)
    return c, dequantize(a, sa) @ dequantize(b, sb).T, args, consts


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("collective", [False, True], ids=["1cta", "2cta"])
def test_block_scaled_mma_matches_dequantized_torch(fmt, collective):
    """f32 accumulation of products that are exact in f32: within f32 rounding of the float64 reference."""
    m, n = (256, 256) if collective else (128, 256)
    c, ref, _, _ = run_scaled(fmt, m, n, collective)
    assert not c.isnan().any()
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-6


def test_every_scale_is_used_where_it_belongs():
    """One scale of A and one of B set to 2^k in turn move exactly their row's or column's block of products."""
    c0, ref, (a, b, sfa, sfb, c), consts = run_scaled("mxfp8-e4m3", 128, 256, False)
    sa = torch.full((128, 4), 127, dtype=torch.uint8)  # 2^0
    sb = torch.full((256, 4), 127, dtype=torch.uint8)
    sa[37, 2] = 130  # 2^3 on row 37's third block of K
    sb[200, 1] = 125  # 2^-2 on column 200's second block
    args = (a, b, mgjit.blocked_scales(sa.view(E8M0)), mgjit.blocked_scales(sb.view(E8M0)), c)
    scaled_mma.interpret[(1,)](*args, **consts)
    av, bv = a.double(), b.double()
    av[37, 64:96] *= 8
    bv[200, 32:64] /= 4
    assert ((c.double() - av @ bv.T).abs().max() / (av @ bv.T).abs().max()).item() < 1e-6


# ---------------------------------------------------------------------------------------------- sm_100a

@pytest.fixture(scope="module")
def compiled():
    out = {}
    for fmt in ("mxfp8-e4m3", "mxfp4", "nvfp4"):
        dtype, scale_dtype, block = FORMATS[fmt]
        k = 256 if dtype == E2M1 else 128
        a = torch.empty(128, 128, dtype=dtype, device="meta")  # 128 bytes a row: k values
        b = torch.empty(256, a.shape[1], dtype=dtype, device="meta")
        sfa = torch.empty(1, k // block // 4 * 32, 16, dtype=scale_dtype, device="meta")
        sfb = torch.empty(2, k // block // 4 * 32, 16, dtype=scale_dtype, device="meta")
        c = torch.empty(128, 256, dtype=torch.float32, device="meta")
        out[fmt] = scaled_mma.compile(a, b, sfa, sfb, c, BM=128, BN=256, BK=a.shape[1], S=k // block,
                                      COLLECTIVE=False, target="sm_100a")
    return out


@pytest.mark.parametrize("fmt,kind,vec,ids", [
    ("mxfp8-e4m3", "mxf8f6f4", "1X", [0, 1, 2, 3]),  # one scale per instruction: byte k of the word
    ("mxfp4", "mxf4nvf4", "2X", [0, 2, 0, 2]),  # two per instruction: half-words
    ("nvfp4", "mxf4nvf4", "4X", [0, 0, 0, 0]),  # four per instruction: the whole word
])
def test_block_scaled_mma_compiles_for_sm100a(compiled, fmt, kind, vec, ids):
    c = compiled[fmt]
    assert c.spills == 0 and "0 bytes spill stores, 0 bytes spill loads" in c.ptxas_report
    mmas = re.findall(rf"tcgen05\.mma\.cta_group::1\.kind::{kind}\.block_scale\.scale_vec::{vec} \[%r\d+\], "
                      r"%rd\d+, %rd\d+, (%r\d+), \[(%r\d+)\], \[(%r\d+)\], %p\d+;", c.ptx)
    assert len(mmas) == 4  # K = 128 bytes of A per row: four instructions of 32 bytes
    # The instruction descriptors: M = 128, N = 256, K-major, the scale type, and each instruction's scale IDs.
    dtype, scale_dtype, _ = FORMATS[fmt]
    to = mgjit.dtypes.from_torch
    for i in set(ids):
        desc = Tcgen05ScaledInstrDescriptor(128, 256, to(dtype), to(dtype), to(scale_dtype), Major.K, Major.K, i, i)
        assert re.search(rf"mov\.b32\s+%r\d+, {desc.encode()};", c.ptx), (fmt, i)
    # Scale matrices: 128 x 4 chunks copied with 32x128b.warpx4, one per 4 scales of 128 rows (A: 128 rows, B: 256).
    copies = re.findall(r"tcgen05\.cp\.cta_group::1\.32x128b\.warpx4 \[%r\d+\], %rd\d+;", c.ptx)
    scales_per_row = {"mxfp8-e4m3": 4, "mxfp4": 8, "nvfp4": 16}[fmt]
    assert len(copies) == (1 + 2) * scales_per_row // 4


def test_block_scaled_mma_ir(compiled):
    text = compiled["nvfp4"].ir
    assert "tcgen05_mma {m=128, n=256, k=128, kind=mxf4nvf4, scaling=block_scale.scale_vec::4X" in text
    assert re.search(r"tmem_alloc \{shape=\(256, 16\), dtype=float8_e4m3fn, packing=4, collective=False, "
                     r"scales=True\}\(\) : ref<tmem, float8_e4m3fn\[256,16\], packing 4, scales> "
                     r"ScaleLayout\(rows=256, cols=16\)", text)
    assert "tcgen05_copy(" in text


# ---------------------------------------------------------------------------------------------- errors

@mgjit.kernel
def bad_scaled(a, b, sfa, sfb, c, SA_ROWS: mgjit.constexpr, S: mgjit.constexpr, B_T: mgjit.constexpr,
               ONE_SCALE: mgjit.constexpr):
    a_s = mgjit.smem((128, 128), a.dtype, swizzle=128)
    b_s = mgjit.smem((128, 128), b.dtype, swizzle=128)
    sfa_s = mgjit.smem((SA_ROWS // 128, S // 4 * 32, 16), sfa.dtype)
    acc = mgjit.tmem((128, 128), mgjit.float32)
    sfa_t = mgjit.tmem((SA_ROWS, S), sfa.dtype, scales=True)
    sfb_t = mgjit.tmem((128, S), sfb.dtype, scales=True)
    mgjit.tcgen05_copy(sfa_t, sfa_s)
    if ONE_SCALE:  # a register array where the scales go
        mgjit.tcgen05_mma(acc, a_s, b_s.T, a_scale=sfa_t, b_scale=sfa_t.load())
    mgjit.tcgen05_mma(acc, a_s, b_s.T if B_T else b_s, a_scale=sfa_t, b_scale=sfb_t)
    c[0:128, 0:64] = acc[:, 0:64].load()


META = {"e4m3": torch.empty(128, 128, dtype=E4M3, device="meta"), "e2m1": torch.empty(128, 128, dtype=E2M1,
                                                                                        device="meta")}


@pytest.mark.parametrize("data,scale,consts,text,phrase", [
    # mxfp8 over K = 128 has 4 scales per row; 8 given.
    ("e4m3", E8M0, dict(SA_ROWS=128, S=8, B_T=True, ONE_SCALE=False), "b_s.T if B_T else b_s",
     r"a_scale holds one float8_e8m0fnu scale per 32 values of K for each row of A: shape \(128, 4\)"),
    ("e4m3", E8M0, dict(SA_ROWS=256, S=4, B_T=True, ONE_SCALE=False), "b_s.T if B_T else b_s",
     r"a_scale .* shape \(128, 4\) for this MMA, got \(256, 4\)"),
    ("e4m3", E4M3, dict(SA_ROWS=128, S=4, B_T=True, ONE_SCALE=False), "b_s.T if B_T else b_s",
     r"no block-scaled tcgen05.mma multiplies float8_e4m3fn with float8_e4m3fn scales"),
    ("e2m1", E4M3, dict(SA_ROWS=128, S=16, B_T=False, ONE_SCALE=False), "b_s.T if B_T else b_s",
     r"e2m1 operands must be K-major"),
    ("e4m3", E8M0, dict(SA_ROWS=128, S=4, B_T=True, ONE_SCALE=True), "b_scale=sfa_t.load()",
     r"takes both a_scale= and b_scale=, TMEM references of scales"),
])
def test_block_scaled_mistakes_are_compile_errors(data, scale, consts, text, phrase):
    x = META[data]
    s = torch.empty(1, 32, 16, dtype=scale, device="meta")
    with pytest.raises(mgjit.CompileError) as excinfo:
        bad_scaled.compile(x, x, s, s, torch.empty(128, 128, device="meta"), **consts, target="sm_100a")
    e = excinfo.value
    assert e.loc.line == line_of(bad_scaled, text), str(e)
    assert re.search(phrase, e.message), e.message


@mgjit.kernel
def fp4_unscaled(a, c):
    a_s = mgjit.smem((128, 128), a.dtype, swizzle=128)
    acc = mgjit.tmem((128, 128), mgjit.float32)
    mgjit.tcgen05_mma(acc, a_s, a_s.T)
    c[0:128, 0:64] = acc[:, 0:64].load()


@mgjit.kernel
def scale_in_registers(s, c):
    c[0:4, 0:32] = s[0:4, 0:32].astype(mgjit.float32)


@mgjit.kernel
def scales_from_tmem(c):
    t = mgjit.tmem((128, 4), mgjit.float8_e4m3fn, scales=True)  # nvfp4 scales: an ordinary dtype
    c[0:128, 0:4] = t.load().astype(mgjit.float32)


def test_storage_types_need_their_scales_and_stay_out_of_registers():
    out = torch.empty(128, 128, device="meta")
    with pytest.raises(mgjit.CompileError, match=r"float4_e2m1fn_x2 operands are multiplied only with block scaling"):
        fp4_unscaled.compile(META["e2m1"], out, target="sm_100a")
    with pytest.raises(mgjit.CompileError, match=r"float8_e8m0fnu is a block-scaling storage type") as excinfo:
        scale_in_registers.compile(torch.empty(4, 32, dtype=E8M0, device="meta"), out)
    assert excinfo.value.loc.line == line_of(scale_in_registers, "c[0:4, 0:32] = s[0:4, 0:32]")
    with pytest.raises(mgjit.CompileError, match=r"block scales reach TMEM from SMEM .* do not move through "
                                                  r"registers") as excinfo:
        scales_from_tmem.compile(out, target="sm_100a")
    assert excinfo.value.rule == "tmem-layout"


@mgjit.kernel
def copy_before_the_scales_land(sfa, c):
    sfa_s = mgjit.smem((1, 32, 16), sfa.dtype)
    bar = mgjit.barrier(1)
    done = mgjit.barrier(1)
    sfa_t = mgjit.tmem((128, 4), sfa.dtype, scales=True)
    acc = mgjit.tmem((128, 32), mgjit.float32)
    mgjit.copy_async(sfa, (0, 0, 0), sfa_s, barrier=bar[0])
    mgjit.tcgen05_copy(sfa_t, sfa_s)
    bar[0].wait()
    mgjit.tcgen05_commit(done[0])
    done[0].wait()
    c[0:128, 0:32] = acc.load()


def test_interpreter_reports_a_scale_copy_that_races_its_tma_load():
    sfa = mgjit.blocked_scales(torch.randint(0, 255, (128, 4), dtype=torch.uint8).view(E8M0))
    with pytest.raises(mgjit.InterpretError, match="this tcgen05_copy reads SMEM bytes .* still in flight") as excinfo:
        copy_before_the_scales_land.interpret[(1,)](sfa, torch.zeros(128, 32))
    assert excinfo.value.check == "tma-incomplete"
    assert excinfo.value.loc.line == line_of(copy_before_the_scales_land, "mgjit.tcgen05_copy(sfa_t, sfa_s)")


def test_blocked_scales_is_the_chunk_layout():
    """Row r, scale s of a (256, 8) matrix lands at chunk (r // 128, s // 4), byte 16 (r % 32) + 4 (r // 32 % 4)
    + s % 4 of its 512: the rows of the SMEM tile tcgen05.cp reads, in the order the lanes get them."""
    scales = torch.arange(256 * 8, dtype=torch.int32).reshape(256, 8)
    blocked = mgjit.blocked_scales((scales % 251).to(torch.uint8)).view(torch.uint8)
    assert blocked.shape == (2, 64, 16)
    flat = blocked.reshape(-1)
    for r, s in [(0, 0), (37, 5), (130, 3), (255, 7)]:
        chunk = (r // 128) * 2 + s // 4
        assert flat[chunk * 512 + 16 * (r % 32) + 4 * (r % 128 // 32) + s % 4] == scales[r, s] % 251
