"""Hopper matmul: TMA into 128B-swizzled SMEM, an mbarrier ring, wgmma, warp specialization, persistent grid.

Each CTA loops over output tiles. Warpgroup 0 is the producer: it streams A and B tiles into a ring of
STAGES shared-memory slots with the TMA engine, running ahead into the next tile while the consumers
finish the current one. Warpgroups 1 and 2 are consumers: each multiplies its half of the A tile by the
B tile on the tensor cores (wgmma), hands each slot back, and stores its half of C. Ragged edges need no
code: TMA reads zeros past the tensor's end and the final store is masked.

    python examples/matmul_hopper.py     # runs and checks on a Hopper GPU; compiles for sm_90a without one
"""
from __future__ import annotations

import functools

import mgjit


@mgjit.device
def tile_origin(tile, tiles_m, tiles_n, BM, BN, GROUP_M):
    """Grouped order: GROUP_M row tiles share each column sweep, so B tiles are reused from L2."""
    group = tile // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    rows_in_group = mgjit.minimum(tiles_m - first_m, GROUP_M)
    within = tile % (GROUP_M * tiles_n)
    return (first_m + within % rows_in_group) * BM, (within // rows_in_group) * BN


@mgjit.kernel(num_warpgroups=3)
def matmul_kernel(a, b, c, scale, bias, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr,
                  STAGES: mgjit.constexpr, GROUP_M: mgjit.constexpr, B_KMAJOR: mgjit.constexpr = False,
                  SCALED: mgjit.constexpr = False, BIAS: mgjit.constexpr = False,
                  ACTIVATION: mgjit.constexpr = None, TMA_STORE: mgjit.constexpr = True):
    """c = act(a @ b * scale[0] + bias): b is (K, N), or (N, K) when B_KMAJOR (needed for fp8/tf32); the
    scale, bias and activation are optional and applied to the fp32 accumulator on the way out."""
    tiles_m = mgjit.cdiv(a.shape[0], BM)
    tiles_n = mgjit.cdiv(b.shape[0] if B_KMAJOR else b.shape[1], BN)
    k_tiles = mgjit.cdiv(a.shape[1], BK)
    first, step = mgjit.program_id(0), mgjit.num_programs(0)

    a_s = mgjit.smem((STAGES, 2, BM // 2, BK), a.dtype, swizzle=128)  # one half of A per consumer
    b_s = mgjit.smem((STAGES, BN, BK) if B_KMAJOR else (STAGES, BK, BN), b.dtype, swizzle=128)
    if TMA_STORE:
        c_s = mgjit.smem((2, BM // 2, BN), c.dtype, swizzle=128)  # each consumer's epilogue tile
    full = mgjit.barrier(STAGES, arrivals=3)   # three TMA copies fill a slot
    empty = mgjit.barrier(STAGES, arrivals=2)  # both consumers release it

    wg = mgjit.warpgroup_id()
    it = 0  # position in the slot ring, continued across tiles
    if wg == 0:
        mgjit.set_max_registers(40, increase=False)
        for tile in range(first, tiles_m * tiles_n, step):
            m0, n0 = tile_origin(tile, tiles_m, tiles_n, BM, BN, GROUP_M)
            with mgjit.trace("load tile"):  # spans: recorded when a launch profiles (profile=mgjit.Profile())
                for k in range(k_tiles):
                    slot = it % STAGES
                    if it >= STAGES:
                        empty[slot].wait()
                    mgjit.copy_async(a, (m0, k * BK), a_s[slot][0], barrier=full[slot])
                    mgjit.copy_async(a, (m0 + BM // 2, k * BK), a_s[slot][1], barrier=full[slot])
                    mgjit.copy_async(b, (n0, k * BK) if B_KMAJOR else (k * BK, n0), b_s[slot], barrier=full[slot])
                    it += 1
    else:
        mgjit.set_max_registers(232, increase=True)
        for tile in range(first, tiles_m * tiles_n, step):
            with mgjit.trace("tile"):
                m0, n0 = tile_origin(tile, tiles_m, tiles_n, BM, BN, GROUP_M)
                acc = mgjit.zeros((BM // 2, BN), mgjit.float32)
                with mgjit.trace("mma"):
                    for k in range(k_tiles):
                        slot = it % STAGES
                        full[slot].wait()
                        acc = mgjit.wgmma(acc, a_s[slot][wg - 1], b_s[slot].T if B_KMAJOR else b_s[slot])
                        mgjit.wgmma_wait(1)  # the previous slot's wgmma is done: give that slot back
                        if k > 0:
                            empty[(it - 1) % STAGES].arrive()
                        it += 1
                    mgjit.wgmma_wait(0)
                empty[(it - 1) % STAGES].arrive()
                with mgjit.trace("epilogue"):
                    if SCALED:
                        acc = acc * scale[0]
                    if BIAS:
                        acc = acc + bias[mgjit.ds(n0, BN)].astype(mgjit.float32)
                    if ACTIVATION == "relu":
                        acc = mgjit.maximum(acc, 0.0)
                    elif ACTIVATION == "gelu":
                        acc = 0.5 * acc * (1.0 + mgjit.erf(acc * 0.7071067811865476))
                    row0 = m0 + (wg - 1) * (BM // 2)
                    if TMA_STORE:  # registers → swizzled SMEM (no bank conflicts) → TMA, overlapping the next tile
                        mgjit.store_async_wait(0)
                        c_s[wg - 1][...] = acc.astype(c.dtype)
                        mgjit.store_async(c, (row0, n0), c_s[wg - 1])
                    else:
                        c[mgjit.ds(row0, BM // 2), mgjit.ds(n0, BN)] = acc.astype(c.dtype)
        mgjit.store_async_wait(0)


DEFAULT_CONFIG = dict(BM=128, BN=256, BK=64, STAGES=3, GROUP_M=8)
# One 128-byte swizzle row of K per tile row: 64 bf16/f16, 128 fp8, 32 tf32.
BK_FOR_BITS = {16: 64, 8: 128, 32: 32}


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count


def _tma_ready(t, copy: bool = True):
    """TMA needs 16-byte aligned rows: a tensor whose rows are not goes into (a view of) one padded to 16."""
    import torch
    if t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0:
        return t
    cols = -(-t.shape[1] * t.element_size() // 16) * 16 // t.element_size()
    padded = torch.zeros(t.shape[0], cols, dtype=t.dtype, device=t.device)
    if copy:
        padded[:, :t.shape[1]] = t
    return padded[:, :t.shape[1]]


def matmul(a, b, config: dict | None = None, *, scale=None, bias=None, activation: str | None = None,
           out_dtype=None, b_kmajor: bool = False, profile=None):
    """act(a @ b * scale + bias) for 2D CUDA tensors with fp32 accumulation: bf16/f16; fp8 e4m3/e5m2 and f32
    (as tf32) with b given (N, K) and b_kmajor=True. `scale` is a 1-element f32 tensor, `bias` an (N,)
    tensor, `activation` None, "relu" or "gelu"; `profile` an mgjit.Profile that records the kernel's spans."""
    import torch
    k_b = b.shape[1] if b_kmajor else b.shape[0]
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != k_b:
        raise ValueError(f"matmul needs (M, K) @ (K, N) (or (N, K) with b_kmajor), got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul takes two tensors of one dtype, got {a.dtype} and {b.dtype}")
    bits = a.element_size() * 8
    if bits != 16 and not b_kmajor:
        raise ValueError(f"{a.dtype} operands must be K-major: pass b as (N, K) with b_kmajor=True")
    out_dtype = out_dtype or (a.dtype if bits == 16 else torch.bfloat16)
    wide_out = out_dtype.itemsize == 4  # a 4-byte epilogue tile does not fit beside the stages: store directly
    cfg = {**DEFAULT_CONFIG, "BK": BK_FOR_BITS[bits], "TMA_STORE": not wide_out, **(config or {}),
           "B_KMAJOR": b_kmajor, "SCALED": scale is not None, "BIAS": bias is not None, "ACTIVATION": activation}
    m, n = a.shape[0], (b.shape[0] if b_kmajor else b.shape[1])
    c = _tma_ready(torch.empty(m, n, dtype=out_dtype, device=a.device), copy=False)
    tiles = -(-m // cfg["BM"]) * -(-n // cfg["BN"])
    matmul_kernel[(min(tiles, _sm_count(a.device.index)),)](
        _tma_ready(a), _tma_ready(b), c, scale if scale is not None else c, bias if bias is not None else c, **cfg,
        **({} if profile is None else {"profile": profile}))  # a profiled launch takes the Python path
    return c


def _matmul_outputs(a, b, scale=None, bias=None, activation=None, b_kmajor=False):
    import torch
    return (a.shape[0], b.shape[0] if b_kmajor else b.shape[1]), a.dtype if a.element_size() == 2 else torch.bfloat16


# matmul (default config and output dtype) as a torch custom op: torch.compile keeps it as one node.
matmul_op = mgjit.torch_op("mgjit_examples::matmul", outputs=_matmul_outputs, params={
    "a": "Tensor", "b": "Tensor", "scale": "Optional[Tensor]", "bias": "Optional[Tensor]",
    "activation": "Optional[str]", "b_kmajor": bool})(matmul)


if __name__ == "__main__":
    import torch
    if torch.cuda.is_available():
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        c = matmul(a, b)
        err = ((c.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
        print(f"matmul 4096^3 bf16: relative error {err:.2e}")
        raise SystemExit(0 if err < 1e-2 else 1)
    x = torch.empty(4096, 4096, dtype=torch.bfloat16)
    print(matmul_kernel.compile(x, x, x, x, x, **DEFAULT_CONFIG, target="sm_90a"))
