"""Row softmax for rows of any length, reading every row once where it fits on chip.

Rows are held in registers (examples/_rows.py): short rows ROWS to a program, each as a few register arrays
whose widths add up to the row rounded up to 128 columns (4097 columns → 4096 + 128, so almost no work is
wasted on padding); rows too long for one warpgroup split into segments over the warpgroups of a cluster.
Each segment computes exp(x - its own maximum) and their sum; the segments swap (maximum, sum) pairs once
(one mbarrier wait) and rescale by exp(their maximum - the row's). The padding is masked to -inf so it adds
nothing. Reductions run across the 128 threads of a warpgroup: within each thread, then across lanes with
butterfly shuffles, then across the 4 warps through shared memory. Rows can also stream through registers in
BLOCK-wide chunks with an online softmax (a running maximum and a sum rescaled when it grows), then a second
pass writes: the only way for rows longer than 262144 columns, and a candidate for any row over 8192. Or a row
is split over a cluster in chunks kept in shared memory (chunked rows): each CTA reads its segment once
(its maximum on the way), sums exp(x - its maximum) from shared memory, swaps (maximum, sum) once, and writes
from shared memory. Or (piped rows, 4097 to 16385 columns, contiguous tensors: examples/_rows_piped.py) a few
persistent programs an SM each stream their rows through shared-memory slots, one TMA copy a row, computing one
while the next ones land; longer rows split over the CTAs of a cluster the same way (up to 262144 columns, 16
CTAs). bf16/f16 inputs are computed in float32 and rounded once at the store, float64 in float64 (`_rows.wide`; no piped
mapping: `_rows_launch.for_dtypes`). The mapping is autotuned per shape.

    python examples/softmax.py     # compile for sm_90a without a GPU; check against torch and time with one
"""
import functools

import torch
from _rows import (LOG2E, chunked_segment, exp_segment, finite_shift, load_row, mapping as rows_mapping,
                   merge_exp, segment, shifted_exp, stage, staging, store_row, streamed_exp_sum, wide)
from _rows_launch import as_rows, floating, for_dtypes, launch, output
from _rows_piped import (envelope, exp_lines, flat_rows, piped_views, piping, read_lines, refill, ring, store_envelope,
                         write_lines)

import mgjit

# Chunked rows are read in groups of this many columns, each group's loads issued together (_rows.stage): wider
# groups take registers the exps need (bf16 rows of 100000 on an H100: 0.90 of copy bandwidth in groups of 4096,
# 0.75 with the whole segment at once).
STAGE_GROUP = 4096


@mgjit.kernel
def softmax_kernel(x, out, xl, outl, ROWS: mgjit.constexpr, PARTS: mgjit.constexpr, CTAS: mgjit.constexpr,
                   WGS: mgjit.constexpr, BLOCK: mgjit.constexpr, CHUNKS: mgjit.constexpr, PIPE: mgjit.constexpr = 0,
                   PL: mgjit.constexpr = (), STAGES: mgjit.constexpr = 0, LAST: mgjit.constexpr = 0,
                   STAGED: mgjit.constexpr = 0, FLAT: mgjit.constexpr = 0, OCC: mgjit.constexpr = 0):
    """xl, outl: x and out as lines (examples/_rows_piped.py), read by piped mappings (PIPE > 0) and flat ones
    (FLAT: rows of one column, ROWS a program) only. OCC > 0: registers capped so that OCC CTAs fit on an SM."""
    if OCC:
        mgjit.min_ctas_per_sm(OCC)
    if FLAT:
        flat_rows(x, out, xl, outl, ROWS, one_column, ())
    elif PIPE:
        softmax_piped(x, out, xl, outl, PIPE, PL, STAGES, CTAS, LAST)
    elif BLOCK and CHUNKS:
        softmax_chunked(x, out, CTAS, BLOCK, CHUNKS)
    elif BLOCK:
        softmax_stream(x, out, BLOCK)
    else:
        rows, starts = segment(ROWS, PARTS, CTAS, WGS)        # ROWS rows, or a segment of one
        v = load_row(x, rows, starts, PARTS, -float("inf"))  # into registers, padding at -inf
        e, m, s = exp_segment(v, CTAS * WGS)              # exp(v - the segment's max), and their sum
        if CTAS * WGS == 1:
            scale = 1.0 / s
        else:                                             # one exchange of (max, sum) between the segments
            top, total = merge_exp(*mgjit.cluster_gather(m, s), CTAS * WGS)
            scale = mgjit.exp(m - top) / total
        y = ()
        for p in mgjit.static_range(len(PARTS)):
            y = y + (e[p] * scale[:, None],)
        store_row(out, rows, starts, y, PARTS, STAGED)


