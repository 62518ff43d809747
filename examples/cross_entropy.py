"""Cross-entropy forward: loss[r] = logsumexp(logits[r, :]) - logits[r, target[r]], for any vocabulary size.

The logits are read exactly once, by one of four mappings (autotuned per shape). Held rows, as in
examples/_rows.py: short rows ROWS to a program; rows of up to 262144 split over the warpgroups of a cluster,
each segment computing its maximum and its sum of exp(x - that maximum), which the segments swap once through
distributed shared memory (one mbarrier wait). Streamed rows (any row over
8192 columns, and the only way past 262144): one program per row loops over BLOCK-wide chunks with an online
logsumexp (a running maximum, the sum rescaled when it grows). Chunked rows (any row over 8192): a segment of
the row per CTA of a cluster, read once into shared memory with its maximum, then its sum of exp(x - that
maximum) from shared memory; the segments swap them once. Piped rows (4097 to 16385 columns, contiguous logits:
examples/_rows_piped.py): persistent programs stream their rows through shared-memory slots by TMA, and read
the target's logit from the slot; longer rows in segments of whole lines, each program taking an even run of
them in order and merging a row's statistics as they come, the rows at a run's ends merged by the last program to
finish its piece (`cross_entropy_segments`).
Elsewhere the targets' logits are gathered (`logits[rows, targets]`), a load for each row a thread holds. Rows
whose target is `ignore_index` get a loss of 0, as in torch; a target outside [0, n) otherwise gets a loss of NaN
(torch raises). The logsumexp is returned too (what a backward pass needs). Losses and logsumexps are float32,
computed in float32; float64 for float64 logits, computed in float64 (`_rows.wide`; no piped mapping:
`_rows_launch.for_dtypes`).

    python examples/cross_entropy.py     # compile for sm_90a without a GPU; check against torch and time with one
"""
import functools
import math

import torch
from _rows import (LOG2E, chunked_segment, exp_segment, finite_shift, first_row, load_row, grid,
                   mapping as rows_mapping, merge_exp, merge_pair, segment, sm_count, stage, store_stat,
                   streamed_exp_sum, TWO_PARTS_BELOW, wide)
from _rows_launch import floating, for_dtypes, launch, output
from _device import current_stream, kept_zero
from _rows_piped import (LINE, copy_row, envelope, exp_lines, item_program, piped_views, piping, program_items,
                         program_segment, read_lines, ring)

import mgjit

# Chunked rows are read in groups of this many columns (_rows.stage); as softmax's, whose registers it shares.
STAGE_GROUP = 4096
# CTAs an SM that short rows held as two arrays (33 as 32 + 1) are also tried at: their row statistics' placement
# (ops/reductions.py, a reduction over a unit axis) took rows of 33 from 64 registers to 67, 8 CTAs an SM to 7,
# and 0.80 of copy bandwidth to 0.76. Capped (63 registers; H200, bf16, kernel alone): 33 0.75 -> 0.80, 65 0.72 ->
# 0.74, 17 0.85 -> 0.87 (256 rows a program), 150 as 128 + 32 0.75 -> 0.75.
TWO_PART_OCC = 8
# Rows held whole, one a program in at most this many columns, are also tried at every thread slot of an SM: 16 CTAs
# of 128 threads, 32 registers (H200, bf16, kernel alone: 2304 columns 0.80 -> 0.90 of copy bandwidth, 3000 0.87 ->
# 0.90 with 244 bytes of spills; tuned, 3000: 0.86 -> 0.89).
FULL_OCC, FULL_OCC_COLUMNS = 16, 3072
# Rows held whole in two arrays or more, wider than this, are also tried with their targets' logits gathered first
# (EARLY, `mapping`); on narrower rows that never ran faster (H200, bf16: 9, 33, 300, 768 columns).
EARLY_COLUMNS = 1024
LN2 = math.log(2.0)


