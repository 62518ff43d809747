"""LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * w + b, for any row length.

Every row is read once and held in registers (examples/_rows.py), the mapping autotuned per shape:
- short rows: ROWS rows per program, each held as a few (ROWS, width) arrays whose widths add up to the row
  rounded up to 128 columns;
- rows too long for one warpgroup: segments over the warpgroups of a cluster; each computes its sum and the
  sum of squared deviations from its own mean, the segments swap them once through distributed shared memory
  (one mbarrier wait) and merge them (Chan's parallel update: exact in f32, with no cancellation);
- a loop over BLOCK-wide chunks, the mean and variance merged chunk by chunk (the same update), then a second
  pass that normalizes: the only way for rows longer than 262144 columns, and a candidate for any row over 8192;
- chunked rows: a segment of the row per CTA of a cluster, read once into shared memory; its sum, then its
  squared deviations from its own mean (read back from shared memory), are swapped and merged as above, and
  each CTA writes its segment from shared memory. A thread holds one chunk at a time, not the row, the weight
  and the bias: this is the mapping of long rows (bf16 rows of 100000: 0.86 of copy bandwidth, held: 0.53).
- piped rows (from 4097 columns, contiguous tensors: examples/_rows_piped.py): a few persistent programs an SM
  stream their rows (longer ones over the CTAs of a cluster) through shared-memory slots by TMA, each with w and
  b laid out once and read per row through a window (bf16, H200: rows of 8193 0.84 of copy bandwidth, 16385
  over 2 CTAs 0.75, 20001 0.86).
Held rows also run as persistent grids: PERSIST programs an SM, each looping over rows with its segments of w and
b in shared memory as float32, read from global memory once (per row they would triple what an SM reads, a round
trip to L2 after the row's statistics). Held rows are also tried with ptxas asked to fit OCC CTAs on an SM
(`mgjit.min_ctas_per_sm`): the layernorm keeps the row, its deviations, the weight and the bias live at once, and
occupancy, not traffic, bounds it (rows of 4097 bf16 held by one warpgroup: 135 registers, 3 CTAs an SM, 0.64 of
copy bandwidth; without the bias, 125 registers and 4 CTAs, 0.83). Candidates that spill are pruned by the tuner.
Statistics are computed in f32 (in f64 where x, w or b is float64: `_rows.wide`; not persistent, and piped
only where x is float64, `_rows_launch.for_dtypes`) and the output rounded once (x - mean first, then one fma with
w and b); the padding past a row's end reads as zero and is masked out of the variance. Held rows of
ONE_PASS_WIDTH columns or more sum x and x^2 in one pass where every mean lies within 4 standard deviations of 0 (y
then comes from x * rstd - mean * rstd, the second term at most 4 in size: rounding it errs by 2.4e-7 at most), and
take their deviations from registers where one does not.

    python examples/layernorm.py     # compile for sm_90a without a GPU; check against torch and time with one
"""
import functools

import torch
from _rows import (chunked_segment, columns, held_width, load_row, mapping, merge_moments, persisting,
                   row_groups, segment, segment_count, segment_sum, stage, staging, stash_vector, store_row,
                   TWO_PARTS_BELOW, weights, wide)
from _rows_launch import as_rows, floating, for_dtypes, launch
from _rows_piped import (envelope, fill_outside, flat_rows, line_parts, piped_views, piping, read_lines, refill, ring,
                         stash_lines, store_envelope, weight_lines)

import mgjit

# Chunked rows are read in groups of this many columns, each group's loads issued together (_rows.stage): bf16 rows
# of 100000 on an H100 ran at 0.86 of copy bandwidth in groups of 8192, 0.71 in groups of 4096; rows of 262144 in
# chunks of 4096, 0.73 in groups of 8192, 0.68 with the whole segment at once.
STAGE_GROUP = 8192

