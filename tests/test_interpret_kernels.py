"""Every example and every GPU-test kernel, interpreted on the CPU on small shapes and fresh random inputs
(outputs poisoned first) and compared with torch: numerics checked in CI, and the checker silent on all of
them under every schedule. This is where the Blackwell matmul (1-CTA M = 64 / 128, 2-CTA M = 128 / 256) is
run for the first time.

Tolerances: f32 results of exact inputs match to f32 rounding (the interpreter accumulates MMAs in f32, as
the tensor cores do, in another order); bf16/f16 results within a few units of their last place (relative
error 5e-3 over the tensor, against 1e-2 on the GPU); the lowering's approximate ex2/lg2/rsqrt are computed
exactly in f32 here, so unary results are within 2 f32 ulp of float64's, exp and exp2 within 1e-6 (exp is
ex2(x log2 e), whose product rounds).
"""
import importlib.util
import math
import sys
import time
from pathlib import Path

import pytest
import torch

import mgjit
import test_blackwell
import test_gpu_core as core
import test_gpu_matmul as gm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))  # the row examples share examples/_rows.py
BF16, F16 = torch.bfloat16, torch.float16
POLICIES = [("late", 0), ("eager", 0), ("random", 1), ("random", 2)]


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hopper = load(ROOT / "examples" / "matmul_hopper.py", "interp_matmul_hopper")
blackwell = test_blackwell.example
vector_add = load(ROOT / "examples" / "vector_add.py", "interp_vector_add")
softmax = load(ROOT / "examples" / "softmax.py", "interp_softmax")
rmsnorm = load(ROOT / "examples" / "rmsnorm.py", "interp_rmsnorm")
layernorm = load(ROOT / "examples" / "layernorm.py", "interp_layernorm")
cross_entropy = load(ROOT / "examples" / "cross_entropy.py", "interp_cross_entropy")
fused = load(ROOT / "examples" / "fused_elementwise.py", "interp_fused_elementwise")


def poisoned(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype) if dtype.is_floating_point else torch.full(shape, -12345,
                                                                                                    dtype=dtype)


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    assert not out.isnan().any(), "some of the poisoned output was never written"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def cdiv(a, b):
    return (a + b - 1) // b


# ---------------------------------------------------------------------------------------------- the small examples

@pytest.mark.parametrize("dtype", [torch.float32, BF16, F16])
@pytest.mark.parametrize("n", [3000, 7])
def test_vector_add(dtype, n):
    x, y = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)
    out = poisoned(n, dtype=dtype)
    vector_add.add_kernel.interpret[(cdiv(n, 1024),)](x, y, out, BLOCK=1024)
    assert torch.equal(out, x + y)  # one rounding of the f32 sum, as torch rounds it


def test_vector_add_refuses_an_out_unlike_x_by_name():
    """An out shorter than x was written in part (each window stops at the tensor's edge), one of another dtype
    converted: both refused, naming the argument."""
    x = torch.randn(100)
    for out in (torch.empty(99), torch.empty(100, dtype=BF16), torch.empty(10, 10)):
        with pytest.raises(ValueError, match="add: out must be"):
            vector_add.add(x, x, out)


# float32: exp runs as ex2.approx(x * log2(e)), whose relative error grows with |x| (the rounding of the product):
# rows of 9000 values of 3 * randn reached 2.2e-6 in 1 of 25 draws.
ROW_TOL = {torch.float32: 5e-6, BF16: 5e-3, F16: 1e-3}
# Every mapping of the row examples: many short rows per program, a row split into parts (4097 = 4096 + 128),
# and rows streamed in chunks (over 8192 columns).
ROW_COLS = [5, 77, 1000, 4097, 9000]