@mgjit.kernel
def cross_entropy_rows(logits, target, loss, lse, ignore_index, xl, parts, counts, ROWS: mgjit.constexpr,
                       PARTS: mgjit.constexpr, CTAS: mgjit.constexpr, WGS: mgjit.constexpr, BLOCK: mgjit.constexpr,
                       CHUNKS: mgjit.constexpr, PIPE: mgjit.constexpr = 0, PL: mgjit.constexpr = (),
                       STAGES: mgjit.constexpr = 0, LAST: mgjit.constexpr = 0, SEGS: mgjit.constexpr = 0,
                       OCC: mgjit.constexpr = 0, EARLY: mgjit.constexpr = 0, LSE: mgjit.constexpr = 1):
    """xl: the logits as lines (examples/_rows_piped.py), read by piped mappings (PIPE > 0) only; parts: (3, at
    least two a program) float32, the statistics of the pieces of rows that programs share, and counts: (at least
    rows) int32, zero, each such row's pieces counted in and set back to zero, both used by piped segments
    (SEGS > 1) only (`scratch`, `finish_piece`). OCC > 0: registers capped so that OCC CTAs fit on an SM. EARLY: held
    rows gather their targets' logits before the row's arithmetic, not after it (`mapping`). LSE: store each row's
    logsumexp into lse (0: lse is not written, and may be any float32 tensor; the wrapper passes a kept one of one
    element, not loss, which the tuner would take for an in-place argument)."""
    if OCC:
        mgjit.min_ctas_per_sm(OCC)
    if PIPE:
        mgjit.device_assert(CTAS == 1, "cross-entropy pipes each row through one CTA (examples/_rows_piped.py, piping)")
        if SEGS > 1:
            cross_entropy_segments(logits, target, loss, lse, ignore_index, xl, parts, counts, PIPE, PL, STAGES, LAST,
                                   SEGS, LSE)
        else:
            cross_entropy_piped(logits, target, loss, lse, ignore_index, xl, PIPE, PL, STAGES, LAST, LSE)
    elif BLOCK and CHUNKS:
        cross_entropy_chunked(logits, target, loss, lse, ignore_index, CTAS, BLOCK, CHUNKS, LSE)
    elif BLOCK:
        cross_entropy_stream(logits, target, loss, lse, ignore_index, BLOCK, LSE)
    else:
        rows, starts = segment(ROWS, PARTS, CTAS, WGS)
        v = load_row(logits, rows, starts, PARTS, -float("inf"))
        targets = target[rows]
        t = targets.astype(mgjit.int32)
        # Each row's target logit, gathered: a load for each row a thread holds. A masked sum over the held rows
        # cost a compare, a select and an add an element, and scalar loads by every thread two loads a row (H200,
        # kernel alone, bf16: rows of 16 0.70 -> 0.85 of copy bandwidth, 127 0.66 -> 0.79, 255 0.67 -> 0.81).
        # After the row's arithmetic, or before it (EARLY): which is faster depends on the mapping (issued before,
        # rows of 2047 two a program ran 0.85 -> 0.77, 4096 0.95 -> 0.88, but 2304 two a program 0.82 -> 0.95).
        if EARLY:
            hit = logits[first_row(ROWS, CTAS) + mgjit.arange(ROWS), t].astype(wide(logits))
        e, m, s = exp_segment(v, CTAS * WGS)
        if not EARLY:
            hit = logits[first_row(ROWS, CTAS) + mgjit.arange(ROWS), t].astype(wide(logits))
        if CTAS * WGS == 1:
            top, total = m, s
            excess = shifted_loss(total, hit, m * -LOG2E)  # exp_segment's shift, as it rounds
        else:  # one exchange of (max, sum) between the segments
            top, total = merge_exp(*mgjit.cluster_gather(m, unshifted_sum(s, m)), CTAS * WGS)
            excess = mgjit.log(total) - (hit - top)
        row_lse = top + mgjit.log(total)
        if LSE:
            store_stat(lse, rows, row_lse, starts, CTAS * WGS)
        row_losses = row_loss(targets, ignore_index, logits.shape[1], excess)
        store_stat(loss, rows, row_losses, starts, CTAS * WGS)


