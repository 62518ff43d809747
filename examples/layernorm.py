"""LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * w + b, for any row length.

Every row is read once and held in registers (examples/_rows.py), the mapping autotuned per shape:
- short rows: ROWS rows per program, each held as a few (ROWS, width) arrays whose widths add up to the row
  rounded up to 128 columns;
- rows too long for one warpgroup: segments over the warpgroups of a cluster, which add up their sums (for
  the mean, then for the variance of the centred values) through distributed shared memory;
- rows longer than 262144 columns: a loop over BLOCK-wide chunks, the mean and variance merged chunk by chunk
  (Chan's parallel update of Welford's sums, exact in f32), then a second pass that normalizes.
Statistics are computed in f32 and the output rounded once; the padding past a row's end reads as zero and is
masked out of the variance.

    python examples/layernorm.py     # compile for sm_90a without a GPU; check against torch and time with one
"""
import torch
from _rows import columns, launch, load_row, load_vector, mapping, row_sum, segment, store_row

import mgjit


@mgjit.kernel
def layernorm_rows(x, w, b, out, eps: mgjit.constexpr, ROWS: mgjit.constexpr, PARTS: mgjit.constexpr,
                   CTAS: mgjit.constexpr, WGS: mgjit.constexpr):
    """ROWS rows, or a segment of one, held as arrays of the widths PARTS, per program."""
    rows, c0 = segment(ROWS, PARTS, CTAS, WGS)
    n = x.shape[1]
    cols = columns(c0, PARTS)
    v = load_row(x, rows, c0, cols, PARTS, 0.0)
    mean = row_sum(v, CTAS * WGS) / n
    d = ()
    squares = ()
    for p in mgjit.static_range(len(PARTS)):
        dp = mgjit.where(cols[p] < n, v[p] - mean[:, None], 0.0)
        d = d + (dp,)
        squares = squares + (dp * dp,)
    rstd = mgjit.rsqrt(row_sum(squares, CTAS * WGS) / n + eps)
    wv, bv = load_vector(w, c0, PARTS), load_vector(b, c0, PARTS)
    y = ()
    for p in mgjit.static_range(len(PARTS)):
        y = y + (d[p] * rstd[:, None] * wv[p] + bv[p],)
    store_row(out, rows, c0, y, PARTS)


@mgjit.kernel
def layernorm_long(x, w, b, out, eps: mgjit.constexpr, BLOCK: mgjit.constexpr):
    """One row per program, in BLOCK-wide chunks."""
    row = mgjit.program_id(0)
    n = x.shape[1]
    count = 0.0
    mean = 0.0
    m2 = 0.0
    for c0 in range(0, n, BLOCK):
        v = x[row, mgjit.ds(c0, BLOCK)].astype(mgjit.float32)
        inside = c0 + mgjit.arange(BLOCK) < n
        k = mgjit.minimum(n - c0, BLOCK).astype(mgjit.float32)
        chunk_mean = v.sum() / k
        d = mgjit.where(inside, v - chunk_mean, 0.0)
        chunk_m2 = (d * d).sum()
        total = count + k
        delta = chunk_mean - mean
        mean = mean + delta * (k / total)
        m2 = m2 + chunk_m2 + delta * delta * (count * k / total)
        count = total
    rstd = mgjit.rsqrt(m2 / n + eps)
    for c0 in range(0, n, BLOCK):
        v = x[row, mgjit.ds(c0, BLOCK)].astype(mgjit.float32)
        y = (v - mean) * rstd * w[mgjit.ds(c0, BLOCK)].astype(mgjit.float32) \
            + b[mgjit.ds(c0, BLOCK)].astype(mgjit.float32)
        out[row, mgjit.ds(c0, BLOCK)] = y.astype(out.dtype)


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5,
              out: torch.Tensor | None = None, rows_per_program: int | None = None) -> torch.Tensor:
    """torch.nn.functional.layer_norm(x, (n,), w, b, eps) for a 2D tensor with rows of any length."""
    assert x.ndim == 2 and w.shape == b.shape == (x.shape[1],)
    out = torch.empty_like(x) if out is None else out
    if x.shape[0] == 0:
        return out
    configs = mapping(x.shape[1], rows_per_program)
    if configs is None:
        layernorm_long[(x.shape[0],)](x, w, b, out, eps=eps, BLOCK=4096)
    else:
        launch(layernorm_rows, configs, (x, w, b, out), eps=eps)
    return out


# ---- what the harness needs: inputs, the specialization layernorm() launches, a reference

def setup(device):
    x = torch.randn(16384, 5000, device=device, dtype=torch.bfloat16) * 2 + 0.5
    w = torch.randn(5000, device=device, dtype=torch.bfloat16)
    b = torch.randn(5000, device=device, dtype=torch.bfloat16)
    return (x, w, b), torch.empty_like(x)


def compile(x, w, b, out, target):
    configs = mapping(x.shape[1])
    if configs is None:
        return layernorm_long.compile(x, w, b, out, eps=1e-5, BLOCK=4096, target=target)
    return layernorm_rows.compile(x, w, b, out, eps=1e-5, **configs[0].launch_kwargs(), target=target)


def reference(x, w, b):
    return torch.nn.functional.layer_norm(x.float(), (x.shape[1],), w.float(), b.float(), 1e-5)


if __name__ == "__main__":
    from _harness import main
    main(name="layernorm", setup=setup, compile=compile, run=layernorm, reference=reference, rtol=2e-2, atol=3e-2)