@mgjit.device
def one_column(v, operands):
    """The softmax of rows of one column (float32 v; no operands), elementwise: exp(v - v) / exp(v - v) as held rows
    compute it, 1, or NaN where v is not finite (as torch)."""
    e = shifted_exp(v, v * -LOG2E)
    return e * (1.0 / e)


@mgjit.device
def softmax_piped(x, out, xl, outl, PIPE, PL, STAGES, CTAS, LAST):
    """PIPE programs an SM, each streaming its rows (or, over a cluster of CTAS, its segments of them) through
    STAGES shared-memory slots (examples/_rows_piped.py); the segments of a row swap (maximum, sum) once."""
    mgjit.min_ctas_per_sm(PIPE)
    buf, full, count = ring(x, xl, PL, STAGES, CTAS, LAST)
    for i in range(count):
        env, row, a, s = envelope(x, xl, buf, full, i, -float("inf"), CTAS, LAST)
        refill(x, xl, buf, full, i, count, CTAS, True)
        e, m, total = exp_lines(read_lines(env, PL, wide(x)))
        if CTAS == 1:
            scale = 1.0 / total
        else:
            top, row_total = merge_exp(*mgjit.cluster_gather(m, total), CTAS)
            scale = mgjit.exp(m - top) / row_total
        y = ()
        for p in mgjit.static_range(len(PL)):
            y = y + (e[p] * scale,)
        write_lines(env, y, PL)
        refill(x, xl, buf, full, i, count, CTAS, False)
        store_envelope(out, outl, env, row, a, s, CTAS, LAST)
    mgjit.store_async_wait(0)


@mgjit.device
def softmax_stream(x, out, BLOCK):
    """One row per program, in BLOCK-wide chunks: an online max and sum, then a second pass that writes."""
    row = mgjit.program_id(0)
    n = x.shape[1]
    m, s = streamed_exp_sum(x, row, BLOCK)
    scale = 1.0 / s
    for c0 in range(0, n, BLOCK):
        v = x[row, mgjit.ds(c0, BLOCK)].astype(wide(x))
        out[row, mgjit.ds(c0, BLOCK)] = (mgjit.exp(v - m, ftz=v.dtype == mgjit.float32) * scale).astype(out.dtype)


@mgjit.device
def softmax_chunked(x, out, CTAS, BLOCK, CHUNKS):
    """A segment of CHUNKS chunks of one row per CTA of a cluster, kept in shared memory between the passes; a
    float64 segment's exps kept in its place by the sum's pass, for the output's (libdevice's float64 exp takes
    about 17 float64 instructions; H200, kernel alone, of copy bandwidth: rows of 32000 on 8 CTAs, 0.81 -> 0.91; of
    100003 on 16, 0.57 -> 0.66). Others compute each exp twice: a bf16 row's exps would round to its buffer's
    dtype, and a float32 row's store and reload cost more than its exp (0.77 -> 0.75, rows of 100003 on 8 CTAs)."""
    row, c0 = chunked_segment(CTAS, BLOCK, CHUNKS)
    buf = mgjit.smem((CHUNKS, BLOCK), x.dtype)
    m = stage(x, buf, row, c0, BLOCK, CHUNKS, -float("inf"), "max", STAGE_GROUP).max()
    shift = finite_shift(m)
    e = mgjit.zeros((BLOCK,), wide(x))
    for k in range(CHUNKS):
        ek = mgjit.exp(buf[k][...].astype(e.dtype) - shift, ftz=e.dtype == mgjit.float32)
        if x.dtype == mgjit.float64:
            buf[k][...] = ek
        e = e + ek
    s = e.sum()
    if CTAS == 1:
        scale = 1.0 / s
    else:
        top, total = merge_exp(*mgjit.cluster_gather(m, s), CTAS)
        scale = mgjit.exp(m - top) / total
    for k in range(CHUNKS):
        if x.dtype == mgjit.float64:
            y = buf[k][...] * scale
        else:
            y = mgjit.exp(buf[k][...].astype(e.dtype) - shift, ftz=e.dtype == mgjit.float32) * scale
        out[row, mgjit.ds(c0 + k * BLOCK, BLOCK)] = y.astype(out.dtype)


