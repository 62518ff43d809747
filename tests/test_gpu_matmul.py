"""GPU tests of the Hopper machinery: TMA into swizzled SMEM, mbarrier pipelines and wgmma, against an
fp32 torch reference on fresh random inputs with poisoned outputs."""
import math

import pytest

import mgjit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@mgjit.kernel
def pipelined_matmul(a, b, c, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr,
                     STAGES: mgjit.constexpr):
    m0 = mgjit.program_id(0) * BM
    n0 = mgjit.program_id(1) * BN
    a_s = mgjit.smem((STAGES, BM, BK), a.dtype, swizzle=128)
    b_s = mgjit.smem((STAGES, BK, BN), b.dtype, swizzle=128)
    full = mgjit.barrier(STAGES, arrivals=2)  # two TMA copies (A and B) arrive on each phase
    k_tiles = mgjit.cdiv(a.shape[1], BK)
    for s in mgjit.static_range(STAGES - 1):
        if s < k_tiles:
            mgjit.copy_async(a, (m0, s * BK), a_s[s], barrier=full[s])
            mgjit.copy_async(b, (s * BK, n0), b_s[s], barrier=full[s])
    acc = mgjit.zeros((BM, BN), mgjit.float32)
    for k in range(k_tiles):
        slot = k % STAGES
        full[slot].wait()
        acc = mgjit.wgmma(acc, a_s[slot], b_s[slot])
        mgjit.wgmma_wait(1)
        nk = k + STAGES - 1
        if nk < k_tiles:
            mgjit.copy_async(a, (m0, nk * BK), a_s[nk % STAGES], barrier=full[nk % STAGES])
            mgjit.copy_async(b, (nk * BK, n0), b_s[nk % STAGES], barrier=full[nk % STAGES])
    mgjit.wgmma_wait(0)
    c[mgjit.ds(m0, BM), mgjit.ds(n0, BN)] = acc.astype(c.dtype)


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("m,n,k", [(256, 256, 64), (1024, 1024, 1024), (1000, 3000, 2000), (128, 512, 4096)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pipelined_matmul(m, n, k, dtype):
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    bm, bn = 128, 128
    pipelined_matmul[(triton_cdiv(m, bm), triton_cdiv(n, bn))](a, b, c, BM=bm, BN=bn, BK=64, STAGES=4)
    ref = a.float() @ b.float()
    assert not c.isnan().any()
    assert rel_err(c, ref) < 1e-2


def triton_cdiv(x, y):
    return (x + y - 1) // y


@mgjit.kernel(num_warpgroups=3)
def ws_matmul(a, b, c, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr, STAGES: mgjit.constexpr,
              GROUP_M: mgjit.constexpr):
    """Warp-specialized: warpgroup 0 issues TMA, warpgroups 1 and 2 each compute BM/2 rows with wgmma."""
    pid = mgjit.program_id(0)
    tiles_m = mgjit.cdiv(a.shape[0], BM)
    tiles_n = mgjit.cdiv(b.shape[1], BN)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    rows_in_group = mgjit.minimum(tiles_m - first_m, GROUP_M)
    m0 = (first_m + (pid % (GROUP_M * tiles_n)) % rows_in_group) * BM
    n0 = ((pid % (GROUP_M * tiles_n)) // rows_in_group) * BN
    a_s = mgjit.smem((STAGES, 2, BM // 2, BK), a.dtype, swizzle=128)
    b_s = mgjit.smem((STAGES, BK, BN), b.dtype, swizzle=128)
    full = mgjit.barrier(STAGES, arrivals=3)   # three TMA copies per stage
    empty = mgjit.barrier(STAGES, arrivals=2)  # both consumers release a stage
    k_tiles = mgjit.cdiv(a.shape[1], BK)
    wg = mgjit.warpgroup_id()
    if wg == 0:
        mgjit.set_max_registers(40, increase=False)
        for k in range(k_tiles):
            slot = k % STAGES
            if k >= STAGES:
                empty[slot].wait()
            mgjit.copy_async(a, (m0, k * BK), a_s[slot][0], barrier=full[slot])
            mgjit.copy_async(a, (m0 + BM // 2, k * BK), a_s[slot][1], barrier=full[slot])
            mgjit.copy_async(b, (k * BK, n0), b_s[slot], barrier=full[slot])
    else:
        mgjit.set_max_registers(232, increase=True)
        acc = mgjit.zeros((BM // 2, BN), mgjit.float32)
        for k in range(k_tiles):
            slot = k % STAGES
            full[slot].wait()
            acc = mgjit.wgmma(acc, a_s[slot][wg - 1], b_s[slot])
            mgjit.wgmma_wait(1)
            if k > 0:
                empty[(k - 1) % STAGES].arrive()
        mgjit.wgmma_wait(0)
        c[mgjit.ds(m0 + (wg - 1) * (BM // 2), BM // 2), mgjit.ds(n0, BN)] = acc.astype(c.dtype)


@pytest.mark.parametrize("m,n,k", [(1024, 1024, 1024), (1000, 3000, 2000), (4096, 4096, 512), (256, 8192, 1024)])
def test_ws_matmul(m, n, k):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    bm, bn = 128, 256
    grid = (triton_cdiv(m, bm) * triton_cdiv(n, bn),)
    ws_matmul[grid](a, b, c, BM=bm, BN=bn, BK=64, STAGES=4, GROUP_M=8)
    ref = a.float() @ b.float()
    assert not c.isnan().any()
    assert rel_err(c, ref) < 1e-2


@pytest.mark.parametrize("m,n,k", [(4096, 4096, 4096), (1000, 3000, 2000), (4097, 4095, 333), (128, 8192, 1024),
                                   (1, 256, 512), (77, 1000, 64)])
@pytest.mark.parametrize("config", [{}, {"BN": 128, "STAGES": 6}, {"BN": 64, "STAGES": 8}])
def test_example_persistent_matmul(m, n, k, config):
    import sys, os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    from matmul_hopper import matmul
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = matmul(a, b, config)
    ref = a.float() @ b.float()
    assert not c.isnan().any()
    assert rel_err(c, ref) < 1e-2


def _example():
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import matmul_hopper
    return matmul_hopper


@pytest.mark.parametrize("m,n,k", [(2048, 2048, 2048), (1000, 3000, 2000), (64, 512, 1024)])
def test_fp8_e4m3_with_scales(m, n, k, poison_empty):
    mh = _example()
    a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)  # B given (N, K): K-major
    scale_a = torch.tensor([0.5], device="cuda")
    scale_b = torch.tensor([0.25], device="cuda")
    c = mh.matmul(a, w, scale=scale_a * scale_b, b_kmajor=True)
    ref = (a.float() @ w.float().t()) * 0.125
    assert c.dtype == torch.bfloat16 and not c.isnan().any()
    assert rel_err(c, ref) < 1e-2
    if m % 16 == 0 and n % 16 == 0 and k % 16 == 0:
        theirs = torch._scaled_mm(a, w.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
        assert rel_err(c, theirs.float()) < 1e-2


@pytest.mark.parametrize("m,n,k", [(1024, 1024, 1024), (1000, 300, 200)])
def test_tf32(m, n, k):
    mh = _example()
    a = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda")
    c = mh.matmul(a, w, b_kmajor=True, out_dtype=torch.float32)
    ref = a.double() @ w.double().t()
    assert rel_err(c, ref) < 2e-3


def test_f16_operands_k_major_b():
    mh = _example()
    a = torch.randn(512, 768, device="cuda", dtype=torch.float16)
    w = torch.randn(384, 768, device="cuda", dtype=torch.float16)
    c = mh.matmul(a, w, b_kmajor=True)
    assert rel_err(c, a.float() @ w.float().t()) < 1e-2


@mgjit.kernel
def tile_roundtrip(x, y, BM: mgjit.constexpr, BN: mgjit.constexpr):
    """GMEM → registers → swizzled SMEM → TMA store."""
    m0 = mgjit.program_id(0) * BM
    t = mgjit.smem((BM, BN), y.dtype, swizzle=128)
    v = x[mgjit.ds(m0, BM), mgjit.ds(0, BN)]
    t[...] = (v * 2).astype(y.dtype)
    mgjit.store_async(y, (m0, 0), t)
    mgjit.store_async_wait(0)


@pytest.mark.parametrize("dtype,bn", [(torch.bfloat16, 128), (torch.float32, 64), (torch.bfloat16, 64)])
def test_smem_store_and_tma_store(dtype, bn):
    x = torch.randn(300, bn, device="cuda", dtype=dtype)
    y = torch.full_like(x, float("nan"))
    tile_roundtrip[(triton_cdiv(300, 64),)](x, y, BM=64, BN=bn)
    torch.testing.assert_close(y, (x * 2).to(dtype))


def test_fused_bias_gelu_epilogue():
    mh = _example()
    a = torch.randn(1000, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 3000, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(3000, device="cuda", dtype=torch.bfloat16)
    c = mh.matmul(a, b, bias=bias, activation="gelu")
    ref = torch.nn.functional.gelu(a.float() @ b.float() + bias.float())
    assert rel_err(c, ref) < 1e-2


@pytest.mark.parametrize("tma_store", [True, False])
def test_epilogue_variants(tma_store):
    mh = _example()
    a = torch.randn(4097, 333, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(333, 4095, device="cuda", dtype=torch.bfloat16)
    cfg = {"TMA_STORE": tma_store, "STAGES": 3 if tma_store else 4}
    c = mh.matmul(a, b, cfg)
    assert rel_err(c, a.float() @ b.float()) < 1e-2


@mgjit.kernel
def splitk_matmul(a, b, c, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr, SPLIT: mgjit.constexpr):
    """Each CTA multiplies one K slice and adds its partial tile into c (f32) with a TMA reduction."""
    m0 = mgjit.program_id(0) * BM
    n0 = mgjit.program_id(1) * BN
    split = mgjit.program_id(2)
    a_s = mgjit.smem((2, BM, BK), a.dtype, swizzle=128)
    b_s = mgjit.smem((2, BK, BN), b.dtype, swizzle=128)
    c_s = mgjit.smem((BM, BN), c.dtype, swizzle=128)
    full = mgjit.barrier(2, arrivals=2)
    k_tiles = mgjit.cdiv(mgjit.cdiv(a.shape[1], BK), SPLIT)
    k_first = split * k_tiles
    acc = mgjit.zeros((BM, BN), mgjit.float32)
    mgjit.copy_async(a, (m0, k_first * BK), a_s[0], barrier=full[0])
    mgjit.copy_async(b, (k_first * BK, n0), b_s[0], barrier=full[0])
    for k in range(k_tiles):
        slot = k % 2
        if k + 1 < k_tiles:
            nxt = (k + 1) % 2
            mgjit.copy_async(a, (m0, (k_first + k + 1) * BK), a_s[nxt], barrier=full[nxt])
            mgjit.copy_async(b, ((k_first + k + 1) * BK, n0), b_s[nxt], barrier=full[nxt])
        full[slot].wait()
        acc = mgjit.wgmma(acc, a_s[slot], b_s[slot])
        mgjit.wgmma_wait(0)
    c_s[...] = acc
    mgjit.store_async(c, (m0, n0), c_s, reduce="add")
    mgjit.store_async_wait(0)


def test_split_k_with_tma_reduce_add():
    m, n, k = 256, 256, 2048
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.zeros(m, n, device="cuda")
    splitk_matmul[(m // 64, n // 64, 4)](a, b, c, BM=64, BN=64, BK=64, SPLIT=4)
    assert rel_err(c, a.float() @ b.float()) < 1e-3


@mgjit.kernel
def pipe_matmul(a, b, c, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr, STAGES: mgjit.constexpr,
                RELEASE: mgjit.constexpr = 1):
    m0 = mgjit.program_id(0) * BM
    n0 = mgjit.program_id(1) * BN
    acc = mgjit.zeros((BM, BN), mgjit.float32)
    for k, a_t, b_t in mgjit.pipeline(mgjit.cdiv(a.shape[1], BK), mgjit.tile(a, (m0, 0), (BM, BK), (0, BK)),
                                      mgjit.tile(b, (0, n0), (BK, BN), (BK, 0)), stages=STAGES, release=RELEASE):
        acc = mgjit.wgmma(acc, a_t, b_t)
    c[mgjit.ds(m0, BM), mgjit.ds(n0, BN)] = acc.astype(c.dtype)


@mgjit.kernel(num_warpgroups=2)
def ws_pipe_matmul(a, b, c, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr,
                   STAGES: mgjit.constexpr):
    m0 = mgjit.program_id(0) * BM
    n0 = mgjit.program_id(1) * BN
    acc = mgjit.zeros((BM, BN), mgjit.float32)
    for k, a_t, b_t in mgjit.pipeline(mgjit.cdiv(a.shape[1], BK), mgjit.tile(a, (m0, 0), (BM, BK), (0, BK)),
                                      mgjit.tile(b, (0, n0), (BK, BN), (BK, 0)), stages=STAGES,
                                      warp_specialize=True):
        acc = mgjit.wgmma(acc, a_t, b_t)
    if mgjit.warpgroup_id() == 1:
        c[mgjit.ds(m0, BM), mgjit.ds(n0, BN)] = acc.astype(c.dtype)


@pytest.mark.parametrize("kernel", [pipe_matmul, ws_pipe_matmul])
@pytest.mark.parametrize("m,n,k", [(512, 512, 1024), (1000, 304, 200), (128, 128, 64)])  # TMA needs 16-byte rows
def test_pipeline_helper(kernel, m, n, k):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    kernel[(triton_cdiv(m, 128), triton_cdiv(n, 128))](a, b, c, BM=128, BN=128, BK=64, STAGES=4)
    assert rel_err(c, a.float() @ b.float()) < 1e-2


@pytest.mark.parametrize("stages,release", [(4, 2), (4, 3), (3, 0)])
def test_pipeline_helper_keeping_wgmmas_in_flight(stages, release):
    """release wgmmas stay in flight; the ring never refills a slot one of them still reads."""
    a = torch.randn(1000, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 304, device="cuda", dtype=torch.bfloat16)
    c = torch.full((1000, 304), float("nan"), device="cuda", dtype=torch.bfloat16)
    pipe_matmul[(triton_cdiv(1000, 128), triton_cdiv(304, 128))](a, b, c, BM=128, BN=128, BK=64, STAGES=stages,
                                                                  RELEASE=release)
    assert rel_err(c, a.float() @ b.float()) < 1e-2


@mgjit.kernel
def a_from_registers(a, b, c, K: mgjit.constexpr, N: mgjit.constexpr):
    """acc = relu(a) @ b: A is loaded to registers, transformed, and fed to wgmma from registers."""
    m0 = mgjit.program_id(0) * 64
    b_s = mgjit.smem((K, N), b.dtype, swizzle=128)
    bar = mgjit.barrier(1)
    mgjit.copy_async(b, (0, 0), b_s, barrier=bar[0])
    a_r = mgjit.maximum(a[mgjit.ds(m0, 64), mgjit.ds(0, K)], 0.0)
    bar[0].wait()
    acc = mgjit.wgmma(mgjit.zeros((64, N), mgjit.float32), a_r, b_s)
    mgjit.wgmma_wait(0)
    c[mgjit.ds(m0, 64), mgjit.ds(0, N)] = acc


@pytest.mark.parametrize("k,n", [(64, 128), (128, 64)])
def test_wgmma_a_from_registers(k, n):
    a = torch.randn(200, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.full((200, n), float("nan"), device="cuda")
    a_from_registers[(triton_cdiv(200, 64),)](a, b, c, K=k, N=n)
    assert rel_err(c, a.float().relu() @ b.float()) < 1e-2


@mgjit.kernel
def multicast_copy(x, out, R: mgjit.constexpr, C: mgjit.constexpr):
    """Each CTA of a 2-CTA cluster issues half of one tile, multicast: both receive all of it."""
    t = mgjit.smem((R, C), x.dtype, swizzle=128)
    bar = mgjit.barrier(1)
    mgjit.cluster_sync()  # every CTA's barrier is initialised before any multicast signals it
    cluster = mgjit.program_id(0) // 2
    mgjit.copy_async(x, (cluster * R, 0), t, barrier=bar[0], multicast=True)
    bar[0].wait()
    mgjit.store_async(out, (mgjit.program_id(0) * R, 0), t)
    mgjit.store_async_wait(0)
    mgjit.cluster_sync()  # no CTA exits while its peer may still write into its shared memory


@mgjit.kernel
def multicast_axes(x, out, R: mgjit.constexpr, C: mgjit.constexpr, CLUSTER: mgjit.constexpr,
                   AXES: mgjit.constexpr):
    """Tile i of each CTA is multicast along cluster axis AXES[i]: the CTAs along that axis copy a part each of
    the tile at the CTA's grid position with its coordinate on that axis rounded down to the cluster's start."""
    t = mgjit.smem((2, R, C), x.dtype, swizzle=128)
    bar = mgjit.barrier(1, arrivals=2)
    mgjit.cluster_sync()  # every CTA's barrier is initialised before any multicast signals it
    x0, y0, z0 = mgjit.program_id(0), mgjit.program_id(1), mgjit.program_id(2)
    nx, ny = mgjit.num_programs(0), mgjit.num_programs(1)
    for i in mgjit.static_range(2):
        px, py, pz = x0, y0, z0
        if AXES[i] == "x":
            px = x0 - x0 % CLUSTER[0]
        if AXES[i] == "y":
            py = y0 - y0 % CLUSTER[1]
        if AXES[i] == "z":
            pz = z0 - z0 % CLUSTER[2]
        mgjit.copy_async(x, ((px + nx * (py + ny * pz)) * R, 0), t[i], barrier=bar[0], multicast=AXES[i])
    bar[0].wait()
    me = x0 + nx * (y0 + ny * z0)
    for i in mgjit.static_range(2):
        mgjit.store_async(out, ((2 * me + i) * R, 0), t[i])
    mgjit.store_async_wait(0)
    mgjit.cluster_sync()  # no CTA exits while its peers may still write into its shared memory


def multicast_axes_expected(x, grid, cluster, axes, r):
    """What multicast_axes stores: for each CTA (x fastest) and each tile, the rows its group reads."""
    parts = []
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x0 in range(grid[0]):
                for a in axes:
                    p = [x0, y, z]
                    d = "xyz".index(a)
                    p[d] -= p[d] % cluster[d]
                    src = p[0] + grid[0] * (p[1] + grid[1] * p[2])
                    parts.append(x[src * r:(src + 1) * r])
    return torch.cat(parts)


MULTICAST_AXES_CASES = [((4, 2, 1), (2, 2, 1), "xy"), ((4, 3, 1), (2, 3, 1), "yx"), ((2, 2, 2), (1, 2, 2), "zy"),
                        ((4, 2, 1), (4, 2, 1), "xy")]


@pytest.mark.parametrize("grid,cluster,axes", MULTICAST_AXES_CASES)
def test_tma_multicast_along_cluster_axes(grid, cluster, axes):
    r, c = 96, 64
    x = torch.randn(math.prod(grid) * r, c, device="cuda", dtype=torch.bfloat16)
    out = torch.full((2 * math.prod(grid) * r, c), float("nan"), device="cuda", dtype=torch.bfloat16)
    multicast_axes[grid](x, out, R=r, C=c, CLUSTER=cluster, AXES=tuple(axes), cluster=cluster)
    torch.cuda.synchronize()
    assert torch.equal(out, multicast_axes_expected(x, grid, cluster, axes, r))


def test_tma_multicast_in_a_cluster():
    clusters, r, c = 6, 64, 64
    x = torch.randn(clusters * r, c, device="cuda", dtype=torch.bfloat16)
    out = torch.full((2 * clusters * r, c), float("nan"), device="cuda", dtype=torch.bfloat16)
    multicast_copy[(2 * clusters,)](x, out, R=r, C=c, cluster=(2, 1, 1))
    torch.cuda.synchronize()
    expected = x.view(clusters, 1, r, c).expand(clusters, 2, r, c).reshape(2 * clusters * r, c)
    torch.testing.assert_close(out, expected)
    with pytest.raises(mgjit.LaunchError, match="whole number of clusters"):
        multicast_copy[(3,)](x, out, R=r, C=c, cluster=(2, 1, 1))