OCCUPANCY = (3, 4)  # CTAs an SM that held rows are also tried at
# Held rows of at least this many columns take their statistics in one pass (`layernorm_held`), where a thread's
# elements of a row outnumber the row-wide steps the pass adds: PTX instructions an element, bf16, rows of 1000
# 16.4 -> 15.3, 4095 32.9 -> 30.2, 5000 15.0 -> 13.6; f16 rows of 98 (8 rows a thread, 3 columns each) 25.6 -> 26.8.
ONE_PASS_WIDTH = 1024
# Rows shorter than this also try staged stores (_rows.staging; their loads then 16-byte vectors, a row's elements
# in one or two threads). H200, bf16, tuned, a row held as two arrays stored side by side as one run: rows of 5
# 0.53 -> 0.92 of copy bandwidth, 9 0.49 -> 0.95, 17 0.52 -> 0.81, 33 0.61 -> 0.83, 65 0.57 -> 0.79; longer rows
# ran slower staged (255: 0.72 against 0.86 from registers).
STAGED_ROWS = 128


@mgjit.kernel
def layernorm_rows(x, w, b, out, xl, outl, wv, bv, eps: mgjit.constexpr, ROWS: mgjit.constexpr,
                   PARTS: mgjit.constexpr, CTAS: mgjit.constexpr, WGS: mgjit.constexpr, BLOCK: mgjit.constexpr,
                   CHUNKS: mgjit.constexpr, OCC: mgjit.constexpr = 0, PERSIST: mgjit.constexpr = 0,
                   PIPE: mgjit.constexpr = 0, PL: mgjit.constexpr = (), STAGES: mgjit.constexpr = 0,
                   STASH: mgjit.constexpr = 0, LAST: mgjit.constexpr = 0, STAGED: mgjit.constexpr = 0,
                   FLAT: mgjit.constexpr = 0):
    """ROWS rows, or a segment of one, held as arrays of the widths PARTS, per program (PERSIST > 0: PERSIST
    programs an SM, each looping over row groups with its segments of w and b in shared memory); or (BLOCK > 0)
    one row streamed in BLOCK-wide chunks, or (and CHUNKS > 0) a segment of CHUNKS chunks per CTA of a cluster;
    or (PIPE > 0) rows piped through shared memory (examples/_rows_piped.py; xl, outl: x and out as lines, wv,
    bv: w and b as `weight_rows`; read by piped mappings only); or (FLAT) rows of one column, ROWS a program, as
    lines of xl and outl. OCC > 0: registers capped so that OCC CTAs fit on an SM."""
    if OCC:
        mgjit.min_ctas_per_sm(OCC)
    if FLAT:
        flat_rows(x, out, xl, outl, ROWS, one_column, (w, b, x.shape[1], eps))
    elif PIPE:
        layernorm_piped(x, w, b, out, xl, outl, wv, bv, eps, PIPE, PL, STAGES, CTAS, LAST)
    elif BLOCK and CHUNKS:
        layernorm_chunked(x, w, b, out, eps, CTAS, BLOCK, CHUNKS)
    elif BLOCK:
        layernorm_stream(x, w, b, out, eps, BLOCK)
    elif PERSIST:
        mgjit.min_ctas_per_sm(PERSIST)
        _, starts = segment(ROWS, PARTS, CTAS, WGS)
        w_bufs, b_bufs = stash_vector(w, starts, PARTS, WGS), stash_vector(b, starts, PARTS, WGS)
        for g in range(mgjit.program_id(0), row_groups(x, ROWS), mgjit.num_programs(0)):
            layernorm_held(x, w, b, w_bufs, b_bufs, out, mgjit.ds(g * ROWS, ROWS), starts, eps, PARTS, CTAS * WGS,
                           PERSIST, STAGED)
    else:
        rows, starts = segment(ROWS, PARTS, CTAS, WGS)
        layernorm_held(x, w, b, w, b, out, rows, starts, eps, PARTS, CTAS * WGS, PERSIST, STAGED)