def softmax(x: torch.Tensor, out: torch.Tensor | None = None, rows_per_program: int | None = None, *,
            dim: int = -1) -> torch.Tensor:
    """torch.softmax(x, dim): over the last dimension of x (rows of any length, any leading dimensions), or over
    dimension `dim`, moved last (a copy of x where its rows are not a view) and the result moved back into out."""
    floating("softmax", x=x)
    if not isinstance(out, (torch.Tensor, type(None))):  # softmax(x, -1), as torch.softmax is called
        raise TypeError(f"softmax: out must be a tensor (or None), got {out!r}; the dimension is the keyword dim")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"softmax: dim must be an int, got {dim!r}")
    if x.ndim and not -x.ndim <= dim < x.ndim:
        raise IndexError(f"softmax: dim must lie in [-{x.ndim}, {x.ndim}) for x of shape {tuple(x.shape)}, got {dim}")
    if x.ndim and dim % x.ndim != x.ndim - 1:
        out = output(out, x.shape, x.device, x.dtype, "softmax", x=x)
        out.copy_(softmax(x.movedim(dim, -1), rows_per_program=rows_per_program).movedim(-1, dim))
        return out
    rows, out, out_rows = as_rows("softmax", x, out)
    if rows.numel() == 0:
        return out
    itemsize, views = piped_views((rows, out_rows), rows_per_program=rows_per_program)
    configs = for_dtypes(mapping(rows.shape[1], rows_per_program, itemsize), (x.dtype,), rows_per_program is not None,
                         rows.shape[1], piped=True)
    launch(softmax_kernel, configs, (rows, out_rows), views)
    return out


@functools.lru_cache(maxsize=None, typed=True)  # rows_per_program=1.0 or True: refused, not served as 1's
def mapping(n: int, rows_per_program: int | None = None, itemsize: int = 0) -> tuple[mgjit.Config, ...]:
    """The row examples' mappings for rows of n columns, then the piped ones for elements of `itemsize` bytes, or
    for rows of one column the flat ones (0: none; they need contiguous, aligned tensors,
    `_rows_piped.piped_views`)."""
    configs = staging(rows_mapping(n, rows_per_program), n)
    return piping(configs, n if rows_per_program is None else 0, itemsize, clusters=True, flat=True)


# softmax as a torch custom op: torch.compile(model, fullgraph=True) keeps it as one node of its graph.
softmax_op = mgjit.torch_op("mgjit_examples::softmax", outputs=lambda x, rows_per_program=None: (x.shape, x.dtype),
                            params=["x", "rows_per_program"])(softmax)


# ---- what the harness needs: inputs, the specialization softmax() launches, a reference

def setup(device):
    x = torch.randn(16384, 4096, device=device, dtype=torch.bfloat16) * 3  # 128 MiB
    return (x,), torch.empty_like(x)


def compile(x, out, target):
    return softmax_kernel.compile(x, out, x, out, **mapping(x.shape[1])[0].launch_kwargs(), target=target)


def reference(x):
    return torch.softmax(x.float(), dim=1)


if __name__ == "__main__":
    from _harness import main
    main(name="softmax", setup=setup, compile=compile, run=softmax, reference=reference, rtol=1e-2, atol=1e-5)
