"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, for rows of any length.

`eps` is a constexpr: it is folded into the kernel and is part of the cache key, so each value compiles once.
The row length stays a runtime value (`x.shape[1]`): the padding beyond the row is loaded as 0 (loads outside
the tensor read zeros) and contributes nothing. Every row is read once and held in registers (examples/_rows.py):
short rows ROWS to a program, each as a few arrays whose widths add up to the row rounded up to 128 columns;
rows too long for one warpgroup split over the warpgroups of a cluster, which add up their sums of squares
through distributed shared memory (one mbarrier wait). Rows can also take two passes over BLOCK-wide chunks
(the sum of squares, then the scaled row): the only way for rows longer than 262144 columns, and a candidate for
any row over 8192. Or a row is split over a cluster in chunks kept in shared memory (chunked rows): each CTA
reads its segment once, the CTAs add up their sums of squares, and each writes its segment from shared memory.
Held rows also run as persistent grids (a few programs an SM, each looping over rows with its segment of w in
shared memory, read from global memory once). Or (piped rows, from 4097 columns, contiguous tensors:
examples/_rows_piped.py) a few persistent programs an SM stream their rows (longer ones over the CTAs of a
cluster) through shared-memory slots by TMA, each with w laid out once and read per row through a window. The
mapping is autotuned per shape. Rows are computed in float32, or in float64 where x or w is float64 (`_rows.wide`;
not persistent, and piped only where x is float64: `_rows_launch.for_dtypes`).

    python examples/rmsnorm.py     # compile for sm_90a without a GPU; check against torch and time with one