@mgjit.device
def row_loss(t, ignore_index, n, excess):
    """A row's loss, excess = logsumexp - its target's logit (`shifted_loss`, or log(total) - (picked - top) from
    exps of exact differences): 0 where the target is ignore_index (as torch), NaN where it lies outside [0, n)
    (torch raises; the target's logit would read as 0 there and the loss be a plausible number). A rounded excess
    may come out a few ulps of 1 below 0 where the target's logit dominates the row: such a loss is 0, as torch's;
    NaN stays NaN."""
    inside = (t >= 0) & (t < n)
    return mgjit.where(t == ignore_index, 0.0, mgjit.where(inside, mgjit.maximum(excess, 0.0), float("nan")))


@mgjit.device
def shifted_loss(total, picked, shift):
    """log(total) - (picked - m), total the sum of a row's `shifted_exp`s by shift, -m * LOG2E as it rounded (the
    very value the exps took: the same expression, computed once): the shift's rounding, r, makes every exp 2 ** r
    too large, so the loss is log(total) - ln 2 * (picked * LOG2E + shift), one fma, exact where the target's logit
    is the maximum. Taken apart, as lse - picked, a loss near 0 was off by up to an ulp of m * LOG2E (bf16 logits of
    52.75, -30, -23: -3.8e-6, torch 0; of 40, 39.5: 1.1e-6 of 0.474)."""
    return mgjit.log(total) - LN2 * mgjit.fma(picked, LOG2E, shift)


@mgjit.device
def unshifted_sum(total, m):
    """The sum of a segment's exp(x - m) from `shifted_exp`s' total by the shift -m * LOG2E as it rounds (m of -inf
    as 0), for segments to merge (`shifted_loss`, where a row is one segment)."""
    shift = finite_shift(m)
    return total * mgjit.exp2(-mgjit.fma(shift, LOG2E, shift * -LOG2E))


@mgjit.device
def cross_entropy_piped(logits, target, loss, lse, ignore_index, xl, PIPE, PL, STAGES, LAST, LSE):
    """PIPE programs an SM, each streaming its rows through STAGES shared-memory slots (examples/_rows_piped.py).
    A slot is copied into again as soon as its row is in registers: nothing is stored from it. The target's logit
    is read from the slot, the target one row ahead: a row's two dependent global loads (its target, then that
    logit) cost a memory latency each, every row (H200, bf16 rows of 8193: 0.80 -> 0.85 of copy bandwidth)."""
    mgjit.min_ctas_per_sm(PIPE)
    n = logits.shape[1]
    buf, full, count = ring(logits, xl, PL, STAGES, 1, LAST)
    t_next = segment_target(target, 0, 1)
    for i in range(count):
        t = t_next
        env, row, _, s = envelope(logits, xl, buf, full, i, -float("inf"), 1, LAST)
        t_next = segment_target(target, i + 1, 1)
        v = read_lines(env, PL, mgjit.float32)  # piped statistics are float32's (no float64 wrapper pipes)
        picked = target_logit(env, s, t, n, 1)
        mgjit.cta_sync()
        if i + STAGES < count:
            copy_row(logits, xl, buf, full, i + STAGES, 1)
        _, m, total = exp_lines(v)
        row_lse = m + mgjit.log(total)
        if LSE:
            lse[row] = row_lse
        loss[row] = row_loss(t, ignore_index, n, shifted_loss(total, picked, -finite_shift(m) * LOG2E))


