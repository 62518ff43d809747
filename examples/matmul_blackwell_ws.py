"""Blackwell persistent matmul with warp roles: a TMA warp, an MMA warp and epilogue warpgroups, the accumulator
double-buffered in tensor memory so that the epilogue of one tile overlaps the MMAs of the next. In bf16, and
block-scaled in mxfp8 (e4m3 with an e8m0 scale per 32 values of K) and nvfp4 (e2m1 with an e4m3 scale per 16);
on one CTA (M = 128 per tile) or a CTA pair (M = 256, cluster (2, 1, 1)); tiles scheduled statically over a
persistent grid, or dynamically with cluster launch control (CLC=True: one cluster per tile is launched, and
each running cluster cancels clusters that have not launched yet and takes their tiles).

Roles, per CTA (warpgroup 0's warps, then the epilogue warpgroups 1..EPI_WG):
- warp 0 (TMA): streams A, B (and the scales' blocked 128 x 4 chunks) into a ring of STAGES SMEM slots;
- warp 1 (MMA, the pair's leader CTA only): per K step copies the slot's scales to TMEM (tcgen05_copy), issues
  the tcgen05 MMAs into accumulator acc[i % 2], and commits: the slot back to `empty`, the finished
  accumulator to `acc_full`;
- warp 2 (CLC only): asks for the next tile (clc_try_cancel) while the others work on this one;
- epilogue warpgroup e: waits for the accumulator, reads its share of the columns from TMEM, hands the
  accumulator back (`acc_empty`, on the leader CTA's barrier for a pair) and stores through SMEM with TMA.
Every role walks the same sequence of tiles: program_id's pair, then every `pairs`-th one, or with CLC the
tiles the responses name (each role reads each response and releases it on `clc_empty`).

B is given K-major, as (N, K) (what e2m1 needs; for bf16 `matmul` takes any (K, N) and transposes a copy).
The block scales are given as (rows, K // block) matrices; `mgjit.blocked_scales` arranges them as the kernel
copies them (the wrapper does it).

    python examples/matmul_blackwell_ws.py   # a B200: runs and checks; anywhere else: compiles for sm_100a
"""
from __future__ import annotations

import sys

import torch
from _device import sm_count

import mgjit


@mgjit.device
def release(bar, COLLECTIVE):
    """One arrival on a barrier that counts the readers of both CTAs of a pair on the leader's copy."""
    if COLLECTIVE:
        bar.arrive(cta=0)
    else:
        bar.arrive()


@mgjit.device
def claimed_tile(i, responses, clc_full, clc_empty, COLLECTIVE):
    """(tile, valid): the tile of the i-th cluster launch control response, read by one role, which then
    releases the response."""
    clc_full[i % 2].wait()
    canceled, (first, _, _) = mgjit.clc_query(responses[i % 2])
    release(clc_empty[i % 2], COLLECTIVE)
    return first // (2 if COLLECTIVE else 1), canceled