"""
import functools

import torch
from _rows import (chunked_segment, load_row, mapping, persisting, row_groups, row_sum, segment, stage,
                   staging, stash_vector, store_row, weights, wide)
from _rows_launch import as_rows, floating, for_dtypes, launch
from _rows_piped import (envelope, flat_rows, line_parts, piped_views, piping, read_lines, refill, ring, stash_lines,
                         store_envelope, weight_lines)

import mgjit

# Chunked rows are read in groups of this many columns, each group's loads issued together (_rows.stage).
STAGE_GROUP = 8192


@mgjit.kernel
def rmsnorm_kernel(x, w, out, xl, outl, wv, eps: mgjit.constexpr, ROWS: mgjit.constexpr, PARTS: mgjit.constexpr,
                   CTAS: mgjit.constexpr, WGS: mgjit.constexpr, BLOCK: mgjit.constexpr, CHUNKS: mgjit.constexpr,
                   PERSIST: mgjit.constexpr = 0, PIPE: mgjit.constexpr = 0, PL: mgjit.constexpr = (),
                   STAGES: mgjit.constexpr = 0, STASH: mgjit.constexpr = 0,
                   LAST: mgjit.constexpr = 0, STAGED: mgjit.constexpr = 0, FLAT: mgjit.constexpr = 0,
                   OCC: mgjit.constexpr = 0):
    """ROWS rows, or a segment of one, held as arrays of the widths PARTS, per program (PERSIST > 0: PERSIST
    programs an SM, each looping over row groups with its segment of w in shared memory); or (BLOCK > 0) one row
    streamed in BLOCK-wide chunks, or (and CHUNKS > 0) a segment of CHUNKS chunks per CTA of a cluster; or
    (PIPE > 0) rows piped through shared memory (examples/_rows_piped.py; xl, outl: x and out as lines, wv: w
    as `weight_rows`; read by piped mappings only); or (FLAT) rows of one column, ROWS a program, as lines of xl
    and outl. OCC > 0: registers capped so that OCC CTAs fit on an SM."""
    if OCC:
        mgjit.min_ctas_per_sm(OCC)
    if FLAT:
        flat_rows(x, out, xl, outl, ROWS, one_column, (w, x.shape[1], eps))
    elif PIPE:
        rmsnorm_piped(x, w, out, xl, outl, wv, eps, PIPE, PL, STAGES, CTAS, LAST)
    elif BLOCK and CHUNKS:
        rmsnorm_chunked(x, w, out, eps, CTAS, BLOCK, CHUNKS)
    elif BLOCK:
        rmsnorm_stream(x, w, out, eps, BLOCK)
    elif PERSIST:
        mgjit.min_ctas_per_sm(PERSIST)
        _, starts = segment(ROWS, PARTS, CTAS, WGS)
        bufs = stash_vector(w, starts, PARTS, WGS)
        for g in range(mgjit.program_id(0), row_groups(x, ROWS), mgjit.num_programs(0)):
            rmsnorm_held(x, w, bufs, out, mgjit.ds(g * ROWS, ROWS), starts, eps, PARTS, CTAS * WGS, PERSIST,
                         STAGED)
    else:
        rows, starts = segment(ROWS, PARTS, CTAS, WGS)
        rmsnorm_held(x, w, w, out, rows, starts, eps, PARTS, CTAS * WGS, PERSIST, STAGED)


@mgjit.device
def rmsnorm_held(x, w, bufs, out, rows, starts, eps, PARTS, SPLIT, PERSIST, STAGED):
    """The rows `rows` (a segment of them, its parts from `starts`) read once and held; w's elements read after
    the sum of squares (from `bufs`, PERSIST) so that they are not live while the row is reduced."""
    v = load_row(x, rows, starts, PARTS, 0.0)
    squares = ()
    for p in mgjit.static_range(len(PARTS)):
        squares = squares + (v[p] * v[p],)
    scale = mgjit.rsqrt(row_sum(squares, SPLIT) / x.shape[1] + eps)
    wv = weights(w, bufs, starts, PARTS, PERSIST)
    y = ()
    for p in mgjit.static_range(len(PARTS)):
        y = y + (v[p] * scale[:, None] * wv[p],)
    store_row(out, rows, starts, y, PARTS, STAGED)


@mgjit.device
def one_column(v, operands):
    """RMSNorm of rows of one column (float32 v; operands w, the row length n = 1, eps), elementwise, as held rows
    compute it."""
    w, n, eps = operands
    return v * mgjit.rsqrt(v * v / n + eps) * w[0].astype(mgjit.float32)


@mgjit.device
def rmsnorm_piped(x, w, out, xl, outl, wv, eps, PIPE, PL, STAGES, CTAS, LAST):
    """A multiple of STASH programs (about PIPE an SM), each streaming its rows (or, over a cluster of CTAS, its
    segments of them: the segments swap their sums of squares once a row) through STAGES shared-memory slots with
    w laid out once in shared memory and read per row through a window (examples/_rows_piped.py, stash_lines,
    weight_lines)."""
    mgjit.min_ctas_per_sm(PIPE)
    buf, full, count = ring(x, xl, PL, STAGES, CTAS, LAST)
    w_env = stash_lines(w, wv, x, PL, CTAS, LAST)
    inv_n = 1.0 / x.shape[1].astype(wide(x))  # once: a division a row is a dozen instructions and a slow path
    for i in range(count):
        env, row, a, s = envelope(x, xl, buf, full, i, 0.0, CTAS, LAST)
        refill(x, xl, buf, full, i, count, CTAS, True)
        v = read_lines(env, PL, wide(x))
        squares = ()
        for p in mgjit.static_range(len(PL)):
            squares = squares + (v[p] * v[p],)
        squares = mgjit.sum(squares)
        if CTAS > 1:
            squares = mgjit.cluster_reduce(squares, "sum")
        scale = mgjit.rsqrt(squares * inv_n + eps)
        w_parts, parts = weight_lines(w_env, s, PL), line_parts(env, PL)
        for p in mgjit.static_range(len(PL)):  # w read part by part: not all live at once
            parts[p][...] = (v[p] * scale * w_parts[p][...].astype(v[p].dtype)).astype(out.dtype)
        refill(x, xl, buf, full, i, count, CTAS, False)
        store_envelope(out, outl, env, row, a, s, CTAS, LAST)
    mgjit.store_async_wait(0)


@mgjit.device
def rmsnorm_stream(x, w, out, eps, BLOCK):
    """One row per program, in BLOCK-wide chunks: the sum of squares, then a second pass that writes."""
    row = mgjit.program_id(0)
    n = x.shape[1]
    squares = 0.0
    for c0 in range(0, n, BLOCK):
        v = x[row, mgjit.ds(c0, BLOCK)].astype(wide(x))
        squares = squares + (v * v).sum()
    scale = mgjit.rsqrt(squares / n + eps)
    for c0 in range(0, n, BLOCK):
        v = x[row, mgjit.ds(c0, BLOCK)].astype(wide(x))
        out[row, mgjit.ds(c0, BLOCK)] = (v * scale * w[mgjit.ds(c0, BLOCK)].astype(wide(w))).astype(out.dtype)


@mgjit.device
def rmsnorm_chunked(x, w, out, eps, CTAS, BLOCK, CHUNKS):
    """A segment of CHUNKS chunks of one row per CTA of a cluster, kept in shared memory between the passes."""
    row, c0 = chunked_segment(CTAS, BLOCK, CHUNKS)
    buf = mgjit.smem((CHUNKS, BLOCK), x.dtype)
    squares = stage(x, buf, row, c0, BLOCK, CHUNKS, 0.0, "squares", STAGE_GROUP).sum()
    if CTAS > 1:
        squares = mgjit.cluster_reduce(squares, "sum")
    scale = mgjit.rsqrt(squares / x.shape[1] + eps)
    for k in range(CHUNKS):
        c = c0 + k * BLOCK
        y = buf[k][...].astype(wide(x)) * scale * w[mgjit.ds(c, BLOCK)].astype(wide(w))
        out[row, mgjit.ds(c, BLOCK)] = y.astype(out.dtype)


def rmsnorm(x: torch.Tensor, w: torch.Tensor | None, eps: float = 1e-6, out: torch.Tensor | None = None,
            rows_per_program: int | None = None) -> torch.Tensor:
    """torch.nn.functional.rms_norm(x, (n,), w, eps): over the last dimension of x (n columns, any leading
    dimensions); a w of None scales by 1, as torch's."""
    if x.ndim and w is None:
        w = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    if x.ndim == 0 or w.shape != (x.shape[-1],):
        raise ValueError(f"rmsnorm takes x of shape (..., n) and w of shape (n,), got {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")
    floating("rmsnorm", x=x, w=w)
    rows, out, out_rows = as_rows("rmsnorm", x, out, w=w)
    if rows.numel() == 0:
        return out
    itemsize, views = piped_views((rows, out_rows), (w,), rows_per_program)
    configs = for_dtypes(rmsnorm_mapping(rows.shape[1], rows_per_program, itemsize, (w.element_size(),)),
                         (x.dtype, w.dtype), rows_per_program is not None, rows.shape[1], piped=True)
    launch(rmsnorm_kernel, configs, (rows, w, out_rows), views, eps=eps)
    return out


