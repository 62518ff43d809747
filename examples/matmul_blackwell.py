"""Blackwell matmul: TMA into 128B-swizzled SMEM, an mbarrier ring, tcgen05 MMAs into tensor memory (TMEM),
and a TMEM -> registers -> swizzled SMEM -> TMA store epilogue. One kernel, three shapes (`CONFIGS`):

- "1cta": M = 128 per CTA. The accumulator is a 128 x BN TMEM reference in the default layout (row r in
  lane r); one tcgen05.mma.cta_group::1 of N = BN per K step; the epilogue reads 64 columns at a time
  into registers in the TCGEN05 layout and stores them through two SMEM tiles with TMA.
- "2cta": M = 256 per CTA pair (cluster=(2, 1, 1)). Each CTA loads its 128 rows of A and half the columns of
  B, with the TMA arrivals counted on the leader CTA's barrier; the leader issues tcgen05.mma.cta_group::2,
  which reads both CTAs' SMEM and writes both CTAs' TMEM, and tcgen05.commit multicasts each completion to the
  barriers of both CTAs.
- "m64": M = 64 per CTA. The 64 x BN accumulator takes the half-lane layout: two M = 64 MMAs per K step, the
  second writing lanes 16-31 of each quarter; it reaches registers in the WGMMA layout.

The pipeline is one warpgroup: its thread 0 keeps STAGES - 1 TMA loads in flight ahead of the MMAs, each MMA
is asynchronous, and `tcgen05_commit(empty[slot])` frees a slot when the MMA that read it is done. Ragged edges
need no code: TMA reads zeros past the tensor's end and drops what a store puts there.

    python examples/matmul_blackwell.py   # a B200: runs and checks; anywhere else: compiles for sm_100a

There is no Blackwell GPU here: without one the script compiles all three variants for sm_100a (ptxas runs,
the cubins go to the cache) and prints what it built; on a Hopper GPU it first shows that launching stops
with a LaunchError naming the architecture the kernel needs.
"""
from __future__ import annotations

import sys

import torch

import mgjit