@mgjit.device
def layernorm_held(x, w, b, w_bufs, b_bufs, out, rows, starts, eps, PARTS, SPLIT, PERSIST, STAGED):
    """The rows `rows` (a segment of them, of SPLIT segments, its parts from `starts`) read once and held; w and
    b read once the statistics are known (from w_bufs and b_bufs, PERSIST) so that they are not live meanwhile."""
    n = x.shape[1]
    cols = columns(starts, PARTS)
    v = load_row(x, rows, starts, PARTS, 0.0)
    one_pass = SPLIT == 1 and held_width(PARTS) >= ONE_PASS_WIDTH
    if one_pass:
        # The sums of x and x^2 (the padding reads as 0: no mask), reduced apart from each other, where every row's
        # mean lies within 4 standard deviations of 0 (the variance, sum(x^2) - n mean^2, then loses at most 4 bits
        # to cancellation, as the piped rows' shift does); else the rows taken again from registers as deviations
        # from their means (centre 0), and y from those. So too where the test is NaN: squares past float32's
        # range (x beyond about 1e18, whose deviations may be finite) or a row that is not finite.
        mean = segment_sum(v) / n
        s2 = segment_sum(squares(v))
        m2 = s2 - mean * mean * n
        centre = mean
        if ~(mgjit.max(17.0 * mean * mean * n - 16.0 * s2) <= 0.0):
            v = centred_row(v, cols, mean, n, PARTS)
            m2 = segment_sum(squares(v))
            centre = mgjit.zeros(mean.shape, mean.dtype)
    elif SPLIT == 1:
        v = centred_row(v, cols, segment_sum(v) / n, n, PARTS)
        m2 = segment_sum(squares(v))
    else:  # each segment's sum and squared deviations from its own mean, merged after one exchange
        count = segment_count(n, starts, PARTS).astype(v[0].dtype)
        s = segment_sum(v)
        deviations = segment_sum(squares(centred(v, cols, s / mgjit.maximum(count, 1.0), n)))
        sums, all_deviations = mgjit.cluster_gather(s, deviations)
        centre, m2 = merge_moments(sums, all_deviations, n, PARTS, SPLIT)
    rstd = mgjit.rsqrt(m2 / n + eps)
    wv, bv = weights(w, w_bufs, starts, PARTS, PERSIST), weights(b, b_bufs, starts, PARTS, PERSIST)
    y = ()
    for p in mgjit.static_range(len(PARTS)):  # (x - mean) first where the mean may lie far from 0: exact there
        if one_pass:
            t = mgjit.fma(v[p], rstd[:, None], (-centre * rstd)[:, None])
        elif SPLIT == 1:
            t = v[p] * rstd[:, None]
        else:
            t = (v[p] - centre[:, None]) * rstd[:, None]
        y = y + (mgjit.fma(t, wv[p], bv[p]),)
    store_row(out, rows, starts, y, PARTS, STAGED)


@mgjit.device
def centred_row(v, cols, mean, n, PARTS):
    """A held row's deviations from its mean, zero in its padding: only its last part is masked, a row's padding
    being narrower than that (PTX instructions an element, bf16 rows of 1600 held as 1024 + 512 + 128: 20.2 ->
    18.4), and none where the parts hold exactly the row (17 as 16 + 1: a select fewer an element)."""
    if len(PARTS) == 2 and held_width(PARTS) < TWO_PARTS_BELOW:
        if n == held_width(PARTS):
            d = centred(v, (), mean, 0)
        else:
            d = centred(v, cols, mean, n, len(PARTS) - 1)
    else:
        mgjit.device_assert(n > held_width(PARTS) - PARTS[len(PARTS) - 1],
                            "layernorm: a row's padding reaches past its last part")
        d = centred(v, cols, mean, n, len(PARTS) - 1)
    return d


@mgjit.device
def one_column(v, operands):
    """Layernorm of rows of one column (float32 v; operands w, b, the row length n = 1, eps), elementwise, as held
    rows compute it: b, or NaN where v is not finite (as torch)."""
    w, b, n, eps = operands
    d = v - v / n
    return mgjit.fma(d * mgjit.rsqrt(d * d / n + eps), w[0].astype(mgjit.float32), b[0].astype(mgjit.float32))


