"""SMEM views, scoped SMEM and the TMA extras on the GPU, against torch on fresh random inputs with poisoned
outputs: static and runtime slices of swizzled tiles feeding wgmma (K-major and MN-major operands), TMA into
views, two scoped buffers that together exceed the SMEM budget sharing their bytes, an L2 prefetch before a copy,
row gathers (embedding lookups; gathered tokens times a weight) against torch.index_select, and windows (a tile's
elements in storage order from a runtime start, read and written). The same kernels run under the interpreter in
test_smem_views.py."""
import pytest

import mgjit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@mgjit.kernel
def sliced_wgmma(a, b, c, K: mgjit.constexpr, B_KMAJOR: mgjit.constexpr):
    """c (128 x 128) = a @ b from views: 64-row halves of A, 64-column blocks of B, K in runtime 64-wide steps."""
    a_s = mgjit.smem((128, K), a.dtype, swizzle=128)
    b_s = mgjit.smem((128, K) if B_KMAJOR else (K, 128), b.dtype, swizzle=128)
    bars = mgjit.barrier(1, arrivals=2)
    mgjit.copy_async(a, (0, 0), a_s, barrier=bars[0])
    mgjit.copy_async(b, (0, 0), b_s, barrier=bars[0])
    bars[0].wait()
    b_kn = b_s.T if B_KMAJOR else b_s  # (K, N) either way
    for h in mgjit.static_range(2):
        rows = a_s[h * 64:(h + 1) * 64]
        for n in mgjit.static_range(2):
            acc = mgjit.zeros((64, 64), mgjit.float32)
            for k in range(K // 64):
                acc = mgjit.wgmma(acc, rows[:, mgjit.ds(k * 64, 64)], b_kn[mgjit.ds(k * 64, 64), n * 64:(n + 1) * 64])
                mgjit.wgmma_wait(0)
            c[mgjit.ds(h * 64, 64), mgjit.ds(n * 64, 64)] = acc.astype(c.dtype)


@pytest.mark.parametrize("b_kmajor", [False, True], ids=["b-mn-major", "b-k-major"])
def test_slices_feed_wgmma(b_kmajor):
    a = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16) if b_kmajor else \
        torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    c = torch.full((128, 128), float("nan"), device="cuda", dtype=torch.float32)
    sliced_wgmma[(1,)](a, b, c, K=256, B_KMAJOR=b_kmajor)
    ref = a.float() @ (b.float().t() if b_kmajor else b.float())
    torch.testing.assert_close(c, ref, rtol=1e-2, atol=1e-2)


@mgjit.kernel
def views_through_tma(x, x3, out, R: mgjit.constexpr, C: mgjit.constexpr):
    """TMA copies into views of some rows of a 2-block tile, and into a 3D buffer whose stages do not fold into
    one box (a box per stage and column block); reads back from views."""
    t = mgjit.smem((2 * R, C), x.dtype, swizzle=128)
    s = mgjit.smem((2, R, C), x.dtype, swizzle=128)
    bars = mgjit.barrier(1, arrivals=3)
    mgjit.copy_async(x, (R, 0), t[0:R], barrier=bars[0])
    mgjit.copy_async(x, (0, 0), t[R:2 * R], barrier=bars[0])
    mgjit.copy_async(x3, (0, 0, 0), s, barrier=bars[0])
    bars[0].wait()
    out[mgjit.ds(0, R), mgjit.ds(0, C)] = t[R:2 * R][...]
    out[mgjit.ds(R, R), mgjit.ds(0, C)] = t[0:R][...] + s[0][...]


def test_tma_into_views():
    x = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    views_through_tma[(1,)](x, x.view(2, 64, 128), out, R=64, C=128)
    assert torch.equal(out, torch.cat([x[:64], x[64:] + x[:64]]))


@mgjit.kernel
def scoped_reuse(x, out, STAGES: mgjit.constexpr, R: mgjit.constexpr, C: mgjit.constexpr):
    """Two scopes of STAGES x R x C each (together over the SMEM budget): the second reuses the first's bytes."""
    bars = mgjit.barrier(2, arrivals=STAGES)
    for phase in mgjit.static_range(2):
        with mgjit.scoped_smem((STAGES, R, C), x.dtype, swizzle=128) as buf:
            for s in mgjit.static_range(STAGES):
                mgjit.copy_async(x, (phase * STAGES * R + s * R, 0), buf[s], barrier=bars[phase])
            bars[phase].wait()
            for s in range(STAGES):
                row = phase * STAGES * R + s * R
                out[mgjit.ds(row, R), mgjit.ds(0, C)] = buf[s][...] * (phase + 2)