@pytest.mark.parametrize("dtype", [torch.float32, BF16, F16])
@pytest.mark.parametrize("cols", ROW_COLS)
def test_softmax(dtype, cols, monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    x = torch.randn(9, cols, dtype=dtype) * 3
    out = poisoned(9, cols, dtype=dtype)
    softmax.softmax(x, out)
    assert rel_err(out, torch.softmax(x.float(), dim=1)) < ROW_TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("cols", ROW_COLS)
def test_rmsnorm_and_layernorm(dtype, cols, monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    x, w, b = torch.randn(13, cols, dtype=dtype) + 0.3, torch.randn(cols, dtype=dtype), torch.randn(cols, dtype=dtype)
    out = poisoned(13, cols, dtype=dtype)
    rmsnorm.rmsnorm(x, w, 1e-6, out)
    xf = x.float()
    assert rel_err(out, torch.nn.functional.rms_norm(xf, (cols,), w.float(), 1e-6)) < ROW_TOL[dtype]
    out = poisoned(13, cols, dtype=dtype)
    layernorm.layernorm(x, w, b, 1e-5, out)
    assert rel_err(out, torch.nn.functional.layer_norm(xf, (cols,), w.float(), b.float(), 1e-5)) < ROW_TOL[dtype]


@pytest.mark.parametrize("dim", [0, 1, -2, 2])
def test_softmax_over_any_dimension(dim, monkeypatch):
    """softmax(x, dim=d) as torch.softmax(x, d): the dimension moved last, the result moved back (into a given out
    too); `softmax(x, -1)`, as torch's is called, raised AttributeError ('int' object has no attribute 'shape')."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    x = torch.randn(6, 77, 5, dtype=BF16) * 3
    ref = torch.softmax(x.float(), dim)
    assert rel_err(softmax.softmax(x, dim=dim), ref) < ROW_TOL[BF16]
    out = poisoned(6, 77, 5, dtype=BF16)
    assert softmax.softmax(x, out, dim=dim) is out and rel_err(out, ref) < ROW_TOL[BF16]
    with pytest.raises(TypeError, match=r"softmax: out must be a tensor \(or None\), got -1; the dimension is the "
                                        r"keyword dim"):
        softmax.softmax(x, -1)
    with pytest.raises(IndexError, match=r"softmax: dim must lie in \[-3, 3\) for x of shape \(6, 77, 5\), got 3"):
        softmax.softmax(x, dim=3)
    with pytest.raises(TypeError, match="softmax: dim must be an int, got 1.0"):
        softmax.softmax(x, dim=1.0)


def test_norms_without_weight_or_bias(monkeypatch):
    """A weight or bias of None (torch's default) scales by 1 or adds 0; it raised AttributeError."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    x, w = torch.randn(13, 77) + 0.3, torch.randn(77)
    layer_norm = torch.nn.functional.layer_norm
    assert rel_err(layernorm.layernorm(x, None, None), layer_norm(x, (77,))) < ROW_TOL[torch.float32]
    assert rel_err(layernorm.layernorm(x, w, None), layer_norm(x, (77,), w)) < ROW_TOL[torch.float32]
    assert rel_err(layernorm.layernorm(x, None, w), layer_norm(x, (77,), None, w)) < ROW_TOL[torch.float32]
    assert rel_err(rmsnorm.rmsnorm(x, None), torch.nn.functional.rms_norm(x, (77,), None, 1e-6)) < \
        ROW_TOL[torch.float32]


@pytest.mark.parametrize("cols", [5, 1000, 9000])
def test_cross_entropy(cols, monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    logits = torch.randn(11, cols, dtype=BF16) * 4
    target = torch.randint(0, cols, (11,))
    target[::4] = -100
    loss = poisoned(11, dtype=torch.float32)
    got, lse = cross_entropy.cross_entropy(logits, target, out=loss)
    ref = torch.nn.functional.cross_entropy(logits.float(), target, reduction="none", ignore_index=-100)
    assert rel_err(got, ref) < 1e-5 and rel_err(lse, torch.logsumexp(logits.float(), 1)) < 1e-6


@pytest.mark.parametrize("shape", [(3, 5, 7), (64, 257)])
def test_fused_elementwise(shape, monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    x, y, z = (torch.randn(shape, dtype=BF16) for _ in range(3))
    out = poisoned(*shape, dtype=BF16)
    fused.fused(x, y, z, out)
    assert rel_err(out, fused.reference(x, y, z)) < 5e-3


def test_a_flat_range_goes_in_pieces_a_launch_can_take(monkeypatch):
    """A contiguous range of 2**31 elements or more (sizes travel as 32-bit ints) was refused at launch: it goes to
    the kernel in pieces of FLAT_SPAN elements, the last one ragged; here with pieces of 3 blocks of 4096."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(fused, "FLAT_SPAN", 3 * 4096)
    launched = []
    real = fused.tuned_launch
    monkeypatch.setattr(fused, "tuned_launch", lambda kernel, configs, grid, args: launched.append(
        (args[0].numel(), args[0].data_ptr() - x.data_ptr())) or real(kernel, configs, grid, args))
    x, y, z = (torch.randn(5, 7, 1003, dtype=BF16) for _ in range(3))
    out = poisoned(5, 7, 1003, dtype=BF16)
    fused.fused(x, y, z, out)
    assert launched == [(12288, 0), (12288, 24576), (10529, 49152)]
    assert rel_err(out, fused.reference(x, y, z)) < 5e-3


# ---------------------------------------------------------------------------------------------- the core GPU tests

@pytest.mark.parametrize("op", sorted(core.UNARY_REF))
def test_unary_f32(op):
    x = torch.randn(3000) * 2
    out = poisoned(3000)
    core.unary_kernel.interpret[(cdiv(3000, 512),)](x, out, OP=op, BLOCK=512)
    rtol = 1e-6 if op in ("exp", "exp2") else 2.5e-7  # exp2(x log2 e): the product's rounding scales with |x|
    torch.testing.assert_close(out.double(), core.UNARY_REF[op](x.double()), rtol=rtol, atol=1e-6)


def test_int32_ops():
    """Signed inputs: // and % truncate toward zero (arith's divsi and remsi), << and >> on int32."""
    n = 5000
    a = torch.randint(-1000, 1000, (n,), dtype=torch.int32)
    b = torch.randint(1, 50, (n,), dtype=torch.int32) * torch.where(torch.rand(n) < 0.5, -1, 1).int()
    outs = [poisoned(n, dtype=torch.int32) for _ in range(4)]
    core.int_kernel.interpret[(cdiv(n, 1024),)](a, b, *outs, BLOCK=1024)
    assert torch.equal(outs[0], torch.div(a, b, rounding_mode="trunc"))
    assert torch.equal(outs[1], torch.fmod(a, b))
    assert torch.equal(outs[2], torch.where((a > b) & (a != 7), a, b))
    assert torch.equal(outs[3], (torch.maximum(a, b) * 3 - torch.minimum(a, b)) ^ (a << 2) | (b >> 1))


@pytest.mark.parametrize("bm,bn", [(32, 64), (8, 256), (64, 16)])
def test_2d_reductions_and_broadcast(bm, bn):
    x = torch.randn(3 * bm, bn, dtype=BF16)
    row_sum, col_max, centered = poisoned(3 * bm), poisoned(3, bn), poisoned(3 * bm, bn, dtype=BF16)
    core.tile_reduce_kernel.interpret[(3,)](x, row_sum, col_max, centered, BM=bm, BN=bn)
    xf = x.float()
    torch.testing.assert_close(row_sum, xf.sum(1), rtol=1e-6, atol=1e-5)
    assert torch.equal(col_max, xf.view(3, bm, bn).amax(1))
    torch.testing.assert_close(centered.float(), xf - xf.mean(1, keepdim=True), rtol=1e-2, atol=1e-2)


@mgjit.kernel
def where_broadcasts(x, out, G: mgjit.constexpr):
    """where(cond, a, b) with values that broadcast along the condition's dimensions: a row view, a column
    view, a scalar (a running maximum over a square, and its column-wise twin)."""
    g = mgjit.arange(G)
    v = x[mgjit.ds(0, G)]
    out[0, mgjit.ds(0, G)] = mgjit.where(g[None, :] <= g[:, None], v[None, :], -1000.0).max(axis=1)
    out[1, mgjit.ds(0, G)] = mgjit.where(g[None, :] >= g[:, None], v[:, None], v[None, :]).min(axis=0)
    out[2, mgjit.ds(0, G)] = mgjit.where(v[:, None] > v[None, :], 1.0, 0.0).sum(axis=1)


def test_where_broadcasts_its_values_along_the_condition():
    """A size-1 view of a value broadcast against the condition's shape: `where(square, v[None, :], 0)` was
    refused with "cannot broadcast shape (1, 16) to (16, 16)" (the values were broadcast to each other's shape
    first, and that materialised size-1 dimension then could not broadcast)."""
    x = torch.randn(16)
    out = poisoned(3, 16)
    where_broadcasts.interpret[(1,)](x, out, G=16)
    i = torch.arange(16)
    assert torch.equal(out[0], torch.where(i[None, :] <= i[:, None], x[None, :], -1000.0).amax(1))
    assert torch.equal(out[1], torch.where(i[None, :] >= i[:, None], x[:, None], x[None, :]).amin(0))
    assert torch.equal(out[2], (x[:, None] > x[None, :]).float().sum(1))
    assert where_broadcasts.compile(x, out, G=16, target="sm_90a").spills == 0


@mgjit.kernel
def real_size_one_broadcasts(x, out, G: mgjit.constexpr):
    """Arrays loaded with a real size-1 dimension stretched to a square: a (1, G) row, a (G, 1) column, a (1, 1)
    corner, in float32 and as a bool mask."""
    row = x[mgjit.ds(0, 1), mgjit.ds(0, G)]
    col = x[mgjit.ds(0, G), mgjit.ds(1, 1)]
    corner = x[mgjit.ds(2, 1), mgjit.ds(3, 1)]
    square = x[mgjit.ds(0, G), mgjit.ds(0, G)]
    out[mgjit.ds(0, G), mgjit.ds(0, G)] = square * row + col - corner
    out[mgjit.ds(G, G), mgjit.ds(0, G)] = mgjit.where(row > 0, square, col)


def test_real_size_one_dimensions_broadcast():
    """A genuine (1, G) array (not a view made by indexing with None) stretched to (G, G) was refused with "cannot
    broadcast shape (1, 16) to (16, 16)": Broadcast maps dimensions of equal size. It is squeezed first (no
    arithmetic: the same elements), then broadcast. Exact against torch, in the interpreter and from the PTX."""
    import ptx_sim
    x = torch.randn(16, 16)
    out = poisoned(32, 16)
    real_size_one_broadcasts.interpret[(1,)](x, out, G=16)
    row, col, corner = x[0:1, :], x[:, 1:2], x[2, 3]
    want = torch.cat([x * row + col - corner, torch.where(row > 0, x, col)])
    assert torch.equal(out, want)
    compiled = real_size_one_broadcasts.compile(x, out, G=16, target="sm_90a")
    assert compiled.spills == 0 and "squeeze" in str(real_size_one_broadcasts.inspect(x, out, G=16))
    out = poisoned(32, 16)
    dev = ptx_sim.Device()
    dev.run(compiled, (1,), x, out)
    assert torch.equal(dev.fetch(out), want)


def test_loops_helpers_if():
    rows, n = 7, 1300
    x = torch.randn(rows, n)
    out = poisoned(rows)
    core.loop_kernel.interpret[(rows,)](x, out, n, 2.5, BLOCK=512, UNROLL=4)
    s = x.double().sum(1)
    torch.testing.assert_close(out.double(), torch.where(torch.arange(rows) % 2 == 0, s * 2.5 + 6.0, -s),
                               rtol=1e-5, atol=1e-4)


def test_num_warpgroups():
    x = torch.randn(4 * 2048)
    out = poisoned(4 * 2048)
    core.two_warpgroups_kernel.interpret[(4,)](x, out, BLOCK=1024)
    xv = x.view(-1, 1024)
    assert torch.equal(out.view(-1, 1024), xv - xv.amax(1, keepdim=True))


def test_strided_and_unaligned_views():
    x = torch.randn(16, 1030)[:, 3:1003]
    out = poisoned(16, 1000)
    core.softmax_kernel.interpret[(16,)](x, out, BLOCK=1024)
    torch.testing.assert_close(out, torch.softmax(x, 1), rtol=2e-6, atol=1e-7)
    xt = torch.randn(1000, 16).t()
    out2 = poisoned(16, 1000)
    core.softmax_kernel.interpret[(16,)](xt, out2, BLOCK=1024)
    torch.testing.assert_close(out2, torch.softmax(xt, 1), rtol=2e-6, atol=1e-7)


def test_fixed_dtype():
    x = torch.randn(128, dtype=F16)
    out = poisoned(128, dtype=F16)
    core.fixed_kernel.interpret[(1,)](x, out, BLOCK=128)
    assert torch.equal(out, x)
    with pytest.raises(mgjit.LaunchError, match="must be float16"):
        core.fixed_kernel.interpret[(1,)](x.float(), out.float(), BLOCK=128)


def test_autotune_real_axpy_in_place():
    import test_autotune_real
    axpy = test_autotune_real.axpy.kernel
    for config in test_autotune_real.CONFIGS[1:3]:
        x, y = torch.randn(8192), torch.randn(8192)
        expected = x * 2.0 + y
        axpy.interpret[(8192 // config.kwargs["BLOCK"],)](x, y, 8192, **config.kwargs)
        assert torch.equal(x, expected)


# ---------------------------------------------------------------------------------------------- Hopper

@pytest.mark.parametrize("m,n,k", [(256, 256, 64), (200, 304, 200)])
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_pipelined_matmul(m, n, k, dtype):
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    c = poisoned(m, n, dtype=dtype)
    gm.pipelined_matmul.interpret[(cdiv(m, 128), cdiv(n, 128))](a, b, c, BM=128, BN=128, BK=64, STAGES=4)
    assert rel_err(c, a.float() @ b.float()) < 5e-3


@pytest.mark.parametrize("m,n,k", [(256, 512, 256), (300, 304, 200)])
def test_ws_matmul(m, n, k):
    a, b = torch.randn(m, k, dtype=BF16), torch.randn(k, n, dtype=BF16)
    c = poisoned(m, n, dtype=BF16)
    gm.ws_matmul.interpret[(cdiv(m, 128) * cdiv(n, 256),)](a, b, c, BM=128, BN=256, BK=64, STAGES=4, GROUP_M=8)
    assert rel_err(c, a.float() @ b.float()) < 5e-3


def hopper_matmul(a, b, config=None, grid=2, **kw):
    """The example's kernel as its wrapper launches it (TMA-ready tensors, c as the unused operands), on a
    persistent grid of `grid` CTAs so that each loops over several tiles."""
    m, n = a.shape[0], (b.shape[0] if kw.get("b_kmajor") else b.shape[1])
    out_dtype = kw.get("out_dtype") or (a.dtype if a.element_size() == 2 else BF16)
    c = hopper._output(m, n, out_dtype, a.device).fill_(float("nan"))
    cfg = {**hopper.DEFAULT_CONFIG, "BK": hopper.BK_FOR_BITS[a.element_size() * 8],
           "TMA_STORE": out_dtype.itemsize != 4, **(config or {}), "B_KMAJOR": kw.get("b_kmajor", False),
           "SCALED": "scale" in kw, "BIAS": "bias" in kw, "ACTIVATION": kw.get("activation")}
    hopper.matmul_kernel.interpret[(grid,)](hopper._tma_ready(a), hopper._tma_ready(b), c, kw.get("scale", c),
                                            kw.get("bias", c), c, c, **cfg)
    return c


def with_padding(view):
    """The whole tensor, padding and all, of a view of rows padded to a longer stride (`_padded`)."""
    return torch.as_strided(view, (view.shape[0], view.stride(0)), (view.stride(0), 1))


def poisoned_padding(t):
    """`_tma_ready(t)` with the padding of its rows NaN: what TMA must never read."""
    ready = hopper._tma_ready(t)
    if ready.data_ptr() != t.data_ptr():
        with_padding(ready)[:, ready.shape[1]:] = float("nan")
    return ready


@pytest.mark.parametrize("m,n,k", [(77, 203, 70), (130, 9, 37)])
def test_example_matmul_never_reads_the_padding_of_unaligned_rows(m, n, k):
    """Operands whose rows are not 16-byte aligned go into padded rows that the wrapper leaves unfilled
    (`_padded`): the descriptors take the views' sizes, so the padding, NaN here, is never read."""
    a, b = torch.randn(m, k, dtype=BF16), torch.randn(k, n, dtype=BF16)
    c = hopper._output(m, n, BF16, a.device).fill_(float("nan"))
    cfg = {**hopper.DEFAULT_CONFIG, "BK": 64, "TMA_STORE": True, "B_KMAJOR": False, "SCALED": False, "BIAS": False,
           "ACTIVATION": None}
    hopper.matmul_kernel.interpret[(2,)](poisoned_padding(a), poisoned_padding(b), c, c, c, c, c, **cfg)
    assert rel_err(c, a.float() @ b.float()) < 5e-3


# (dtype, rows, cols, source offset in elements): bf16 rows of 2468 bytes (4-byte words) and of 2466 (2-byte
# halves, a row starting inside a word), a source 2 bytes past a word, f32 rows of 12 bytes, int8 rows of 37.
COPY_CASES = [(BF16, 5, 1234, 0), (BF16, 4, 1233, 0), (BF16, 20, 300, 1), (torch.float32, 7, 3, 0),
              (torch.int8, 33, 37, 3)]


@pytest.mark.parametrize("dtype,rows,cols,offset", COPY_CASES, ids=lambda v: str(v))
def test_copy_into_padded_rows_is_exact_and_leaves_the_padding(dtype, rows, cols, offset):
    """`copy_window`'s PTX (simulated) over the windows `_tma_ready` launches, into a `_padded` view: every
    element bit for bit, the padding untouched, no byte outside the padded tensor written."""
    from test_gmem_vectors import simulate_copy
    base = (torch.randn(rows * cols + offset) * 100).to(dtype)
    src = base[offset:].view(rows, cols)
    dst = hopper._padded(rows, cols, dtype, src.device)
    whole = with_padding(dst)
    whole.view(torch.uint8).fill_(0xA5)
    want = whole.clone()
    want[:, :cols] = src
    grid = (cdiv(rows, hopper.COPY_ROWS), cdiv(cols, hopper.COPY_COLUMNS))
    got, _, _ = simulate_copy(hopper.copy_window, grid, base, src, whole, dst, None, ROWS=hopper.COPY_ROWS,
                              COLS=hopper.COPY_COLUMNS)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("m,n,k", [(256, 512, 256), (300, 304, 200), (1, 256, 128), (77, 200, 64)])
@pytest.mark.parametrize("config", [{}, {"BN": 128, "STAGES": 6}, {"BN": 64, "STAGES": 8}, {"BN": 192, "STAGES": 3},
                                    {"TMA_STORE": False, "STAGES": 4}])
def test_example_persistent_matmul(m, n, k, config):
    a, b = torch.randn(m, k, dtype=BF16), torch.randn(k, n, dtype=BF16)
    assert rel_err(hopper_matmul(a, b, config), a.float() @ b.float()) < 5e-3


def test_fp8_e4m3_with_scales():
    a = (torch.randn(200, 256) * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(256, 256) * 2).to(torch.float8_e4m3fn)
    c = hopper_matmul(a, w, b_kmajor=True, scale=torch.tensor([0.125]))
    assert c.dtype == BF16 and rel_err(c, (a.float() @ w.float().t()) * 0.125) < 5e-3


def test_tf32():
    a, w = torch.randn(200, 96), torch.randn(136, 96)
    c = hopper_matmul(a, w, b_kmajor=True, out_dtype=torch.float32)
    tf32 = lambda t: (t.view(torch.int32) & ~0x1FFF).view(torch.float32).double()  # noqa: E731
    assert rel_err(c, tf32(a) @ tf32(w).t()) < 1e-6  # exactly the tf32 product, to f32 rounding
    assert rel_err(c, a.double() @ w.double().t()) < 2e-3


def test_f16_operands_k_major_b():
    a, w = torch.randn(256, 192, dtype=F16), torch.randn(128, 192, dtype=F16)
    assert rel_err(hopper_matmul(a, w, b_kmajor=True), a.float() @ w.float().t()) < 1e-3


def test_fused_bias_gelu_epilogue():
    a, b = torch.randn(300, 128, dtype=BF16), torch.randn(128, 304, dtype=BF16)
    bias = torch.randn(304, dtype=BF16)
    c = hopper_matmul(a, b, bias=bias, activation="gelu", grid=3)
    assert rel_err(c, torch.nn.functional.gelu(a.float() @ b.float() + bias.float())) < 5e-3


def test_the_example_wrapper_under_mgjit_interpret(monkeypatch):
    """MGJIT_INTERPRET=1: the wrapper's own launch, `matmul_kernel[grid](...)`, runs on the CPU."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(hopper, "sm_count", lambda device: 2)
    a, b = torch.randn(333, 100, dtype=BF16), torch.randn(100, 250, dtype=BF16)  # rows TMA cannot read: padded
    assert rel_err(hopper.matmul(a, b), a.float() @ b.float()) < 5e-3


@pytest.mark.parametrize("dtype,bn", [(BF16, 128), (torch.float32, 64)])
def test_smem_store_and_tma_store(dtype, bn):
    x = torch.randn(300, bn, dtype=dtype)
    y = poisoned(300, bn, dtype=dtype)
    gm.tile_roundtrip.interpret[(cdiv(300, 64),)](x, y, BM=64, BN=bn)
    assert torch.equal(y, (x * 2).to(dtype))


def test_split_k_with_tma_reduce_add():
    a, b = torch.randn(128, 1024, dtype=BF16), torch.randn(1024, 128, dtype=BF16)
    c = torch.zeros(128, 128)
    gm.splitk_matmul.interpret[(2, 2, 4)](a, b, c, BM=64, BN=64, BK=64, SPLIT=4)
    assert rel_err(c, a.float() @ b.float()) < 1e-6


@pytest.mark.parametrize("kernel", [gm.pipe_matmul, gm.ws_pipe_matmul], ids=lambda k: k.name)
@pytest.mark.parametrize("m,n,k", [(256, 256, 256), (200, 304, 200), (128, 128, 64)])
def test_pipeline_helper(kernel, m, n, k):
    a, b = torch.randn(m, k, dtype=BF16), torch.randn(k, n, dtype=BF16)
    c = poisoned(m, n, dtype=BF16)
    kernel.interpret[(cdiv(m, 128), cdiv(n, 128))](a, b, c, BM=128, BN=128, BK=64, STAGES=4)
    assert rel_err(c, a.float() @ b.float()) < 5e-3


@mgjit.kernel
def pipe_release(a, b, c, STAGES: mgjit.constexpr, RELEASE: mgjit.constexpr):
    acc = mgjit.zeros((128, 128), mgjit.float32)
    for k, a_t, b_t in mgjit.pipeline(mgjit.cdiv(a.shape[1], 64), mgjit.tile(a, (0, 0), (128, 64), (0, 64)),
                                      mgjit.tile(b, (0, 0), (64, 128), (64, 0)), stages=STAGES, release=RELEASE):
        acc = mgjit.wgmma(acc, a_t, b_t)
    c[0:128, 0:128] = acc.astype(c.dtype)


@pytest.mark.parametrize("stages,release", [(2, 0), (2, 1), (3, 1), (4, 0)])
def test_pipeline_helper_release(stages, release):
    a, b = torch.randn(128, 448, dtype=BF16), torch.randn(448, 128, dtype=BF16)
    c = poisoned(128, 128, dtype=BF16)
    pipe_release.interpret[(1,)](a, b, c, STAGES=stages, RELEASE=release)
    assert rel_err(c, a.float() @ b.float()) < 5e-3


@pytest.mark.parametrize("stages,release", [(4, 2), (3, 2), (4, 3)])
def test_pipeline_helper_keeping_several_wgmmas_in_flight(stages, release):
    """Step k refills the slot of step k - release, whose wgmma is done (it used to refill step k - 1's, which
    with release >= 2 a wgmma may still be reading: a race the checker found)."""
    a, b = torch.randn(128, 448, dtype=BF16), torch.randn(448, 128, dtype=BF16)
    c = poisoned(128, 128, dtype=BF16)
    pipe_release.interpret[(1,)](a, b, c, STAGES=stages, RELEASE=release)
    assert rel_err(c, a.float() @ b.float()) < 5e-3


@pytest.mark.parametrize("k,n", [(64, 128), (128, 64)])
def test_wgmma_a_from_registers(k, n):
    a, b = torch.randn(200, k, dtype=BF16), torch.randn(k, n, dtype=BF16)
    c = poisoned(200, n)
    gm.a_from_registers.interpret[(cdiv(200, 64),)](a, b, c, K=k, N=n)
    assert rel_err(c, a.float().relu() @ b.float()) < 1e-6


def test_tma_multicast_in_a_cluster():
    x = torch.randn(3 * 64, 64, dtype=BF16)
    out = poisoned(6 * 64, 64, dtype=BF16)
    gm.multicast_copy.interpret[(6,)](x, out, R=64, C=64, cluster=(2, 1, 1))
    assert torch.equal(out, x.view(3, 1, 64, 64).expand(3, 2, 64, 64).reshape(6 * 64, 64))
    with pytest.raises(mgjit.LaunchError, match="whole number of clusters"):
        gm.multicast_copy.interpret[(3,)](x, out, R=64, C=64, cluster=(2, 1, 1))


@pytest.mark.parametrize("grid,cluster,axes", gm.MULTICAST_AXES_CASES)
def test_tma_multicast_along_cluster_axes(grid, cluster, axes):
    r, c = 96, 64
    x = torch.randn(math.prod(grid) * r, c, dtype=BF16)
    out = poisoned(2 * math.prod(grid) * r, c, dtype=BF16)
    gm.multicast_axes.interpret[grid](x, out, R=r, C=c, CLUSTER=cluster, AXES=tuple(axes), cluster=cluster)
    assert torch.equal(out, gm.multicast_axes_expected(x, grid, cluster, axes, r))


def test_autotune_space_configs():
    """The configs test_gpu_autotune sweeps (BN 128/192/256, 3-5 stages), as the tuner launches them."""
    a, b = torch.randn(300, 256, dtype=BF16), torch.randn(256, 400, dtype=BF16)
    for bn, stages in ((128, 5), (192, 4), (256, 3)):
        c = hopper_matmul(a, b, {"BN": bn, "STAGES": stages, "BK": 64}, grid=3)
        assert rel_err(c, a.float() @ b.float()) < 5e-3


# ---------------------------------------------------------------------------------------------- Blackwell

VARIANTS = {**blackwell.CONFIGS, "2cta-m128": {**blackwell.CONFIGS["2cta"], "BM": 64, "BN": 128}}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("tma_store", [True, False])
@pytest.mark.parametrize("m,n,k", [(256, 256, 128), (300, 304, 200)])
def test_blackwell_matmul(variant, tma_store, m, n, k):
    a, b = torch.randn(m, k, dtype=BF16), torch.randn(k, n, dtype=BF16)
    c = poisoned(m, n, dtype=BF16)
    cfg = {**VARIANTS[variant], "TMA_STORE": tma_store}
    grid, cluster = blackwell._launch_shape(m, n, cfg)
    blackwell.matmul_kernel.interpret[grid](a, b, c, **cfg, cluster=cluster)
    assert rel_err(c, a.float() @ b.float()) < 5e-3


def test_blackwell_wrapper_under_mgjit_interpret(monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    a, b = torch.randn(260, 100, dtype=BF16), torch.randn(100, 260, dtype=BF16)  # padded for TMA, direct stores
    for variant in blackwell.CONFIGS:
        assert rel_err(blackwell.matmul(a, b, variant=variant), a.float() @ b.float()) < 5e-3


@pytest.mark.parametrize("rows,cols,dt,packing", [
    (128, 64, BF16, 2), (128, 64, BF16, 1), (128, 64, torch.float32, 1), (64, 128, BF16, 2),
    (64, 64, torch.float32, 1)])
def test_tmem_store_and_load(rows, cols, dt, packing):
    x = torch.randn(rows, cols, dtype=dt)
    y = poisoned(rows, cols, dtype=dt)
    test_blackwell.tmem_roundtrip.interpret[(1,)](x, y, ROWS=rows, COLS=cols, DT=mgjit.dtypes.from_torch(dt),
                                                  PACKING=packing)
    assert torch.equal(y, x + x)


@pytest.mark.parametrize("dtype,a_tmem", [(torch.float32, False), (torch.float8_e4m3fn, False), (F16, False),
                                          (BF16, True)])
def test_mma_kinds_and_a_from_tmem(dtype, a_tmem):
    x = torch.randn(256, 256).to(dtype)
    out = poisoned(256, 256)
    bk = 128 // x.element_size()
    test_blackwell.mma_kinds.interpret[(1,)](x, x, out, BM=128, BN=128, BK=bk, A_TMEM=a_tmem)
    xf = (x.view(torch.int32) & ~0x1FFF).view(torch.float32) if dtype == torch.float32 else x.float()
    assert rel_err(out[:128, :128], xf[:128, :bk] @ xf[:128, :bk].t()) < 1e-6


# ---------------------------------------------------------------------------------------------- schedules, speed

@pytest.mark.parametrize("policy,seed", POLICIES)
def test_every_schedule_is_silent_and_right(policy, seed):
    a, b = torch.randn(300, 320, dtype=BF16), torch.randn(320, 304, dtype=BF16)
    ref = a.float() @ b.float()
    c = poisoned(300, 304, dtype=BF16)
    hopper.matmul_kernel.interpret(policy=policy, seed=seed)[(2,)](a, b, c, c, c, c, c,
                                                                   **{**hopper.DEFAULT_CONFIG, "BN": 128})
    assert rel_err(c, ref) < 5e-3
    for kernel in (gm.ws_pipe_matmul, gm.pipe_matmul):
        c = poisoned(300, 304, dtype=BF16)
        kernel.interpret(policy=policy, seed=seed)[(3, 3)](a, b, c, BM=128, BN=128, BK=64, STAGES=4)
        assert rel_err(c, ref) < 5e-3
    for variant, cfg in VARIANTS.items():
        c = poisoned(300, 304, dtype=BF16)
        grid, cluster = blackwell._launch_shape(300, 304, cfg)
        blackwell.matmul_kernel.interpret(policy=policy, seed=seed)[grid](a, b, c, **cfg, cluster=cluster)
        assert rel_err(c, ref) < 5e-3, variant
    x = torch.randn(2 * 64, 64, dtype=BF16)
    out = poisoned(4 * 64, 64, dtype=BF16)
    gm.multicast_copy.interpret(policy=policy, seed=seed)[(4,)](x, out, R=64, C=64, cluster=(2, 1, 1))
    assert torch.equal(out, x.view(2, 1, 64, 64).expand(2, 2, 64, 64).reshape(4 * 64, 64))


def test_a_256_cubed_warp_specialized_matmul_interprets_in_seconds():
    """The Hopper example, warp-specialized and persistent with its TMA-store epilogue (2 CTAs, 1 tile each),
    with torch held to one thread: the bound is generous (10 s on one core)."""
    a, b = torch.randn(256, 256, dtype=BF16), torch.randn(256, 256, dtype=BF16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        hopper_matmul(a, b)  # traced and inferred once: the timing is of the interpretation
        start = time.perf_counter()
        c = hopper_matmul(a, b)
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    print(f"256x256x256 warp-specialized matmul interpreted in {seconds:.3f} s")
    assert rel_err(c, a.float() @ b.float()) < 5e-3
    assert seconds < 10


# ---------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_interpreter_agrees_with_the_gpu_on_cuda_tensors():
    """A differential check on the GPU machine: the same launch on the hardware and interpreted (CUDA tensors
    are copied in and out): within one bf16 rounding, the accumulation orders differing."""
    a = torch.randn(300, 320, device="cuda", dtype=BF16)
    b = torch.randn(320, 304, device="cuda", dtype=BF16)
    cfg = {**hopper.DEFAULT_CONFIG, "BN": 128}
    outs = []
    for launch in (hopper.matmul_kernel, hopper.matmul_kernel.interpret):
        c = torch.full((300, 304), float("nan"), device="cuda", dtype=BF16)
        launch[(2,)](a, b, c, c, c, c, c, **cfg)
        outs.append(c)
    torch.cuda.synchronize()
    assert outs[1].is_cuda and not outs[1].isnan().any()
    assert ((outs[0].float() - outs[1].float()).abs() <= 2 ** -7 * outs[0].float().abs() + 1e-3).all()
