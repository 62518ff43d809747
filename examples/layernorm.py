"""LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * w + b, for any row length.

Three mappings of rows to programs, chosen by the wrapper from the row length (and autotuned among the fitting
ones by `layernorm_tuned`):
- short rows: ROWS rows per program, as one (ROWS, BLOCK) register array reduced along axis 1;
- rows that fit in registers: one row per program;
- long rows: a loop over BLOCK-wide chunks, the mean and variance merged chunk by chunk (Chan's parallel
  update of Welford's sums, exact in f32), then a second pass that normalizes.
Statistics are computed in f32 and the output rounded once; the padding past a row's end reads as zero and is
masked out of the variance.

    python examples/layernorm.py     # compile for sm_90a without a GPU; check against torch and time with one
"""
import torch

import mgjit

MAX_BLOCK = 8192  # the widest row kept whole in registers (64 f32 per thread of one warpgroup)


@mgjit.kernel
def layernorm_rows(x, w, b, out, eps: mgjit.constexpr, ROWS: mgjit.constexpr, BLOCK: mgjit.constexpr):
    """ROWS rows of at most BLOCK columns per program."""
    row0 = mgjit.program_id(0) * ROWS
    n = x.shape[1]
    v = x[mgjit.ds(row0, ROWS), mgjit.ds(0, BLOCK)].astype(mgjit.float32)
    mean = v.sum(axis=1, keepdims=True) / n
    inside = mgjit.arange(BLOCK) < n
    d = mgjit.where(inside, v - mean, 0.0)
    rstd = mgjit.rsqrt((d * d).sum(axis=1, keepdims=True) / n + eps)
    y = d * rstd * w[mgjit.ds(0, BLOCK)].astype(mgjit.float32) + b[mgjit.ds(0, BLOCK)].astype(mgjit.float32)
    out[mgjit.ds(row0, ROWS), mgjit.ds(0, BLOCK)] = y.astype(out.dtype)


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


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def mapping(n: int, rows_per_program: int | None = None) -> tuple[str, dict]:
    """Which kernel and constexprs serve rows of n columns: several short rows per program (about 4096 elements
    per program), one row per program, or a chunked loop."""
    block = _pow2(n)
    if block > MAX_BLOCK:
        return "long", {"BLOCK": 4096}
    return "rows", {"ROWS": rows_per_program or max(1, min(512, 4096 // block)), "BLOCK": block}


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5,
              out: torch.Tensor | None = None, rows_per_program: int | None = None) -> torch.Tensor:
    """torch.nn.functional.layer_norm(x, (n,), w, b, eps) for a 2D tensor with rows of any length."""
    assert x.ndim == 2 and w.shape == b.shape == (x.shape[1],)
    out = torch.empty_like(x) if out is None else out
    if x.shape[0] == 0:
        return out
    kind, cfg = mapping(x.shape[1], rows_per_program)
    if kind == "long":
        layernorm_long[(x.shape[0],)](x, w, b, out, eps=eps, **cfg)
    else:
        layernorm_rows[(-(-x.shape[0] // cfg["ROWS"]),)](x, w, b, out, eps=eps, **cfg)
    return out


# ---- what the harness needs: inputs, the specialization layernorm() launches, a reference

def setup(device):
    x = torch.randn(16384, 5000, device=device, dtype=torch.bfloat16) * 2 + 0.5
    w = torch.randn(5000, device=device, dtype=torch.bfloat16)
    b = torch.randn(5000, device=device, dtype=torch.bfloat16)
    return (x, w, b), torch.empty_like(x)


def compile(x, w, b, out, target):
    kind, cfg = mapping(x.shape[1])
    kernel = layernorm_long if kind == "long" else layernorm_rows
    return kernel.compile(x, w, b, out, eps=1e-5, **cfg, target=target)


def reference(x, w, b):
    return torch.nn.functional.layer_norm(x.float(), (x.shape[1],), w.float(), b.float(), 1e-5)


if __name__ == "__main__":
    from _harness import main
    main(name="layernorm", setup=setup, compile=compile, run=layernorm, reference=reference, rtol=2e-2, atol=3e-2)