@mgjit.device
def cross_entropy_segments(logits, target, loss, lse, ignore_index, xl, parts, counts, PIPE, PL, STAGES, LAST, SEGS,
                           LSE):
    """Rows too long for one CTA, split into SEGS segments of whole lines (examples/_rows_piped.py, segment_start):
    each program takes its run of the rows' segments in order (`program_items`) through its slots, merging each
    segment's maximum, sum of exp(x - that maximum) and target's logit into its row's as they come. A row wholly in
    the run is stored as it ends; the rows at the run's ends, which other programs hold pieces of, go to
    `finish_piece`: two at most a program, whatever the rows. Kernel alone (bf16, H200, rows of 100000 in 10
    segments of 40 lines, 2 programs an SM; 150000 in 14 of 42, 3 an SM): whole rows dealt to programs in turn ran
    0.80 and 0.79 of copy bandwidth (1342 rows: 6 for 22 programs, 5 for the rest), even runs 0.86 and 0.87, and
    segments spread over programs in turn 0.91 and 0.90, their merge left to a second launch; merged in the kernel
    instead, by the program that counts a row's last segment in (an atomic add a segment), 0.42 and 0.57: a global
    round trip every segment stalls the ring. Over a cluster, its one exchange a row ran 0.49-0.76 (rows of 20000
    to 262144), where softmax over the same clusters ran 0.89-0.92 (its exchange is paid once a row that is read
    and written, twice the bytes)."""
    mgjit.min_ctas_per_sm(PIPE)
    # Pieces stored past parts' end or counted past counts' would be dropped, and their rows' losses wrong
    mgjit.device_assert((parts.shape[1] >= 2 * mgjit.num_programs(0)) & (counts.shape[0] >= logits.shape[0]),
                        "cross-entropy's piped segments need parts of at least two columns a program and counts of "
                        "a row each (examples/cross_entropy.py, scratch)")
    n = logits.shape[1]
    buf, full, count = ring(logits, xl, PL, STAGES, 1, LAST, SEGS)
    first, _ = program_items(mgjit.program_id(0), logits.shape[0], SEGS)
    top = -float("inf")
    total = 0.0
    picked = 0.0
    t_next = segment_target(target, 0, SEGS)
    for i in range(count):
        t = t_next
        t_next = segment_target(target, i + 1, SEGS)
        m, segment_total, segment_picked = segment_statistics(logits, xl, buf, full, i, count, t, PL, STAGES, LAST,
                                                              SEGS)
        picked = picked + segment_picked
        top, total = merge_pair(top, total, m, segment_total)
        row = (first + i) // SEGS
        ends = (first + i) % SEGS == SEGS - 1
        if ends | (i == count - 1):
            if ends & (row * SEGS >= first):
                row_lse = top + mgjit.log(total)
                if LSE:
                    lse[row] = row_lse
                loss[row] = row_loss(t, ignore_index, n, mgjit.log(total) - (picked - top))
            else:
                finish_piece(parts, counts, loss, lse, ignore_index, t, n, row, first, top, total, picked, SEGS, LSE)
            top = -float("inf")
            total = 0.0
            picked = 0.0


