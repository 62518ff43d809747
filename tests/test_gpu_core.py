"""GPU tests of the core language: every kernel is checked against torch on fresh random inputs, with the
output poisoned (NaN or a sentinel) before the launch so that an unwritten element fails."""
import math

import pytest

import mgjit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def poison(t):
    return t.fill_(float("nan")) if t.dtype.is_floating_point else t.fill_(-12345)


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@mgjit.kernel
def add_kernel(x, y, out, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    out[mgjit.ds(start, BLOCK)] = x[mgjit.ds(start, BLOCK)] + y[mgjit.ds(start, BLOCK)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1 << 20, 1000003, 7])
def test_vector_add(dtype, n):
    x = torch.randn(n, device="cuda", dtype=dtype)
    y = torch.randn(n, device="cuda", dtype=dtype)
    out = poison(torch.empty_like(x))
    add_kernel[(triton_cdiv(n, 1024),)](x, y, out, BLOCK=1024)
    torch.testing.assert_close(out, x + y)


def triton_cdiv(a, b):
    return (a + b - 1) // b


@mgjit.kernel
def softmax_kernel(x, out, BLOCK: mgjit.constexpr):
    row = mgjit.program_id(0)
    v = x[row, mgjit.ds(0, BLOCK)].astype(mgjit.float32)
    cols = mgjit.arange(BLOCK)
    v = mgjit.where(cols < x.shape[1], v, -float("inf"))
    e = mgjit.exp(v - v.max())
    out[row, mgjit.ds(0, BLOCK)] = (e / e.sum()).astype(out.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols,block", [(1000, 1024), (1024, 1024), (4096, 4096), (77, 128), (8192, 8192)])
def test_softmax(dtype, cols, block):
    x = torch.randn(300, cols, device="cuda", dtype=dtype) * 3
    out = poison(torch.empty_like(x))
    softmax_kernel[(x.shape[0],)](x, out, BLOCK=block)
    ref = torch.softmax(x.float(), dim=1)
    assert rel_err(out, ref) < TOL[dtype] * 2


@mgjit.kernel
def rmsnorm_kernel(x, w, out, eps: mgjit.constexpr, BLOCK: mgjit.constexpr):
    row = mgjit.program_id(0)
    v = x[row, mgjit.ds(0, BLOCK)].astype(mgjit.float32)
    ms = (v * v).sum() / x.shape[1]
    y = v * mgjit.rsqrt(ms + eps) * w[mgjit.ds(0, BLOCK)].astype(mgjit.float32)
    out[row, mgjit.ds(0, BLOCK)] = y.astype(out.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols,block", [(4096, 4096), (1000, 1024)])
def test_rmsnorm(dtype, cols, block):
    x = torch.randn(513, cols, device="cuda", dtype=dtype)
    w = torch.randn(cols, device="cuda", dtype=dtype)
    out = poison(torch.empty_like(x))
    rmsnorm_kernel[(x.shape[0],)](x, w, out, eps=1e-6, BLOCK=block)
    xf = x.float()
    ref = xf * torch.rsqrt(xf.pow(2).mean(dim=1, keepdim=True) + 1e-6) * w.float()
    assert rel_err(out, ref) < TOL[dtype] * 2


@mgjit.kernel
def unary_kernel(x, out, OP: mgjit.constexpr, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    v = x[mgjit.ds(start, BLOCK)]
    if OP == "exp":
        r = mgjit.exp(v)
    elif OP == "log":
        r = mgjit.log(mgjit.abs(v) + 1e-3)
    elif OP == "sqrt":
        r = mgjit.sqrt(mgjit.abs(v))
    elif OP == "rsqrt":
        r = mgjit.rsqrt(mgjit.abs(v) + 1e-3)
    elif OP == "tanh":
        r = mgjit.tanh(v)
    elif OP == "erf":
        r = mgjit.erf(v)
    elif OP == "sin":
        r = mgjit.sin(v)
    elif OP == "neg_abs":
        r = -abs(v)
    else:
        r = mgjit.exp2(v)
    out[mgjit.ds(start, BLOCK)] = r


UNARY_REF = {
    "exp": torch.exp, "log": lambda v: torch.log(v.abs() + 1e-3), "sqrt": lambda v: v.abs().sqrt(),
    "rsqrt": lambda v: torch.rsqrt(v.abs() + 1e-3), "tanh": torch.tanh, "erf": torch.erf, "sin": torch.sin,
    "neg_abs": lambda v: -v.abs(), "exp2": torch.exp2,
}


@pytest.mark.parametrize("op", sorted(UNARY_REF))
def test_unary_f32(op):
    x = torch.randn(100_000, device="cuda") * 2
    out = poison(torch.empty_like(x))
    unary_kernel[(triton_cdiv(x.numel(), 512),)](x, out, OP=op, BLOCK=512)
    ref = UNARY_REF[op](x.double())
    torch.testing.assert_close(out.double(), ref, rtol=2e-6 if op not in ("exp", "exp2") else 1e-5, atol=1e-6)


@mgjit.kernel
def int_kernel(a, b, out_q, out_r, out_cmp, out_mix, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    x = a[mgjit.ds(start, BLOCK)]
    y = b[mgjit.ds(start, BLOCK)]
    out_q[mgjit.ds(start, BLOCK)] = x // y
    out_r[mgjit.ds(start, BLOCK)] = x % y
    out_cmp[mgjit.ds(start, BLOCK)] = mgjit.where((x > y) & (x != 7), x, y)
    out_mix[mgjit.ds(start, BLOCK)] = (mgjit.maximum(x, y) * 3 - mgjit.minimum(x, y)) ^ (x << 2) | (y >> 1)


def test_int32_ops():
    n = 50_000
    a = torch.randint(0, 1000, (n,), device="cuda", dtype=torch.int32)
    b = torch.randint(1, 50, (n,), device="cuda", dtype=torch.int32)
    outs = [poison(torch.empty_like(a)) for _ in range(4)]
    int_kernel[(triton_cdiv(n, 1024),)](a, b, *outs, BLOCK=1024)
    torch.testing.assert_close(outs[0], a // b)
    torch.testing.assert_close(outs[1], a % b)
    torch.testing.assert_close(outs[2], torch.where((a > b) & (a != 7), a, b))
    torch.testing.assert_close(outs[3], (torch.maximum(a, b) * 3 - torch.minimum(a, b)) ^ (a << 2) | (b >> 1))


@mgjit.kernel
def tile_reduce_kernel(x, row_sum, col_max, centered, BM: mgjit.constexpr, BN: mgjit.constexpr):
    r0 = mgjit.program_id(0) * BM
    t = x[mgjit.ds(r0, BM), mgjit.ds(0, BN)].astype(mgjit.float32)
    row_sum[mgjit.ds(r0, BM)] = t.sum(axis=1)
    col_max[mgjit.program_id(0), mgjit.ds(0, BN)] = t.max(axis=0)
    mean = t.sum(axis=1, keepdims=True) / BN
    centered[mgjit.ds(r0, BM), mgjit.ds(0, BN)] = (t - mean).astype(centered.dtype)


@pytest.mark.parametrize("bm,bn", [(32, 64), (8, 256), (64, 16), (128, 128)])
def test_2d_reductions_and_broadcast(bm, bn):
    tiles = 5
    x = torch.randn(tiles * bm, bn, device="cuda", dtype=torch.bfloat16)
    row_sum = poison(torch.empty(tiles * bm, device="cuda"))
    col_max = poison(torch.empty(tiles, bn, device="cuda"))
    centered = poison(torch.empty_like(x))
    tile_reduce_kernel[(tiles,)](x, row_sum, col_max, centered, BM=bm, BN=bn)
    xf = x.float()
    torch.testing.assert_close(row_sum, xf.sum(1), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(col_max, xf.view(tiles, bm, bn).amax(1))
    torch.testing.assert_close(centered.float(), xf - xf.mean(1, keepdim=True), rtol=1e-2, atol=2e-2)


@mgjit.device
def scaled(v, s):
    return v * s


@mgjit.kernel
def loop_kernel(x, out, n, scale, BLOCK: mgjit.constexpr, UNROLL: mgjit.constexpr):
    """Row sums with a runtime loop over column chunks, a static loop, a helper and a runtime if."""
    row = mgjit.program_id(0)
    acc = mgjit.zeros((BLOCK,), mgjit.float32)
    for j in range(0, n, BLOCK):
        acc += x[row, mgjit.ds(j, BLOCK)].astype(mgjit.float32)
    total = acc.sum()
    extra = 0.0
    for k in mgjit.static_range(UNROLL):
        extra += k
    if row % 2 == 0:
        total = scaled(total, scale) + extra
    else:
        total = -total
    out[row] = total


def test_loops_helpers_if():
    rows, n = 37, 5000
    x = torch.randn(rows, n, device="cuda")
    out = poison(torch.empty(rows, device="cuda"))
    loop_kernel[(rows,)](x, out, n, 2.5, BLOCK=512, UNROLL=4)
    s = x.double().sum(1)
    even = torch.arange(rows, device="cuda") % 2 == 0
    ref = torch.where(even, s * 2.5 + 6.0, -s)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-3)


@mgjit.kernel(num_warpgroups=2)
def two_warpgroups_kernel(x, out, BLOCK: mgjit.constexpr):
    wg = mgjit.warpgroup_id()
    start = (mgjit.program_id(0) * 2 + wg) * BLOCK
    v = x[mgjit.ds(start, BLOCK)]
    out[mgjit.ds(start, BLOCK)] = v - v.max()


def test_num_warpgroups():
    x = torch.randn(64 * 1024, device="cuda")
    out = poison(torch.empty_like(x))
    two_warpgroups_kernel[(x.numel() // 2048,)](x, out, BLOCK=1024)
    xv = x.view(-1, 1024)
    torch.testing.assert_close(out.view(-1, 1024), xv - xv.amax(1, keepdim=True))


def test_strided_and_unaligned_views():
    base = torch.randn(256, 1030, device="cuda")
    x = base[:, 3:1003]  # unaligned start, row stride 1030: scalar accesses
    out = poison(torch.empty(256, 1000, device="cuda"))
    softmax_kernel[(256,)](x, out, BLOCK=1024)
    torch.testing.assert_close(out, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)
    xt = torch.randn(1000, 256, device="cuda").t()  # last stride 256
    out2 = poison(torch.empty(256, 1000, device="cuda"))
    softmax_kernel[(256,)](xt, out2, BLOCK=1024)
    torch.testing.assert_close(out2, torch.softmax(xt, 1), rtol=1e-5, atol=1e-6)


def test_launch_errors():
    x = torch.randn(1024, device="cuda")
    with pytest.raises(mgjit.LaunchError, match="is on cpu"):
        add_kernel[(1,)](x.cpu(), x, x, BLOCK=1024)
    with pytest.raises(mgjit.LaunchError, match="missing the constexpr argument `BLOCK`"):
        add_kernel[(1,)](x, x, x)
    with pytest.raises(mgjit.LaunchError, match="takes 4 arguments"):
        add_kernel[(1,)](x, x, x, 1024, 5)
    with pytest.raises(mgjit.LaunchError, match="grid"):
        add_kernel[(-1,)](x, x, x, BLOCK=1024)
    out = torch.full_like(x, float("nan"))
    add_kernel[(0,)](x, x, out, BLOCK=1024)  # an empty grid launches nothing, as in Triton
    torch.cuda.synchronize()
    assert out.isnan().all()
    with pytest.raises(mgjit.LaunchError, match="1 to 3 ints"):
        add_kernel[(1, 1, 1, 1)](x, x, x, BLOCK=1024)


@mgjit.kernel
def fixed_kernel(x: mgjit.float16, out: mgjit.float16, BLOCK: mgjit.constexpr):
    out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)]


def test_fixed_dtype_error():
    x = torch.randn(128, device="cuda")
    with pytest.raises(mgjit.LaunchError, match="must be float16"):
        fixed_kernel[(1,)](x, x, BLOCK=128)


def test_cached_launch_is_identical_after_recompile_in_new_kernel_object():
    """A second Kernel object over the same function hits the disk cache and computes the same result."""
    x = torch.randn(4096, device="cuda")
    y = torch.randn(4096, device="cuda")
    out1, out2 = poison(torch.empty_like(x)), poison(torch.empty_like(x))
    add_kernel[(4,)](x, y, out1, BLOCK=1024)
    again = mgjit.kernel(add_kernel.fn)
    again[(4,)](x, y, out2, BLOCK=1024)
    assert again.compile(x, y, out2, BLOCK=1024).from_cache
    torch.testing.assert_close(out1, out2)
    assert math.isfinite(out2.sum().item())