@mgjit.device
def layernorm_piped(x, w, b, out, xl, outl, wv, bv, eps, PIPE, PL, STAGES, CTAS, LAST):
    """A multiple of STASH programs (about PIPE an SM), each streaming its rows (or, over a cluster of CTAS, its
    segments of them) through STAGES shared-memory slots, with w and b laid out once and read per row through a
    window (examples/_rows_piped.py, stash_lines, weight_lines). The envelope's columns outside the row are filled
    with f, the previous row's mean rounded to x's dtype, so that the deviations d = v - f are exactly 0 there and
    one read of the slot gives the mean, f + sum(d) / n, and the variance, sum(d^2) / n less (mean - f)^2 (the
    segments of a row add their sums, swapped once: every CTA of a cluster has the same f). That shift costs the
    variance no precision where the mean lies within 4 standard deviations of f; a row further from its predecessor
    (the first row, rows of differing means) is read again with the outside filled with its own mean rounded
    (`deviations` twice: the H200 ran rows of 8193 at 0.74 of copy bandwidth reading every row twice, 0.84 once).
    A row that is not finite leaves a guess of 0: its NaN or infinite mean as the next row's fill made every later
    row of the program NaN. A mask on the deviations would cost an index, two compares and a select an element and
    held 255 registers at 8193 columns (167 this way)."""
    mgjit.min_ctas_per_sm(PIPE)
    n = x.shape[1]
    inv_n = 1.0 / n.astype(wide(x))  # once: a division a row is a dozen instructions and a call to its slow path
    buf, full, count = ring(x, xl, PL, STAGES, CTAS, LAST)
    w_env, b_env = stash_lines(w, wv, x, PL, CTAS, LAST), stash_lines(b, bv, x, PL, CTAS, LAST)
    guess = mgjit.zeros((), wide(x))
    for i in range(count):
        fill = guess.astype(x.dtype)
        env, row, a, s = envelope(x, xl, buf, full, i, fill, CTAS, LAST)
        refill(x, xl, buf, full, i, count, CTAS, True)
        f = fill.astype(wide(x))
        d, shift, m2 = deviations(env, f, inv_n, PL, CTAS)
        if 17.0 * shift * shift * n > 16.0 * m2:  # the mean more than 4 standard deviations from f
            fill = (f + shift).astype(x.dtype)
            fill_outside(env, s, n, fill, CTAS, LAST)
            mgjit.cta_sync()
            f = fill.astype(wide(x))
            d, shift, m2 = deviations(env, f, inv_n, PL, CTAS)
        mean = f + shift
        guess = mgjit.where(abs(mean) < float("inf"), mean, 0.0)
        rstd = mgjit.rsqrt(m2 * inv_n - shift * shift + eps)
        offset = -shift * rstd
        w_parts, b_parts, parts = weight_lines(w_env, s, PL), weight_lines(b_env, s, PL), line_parts(env, PL)
        for p in mgjit.static_range(len(PL)):
            parts[p][...] = mgjit.fma(mgjit.fma(d[p], rstd, offset), w_parts[p][...].astype(d[p].dtype),
                                      b_parts[p][...].astype(d[p].dtype)).astype(out.dtype)
        refill(x, xl, buf, full, i, count, CTAS, False)
        store_envelope(out, outl, env, row, a, s, CTAS, LAST)
    mgjit.store_async_wait(0)