@functools.lru_cache(maxsize=None, typed=True)  # rows_per_program=1.0 or True: refused, not served as 1's
def rmsnorm_mapping(n: int, rows_per_program: int | None = None, itemsize: int = 0,
                    weight_sizes: tuple[int, ...] = (4,)) -> tuple[mgjit.Config, ...]:
    """The row examples' mappings for rows of n columns, then the held ones again as persistent grids, then the
    piped ones for elements of `itemsize` bytes (0: none) and weights of `weight_sizes` bytes, or for rows of one
    column the flat ones."""
    if rows_per_program is not None:
        return piping(mapping(n, rows_per_program), 0, 0, weights=weight_sizes)
    return piping(persisting(staging(mapping(n), n), 1), n, itemsize, weights=weight_sizes, clusters=True, flat=True)


# rmsnorm as a torch custom op: torch.compile(model, fullgraph=True) keeps it as one node of its graph.
rmsnorm_op = mgjit.torch_op("mgjit_examples::rmsnorm", outputs=lambda x, w, eps=1e-6, rows_per_program=None:
                            (x.shape, x.dtype), params=["x", "w", "eps", "rows_per_program"])(rmsnorm)


# ---- what the harness needs: inputs, the specialization rmsnorm() launches, a reference

def setup(device):
    x = torch.randn(16384, 4096, device=device, dtype=torch.bfloat16)
    w = torch.randn(4096, device=device, dtype=torch.bfloat16)
    return (x, w), torch.empty_like(x)


def compile(x, w, out, target):
    config = rmsnorm_mapping(x.shape[1])[0]
    return rmsnorm_kernel.compile(x, w, out, x, out, x, eps=1e-6, **config.launch_kwargs(), target=target)


def reference(x, w):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(dim=1, keepdim=True) + 1e-6) * w.float()


if __name__ == "__main__":
    from _harness import main
    main(name="rmsnorm", setup=setup, compile=compile, run=rmsnorm, reference=reference, rtol=2e-2, atol=2e-2)