@mgjit.kernel(num_warpgroups=3)
def matmul_ws_kernel(a, b, c, sfa, sfb, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr,
                     STAGES: mgjit.constexpr, COLLECTIVE: mgjit.constexpr, CLC: mgjit.constexpr,
                     SF_BLOCK: mgjit.constexpr, EPI_N: mgjit.constexpr, EPI_WG: mgjit.constexpr = 2):
    """c = a @ b.T (a (M, K), b (N, K)), block-scaled by sfa (M, K // SF_BLOCK) and sfb (N, K // SF_BLOCK),
    blocked, when SF_BLOCK is not 0."""
    CTAS = 2 if COLLECTIVE else 1
    BN_CTA = BN // CTAS  # B rows each CTA loads; the pair's MMA reads both halves
    SCALED = SF_BLOCK > 0
    S = BK * (2 if a.dtype == mgjit.float4_e2m1fn_x2 else 1) // SF_BLOCK if SCALED else 0  # scales/row/K step
    COPIES = 4 if SCALED else 2  # TMA copies into one slot, per CTA
    pid = mgjit.program_id(0)
    rank = pid % 2 if COLLECTIVE else 0  # place in the pair; rank 0 issues its MMAs
    pair, pairs = pid // CTAS, mgjit.num_programs(0) // CTAS
    tiles_m = mgjit.cdiv(a.shape[0], BM * CTAS)
    num_tiles = tiles_m * mgjit.cdiv(b.shape[0], BN)
    k_tiles = mgjit.cdiv(a.shape[1], BK)
    # Tiles one CTA can take: its static share, or with CLC any number up to all of them.
    rounds = num_tiles if CLC else mgjit.cdiv(num_tiles - pair, pairs)

    a_s = mgjit.smem((STAGES, BM, BK), a.dtype, swizzle=128)
    b_s = mgjit.smem((STAGES, BN_CTA, BK), b.dtype, swizzle=128)
    if SCALED:
        sfa_s = mgjit.smem((STAGES, BM // 128, S // 4 * 32, 16), sfa.dtype)
        sfb_s = mgjit.smem((STAGES, BN // 128, S // 4 * 32, 16), sfb.dtype)  # every column of the pair's B
    c_s = mgjit.smem((EPI_WG, 2, BM, EPI_N), c.dtype, swizzle=128)
    full = mgjit.barrier(STAGES, arrivals=COPIES * CTAS)  # counted on the leader CTA's barrier
    empty = mgjit.barrier(STAGES, arrivals=1)  # one commit (to both CTAs of a pair)
    acc_full = mgjit.barrier(2, arrivals=1)
    acc_empty = mgjit.barrier(2, arrivals=EPI_WG * CTAS)  # on the leader's barrier
    if CLC:
        responses = mgjit.smem((2, 2), mgjit.int64)
        clc_full = mgjit.barrier(2, arrivals=1)
        clc_empty = mgjit.barrier(2, arrivals=(2 + EPI_WG) * CTAS + 1)  # every reader of a response
    acc = mgjit.tmem((2, BM, BN), mgjit.float32, collective=COLLECTIVE)
    if SCALED:
        sfa_t = mgjit.tmem((STAGES, BM, S), sfa.dtype, scales=True, collective=COLLECTIVE)
        sfb_t = mgjit.tmem((STAGES, BN, S), sfb.dtype, scales=True, collective=COLLECTIVE)

    wg = mgjit.warpgroup_id()
    tile = pair
    valid = tile < num_tiles
    if wg == 0:
        if mgjit.warp_id() == 0:  # TMA
            it = 0  # position in the slot ring, continued across tiles
            for i in range(rounds):
                if valid:
                    m0 = (tile % tiles_m) * (BM * CTAS) + rank * BM
                    n0 = (tile // tiles_m) * BN
                    for k in range(k_tiles):
                        slot = it % STAGES
                        if it >= STAGES:
                            empty[slot].wait()
                        mgjit.copy_async(a, (m0, k * BK), a_s[slot], barrier=full[slot], collective=COLLECTIVE)
                        mgjit.copy_async(b, (n0 + rank * BN_CTA, k * BK), b_s[slot], barrier=full[slot],
                                         collective=COLLECTIVE)
                        if SCALED:
                            group = k * (S // 4) * 32
                            mgjit.copy_async(sfa, (m0 // 128, group, 0), sfa_s[slot], barrier=full[slot],
                                             collective=COLLECTIVE)
                            mgjit.copy_async(sfb, (n0 // 128, group, 0), sfb_s[slot], barrier=full[slot],
                                             collective=COLLECTIVE)
                        it += 1
                    if CLC:
                        tile, valid = claimed_tile(i, responses, clc_full, clc_empty, COLLECTIVE)
                    else:
                        tile = tile + pairs
        if mgjit.warp_id() == 1:  # MMA
            if rank == 0:
                it = 0
                for i in range(rounds):
                    if valid:
                        if i >= 2:
                            acc_empty[i % 2].wait()  # the epilogue has read this accumulator's last tile
                        for k in range(k_tiles):
                            slot = it % STAGES
                            full[slot].wait()
                            if SCALED:
                                mgjit.tcgen05_copy(sfa_t[slot], sfa_s[slot])
                                mgjit.tcgen05_copy(sfb_t[slot], sfb_s[slot])
                                mgjit.tcgen05_mma(acc[i % 2], a_s[slot], b_s[slot].T, accumulate=k > 0,
                                                  a_scale=sfa_t[slot], b_scale=sfb_t[slot])
                            else:
                                mgjit.tcgen05_mma(acc[i % 2], a_s[slot], b_s[slot].T, accumulate=k > 0)
                            mgjit.tcgen05_commit(empty[slot])  # the slot is free once these MMAs are done
                            it += 1
                        mgjit.tcgen05_commit(acc_full[i % 2])
                        if CLC:
                            tile, valid = claimed_tile(i, responses, clc_full, clc_empty, COLLECTIVE)
        if CLC:
            if mgjit.warp_id() == 2:  # the scheduler: asks for the next tile while this one is worked on
                for i in range(rounds):
                    if valid:
                        if rank == 0:
                            if i >= 2:
                                clc_empty[i % 2].wait()  # every role has read the response two tiles back
                        mgjit.clc_try_cancel(responses[i % 2], barrier=clc_full[i % 2], multicast=COLLECTIVE)
                        clc_full[i % 2].wait()
                        canceled, _ = mgjit.clc_query(responses[i % 2])
                        release(clc_empty[i % 2], COLLECTIVE)
                        valid = canceled
    else:
        for e in mgjit.static_range(EPI_WG):  # epilogue warpgroup 1 + e takes columns [e, e + 1) * BN / EPI_WG
            if wg == 1 + e:
                for i in range(rounds):
                    if valid:
                        m0 = (tile % tiles_m) * (BM * CTAS) + rank * BM
                        n0 = (tile // tiles_m) * BN
                        acc_full[i % 2].wait()
                        chunks = BN // EPI_WG // EPI_N
                        for j in mgjit.static_range(chunks):
                            col = e * (BN // EPI_WG) + j * EPI_N
                            part = acc[i % 2][:, col:col + EPI_N].load().astype(c.dtype)
                            if j == chunks - 1:  # the accumulator is read: the MMAs may reuse it
                                release(acc_empty[i % 2], COLLECTIVE)
                            buf = (i * chunks + j) % 2  # the two buffers alternate over all chunks
                            mgjit.store_async_wait(1)  # the store that used this buffer two chunks ago read it
                            c_s[e][buf][...] = part
                            mgjit.store_async(c, (m0, n0 + col), c_s[e][buf])
                        if CLC:
                            tile, valid = claimed_tile(i, responses, clc_full, clc_empty, COLLECTIVE)
                        else:
                            tile = tile + pairs
                mgjit.store_async_wait(0)


# Tile shapes per format and CTA group: the double-buffered accumulator (2 x BN columns) and the staged scales
# share TMEM's 512 columns; A, B and the scales' slots and the epilogue's tiles share SMEM.
CONFIGS = {
    "bf16": dict(BM=128, BN=256, BK=64, STAGES=3, COLLECTIVE=False, SF_BLOCK=0, EPI_N=64),
    "bf16-2cta": dict(BM=128, BN=256, BK=64, STAGES=4, COLLECTIVE=True, SF_BLOCK=0, EPI_N=64),
    "mxfp8": dict(BM=128, BN=128, BK=128, STAGES=4, COLLECTIVE=False, SF_BLOCK=32, EPI_N=64),
    "mxfp8-2cta": dict(BM=128, BN=128, BK=128, STAGES=4, COLLECTIVE=True, SF_BLOCK=32, EPI_N=64),
    "nvfp4": dict(BM=128, BN=128, BK=128, STAGES=4, COLLECTIVE=False, SF_BLOCK=16, EPI_N=64),
    "nvfp4-2cta": dict(BM=128, BN=128, BK=128, STAGES=4, COLLECTIVE=True, SF_BLOCK=16, EPI_N=64),
}
FORMATS = {"bf16": (torch.bfloat16, None), "mxfp8": (torch.float8_e4m3fn, torch.float8_e8m0fnu),
           "nvfp4": (torch.float4_e2m1fn_x2, torch.float8_e4m3fn)}


def launch_shape(m: int, n: int, cfg: dict, clc: bool, sms: int) -> tuple[tuple[int], tuple[int, int, int] | None]:
    """The grid (CTAs) and cluster: one cluster per tile with CLC, else a persistent grid of at most `sms` CTAs."""
    ctas = 2 if cfg["COLLECTIVE"] else 1
    tiles = -(-m // (cfg["BM"] * ctas)) * -(-n // cfg["BN"])
    clusters = tiles if clc else max(1, min(tiles, sms // ctas))
    return (clusters * ctas,), ((2, 1, 1) if ctas == 2 else None)


def _sms(device: torch.device) -> int:
    return sm_count(device.index) if device.type == "cuda" else 148


def matmul(a: torch.Tensor, b_t: torch.Tensor, a_scales: torch.Tensor | None = None,
           b_scales: torch.Tensor | None = None, out: torch.Tensor | None = None, variant: str | None = None,
           clc: bool = False, sms: int | None = None, blocked: bool = False) -> torch.Tensor:
    """bf16 c = a @ b_t.T, with a (M, K) and b_t (N, K) of one format: bf16, mxfp8 (float8_e4m3fn with
    float8_e8m0fnu scales (M, K // 32) and (N, K // 32)) or nvfp4 (float4_e2m1fn_x2, K // 2 bytes a row, with
    float8_e4m3fn scales (M, K // 16), (N, K // 16)). M and N multiples of 128 for the scaled formats.
    variant: a CONFIGS key (default: the format's 1-CTA one); clc: schedule tiles with cluster launch control;
    blocked: the scales are given already laid out by mgjit.blocked_scales (as a model keeps them)."""
    fmt = next((f for f, (dt, _) in FORMATS.items() if dt == a.dtype), None)
    if fmt is None or b_t.dtype != a.dtype or a.shape[1] != b_t.shape[1]:
        raise TypeError(f"matmul takes a (M, K) and b_t (N, K) of one of {sorted(FORMATS)}: got {a.dtype} "
                        f"{tuple(a.shape)} and {b_t.dtype} {tuple(b_t.shape)}")
    variant = variant or fmt
    if not variant.startswith(fmt) or variant not in CONFIGS:
        raise ValueError(f"variant {variant!r} does not multiply {fmt}; one of "
                         f"{[v for v in CONFIGS if v.startswith(fmt)]}")
    cfg = CONFIGS[variant]
    if (a_scales is None) != (FORMATS[fmt][1] is None):
        raise ValueError(f"{fmt} takes {'no' if FORMATS[fmt][1] is None else 'both'} scale matrices")
    m, n = a.shape[0], b_t.shape[0]
    c = torch.empty(m, n, dtype=torch.bfloat16, device=a.device) if out is None else out
    if a_scales is None:
        sfa = sfb = a  # unused without scales
    else:
        sfa, sfb = (a_scales, b_scales) if blocked else (mgjit.blocked_scales(a_scales), mgjit.blocked_scales(b_scales))
    grid, cluster = launch_shape(m, n, cfg, clc, sms or _sms(a.device))
    matmul_ws_kernel[grid](a, b_t, c, sfa, sfb, **cfg, CLC=clc, cluster=cluster)
    return c


# ---- what the harness needs

def quantize(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scales) of a float matrix in `fmt` ("mxfp8" or "nvfp4"): per block of K the scale is the block's
    largest magnitude over the format's largest value (a power of two for mxfp8), data = x / scale."""
    block, top = (32, 448.0) if fmt == "mxfp8" else (16, 6.0)
    blocks = x.float().reshape(x.shape[0], -1, block)
    amax = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    if fmt == "mxfp8":
        scale = torch.exp2(torch.ceil(torch.log2(amax / top)))
        return (blocks / scale).reshape(x.shape).to(torch.float8_e4m3fn), scale[..., 0].to(torch.float8_e8m0fnu)
    scale = (amax / top).to(torch.float8_e4m3fn).float().clamp_min(2.0 ** -9)
    return e2m1_pack(blocks / scale).reshape(x.shape[0], -1), scale[..., 0].to(torch.float8_e4m3fn)


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_pack(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) rounded to the nearest e2m1 value, two a byte (even K index in the low nibble)."""
    grid = _E2M1.to(x.device)
    code = (x.abs()[..., None] - grid).abs().argmin(-1) | ((x < 0).to(torch.int64) << 3)
    pairs = code.reshape(*x.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8).view(torch.float4_e2m1fn_x2)


def dequantize(data: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
    """The float64 matrix a block-scaled (data, scales) stands for."""
    if data.dtype == torch.float4_e2m1fn_x2:
        codes = data.view(torch.uint8).to(torch.int64)
        signed = torch.cat([_E2M1, -_E2M1]).to(data.device).double()
        values = torch.stack([signed[codes & 0xF], signed[codes >> 4]], -1).flatten(-2)
    else:
        values = data.double()
    if scales is None:
        return values
    return values * scales.double().repeat_interleave(values.shape[1] // scales.shape[1], dim=1)


def make_inputs(m: int, n: int, k: int, fmt: str, device) -> tuple:
    """Fresh random (a, b_t, a_scales, b_scales) in `fmt` (scales None for bf16)."""
    x, y = torch.randn(m, k, device=device), torch.randn(n, k, device=device)
    if fmt == "bf16":
        return x.bfloat16(), y.bfloat16(), None, None
    (a, sa), (b, sb) = quantize(x, fmt), quantize(y, fmt)
    return a, b, sa, sb


def setup(device):
    m = n = 4096
    k = 4096
    inputs = make_inputs(m, n, k, "mxfp8", device) if device != "meta" else (
        torch.empty(m, k, dtype=torch.float8_e4m3fn, device="meta"),
        torch.empty(n, k, dtype=torch.float8_e4m3fn, device="meta"),
        torch.empty(m, k // 32, dtype=torch.float8_e8m0fnu, device="meta"),
        torch.empty(n, k // 32, dtype=torch.float8_e8m0fnu, device="meta"))
    return inputs, torch.empty(m, n, device=device, dtype=torch.bfloat16)


def compile(a, b_t, a_scales, b_scales, out, target):
    """Every variant, with and without CLC, for `target` (meta tensors of the formats' dtypes and shapes)."""
    built = []
    m, n, k = a.shape[0], b_t.shape[0], a.shape[1]
    for variant, cfg in CONFIGS.items():
        fmt = variant.split("-")[0]
        dt, sdt = FORMATS[fmt]
        kk = k // 2 if fmt == "nvfp4" else k
        x = torch.empty(m, kk, dtype=dt, device="meta")
        y = torch.empty(n, kk, dtype=dt, device="meta")
        if sdt is None:
            sfa = sfb = x
        else:
            block = cfg["SF_BLOCK"]
            sfa = torch.empty(m // 128, k // block // 4 * 32, 16, dtype=sdt, device="meta")
            sfb = torch.empty(n // 128, k // block // 4 * 32, 16, dtype=sdt, device="meta")
        for clc in (False, True):
            _, cluster = launch_shape(m, n, cfg, clc, 148)
            built.append(matmul_ws_kernel.compile(x, y, out, sfa, sfb, **cfg, CLC=clc, target=target,
                                                  cluster=cluster))
    return built


def reference(a, b_t, a_scales, b_scales):
    return dequantize(a, a_scales) @ dequantize(b_t, b_scales).T


if __name__ == "__main__":
    from _harness import compile_only_elsewhere, main
    argv, _ = compile_only_elsewhere("sm_100a", "matmul_blackwell_ws", sys.argv[1:])
    main(name="matmul_blackwell_ws", setup=setup, compile=compile,
         run=lambda a, b_t, sa, sb, out: matmul(a, b_t, sa, sb, out=out), reference=reference, rtol=2e-2,
         atol=5e-2, bytes_moved=None, argv=argv)