def test_scoped_buffers_share_their_bytes():
    x = torch.randn(1024, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    scoped_reuse[(1,)](x, out, STAGES=4, R=128, C=128)
    torch.testing.assert_close(out, torch.cat([x[:512] * 2, x[512:] * 3]))


@mgjit.kernel
def prefetch_then_copy(x, out, R: mgjit.constexpr, C: mgjit.constexpr):
    r0 = mgjit.program_id(0) * R
    t = mgjit.smem((R, C), x.dtype, swizzle=128)
    bars = mgjit.barrier(1)
    mgjit.prefetch_async(x, (r0, 0), t)
    mgjit.prefetch_async(x, (r0 + R, 0), (R, 64))  # the next block's first columns, by shape
    mgjit.copy_async(x, (r0, 0), t, barrier=bars[0])
    bars[0].wait()
    out[mgjit.ds(r0, R), mgjit.ds(0, C)] = t[...]


def test_prefetch_then_copy():
    x = torch.randn(300, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    prefetch_then_copy[(5,)](x, out, R=64, C=128)
    assert torch.equal(out, x)


@mgjit.kernel
def gather_rows(table, ids, out, R: mgjit.constexpr, D: mgjit.constexpr, SW: mgjit.constexpr):
    """An embedding lookup: out[i] = table[ids[i]], R rows per CTA, through SMEM."""
    r0 = mgjit.program_id(0) * R
    t = mgjit.smem((R, D), table.dtype, swizzle=SW)
    bars = mgjit.barrier(1)
    mgjit.gather_async(table, ids[mgjit.ds(r0, R)], 0, t, barrier=bars[0])
    bars[0].wait()
    out[mgjit.ds(r0, R), mgjit.ds(0, D)] = t[...]


def embedding_reference(table, ids):
    """torch.index_select, with rows whose index is outside the table zero (what TMA reads there)."""
    inside = (ids >= 0) & (ids < table.shape[0])
    rows = torch.index_select(table, 0, torch.where(inside, ids, 0).long())
    return torch.where(inside[:, None], rows, torch.zeros_like(rows))


@pytest.mark.parametrize("swizzle,dim", [(128, 256), (None, 64), (128, 64)])
def test_gather_rows_is_index_select(swizzle, dim):
    table = torch.randn(1000, dim, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 1000, (300,), device="cuda", dtype=torch.int32)
    ids[7], ids[100] = 1000, -3  # outside the table: zero rows
    out = torch.full((300, dim), float("nan"), device="cuda", dtype=torch.bfloat16)
    gather_rows[(5,)](table, ids, out, R=64, D=dim, SW=swizzle)
    assert torch.equal(out, embedding_reference(table, ids))


@mgjit.kernel
def gathered_matmul(x, ids, w, out, R: mgjit.constexpr, K: mgjit.constexpr, N: mgjit.constexpr):
    """MoE-style: the tokens ids[r0:r0 + R] gathered into a swizzled tile, times w (K x N), on the tensor cores."""
    r0 = mgjit.program_id(0) * R
    x_s = mgjit.smem((R, K), x.dtype, swizzle=128)
    w_s = mgjit.smem((K, N), w.dtype, swizzle=128)
    bars = mgjit.barrier(1, arrivals=2)
    mgjit.gather_async(x, ids[mgjit.ds(r0, R)], 0, x_s, barrier=bars[0])
    mgjit.copy_async(w, (0, 0), w_s, barrier=bars[0])
    bars[0].wait()
    acc = mgjit.wgmma(mgjit.zeros((R, N), mgjit.float32), x_s, w_s)
    mgjit.wgmma_wait(0)
    out[mgjit.ds(r0, R), mgjit.ds(0, N)] = acc


def test_gathered_tokens_times_weight():
    x = torch.randn(500, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 500, (256,), device="cuda", dtype=torch.int32)
    out = torch.full((256, 64), float("nan"), device="cuda", dtype=torch.float32)
    gathered_matmul[(4,)](x, ids, w, out, R=64, K=128, N=64)
    torch.testing.assert_close(out, x[ids.long()].float() @ w.float(), rtol=1e-2, atol=1e-2)


@mgjit.kernel
def windows(x, out, start, R: mgjit.constexpr, C: mgjit.constexpr):
    """out[:R] = the elements of x's first 2R rows (staged as two tiles) from flat element `start` on, as (R, C);
    out[R:] = x's first 2R rows, those of a window from `start` doubled in place."""
    t = mgjit.smem((2, R, C), x.dtype)
    t[0][...] = x[mgjit.ds(0, R), mgjit.ds(0, C)]
    t[1][...] = x[mgjit.ds(R, R), mgjit.ds(0, C)]
    mgjit.cta_sync()
    out[mgjit.ds(0, R), mgjit.ds(0, C)] = t.window(start, (R, C))[...]
    u = mgjit.smem((2 * R, C), x.dtype)
    u[...] = x[mgjit.ds(0, 2 * R), mgjit.ds(0, C)]
    mgjit.cta_sync()
    w = u.window(start, (R // 2, 2 * C))
    w[...] = w[...] * 2.0
    mgjit.cta_sync()
    out[mgjit.ds(R, 2 * R), mgjit.ds(0, C)] = u[...]


def windows_reference(x, start, R, C):
    flat = x[:2 * R, :C].reshape(-1)
    doubled = flat.clone()
    doubled[start:start + R * C] *= 2
    return torch.cat([flat[start:start + R * C].view(R, C), doubled.view(2 * R, C)])


@pytest.mark.parametrize("start", [0, 8, 200, 256 + 24, 16 * 256])
def test_windows_read_and_write_a_tile_in_storage_order(start):
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    out = torch.full((48, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    windows[(1,)](x, out, start, R=16, C=256)
    torch.testing.assert_close(out, windows_reference(x, start, 16, 256), rtol=0, atol=0)