@mgjit.device
def finish_piece(parts, counts, loss, lse, ignore_index, t, n, row, first, top, total, picked, SEGS, LSE):
    """This program's piece of row `row` (its run starting at segment `first`: the row's statistics over the
    segments it holds) stored in parts[:, 2 * program + (0 where the row is the run's first, else 1)], and counted
    into counts[row] (acq_rel: the pieces the others stored before counting theirs are visible to it); the program
    that counts the row's last piece in merges them in the programs' order, stores the row's loss and logsumexp,
    and sets the count back to 0 for the next launch."""
    rows = loss.shape[0]
    p = mgjit.program_id(0)
    slot = mgjit.where(row == first // SEGS, 2 * p, 2 * p + 1)
    parts[0, slot] = top
    parts[1, slot] = total
    parts[2, slot] = picked
    lo = item_program(row * SEGS, rows, SEGS)
    hi = item_program(row * SEGS + SEGS - 1, rows, SEGS)
    if mgjit.atomic_add(counts, row, 1, sem="acq_rel") == hi - lo:
        m = -float("inf")
        s = 0.0
        hit = 0.0
        for q in range(lo, hi + 1):
            start, _ = program_items(q, rows, SEGS)
            k = mgjit.where(row == start // SEGS, 2 * q, 2 * q + 1)
            m, s = merge_pair(m, s, parts[0, k], parts[1, k])
            hit = hit + parts[2, k]
        row_lse = m + mgjit.log(s)
        if LSE:
            lse[row] = row_lse
        loss[row] = row_loss(t, ignore_index, n, mgjit.log(s) - (hit - m))
        counts[row] = 0


@mgjit.device
def segment_statistics(logits, xl, buf, full, i, count, t, PL, STAGES, LAST, SEGS):
    """(maximum, sum of exp(x - that maximum), the target's logit or 0 where it lies elsewhere) of this program's
    i-th segment (`program_segment`), whose row's target is t, its slot refilled with segment i + STAGES once
    read."""
    env, _, _, s = envelope(logits, xl, buf, full, i, -float("inf"), 1, LAST, SEGS)
    v = read_lines(env, PL, mgjit.float32)  # as the float32 pieces it merges into (`finish_piece`)
    picked = target_logit(env, s, t, logits.shape[1], SEGS)
    mgjit.cta_sync()
    if i + STAGES < count:
        copy_row(logits, xl, buf, full, i + STAGES, 1, SEGS)
    _, m, total = exp_lines(v)
    return m, unshifted_sum(total, m), picked


@mgjit.device
def segment_target(target, i, SEGS):
    """The target of the row of this program's i-th segment (`program_segment`; a whole row where SEGS is 1; past
    the last row, the last's), loaded a segment ahead of its use: loaded where it was used, it cost a memory
    latency every segment (H200, bf16, kernel alone: rows of 50257 in 5 segments taken in turn, 3 slots and 2
    programs an SM, 0.80 -> 0.85 of copy bandwidth; 100000 in 9, 0.74 -> 0.76; spread over programs, 0.73 -> 0.91
    and 0.65 -> 0.73)."""
    row, _ = program_segment(i, 1, SEGS, target.shape[0])
    return target[mgjit.minimum(row, target.shape[0] - 1)]


@mgjit.device
def target_logit(env, s, t, n, SEGS):
    """The logit of target t (clamped to the row: an ignored or invalid target's loss is set apart, `row_loss`)
    from the row's envelope (or, SEGS > 1, its segment) in a slot, the row starting at s in it; 0 where the target
    lies in another segment."""
    e = s + mgjit.minimum(mgjit.maximum(t.astype(mgjit.int32), 0), n - 1)
    if SEGS == 1:
        return pick(env, e)
    mine = (e >= 0) & (e < env.shape[0] * LINE)
    return mgjit.where(mine, pick(env, mgjit.where(mine, e, 0)), 0.0)


@mgjit.device
def pick(env, e):
    """Element e of a row's envelope (a piped slot) as float32: the 8 elements around it read (whole 16-byte
    runs: a view of an unswizzled tile starts on one), the element selected."""
    line = env[mgjit.ds(e // LINE, 1), mgjit.ds(e % LINE // 8 * 8, 8)][...].astype(mgjit.float32)
    return mgjit.where(mgjit.arange(8)[None, :] == e % 8, line, 0.0).sum()


@mgjit.device
def cross_entropy_stream(logits, target, loss, lse, ignore_index, BLOCK, LSE):
    """One row per program, in BLOCK-wide chunks, with an online logsumexp."""
    row = mgjit.program_id(0)
    n = logits.shape[1]
    m, s = streamed_exp_sum(logits, row, BLOCK)
    row_lse = m + mgjit.log(s)
    t = target[row]
    picked = logits[row, t].astype(wide(logits))
    if LSE:
        lse[row] = row_lse
    loss[row] = row_loss(t, ignore_index, n, mgjit.log(s) - (picked - m))


@mgjit.device
def cross_entropy_chunked(logits, target, loss, lse, ignore_index, CTAS, BLOCK, CHUNKS, LSE):
    """A segment of CHUNKS chunks of one row per CTA of a cluster: its maximum as it is read into shared memory,
    then its sum of exp(x - that maximum) from there (one exp an element; an online sum read once would take
    two)."""
    row, c0 = chunked_segment(CTAS, BLOCK, CHUNKS)
    buf = mgjit.smem((CHUNKS, BLOCK), logits.dtype)
    m = stage(logits, buf, row, c0, BLOCK, CHUNKS, -float("inf"), "max", STAGE_GROUP).max()
    shift = finite_shift(m)
    e = mgjit.zeros((BLOCK,), wide(logits))
    for k in range(CHUNKS):
        e = e + mgjit.exp(buf[k][...].astype(e.dtype) - shift, ftz=e.dtype == mgjit.float32)
    s = e.sum()
    if CTAS == 1:
        top, total = m, s
    else:
        top, total = merge_exp(*mgjit.cluster_gather(m, s), CTAS)
    row_lse = top + mgjit.log(total)
    t = target[row]
    picked = logits[row, t].astype(wide(logits))
    if LSE:
        store_stat(lse, row, row_lse, (c0,), CTAS)
    store_stat(loss, row, row_loss(t, ignore_index, logits.shape[1], mgjit.log(total) - (picked - top)), (c0,), CTAS)


def block_for(n: int) -> int:
    """The chunk width: the row rounded up to a power of two, at most 8192 (64 f32 per thread)."""
    return min(8192, 1 << max(n - 1, 0).bit_length())


@functools.lru_cache(maxsize=None)
def mapping(n: int, itemsize: int = 0, lse: bool = True) -> tuple[mgjit.Config, ...]:
    """The candidate mappings (examples/_rows.py), streamed rows in chunks of block_for(n), short rows held as two
    arrays again with registers capped for TWO_PART_OCC CTAs an SM, rows held one a program in at most
    FULL_OCC_COLUMNS again at FULL_OCC CTAs an SM; rows held whole in two arrays or more, over EARLY_COLUMNS, again
    with their targets' logits gathered first (EARLY; H200, bf16, tuned: 2304 columns 0.81 -> 0.93 of copy bandwidth,
    1600 0.85 -> 0.89, float32 1100 and 2304 picked too; one a program, 3000 columns 0.86 -> 0.79 and 3500 0.94 ->
    0.85, hence tuned); then the piped ones (examples/_rows_piped.py) for elements of `itemsize` bytes (0: none),
    whole rows or, longer, segments; each storing the rows' logsumexps or not (`lse`: LSE)."""
    def whole(c: mgjit.Config) -> bool:
        """Whether a mapping holds its rows whole in one warpgroup's registers (no cluster, no chunks)."""
        return not c.kwargs["BLOCK"] and c.kwargs["CTAS"] * c.kwargs["WGS"] == 1

    configs = rows_mapping(n, stream=block_for(n))
    capped = tuple(c.replace(OCC=TWO_PART_OCC) for c in configs if len(c.kwargs["PARTS"]) == 2
                   and sum(c.kwargs["PARTS"]) < TWO_PARTS_BELOW and not c.kwargs["BLOCK"])
    full = tuple(c.replace(OCC=FULL_OCC) for c in configs
                 if whole(c) and c.kwargs["ROWS"] == 1 and sum(c.kwargs["PARTS"]) <= FULL_OCC_COLUMNS)
    held = tuple(c.replace(OCC=0) for c in configs) + capped + full
    early = tuple(c.replace(EARLY=1) for c in held
                  if whole(c) and len(c.kwargs["PARTS"]) > 1 and sum(c.kwargs["PARTS"]) > EARLY_COLUMNS)
    piped = piping(tuple(c.replace(EARLY=0) for c in held) + early, n, itemsize, segments=True)
    return tuple(c.replace(LSE=int(lse)) for c in piped)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                  out: torch.Tensor | None = None,
                  return_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """Per-row losses (reduction='none') of torch.nn.functional.cross_entropy(logits, target) and their rows'
    logsumexps (what a backward pass needs): (loss, lse); with return_lse=False, loss alone, as torch gives it, and
    the kernel writes no logsumexp: 4 bytes a row less, which short rows feel (bf16 rows of 1 move 14 bytes a row
    instead of 18)."""
    if logits.ndim != 2 or target.shape != (logits.shape[0],):
        raise ValueError(f"cross_entropy takes logits of shape (rows, n) and target of shape (rows,), got "
                         f"{tuple(logits.shape)} and {tuple(target.shape)}")
    floating("cross_entropy", logits=logits)
    if target.dtype.is_floating_point or target.dtype.is_complex or target.dtype == torch.bool:
        raise ValueError(f"cross_entropy takes class indices of an integer dtype as target, got {target.dtype} (torch "
                         "reads a floating-point target as class probabilities of shape (rows, n))")
    rows = logits.shape[0]
    stat = stat_dtype(logits.dtype)
    loss = output(out, (rows,), logits.device, stat, "cross_entropy", logits=logits, target=target)
    if return_lse:
        lse = torch.empty(rows, dtype=stat, device=logits.device)
    else:  # in lse's place, a tensor nothing writes: not loss, or the tuner would see two arguments as one tensor
        lse, = kept_zero(("cross_entropy", "no lse", str(logits.device), stat), (((1,), stat),), logits.device)
    if rows and not logits.shape[1]:  # no classes: every target lies outside the row (torch raises), as `row_loss`
        loss.copy_(torch.where(target == ignore_index, 0.0, float("nan")))
        if return_lse:
            lse.fill_(-float("inf"))
    elif rows:
        itemsize, views = piped_views((logits,))
        configs = for_dtypes(mapping(logits.shape[1], itemsize, return_lse), (logits.dtype,), n=logits.shape[1])
        launch(cross_entropy_rows, configs, (logits, target, loss, lse, ignore_index),
               (*views, *scratch(logits, configs)))
    return (loss, lse) if return_lse else loss


def run_mapping(config: mgjit.Config, logits: torch.Tensor, target: torch.Tensor, loss: torch.Tensor,
                lse: torch.Tensor, ignore_index: int = -100) -> None:
    """Launch one mapping of cross_entropy_rows as `cross_entropy` launches the tuner's pick: on its grid, with
    the views piped mappings read and its scratch (for tests and benchmarks that force a mapping)."""
    _, views = piped_views((logits,))
    cross_entropy_rows[grid(logits.shape[0], config, logits.device)](logits, target, loss, lse, ignore_index, *views,
                                                                     *scratch(logits, (config,)),
                                                                     **config.launch_kwargs())


def stat_dtype(logits_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the losses and logsumexps of logits of `logits_dtype`: float64's own, float32 for the others."""
    return torch.float64 if logits_dtype == torch.float64 else torch.float32


def scratch(logits: torch.Tensor, configs) -> tuple[torch.Tensor, torch.Tensor]:
    """(parts, counts) for launches of `configs` over `logits` (`finish_piece`): room for two pieces of rows a
    program of the largest grid of them, and a count a row, zero (kept for the device and stream: every launch
    leaves them zero). Where no config splits rows, the logits in their places (read by nothing)."""
    per_sm = max(c.kwargs["PIPE"] * (c.kwargs["SEGS"] > 1) for c in configs)
    if not per_sm:
        return logits, logits
    rows, device = logits.shape[0], logits.device
    parts = torch.empty(3, 2 * per_sm * sm_count(device), dtype=torch.float32, device=device)
    counts, = kept_zero(("cross_entropy", str(device), current_stream(device)), (((rows,), torch.int32),), device)
    return parts, counts


# ---- what the harness needs

def setup(device):
    logits = torch.randn(4096, 32000, device=device, dtype=torch.bfloat16) * 4
    target = torch.randint(0, 32000, (4096,), device=device)
    if device != "meta":
        target[::97] = -100
    return (logits, target), torch.empty(4096, device=device, dtype=torch.float32)


def compile(logits, labels, out, target):
    return cross_entropy_rows.compile(logits, labels, out, out, -100, logits, out, out,
                                      **mapping(logits.shape[1])[0].launch_kwargs(), target=target)


def run(logits, labels, out):
    cross_entropy(logits, labels, out=out, return_lse=False)


def reference(logits, target):
    return torch.nn.functional.cross_entropy(logits.float(), target, reduction="none", ignore_index=-100)


if __name__ == "__main__":
    from _harness import main
    main(name="cross_entropy", setup=setup, compile=compile, run=run, reference=reference, rtol=1e-3, atol=1e-3)