@mgjit.kernel
def matmul_kernel(a, b, c, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr,
                  STAGES: mgjit.constexpr, COLLECTIVE: mgjit.constexpr, EPI_N: mgjit.constexpr,
                  TMA_STORE: mgjit.constexpr = True):
    CTAS = 2 if COLLECTIVE else 1
    BN_CTA = BN // CTAS  # the columns of B each CTA loads (a 2-CTA MMA reads both halves)
    pid = mgjit.program_id(0)
    rank = pid % 2 if COLLECTIVE else 0  # place in the CTA pair (the cluster rank); 0 is the leader
    tile = pid // CTAS
    tiles_n = mgjit.cdiv(b.shape[1], BN)
    m0 = (tile // tiles_n) * (BM * CTAS) + rank * BM
    n0 = (tile % tiles_n) * BN

    a_s = mgjit.smem((STAGES, BM, BK), a.dtype, swizzle=128)
    b_s = mgjit.smem((STAGES, BK, BN_CTA), b.dtype, swizzle=128)
    if TMA_STORE:  # the epilogue's tiles: two, so that one is filled while the TMA engine stores the other
        c_s = mgjit.smem((2, BM, EPI_N if BM == 128 else BN), c.dtype, swizzle=128)
    full = mgjit.barrier(STAGES, arrivals=2 * CTAS)  # the A and B copies of every CTA of the pair
    empty = mgjit.barrier(STAGES, arrivals=1)  # one tcgen05_commit per use of a slot
    done = mgjit.barrier(1, arrivals=1)
    acc = mgjit.tmem((BM, BN), mgjit.float32, collective=COLLECTIVE)
    k_tiles = mgjit.cdiv(a.shape[1], BK)

    for s in mgjit.static_range(STAGES - 1):
        if s < k_tiles:
            mgjit.copy_async(a, (m0, s * BK), a_s[s], barrier=full[s], collective=COLLECTIVE)
            mgjit.copy_async(b, (s * BK, n0 + rank * BN_CTA), b_s[s], barrier=full[s], collective=COLLECTIVE)
    for k in range(k_tiles):
        slot = k % STAGES
        if rank == 0:  # the leader CTA issues the MMA for the pair
            full[slot].wait()
            mgjit.tcgen05_mma(acc, a_s[slot], b_s[slot], accumulate=k > 0)
            mgjit.tcgen05_commit(empty[slot])  # arrives when this MMA has read the slot
        nk = k + STAGES - 1
        if nk < k_tiles:
            ns = nk % STAGES
            if nk >= STAGES:
                empty[ns].wait()  # the MMA of step k - 1 is done with slot ns
            mgjit.copy_async(a, (m0, nk * BK), a_s[ns], barrier=full[ns], collective=COLLECTIVE)
            mgjit.copy_async(b, (nk * BK, n0 + rank * BN_CTA), b_s[ns], barrier=full[ns], collective=COLLECTIVE)
    if rank == 0:
        mgjit.tcgen05_commit(done[0])
    done[0].wait()

    # Epilogue: TMEM -> registers (tcgen05.ld, in the register layout that matches the TMEM layout) -> swizzled
    # SMEM -> GMEM with TMA stores (or straight to GMEM with masked stores when TMA_STORE is off). A 128-row
    # accumulator goes EPI_N columns at a time; a 64-row one (half-lane, m64 collective) folds its columns over
    # the lanes, so it is read whole.
    for j in mgjit.static_range(BN // EPI_N if BM == 128 else 1):
        width = EPI_N if BM == 128 else BN
        part = (acc[:, j * width:(j + 1) * width] if BM == 128 else acc).load().astype(c.dtype)
        if TMA_STORE:
            mgjit.store_async_wait(1)  # the store that used this tile two steps ago has read it
            c_s[j % 2][...] = part
            mgjit.store_async(c, (m0, n0 + j * width), c_s[j % 2])
        else:
            c[mgjit.ds(m0, BM), mgjit.ds(n0 + j * width, width)] = part
    if TMA_STORE:
        mgjit.store_async_wait(0)


CONFIGS = {
    "1cta": dict(BM=128, BN=256, BK=64, STAGES=4, COLLECTIVE=False, EPI_N=64),
    "2cta": dict(BM=128, BN=256, BK=64, STAGES=4, COLLECTIVE=True, EPI_N=64),
    "m64": dict(BM=64, BN=128, BK=64, STAGES=4, COLLECTIVE=False, EPI_N=64),
}


def _launch_shape(m: int, n: int, cfg: dict) -> tuple[tuple[int], tuple[int, int, int] | None]:
    ctas = 2 if cfg["COLLECTIVE"] else 1
    tiles = -(-m // (cfg["BM"] * ctas)) * -(-n // cfg["BN"])
    return (tiles * ctas,), ((2, 1, 1) if ctas == 2 else None)


def _tma_ready(t: torch.Tensor) -> bool:
    """TMA needs a 16-byte aligned base, rows a multiple of 16 bytes apart and a contiguous last dimension."""
    return t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def _padded(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a view of a copy whose rows are padded to a multiple of 16 bytes (what TMA can read)."""
    if _tma_ready(t):
        return t
    cols = -(-t.shape[1] * t.element_size() // 16) * 16 // t.element_size()
    padded = torch.zeros(t.shape[0], cols, dtype=t.dtype, device=t.device)
    padded[:, :t.shape[1]] = t
    return padded[:, :t.shape[1]]


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, variant: str = "2cta") -> torch.Tensor:
    """c = a @ b for 2D bf16 CUDA tensors (fp32 accumulation in TMEM), on a Blackwell GPU (sm_100a).

    variant: "2cta" (M = 256 over a CTA pair), "1cta" (M = 128) or "m64" (M = 64, half-lane TMEM layout).
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs (M, K) @ (K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
        raise TypeError(f"matmul takes two bf16 tensors, got {a.dtype} and {b.dtype}")
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    m, n = a.shape[0], b.shape[1]
    c = torch.empty(m, n, dtype=a.dtype, device=a.device) if out is None else out
    # Rows that TMA cannot address: the epilogue stores straight from registers instead.
    cfg = {**CONFIGS[variant], "TMA_STORE": _tma_ready(c)}
    grid, cluster = _launch_shape(m, n, cfg)
    matmul_kernel[grid](_padded(a), _padded(b), c, **cfg, cluster=cluster)
    return c


# ---- what the harness needs

def setup(device):
    m = n = k = 4096
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
    return (a, b), torch.empty(m, n, device=device, dtype=torch.bfloat16)


def compile(a, b, out, target):
    """Every variant, for `target` (what `matmul` launches)."""
    built = []
    for cfg in CONFIGS.values():
        _, cluster = _launch_shape(a.shape[0], b.shape[1], cfg)
        built.append(matmul_kernel.compile(a, b, out, **cfg, target=target, cluster=cluster))
    return built


def reference(a, b):
    return a.float() @ b.float()


def _show_hopper_refusal() -> None:
    """On a GPU that is not a Blackwell: launching stops before the launch, with the architecture it needs."""
    a = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    try:
        matmul(a, b, variant="1cta")
    except mgjit.LaunchError as e:
        print(f"launching on this GPU stops before the launch:\n  LaunchError: {str(e).splitlines()[0]}")
    else:
        raise SystemExit("a Blackwell kernel was launched on a GPU that is not a Blackwell")


if __name__ == "__main__":
    from _harness import compile_only_elsewhere, main
    argv, compile_only = compile_only_elsewhere("sm_100a", "matmul_blackwell", sys.argv[1:])
    if compile_only and torch.cuda.is_available():
        _show_hopper_refusal()
    main(name="matmul_blackwell", setup=setup, compile=compile, run=lambda a, b, out: matmul(a, b, out),
         reference=reference, rtol=2e-2, atol=5e-2, bytes_moved=None, argv=argv)