@mgjit.device
def deviations(env, f, inv_n, PL, CTAS):
    """(d, shift, m2): a segment of a row's envelope in f's dtype less f (d, one array per count of PL), the row's
    mean less f, and the row's sum of d^2 (over a cluster of CTAS, the segments' sums swapped);
    inv_n: 1 / the row's length."""
    v = read_lines(env, PL, f.dtype)
    d = ()
    squared = ()
    for p in mgjit.static_range(len(PL)):
        d = d + (v[p] - f,)
        squared = squared + (d[p] * d[p],)
    total, m2 = mgjit.sum(d), mgjit.sum(squared)
    if CTAS > 1:
        totals, squares = mgjit.cluster_gather(total, m2)
        total, m2 = totals[0], squares[0]
        for k in mgjit.static_range(1, CTAS):
            total, m2 = total + totals[k], m2 + squares[k]
    return d, total * inv_n, m2


@mgjit.device
def centred(v, cols, mean, n, FIRST=0):
    """v - mean per part, zero past the row's end in the parts from FIRST on (cols: each part's column indices; ()
    where no part crosses it)."""
    d = ()
    for p in mgjit.static_range(len(v)):
        if len(cols) and p >= FIRST:
            d = d + (mgjit.where(cols[p] < n, v[p] - mean[:, None], 0.0),)
        else:
            d = d + (v[p] - mean[:, None],)
    return d


@mgjit.device
def squares(d):
    out = ()
    for p in mgjit.static_range(len(d)):
        out = out + (d[p] * d[p],)
    return out


@mgjit.device
def layernorm_stream(x, w, b, out, eps, BLOCK):
    """One row per program, in BLOCK-wide chunks."""
    row = mgjit.program_id(0)
    n = x.shape[1]
    count = 0.0
    mean = 0.0
    m2 = 0.0
    for c0 in range(0, n, BLOCK):
        v = x[row, mgjit.ds(c0, BLOCK)].astype(wide(x))
        inside = c0 + mgjit.arange(BLOCK) < n
        k = mgjit.minimum(n - c0, BLOCK).astype(v.dtype)
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
        v = x[row, mgjit.ds(c0, BLOCK)].astype(wide(x))
        y = (v - mean) * rstd * w[mgjit.ds(c0, BLOCK)].astype(wide(w)) + b[mgjit.ds(c0, BLOCK)].astype(wide(b))
        out[row, mgjit.ds(c0, BLOCK)] = y.astype(out.dtype)


@mgjit.device
def layernorm_chunked(x, w, b, out, eps, CTAS, BLOCK, CHUNKS):
    """A segment of CHUNKS chunks of one row per CTA of a cluster, kept in shared memory between the passes."""
    row, c0 = chunked_segment(CTAS, BLOCK, CHUNKS)
    n = x.shape[1]
    width = CHUNKS * BLOCK
    buf = mgjit.smem((CHUNKS, BLOCK), x.dtype)
    s = stage(x, buf, row, c0, BLOCK, CHUNKS, 0.0, "sum", STAGE_GROUP).sum()
    count = mgjit.minimum(mgjit.maximum(n - c0, 0), width)
    segment_mean = s / mgjit.maximum(count, 1).astype(s.dtype)
    inside = count // BLOCK  # chunks wholly inside the row: no mask
    squares = mgjit.zeros((BLOCK,), s.dtype)
    for k in range(inside):
        d = buf[k][...].astype(s.dtype) - segment_mean
        squares = mgjit.fma(d, d, squares)
    for k in range(inside, CHUNKS):  # the padding past the row's end (read as 0) is masked out
        d = buf[k][...].astype(s.dtype) - segment_mean
        d = mgjit.where(c0 + k * BLOCK + mgjit.arange(BLOCK) < n, d, 0.0)
        squares = mgjit.fma(d, d, squares)
    deviations = squares.sum()
    if CTAS == 1:
        mean, m2 = s / n, deviations
    else:
        sums, all_deviations = mgjit.cluster_gather(s, deviations)
        mean, m2 = merge_moments(sums, all_deviations, n, (width,), CTAS)
    rstd = mgjit.rsqrt(m2 / n + eps)
    shift = -mean * rstd
    for k in range(CHUNKS):
        c = c0 + k * BLOCK
        wv = w[mgjit.ds(c, BLOCK)].astype(wide(w))
        bv = b[mgjit.ds(c, BLOCK)].astype(wide(b))
        y = mgjit.fma(mgjit.fma(buf[k][...].astype(s.dtype), rstd, shift), wv, bv)
        out[row, mgjit.ds(c, BLOCK)] = y.astype(out.dtype)


