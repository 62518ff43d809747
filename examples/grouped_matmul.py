"""Grouped GEMM for mixture-of-experts: out[rows of group g] = x[rows of group g] @ w[g]^T for every group (expert)
at once, in one persistent launch, with ragged group sizes (some zero) known only on the device.

x holds the tokens sorted by group, (M, K); `offs` (int32, on the device) the groups' cumulative row ends and w
the experts' weights (E, K, N), as torch._grouped_mm takes them: K-major (each w[g] the transpose of an (N, K)
nn.Linear weight) or N-major.
bf16/f16, and fp8 e4m3 with rowwise scales (per token, per expert and output column) as
torch._scaled_grouped_mm takes them.

1. `group_tiles` (one CTA) turns offs into a table of row tiles: tile r of the grouped output belongs to group
   tile_group[r] and covers rows tile_row[r] .. min(tile_row[r] + BM, tile_end[r]); count[0] is how many.
2. `grouped_matmul_kernel` is the persistent warp-specialized Hopper matmul (examples/matmul_hopper.py) over the
   table's tiles x the column tiles. A tile's A rows may run into the next group (its results there are never
   stored); its B rows are its expert's (w viewed (E * N, K): rows past N belong to the next expert and land in
   columns past N, which are never stored either). The store stops at the group's last row through a TMA
   descriptor cut on the device (`mgjit.tma_bounded`: a copy of C's descriptor in GMEM whose row count is the
   group's end, one descriptor slot per consumer warpgroup).

    python examples/grouped_matmul.py     # runs and checks on a Hopper GPU; compiles for sm_90a without one
"""
from __future__ import annotations

import os
import sys

import mgjit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _matmul_schedules as schedules  # noqa: E402
from _device import sm_count  # noqa: E402
from matmul_hopper import _output, _tma_ready, check_ring, tile_origin  # noqa: E402

TABLE_CHUNK = 128  # row tiles the table kernel resolves per step


