"""Triton kernels for the row benchmarks (benchmarks/rows.py): softmax, RMSNorm, LayerNorm, cross-entropy and
the fused elementwise kernel, written the way Triton's tutorials and common libraries write them (one program
per row; rows longer than MAX_BLOCK in a loop). They are the comparison, not part of mgjit."""
import torch
import triton
import triton.language as tl

MAX_BLOCK = 16384


def _block(n: int) -> int:
    return min(MAX_BLOCK, triton.next_power_of_2(max(n, 16)))


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


@triton.jit
def _softmax(x_ptr, out_ptr, n, stride_x, stride_o, BLOCK: tl.constexpr, LOOP: tl.constexpr):
    row = tl.program_id(0)
    x_row, o_row = x_ptr + row * stride_x, out_ptr + row * stride_o
    if LOOP:
        m = -float("inf")
        s = 0.0
        for c0 in range(0, n, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            v = tl.load(x_row + cols, mask=cols < n, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(v, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(v - m_new), 0)
            m = m_new
        for c0 in range(0, n, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            v = tl.load(x_row + cols, mask=cols < n, other=-float("inf")).to(tl.float32)
            tl.store(o_row + cols, (tl.exp(v - m) / s).to(out_ptr.dtype.element_ty), mask=cols < n)
    else:
        cols = tl.arange(0, BLOCK)
        v = tl.load(x_row + cols, mask=cols < n, other=-float("inf")).to(tl.float32)
        e = tl.exp(v - tl.max(v, 0))
        tl.store(o_row + cols, (e / tl.sum(e, 0)).to(out_ptr.dtype.element_ty), mask=cols < n)


def softmax(x, out):
    n = x.shape[1]
    block = _block(n)
    _softmax[(x.shape[0],)](x, out, n, x.stride(0), out.stride(0), BLOCK=block, LOOP=n > block,
                            num_warps=_warps(block))


@triton.jit
def _norm(x_ptr, w_ptr, b_ptr, out_ptr, n, stride_x, stride_o, eps, BLOCK: tl.constexpr, LOOP: tl.constexpr,
          LAYER: tl.constexpr):
    row = tl.program_id(0)
    x_row, o_row = x_ptr + row * stride_x, out_ptr + row * stride_o
    if LOOP:
        acc = tl.zeros([BLOCK], tl.float32)
        acc2 = tl.zeros([BLOCK], tl.float32)
        for c0 in range(0, n, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            v = tl.load(x_row + cols, mask=cols < n, other=0.0).to(tl.float32)
            acc += v
            acc2 += v * v
        mean = tl.sum(acc, 0) / n if LAYER else 0.0
        var = tl.sum(acc2, 0) / n - mean * mean
        rstd = 1.0 / tl.sqrt(var + eps)
        for c0 in range(0, n, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            v = tl.load(x_row + cols, mask=cols < n, other=0.0).to(tl.float32)
            y = (v - mean) * rstd * tl.load(w_ptr + cols, mask=cols < n).to(tl.float32)
            if LAYER:
                y += tl.load(b_ptr + cols, mask=cols < n).to(tl.float32)
            tl.store(o_row + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n)
    else:
        cols = tl.arange(0, BLOCK)
        v = tl.load(x_row + cols, mask=cols < n, other=0.0).to(tl.float32)
        mean = tl.sum(v, 0) / n if LAYER else 0.0
        d = tl.where(cols < n, v - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, 0) / n + eps)
        y = d * rstd * tl.load(w_ptr + cols, mask=cols < n).to(tl.float32)
        if LAYER:
            y += tl.load(b_ptr + cols, mask=cols < n).to(tl.float32)
        tl.store(o_row + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n)


def rmsnorm(x, w, out, eps=1e-6):
    n = x.shape[1]
    block = _block(n)
    _norm[(x.shape[0],)](x, w, w, out, n, x.stride(0), out.stride(0), eps, BLOCK=block, LOOP=n > block, LAYER=False,
                         num_warps=_warps(block))


def layernorm(x, w, b, out, eps=1e-5):
    n = x.shape[1]
    block = _block(n)
    _norm[(x.shape[0],)](x, w, b, out, n, x.stride(0), out.stride(0), eps, BLOCK=block, LOOP=n > block, LAYER=True,
                         num_warps=_warps(block))


@triton.jit
def _cross_entropy(x_ptr, t_ptr, loss_ptr, n, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    m = -float("inf")
    s = 0.0
    for c0 in range(0, n, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        v = tl.load(x_row + cols, mask=cols < n, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(v, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(v - m_new), 0)
        m = m_new
    t = tl.load(t_ptr + row)
    picked = tl.load(x_row + t, mask=t >= 0, other=0.0).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(t == -100, 0.0, m + tl.log(s) - picked))


def cross_entropy(logits, target, loss):
    n = logits.shape[1]
    block = min(8192, _block(n))
    _cross_entropy[(logits.shape[0],)](logits, target, loss, n, logits.stride(0), BLOCK=block,
                                       num_warps=_warps(block))


@triton.jit
def _fused(x_ptr, y_ptr, z_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    inner = 0.7978845608028654 * (v + 0.044715 * v * v * v)
    tanh = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
    r = 0.5 * v * (1.0 + tanh) * tl.load(y_ptr + offs, mask=mask).to(tl.float32) \
        + tl.load(z_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, r.to(out_ptr.dtype.element_ty), mask=mask)


def fused(x, y, z, out):
    n = x.numel()
    _fused[(triton.cdiv(n, 4096),)](x, y, z, out, n, BLOCK=4096, num_warps=8)


def torch_fused(x, y, z, out):
    torch.add(torch.nn.functional.gelu(x, approximate="tanh") * y, z, out=out)