def layernorm(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None, eps: float = 1e-5,
              out: torch.Tensor | None = None, rows_per_program: int | None = None) -> torch.Tensor:
    """torch.nn.functional.layer_norm(x, (n,), w, b, eps): over the last dimension of x (rows of any length, any
    leading dimensions); a w or b of None scales by 1 or adds 0, as torch's."""
    if x.ndim and w is None:
        w = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    if x.ndim and b is None:
        b = torch.zeros(x.shape[-1], dtype=x.dtype, device=x.device)
    if x.ndim == 0 or not w.shape == b.shape == (x.shape[-1],):
        raise ValueError(f"layernorm takes x of shape (..., n), w and b of shape (n,), got {tuple(x.shape)}, "
                         f"{tuple(w.shape)} and {tuple(b.shape)}")
    floating("layernorm", x=x, w=w, b=b)
    rows, out, out_rows = as_rows("layernorm", x, out, w=w, b=b)
    if rows.numel() == 0:
        return out
    itemsize, views = piped_views((rows, out_rows), (w, b), rows_per_program)
    configs = for_dtypes(layernorm_mapping(rows.shape[1], rows_per_program, itemsize,
                                           (w.element_size(), b.element_size())),
                         (x.dtype, w.dtype, b.dtype), rows_per_program is not None, rows.shape[1], piped=True)
    launch(layernorm_rows, configs, (rows, w, b, out_rows), views, eps=eps)
    return out


@functools.lru_cache(maxsize=None, typed=True)  # rows_per_program=1.0 or True: refused, not served as 1's
def layernorm_mapping(n: int, rows_per_program: int | None = None, itemsize: int = 0,
                      weight_sizes: tuple[int, ...] = (4, 4)) -> tuple[mgjit.Config, ...]:
    """The row examples' mappings for rows of n columns (rows shorter than STAGED_ROWS also with staged stores),
    then each held one again at every OCCUPANCY that its threads allow, then as persistent grids, then the piped
    ones for elements of `itemsize` bytes (0: none) and weights and biases of `weight_sizes` bytes, or for rows of
    one column the flat ones."""
    plain = mapping(n, rows_per_program)
    staged = staging(plain, n) if n < STAGED_ROWS else plain
    configs = tuple(c.replace(OCC=0, STAGED=c.kwargs.get("STAGED", 0)) for c in staged) + tuple(
        c.replace(OCC=occ, STAGED=0) for occ in OCCUPANCY for c in plain
        if not c.kwargs["BLOCK"] and occ * 128 * c.kwargs["WGS"] <= 2048)
    if rows_per_program is not None:
        return piping(configs, 0, 0, weights=weight_sizes)
    return piping(persisting(configs, 2), n, itemsize, weights=weight_sizes, clusters=True, flat=True)


# ---- what the harness needs: inputs, the specialization layernorm() launches, a reference

def setup(device):
    x = torch.randn(16384, 5000, device=device, dtype=torch.bfloat16) * 2 + 0.5
    w = torch.randn(5000, device=device, dtype=torch.bfloat16)
    b = torch.randn(5000, device=device, dtype=torch.bfloat16)
    return (x, w, b), torch.empty_like(x)


def compile(x, w, b, out, target):
    return layernorm_rows.compile(x, w, b, out, x, out, x, x, eps=1e-5,
                                  **layernorm_mapping(x.shape[1])[0].launch_kwargs(), target=target)


def reference(x, w, b):
    return torch.nn.functional.layer_norm(x.float(), (x.shape[1],), w.float(), b.float(), 1e-5)


if __name__ == "__main__":
    from _harness import main
    main(name="layernorm", setup=setup, compile=compile, run=layernorm, reference=reference, rtol=2e-2, atol=3e-2)