@mgjit.kernel
def group_tiles(offs, rows, tile_group, tile_row, tile_end, count, BM: mgjit.constexpr, GROUPS: mgjit.constexpr):
    """The row-tile table of groups with cumulative row ends `offs` (GROUPS: a power of two >= len(offs)) over
    `rows` rows. Prefix sums and lookups are masked sums over a (rows, GROUPS) square: no loop over the groups.
    offs live on the device, so the wrapper cannot check them without a sync: each group's rows are clamped to
    0..rows (none where its end is below its start) and the tile count to the table's length, so that offs that
    are not cumulative row ends give wrong rows of c but no tile past x or c, nor a read past the table. (A
    running maximum over the ends would need one more (GROUPS, GROUPS) square: at 128 groups it spilled.)"""
    g = mgjit.arange(GROUPS)
    ends = mgjit.minimum(mgjit.maximum(offs[mgjit.ds(0, GROUPS)], 0), rows)
    starts = mgjit.minimum(mgjit.maximum(offs[mgjit.ds(-1, GROUPS)], 0), rows)  # starts[0] reads past the front: 0
    row_tiles = mgjit.where((g < offs.shape[0]) & (ends > starts), (ends - starts + BM - 1) // BM, 0)
    before = (g[None, :] <= g[:, None]).astype(mgjit.int32)
    tiles_end = mgjit.sum(row_tiles[None, :] * before, axis=1)  # inclusive prefix sum
    tiles_start = tiles_end - row_tiles
    count[0] = mgjit.minimum(mgjit.sum(row_tiles), tile_group.shape[0])
    for chunk in range(mgjit.cdiv(tile_group.shape[0], TABLE_CHUNK)):
        r = chunk * TABLE_CHUNK + mgjit.arange(TABLE_CHUNK)
        group = mgjit.sum((tiles_end[None, :] <= r[:, None]).astype(mgjit.int32), axis=1)  # groups ending by r
        mine = (g[None, :] == group[:, None]).astype(mgjit.int32)
        first = mgjit.sum(tiles_start[None, :] * mine, axis=1)
        row0 = mgjit.sum(starts[None, :] * mine, axis=1)
        end = mgjit.sum(ends[None, :] * mine, axis=1)
        valid = group < offs.shape[0]
        tile_group[mgjit.ds(chunk * TABLE_CHUNK, TABLE_CHUNK)] = mgjit.where(valid, group, -1)
        tile_row[mgjit.ds(chunk * TABLE_CHUNK, TABLE_CHUNK)] = row0 + (r - first) * BM
        tile_end[mgjit.ds(chunk * TABLE_CHUNK, TABLE_CHUNK)] = end


@mgjit.kernel(num_warpgroups=3)
def grouped_matmul_kernel(x, w, c, scale_x, scale_w, tile_group, tile_row, tile_end, count, descriptors,
                          N: mgjit.constexpr, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr,
                          STAGES: mgjit.constexpr, GROUP_M: mgjit.constexpr, W_KMAJOR: mgjit.constexpr = True,
                          SCALED: mgjit.constexpr = False):
    """c = x @ w[group] per row tile of the table (group_tiles); w is (E * N, K) with W_KMAJOR, else (E * K, N).
    SCALED: c = (x @ w^T) * scale_x[row] * scale_w[group, column] (fp8 rowwise scales). Launch with BM // 64 + 1
    warpgroups; `descriptors` holds 128 bytes per consumer warpgroup of the grid."""
    check_ring(BM, STAGES, GROUP_M)  # refused by name, as matmul_kernel's
    assert BN % 64 == 0 and 64 <= BN <= 256, f"BN is 64, 128, 192 or 256 (the epilogue's 64-column chunks), got {BN}"
    CONSUMERS = BM // 64
    k_size = x.shape[1]
    tiles_n = mgjit.cdiv(N, BN)
    k_tiles = mgjit.cdiv(k_size, BK)
    row_tiles = count[0]
    tiles = row_tiles * tiles_n
    pid, ctas = mgjit.program_id(0), mgjit.num_programs(0)

    a_s = mgjit.smem((STAGES, CONSUMERS, 64, BK), x.dtype, swizzle=128)
    b_s = mgjit.smem((STAGES, BN, BK) if W_KMAJOR else (STAGES, BK, BN), w.dtype, swizzle=128)
    c_s = mgjit.smem((CONSUMERS, 64, BN), c.dtype, swizzle=128)
    full = mgjit.barrier(STAGES, arrivals=CONSUMERS + 1)
    empty = mgjit.barrier(STAGES, arrivals=CONSUMERS)

    wg = mgjit.warpgroup_id()
    it = 0
    if wg == 0:
        if CONSUMERS == 2:
            mgjit.set_max_registers(40, increase=False)
        for tile in range(pid, tiles, ctas):
            r, n0 = tile_origin(tile, row_tiles, tiles_n, 1, BN, GROUP_M)
            m0, group = tile_row[r], tile_group[r]
            for k in range(k_tiles):
                slot = it % STAGES
                if it >= STAGES:
                    empty[slot].wait()
                for h in mgjit.static_range(CONSUMERS):
                    mgjit.copy_async(x, (m0 + h * 64, k * BK), a_s[slot][h], barrier=full[slot])
                if W_KMAJOR:
                    mgjit.copy_async(w, (group * N + n0, k * BK), b_s[slot], barrier=full[slot])
                else:
                    mgjit.copy_async(w, (group * k_size + k * BK, n0), b_s[slot], barrier=full[slot])
                it += 1
    else:
        if CONSUMERS == 2:
            mgjit.set_max_registers(232, increase=True)
        half = wg - 1
        for tile in range(pid, tiles, ctas):
            r, n0 = tile_origin(tile, row_tiles, tiles_n, 1, BN, GROUP_M)
            m0, group, end = tile_row[r], tile_group[r], tile_end[r]
            acc = mgjit.zeros((64, BN), mgjit.float32)
            for k in range(k_tiles):
                slot = it % STAGES
                full[slot].wait()
                acc = mgjit.wgmma(acc, a_s[slot][half], b_s[slot].T if W_KMAJOR else b_s[slot])
                mgjit.wgmma_wait(1)
                if k > 0:
                    empty[(it - 1) % STAGES].arrive()
                it += 1
            mgjit.wgmma_wait(0)
            empty[(it - 1) % STAGES].arrive()
            row0 = m0 + half * 64
            mgjit.store_async_wait(0)
            # 64 columns at a time (registers of the accumulator: no data moves), each scaled as it is stored: a
            # 64 x 256 fp8 tile's column scales are 64 registers a thread at once, 16 a chunk.
            for j in mgjit.static_range(BN // 64):
                chunk = acc[:, j * 64:(j + 1) * 64]
                if SCALED:
                    chunk = chunk * scale_x[mgjit.ds(row0, 64)][:, None] * scale_w[group, mgjit.ds(n0 + j * 64, 64)]
                c_s[half][:, j * 64:(j + 1) * 64][...] = chunk.astype(c.dtype)
            if row0 + 64 <= end:
                mgjit.store_async(c, (row0, n0), c_s[half])
            else:  # the group ends inside these rows: the store drops the rest (the next group's)
                bounded = mgjit.tma_bounded(c, (end, None), descriptors, pid * CONSUMERS + half)
                mgjit.store_async(bounded, (row0, n0), c_s[half])
        mgjit.store_async_wait(0)


def column_tile(n: int) -> int:
    """BN for N output columns: 256 unless its padding of N exceeds that of 128-wide tiles by an eighth. Measured
    against 128 (benchmarks/RESULTS.md): N = 768 1.04x torch._grouped_mm against 0.98x, N = 1408 1.05x against
    1.04x, N = 4096 1.06x against 0.94x."""
    wide, narrow = -(-n // 256) * 256, -(-n // 128) * 128
    return 256 if wide <= narrow * 9 // 8 else 128


def grouped_matmul(x, w, offs, *, scale_x=None, scale_w=None, out_dtype=None, config: dict | None = None):
    """out (M, N) with out[offs[g-1]:offs[g]] = x[offs[g-1]:offs[g]] @ w[g] for w (E, K, N), as torch._grouped_mm:
    K-major (w[g] the transpose of an (N, K) weight, the usual storage) or N-major. fp8 (K-major): scale_x (M,)
    and scale_w (E, N) f32 scale the rows and columns, bf16 out. offs (int32, on x's device) should be
    non-decreasing and at most M (rows past the last end are not written); where they are not, the result is
    wrong but nothing is read or written out of bounds (`group_tiles`)."""
    out, launches = grouped_launches(x, w, offs, scale_x, scale_w, out_dtype, config)
    for kernel, grid, args, constexprs in launches:
        kernel[grid](*args, **constexprs)
    return out


def grouped_launches(x, w, offs, scale_x=None, scale_w=None, out_dtype=None, config: dict | None = None):
    """(out, the launches that fill it: [(kernel, grid, arguments, constexprs)] in order): what `grouped_matmul`
    runs (tests run them elsewhere: tests/test_ptx_wgmma.py)."""
    import torch
    if x.dim() != 2 or w.dim() != 3 or offs.dim() != 1 or offs.shape[0] != w.shape[0] or w.shape[1] != x.shape[1]:
        raise ValueError(f"grouped_matmul takes x (M, K), w (E, K, N) and offs (E,), got {tuple(x.shape)}, "
                         f"{tuple(w.shape)}, {tuple(offs.shape)}")
    if offs.dtype != torch.int32 or offs.device != x.device or w.device != x.device:
        raise ValueError(f"grouped_matmul takes offs as int32 cumulative row ends and w on x's device ({x.device}), "
                         f"got offs {offs.dtype} on {offs.device}, w on {w.device}")
    if x.dtype != w.dtype:
        raise TypeError(f"grouped_matmul takes x and w of one dtype, got {x.dtype} and {w.dtype}")
    schedules.check_operands("grouped_matmul", x=x)
    groups, k, n = w.shape
    bits = x.element_size() * 8
    w_kmajor = w.stride(1) == 1 or (bits != 16 and w.stride(2) != 1)
    w = w.transpose(1, 2) if w_kmajor else w  # (E, N, K) for K-major weights, else (E, K, N)
    w = w if w.stride(2) == 1 and w.stride(1) == w.shape[2] else w.contiguous()
    if bits != 16 and not w_kmajor:
        raise ValueError(f"{x.dtype} weights must be K-major: w[g] the transpose of an (N, K) matrix")
    out_dtype = out_dtype or (x.dtype if bits == 16 else torch.bfloat16)
    if not (n and k and x.shape[0]):  # nothing to store, or sums of nothing: no launch (no TMA of zero bytes)
        return torch.zeros(x.shape[0], n, dtype=out_dtype, device=x.device), []
    scaled = scale_x is not None
    cfg = {"BM": 128, "BN": column_tile(n), "BK": schedules.BK_FOR_BITS[bits], "GROUP_M": 8, **(config or {})}
    # 4 stages (3 of 256 columns), or as many as fit beside the epilogue's tile (BM=192, BN=256: 3 would need
    # 264 KB); an explicit STAGES is the caller's
    fit = schedules.stages_that_fit(cfg["BM"], cfg["BN"], cfg["BK"], x.element_size(),
                                    cfg["BM"] * cfg["BN"] * out_dtype.itemsize)
    cfg.setdefault("STAGES", min(3 if cfg["BN"] == 256 else 4, fit))
    sms = sm_count(x.device.index)
    rows_bound = -(-x.shape[0] // cfg["BM"]) + groups  # row tiles: at most one partial tile per group
    table = torch.empty(3, -(-rows_bound // TABLE_CHUNK) * TABLE_CHUNK, dtype=torch.int32, device=x.device)
    count = torch.empty(1, dtype=torch.int32, device=x.device)
    c = _output(x.shape[0], n, out_dtype, x.device)
    consumers = cfg["BM"] // 64
    descriptors = torch.empty(sms * consumers * 128, dtype=torch.uint8, device=x.device)
    launches = [
        (group_tiles, (1,), (offs, x.shape[0], table[0], table[1], table[2], count),
         dict(BM=cfg["BM"], GROUPS=max(16, 1 << (groups - 1).bit_length()))),
        (grouped_matmul_kernel, (min(sms, rows_bound * -(-n // cfg["BN"])),),
         (_tma_ready(x), _tma_ready(w.reshape(-1, w.shape[2])), c, scale_x if scaled else c, scale_w if scaled else c,
          table[0], table[1], table[2], count, descriptors),
         dict(N=n, W_KMAJOR=w_kmajor, SCALED=scaled, num_warpgroups=consumers + 1, **cfg))]
    return c, launches


def reference(x, w, offs, scale_x=None, scale_w=None):
    """The same product in float32, group by group."""
    import torch
    out, start = torch.zeros(x.shape[0], w.shape[2], dtype=torch.float32, device=x.device), 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = x[start:end].float() @ w[g].float()
        if scale_x is not None:
            out[start:end] *= scale_x[start:end, None] * scale_w[g][None, :]
        start = end
    return out


if __name__ == "__main__":
    import torch
    if torch.cuda.is_available():
        sizes = torch.tensor([0, 700, 33, 0, 1500, 128, 1, 900])
        offs = sizes.cumsum(0).to(torch.int32).cuda()
        x = torch.randn(int(sizes.sum()), 1024, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(8, 2048, 1024, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # (E, K, N), K-major
        out, ref = grouped_matmul(x, w, offs), reference(x, w, offs)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        print(f"grouped matmul, 8 experts (two empty), bf16: relative error {err:.2e}")
        raise SystemExit(0 if err < 1e-2 else 1)
    x, w = torch.empty(4096, 1024, dtype=torch.bfloat16), torch.empty(8 * 2048, 1024, dtype=torch.bfloat16)
    i32 = torch.empty(64, dtype=torch.int32)
    print(grouped_matmul_kernel.compile(x, w, x, x, x, i32, i32, i32, i32, torch.empty(1024, dtype=torch.uint8),
                                        N=2048, BM=128, BN=256, BK=64, STAGES=3, GROUP_M=8, target="sm_90a"))
