"""Piped rows: a persistent program streams rows through a ring of shared-memory slots, one TMA copy per row,
and computes one row while the copies of the next ones are in flight (a mapping of softmax, cross-entropy,
rmsnorm and layernorm for rows of 4097 to 16385 columns, and of softmax for rows of up to about 130000 over a
cluster, beside those of examples/_rows.py; the tuner picks).

A held row (examples/_rows.py) is loaded into registers, reduced, exchanged, computed and stored by one CTA, and
nothing of that CTA's is in flight between its load and its stores: the bytes in flight an SM are bounded by the
registers of the CTAs it holds, and rows over 8192 columns, which one warpgroup cannot hold, are split over a
cluster that waits on itself. Here a CTA's registers hold one row while its STAGES slots hold the next ones,
landing.

TMA boxes must start on 16 bytes, and an odd row does not. So a row is copied as its envelope: the rows taken
flat, as lines of LINE elements (a 2D view of the contiguous tensor, `lines`), and the NL whole lines that hold
row r's columns, from the line holding its first element (the row starts s elements into its envelope). One box
copies a row, one box stores the lines wholly inside it (lines 1 to NL - 3, whatever s), and its first line and
last two go out through register stores whose windows drop the columns of the neighbouring rows. Before the
row is read, the envelope's columns outside the row are overwritten with the kernel's fill (-inf for a
maximum, 0 for a sum), so that it is read with no mask. The lines view leaves out a last partial line: the row
whose envelope reaches it reads it from the tensor (`patch_tail`).

A weight vector (rmsnorm's, layernorm's two) must meet each element at its column, but rows start anywhere in
their envelopes. A program lays the weights out once in shared memory, as the envelope of a row starting r
elements into a line, r within its first 16 bytes (`stash_lines`), and reads the weights of a row starting s
elements into its envelope through a window s - r elements before that layout's second line (`weight_lines`): on
16 bytes wherever every s of the program is r and a multiple of 16 bytes, which a grid of a multiple of
`stash_multiple` programs makes so (8 for bf16 rows of odd length; 1 where rows start on 16 bytes). Layernorm
fills the envelope's outside with the previous row's mean, so that one read gives its statistics
(examples/layernorm.py says why).

A row longer than one warpgroup's registers hold (65 lines) is split over a cluster of CTAS by whole lines of its
envelope (`segment_start`): each CTA pipes its segment of every row of its cluster through slots of its own, and
the segments swap their statistics once a row (`mgjit.cluster_gather`). Only the first segment holds columns
before the row and only the last (LAST lines, the others' count or fewer) columns past it; the lines of the
segments between are wholly inside the row, and no two CTAs store into one line. The grid is as many clusters as
run at once (`_rows.resident_clusters`): clusters of 4 CTAs, 2 an SM, fit 62 at once on an H200, not 66. Rows no
portable cluster holds may take 16 CTAs (`cluster_splits`). Softmax, bf16, H200: rows of 50257 at 0.91 of copy
bandwidth (held and chunked: 0.67), 65536 0.90, 100000 0.93 (0.79), 128256 0.88 (0.86), 150000 0.85 (0.79), 262144
0.87 (0.64). The norms take clusters too (each CTA stashes its segment of the weights): rmsnorm 50257 0.90, 100000
0.92 (0.80).
Cross-entropy splits such rows into SEGS segments with no exchange: each program takes a run of the rows'
segments in order, as even as the grid allows (`program_items`), merging a row's statistics as they come; a row
whose segments two or more programs hold is merged by the last of them to finish its piece
(examples/cross_entropy.py).

One TMA instruction costs its issuing thread about 70 cycles (H200): a row copied in 256-element boxes of a 1D
view (33 copies and 30 stores a row of 8193) ran softmax at 0.28 of copy bandwidth, with one CTA an SM, where
one box a row runs it at 0.51. Two CTAs an SM of three slots each: softmax 8193 0.94 (held: 0.85), 12289 0.93
(0.79), 16385 0.95 (0.78), 8191 0.94 (0.92); 4097 0.91 (0.94, so held rows keep that). Tuned, bf16:
cross-entropy 8193 0.85 (0.71), 12289 0.87 (0.67), 16385 0.89; rmsnorm 8193 0.88 (0.76), 12289 0.90 (0.76),
16385 0.88 (0.70); layernorm 8193 0.84 (0.60), 12289 0.78 (0.60).

Rows of one column, contiguous, are also read and written flat through the same lines views (FLAT=1,
`flat_rows`): a program's FLAT_ROWS rows are whole lines, moved in 16-byte vectors, where a (ROWS, 1) array moves
an element an access (a row's stride is not specialized, so no access spans two rows); the rows past the last
whole line go through the tensors themselves, element by element, in the program that holds them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from _rows import LOG2E, binary_digits, finite_shift, held_width, part_starts, shifted_exp

import mgjit
from mgjit.targets import HOPPER, PORTABLE_CLUSTER_CTAS

LINE = 256  # elements of one line: the widest box dimension a TMA copy takes
MIN_ROW = 4097  # rows this long and longer are piped candidates (below, a held row runs at 0.93-0.98)
MAX_LINES = 65  # one warpgroup holds a row of up to 65 lines (130 float32 a thread; 16385 columns)
MIN_LINES = 16  # rows piped over a cluster: the fewest lines a CTA's segment holds
# Rows piped over a cluster: (stages, programs an SM) tried, and the most lines a CTA holds in registers with that
# many an SM (128, 170 or 256 registers a thread; 65 lines took 168 registers and spilled a few).
CLUSTER_SHAPES = ((3, 4), (2, 4), (3, 2), (2, 3))
# Rows whose stashed weights leave room for one program an SM, three or four slots (bf16, H200, kernel alone:
# layernorm 262144 over 16 CTAs of 64 lines, w and b 64 KB a CTA, 0.67 / 0.66, two slots 0.61, chunked rows 0.62;
# layernorm 150000 over 8 CTAs of 74 lines 0.77 / 0.77, where 16 of 37 at (2, 2) ran 0.69 and chunked rows 0.71;
# rmsnorm 262144 over 16 of 64 0.86 / 0.88, (2, 2) 0.86), over clusters of a power of two CTAs (LONE_CLUSTERS:
# layernorm 128256 over 8 CTAs of 64 lines 0.83, 7 of 72 0.75 / 0.77; 100000 over 5 of 80 0.62; 200000 over 10 of
# 79 0.42, 16 of 49 0.56). Since an exchange's copies go out from several lanes (ops/clusters.py): layernorm 262144
# 0.81 / 0.85, 150000 over 8 of 74 at (4, 1) 0.86, 128256 over 8 of 64 at (3, 1) 0.87; 230000 over 15 CTAs of 64
# lines (one array, a cluster of 15) 0.53, where 16 of 57 (four arrays) run 0.72.
LONE_CLUSTER_SHAPES = ((3, 1), (4, 1))
LONE_CLUSTERS = (2, 4, 8)
# With weights stashed too, two programs an SM of two slots hold a segment that three slots would not (layernorm
# rows of 100000: 8 CTAs of 49 lines).
STASH_CLUSTER_SHAPES = CLUSTER_SHAPES + ((2, 2),)
# One program an SM holds 80 lines (sm_90a, 8 CTAs of 80 lines at (3, 1): layernorm 217 registers, rmsnorm 189,
# softmax 254, none spilled): a cluster of 8 takes rows of up to 163840 columns (layernorm 150000: 74 lines).
REGISTER_LINES = {1: 80, 2: MAX_LINES, 3: 48, 4: 33}
# Rows no portable cluster holds and 16 CTAs of one power of two of lines do not fit: 16 CTAs of several arrays,
# three slots and three programs an SM (bf16 softmax rows of 150000, 16 of 37 lines, H200: 0.85 of copy bandwidth,
# where (3, 2) ran 0.67, (2, 4) 0.79 and chunked rows 0.79), or two slots and three programs (rmsnorm, whose stashed
# weights leave no room for three slots: 0.89, chunked 0.82; softmax 0.86 since two slots are refilled early,
# `refill`, 0.69 before).
WIDE_CLUSTER_SHAPES = ((3, 3), (2, 3))
# Where three programs an SM do not hold a segment (48 lines; bf16 rows of about 190000 to 235000 columns, 16 CTAs
# of 47 to 58 lines) or their slots (float32 rows from about 60000), two programs of three or two slots, the segment
# in up to four arrays; else, with weights, one program (bf16, H200, tuned, chunked rows before: softmax 200000 0.83
# (0.72), 230000 0.85 (0.61); rmsnorm 0.91 (0.66), 0.87 (0.73); layernorm 200000 0.77 (0.57); float32 softmax
# 150000 0.91 (0.85), rmsnorm 100000 / 150000 0.93 / 0.93 (0.79 / 0.77), layernorm 0.84 / 0.78 (0.62 / 0.69)).
WIDER_CLUSTER_SHAPES = ((3, 2), (2, 2))
FLAT_ROWS = (4096, 2048, 1024)  # rows of one column read flat (`flat_rows`): the rows a program, whole lines
MAX_SEGMENTS = 1024  # rows piped as segments (SEGS): the most a row splits into (rows of 16.7 million columns)
SLACK = 4096  # shared memory a CTA uses beside its slots (reductions, the barriers)
# (stages, programs an SM) tried: two CTAs of three slots ran best from 8191 to 16385 columns on an H200, one CTA
# of four slots and two of two within 0.02 of it at 16385.
SHAPES = ((3, 2), (4, 1), (2, 3), (3, 4))
# Kernels with weights (`stash_lines`): the slots share an SM's shared memory with the stashed weights; one
# program an SM (LONE_SHAPE) where two do not fit (layernorm rows of 16385: two slots, w and b take 136 KB). Three
# programs of two slots ran the norms at 8193 as two of three do (0.86 layernorm, 0.90 rmsnorm) and were picked.
STASH_SHAPES = ((2, 2), (3, 2), (4, 2), (2, 4), (2, 3))
LONE_SHAPE = (4, 1)


def register_lines(lines: int, itemsize: int) -> int:
    """The lines a warpgroup holds in registers where it holds `lines` of 16- or 32-bit rows (computed in float32,
    two registers a line a thread): half as many of float64 rows, computed in float64."""
    return lines // 2 if itemsize == 8 else lines


def line_count(n: int) -> int:
    """The lines of a row's envelope: enough for n columns starting wherever a row of n starts in a line (at a
    multiple of gcd(n, LINE): rows of a multiple of LINE fill whole lines, 256 of them at 65536 columns, not
    257)."""
    return -(-(n + LINE - math.gcd(n, LINE)) // LINE)


def piped(n: int, stages: int, per_sm: int, stash: int = 0, ctas: int = 1, segs: int = 1,
          lines: int = 0) -> mgjit.Config:
    """Rows of n columns piped through `stages` slots per program, `per_sm` programs an SM (with weights of
    `stash` bytes an element stashed, a multiple of STASH programs, or clusters: `stash_multiple`, _rows.grid),
    each row's envelope split over a cluster of `ctas` CTAs, or into `segs` segments that programs take as rows
    (SEGS), by whole lines (`segment_start`): LAST, the lines of the last segment. PL: a segment's `lines` (by
    default the fewest that cover the envelope) as powers of two, widest first (33 lines -> (32, 1)), each read
    into one register array."""
    nl = line_count(n)
    k = lines or -(-nl // (ctas * segs))
    config = mgjit.Config(ROWS=1, PARTS=(), CTAS=ctas, WGS=1, BLOCK=0, CHUNKS=0, PIPE=per_sm, PL=binary_digits(k),
                          STAGES=stages, LAST=nl - (ctas * segs - 1) * k, cluster=(ctas, 1, 1) if ctas > 1 else None)
    if segs > 1:
        config = config.replace(SEGS=segs)
    return config.replace(STASH=stash_multiple(n, stash)) if stash else config


def stash_multiple(n: int, itemsize: int) -> int:
    """The fewest programs (clusters) whose rows of n columns all start in one place within 16 bytes of weights
    of `itemsize` bytes (`stash_lines`): program p takes rows p, p + P, ..., which start P * n elements apart, a
    whole number of 16 bytes where P is a multiple of q / gcd(n, q), q = 16 / itemsize."""
    q = 16 // itemsize
    return q // math.gcd(n, q)


def cluster_splits(n: int, itemsize: int, weights: int = 0,
                   segments: bool = False) -> list[tuple[int, int, int, int]]:
    """How a row of n columns of `itemsize`-byte elements, too long for one CTA (its registers, or its shared memory),
    may be piped over a cluster, with the segments of vectors of `weights` bytes an element in all stashed
    (`stash_lines`: a line more than the segment), or, with `segments`, split into up to MAX_SEGMENTS segments which
    programs take as rows (SEGS): (CTAs or segments, stages, programs an SM, lines a segment), for each shape of
    CLUSTER_SHAPES (with weights, STASH_CLUSTER_SHAPES) the fewest CTAs whose segments fit the registers
    (`REGISTER_LINES`) and slots the shared memory of that many programs an SM. A segment is at least MIN_LINES lines,
    of at most two powers of two where a portable cluster (8 CTAs) has such a split, else three; rows no portable
    cluster holds take clusters of 16 CTAs of one power of two, or else of up to three at WIDE_CLUSTER_SHAPES, or else
    of up to four at WIDER_CLUSTER_SHAPES. With weights, the splits of one program an SM (LONE_CLUSTER_SHAPES) are
    offered over 16 CTAs of one power of two, or else of up to four beside WIDER_CLUSTER_SHAPES' (rmsnorm 230000: 0.92
    at (4, 1), 0.88 at (2, 2)), and over 2, 4 or 8 CTAs where no portable cluster holds a split of two programs an SM
    or more. Each register array costs a row its own reductions, and a segment takes
    more lines than the fewest where those are fewer powers of two (rows of 128256, 501 lines, over 8 CTAs of 64, not 63
    = 32 + 16 + 8 + 4 + 2 + 1). The last segment is at least 4 lines (its first and last two go out through registers),
    and the cluster wastes at most a tenth of its lines (it waits for its widest segment). Segments that programs take
    as rows are offered of at most two powers of two and of three, and waste at most a 32nd of the row's lines: every
    segment's copy is a whole slot, so the last reads the lines past the row again (cross-entropy, bf16, H200, kernel
    alone, segments spread over programs: rows of 150000 in 13 segments of 48 lines, the last 11, 0.77-0.84 of copy
    bandwidth; in 14 of 42, 0.90; 100000 in 9 of 48, the last 8, 0.80; in 10 of 40, 0.90-0.91).
    Bf16 rows on an H200: 50257 over 6 CTAs of 33 lines, 4 an SM, ran softmax at 0.91 of copy bandwidth, 5 of 40
    lines, 2 an SM, 0.87, one program an SM 0.42-0.50, where held and chunked rows ran 0.67; 128256 over 8 of 64 lines
    0.88 (chunked: 0.86); 262144 over 16 of 64 lines 0.87 (chunked: 0.64), where 16 of 65 lines (two arrays) ran 0.62,
    150000 over 10 of 64 lines 0.43 (chunked: 0.78), and clusters of 10 to 15 CTAs of other shapes 0.17-0.63;
    cross-entropy's clusters 0.23-0.76 (its streamed rows 0.72-0.84)."""
    nl = line_count(n)

    def fits(c: int, k: int, stages: int, per_sm: int) -> bool:
        waste = c * k - nl  # lines read past the row
        return (MIN_LINES <= k <= register_lines(REGISTER_LINES[per_sm], itemsize) and k - waste >= 4
                and (32 if segments else 10) * waste <= nl
                and per_sm * (((stages * itemsize + weights) * k + weights) * LINE + SLACK) <= HOPPER.smem_bytes)

    def segment(c: int, stages: int, per_sm: int, widest: int) -> int | None:
        """The fewest lines, of at most `widest` powers of two, of a segment of a split over c."""
        return next((k for k in range(-(-nl // c), register_lines(REGISTER_LINES[per_sm], itemsize) + 1)
                     if bin(k).count("1") <= widest and fits(c, k, stages, per_sm)), None)

    def fewest(counts: Sequence[int], widths: tuple[int, ...],
               shapes: tuple = STASH_CLUSTER_SHAPES if weights else CLUSTER_SHAPES) -> list[tuple[int, int, int, int]]:
        splits = []
        for stages, per_sm in shapes:
            for widest in widths:
                found = next(((c, k) for c in counts if (k := segment(c, stages, per_sm, widest)) is not None), None)
                if found:
                    splits.append((found[0], stages, per_sm, found[1]))
                    break
        return splits
    if segments:
        counts = range(2, MAX_SEGMENTS + 1)
        return list(dict.fromkeys(fewest(counts, (2,)) + fewest(counts, (3,))))
    portable, sixteen = range(2, PORTABLE_CLUSTER_CTAS + 1), range(HOPPER.max_cluster_ctas, HOPPER.max_cluster_ctas + 1)
    lone = LONE_CLUSTER_SHAPES if weights else ()
    shapes = STASH_CLUSTER_SHAPES + lone if weights else CLUSTER_SHAPES
    wider = fewest(sixteen, (2, 3, 4), WIDER_CLUSTER_SHAPES)
    splits = (fewest(portable, (2, 3)) or fewest(sixteen, (1,), shapes) or fewest(sixteen, (2, 3), WIDE_CLUSTER_SHAPES)
              or wider + [split for split in fewest(sixteen, (2, 3, 4), lone) if split not in wider])
    if any(c <= PORTABLE_CLUSTER_CTAS for c, _, _, _ in splits):
        return splits
    return splits + [split for split in fewest(LONE_CLUSTERS, (2, 3), lone) if split not in splits]


def piping(configs: Sequence[mgjit.Config], n: int, itemsize: int, weights: tuple[int, ...] = (),
           clusters: bool = False, segments: bool | None = None, flat: bool = False) -> tuple[mgjit.Config, ...]:
    """`configs` (PIPE=0), then the piped mappings of rows of n columns of `itemsize`-byte elements (none for
    itemsize 0) whose slots, and the vectors stashed by `stash_lines` (of the element sizes `weights`; the
    configs then set STASH too), fit an SM's shared memory: over one CTA a row, or, for rows one CTA does not
    hold, with `clusters`, over a cluster (`cluster_splits`), or,
    with `segments`, split into segments that programs take as rows (SEGS, which every config sets where
    `segments` is not None; a kernel without weights that merges its segments' statistics). With `flat` (FLAT,
    which every config then sets), rows of one column also go flat, FLAT_ROWS a program (`flat_rows`)."""
    stash = sum(weights)  # bytes an element
    plain = tuple(c.replace(PIPE=0, PL=(), STAGES=0, LAST=0, **({"STASH": 0} if weights else {}),
                            **({"SEGS": 0} if segments is not None else {}), **({"FLAT": 0} if flat else {}))
                  for c in configs)
    nl = line_count(n)
    if flat and n == 1 and itemsize:
        return plain + tuple(plain[0].replace(ROWS=rows, FLAT=1) for rows in FLAT_ROWS)
    if n < MIN_ROW or not itemsize:
        return plain
    splits = [(1, stages, per_sm, nl) for stages, per_sm in (STASH_SHAPES + (LONE_SHAPE,) if weights else SHAPES)
              if nl <= register_lines(MAX_LINES, itemsize)
              and per_sm * (((stages * itemsize + stash) * nl + stash) * LINE + SLACK) <= HOPPER.smem_bytes]
    if weights and len(splits) > 1:
        splits = [split for split in splits if split[1:3] != LONE_SHAPE]
    # Over a cluster too where one CTA a row has no three slots at two programs an SM or more (layernorm 16385: (4, 1)
    # 0.68, 2 CTAs 0.75; rmsnorm 16385: (2, 2) 0.87, 2 CTAs at (3, 2) 0.90)
    if clusters and not any(stages >= 3 and per_sm >= 2 for _, stages, per_sm, _ in splits):
        splits += cluster_splits(n, itemsize, stash)
    if not splits and segments:
        widened = (piped(n, stages, per_sm, segs=segs, lines=k)
                   for segs, stages, per_sm, k in cluster_splits(n, itemsize, segments=True))
    else:
        widened = (piped(n, stages, per_sm, min(weights, default=0), ctas, lines=k)
                   for ctas, stages, per_sm, k in splits)
    return plain + tuple(c.replace(**{k: 0 for k in plain[0].kwargs if k not in c.kwargs}) for c in widened)


def pipeable(*tensors) -> bool:
    """Whether piped mappings may run on these tensors: contiguous (a row's envelope is its neighbours' bytes),
    16-byte aligned (TMA), and with their element indices, and an envelope past the last, within int32."""
    return all(t.is_contiguous() and t.data_ptr() % 16 == 0 and t.numel() < 2 ** 31 - MAX_LINES * LINE
               for t in tensors)


def piped_views(tensors: Sequence, weights: Sequence = (), rows_per_program: int | None = None) -> tuple[int, tuple]:
    """What a row example's wrapper launches beside its arguments, for its row tensors (inputs and outputs of one
    shape) and weight vectors: (the element size `piping` offers piped mappings for, 0 where they may not run:
    rows per program forced, tensors not `pipeable`, weights not contiguous; the views the piped mappings read:
    each tensor as `lines`, each weight as `weight_rows`, or, where none runs, tensors[0] in their places)."""
    if rows_per_program is None and pipeable(*tensors) and all(w.is_contiguous() for w in weights):
        return tensors[0].element_size(), (*map(lines, tensors), *map(weight_rows, weights))
    return 0, (*tensors, *[tensors[0]] * len(weights))


def lines(t):
    """The contiguous tensor t as whole lines of LINE elements (its last partial line left out): one view, made on
    every launch of a piped mapping (a flat view sliced and viewed again took three times the host time)."""
    if not t.is_contiguous():
        raise ValueError(f"lines() takes a contiguous tensor, got strides {t.stride()} for shape {tuple(t.shape)}")
    return t.as_strided((t.numel() // LINE, LINE), (LINE, 1))


# ---- device helpers

@mgjit.device
def flat_rows(x, out, xl, outl, ROWS, one_column, operands):
    """Rows of one column, ROWS a program (FLAT), out = one_column(x as float32, operands) elementwise (a row's
    result, as a held row computes it): the program's whole lines through the lines views xl and outl; the rows
    that `lines` leaves out (fewer than LINE) through x and out, by the program whose ROWS rows hold the first of
    them."""
    lines = mgjit.ds(mgjit.program_id(0) * (ROWS // LINE), ROWS // LINE), mgjit.ds(0, LINE)
    outl[lines] = one_column(xl[lines].astype(mgjit.float32), operands).astype(outl.dtype)
    first = xl.shape[0] * LINE
    if (first < x.shape[0]) & (first // ROWS == mgjit.program_id(0)):
        rows = mgjit.ds(first, LINE), 0
        out[rows] = one_column(x[rows].astype(mgjit.float32), operands).astype(out.dtype)


@mgjit.device
def ring(x, xl, PL, STAGES, CTAS, LAST, SEGS=1):
    """This program's ring of STAGES slots of a segment's lines (PL), one barrier per slot, its rows' (segments')
    count, and the copies of its first STAGES rows issued."""
    k = held_width(PL)
    n = x.shape[1]
    span = n + LINE - mgjit.minimum(n & (0 - n), LINE)  # an envelope's columns: rows start on gcd(n, LINE)
    nl = (CTAS * SEGS - 1) * k + LAST
    mgjit.device_assert((span <= nl * LINE) & (span > (nl - 1) * LINE), "a piped mapping made for rows of another "
                        "length (x's rows need other lines than PL's): its stores would write into neighbouring rows")
    buf = mgjit.smem((STAGES, k, LINE), x.dtype)
    full = mgjit.barrier(STAGES)
    programs = mgjit.num_programs(0) // CTAS
    if SEGS == 1:
        count = (x.shape[0] - program_row(0, CTAS) + programs - 1) // programs
    else:
        _, count = program_items(mgjit.program_id(0), x.shape[0], SEGS)
    for j in mgjit.static_range(STAGES):
        if j < count:
            copy_row(x, xl, buf, full, j, CTAS, SEGS)
    return buf, full, count


@mgjit.device
def stash_lines(v, rows, x, PL, CTAS, LAST):
    """A weight vector `v` laid out in shared memory, in its own dtype, as this CTA's segment of the envelope of a
    row starting r elements into a line, with the line before (zero outside the row; `rows`: v as `weight_rows`
    views it): its rows start s elements into their lines, and where the grid is a multiple of `stash_multiple`
    programs (clusters), every s is r more than a multiple of 16 bytes of v (row i + P starts P * n elements after
    row i), so that `weight_lines` reads a row's weights through a window on 16 bytes. Stash line j + 1 is
    envelope line j, v[j * LINE - r:][:LINE], columns LINE - r on of row j - 1 of `rows`: one load per part of PL
    brings the segment's lines, one the line before, then its first line and its lines LAST - 2 and LAST - 1 (the
    envelope's first and last two, beyond `rows`, in the segments that hold them) come from v. A load a line (33
    for rows of 8193) waited for each load where its bounds check's branch joined: rmsnorm 8193 ran at 0.79 of
    copy bandwidth for 0.93 without the weights."""
    q = 128 // v.dtype.bits  # elements of 16 bytes
    clusters = mgjit.num_programs(0) // CTAS
    mgjit.device_assert((clusters * x.shape[1] % q == 0) | (clusters >= x.shape[0]), "stashed weights need a "
                        "grid of a multiple of _rows_piped.stash_multiple programs or clusters (_rows.grid with "
                        "STASH), or a row a program")
    k = held_width(PL)
    buf = mgjit.smem((k + 1, LINE), v.dtype)
    row, seg = program_segment(0, CTAS, 1)
    _, s = envelope_start(x, row)
    r = s % q
    line0 = seg * k  # the envelope line of the segment's first
    starts = part_starts(0, PL, 1)
    for p in mgjit.static_range(len(PL)):
        buf[mgjit.ds(starts[p] + 1, PL[p]), :][...] = mgjit.load(
            rows, (mgjit.ds(line0 + starts[p] - 1, PL[p]), mgjit.ds(LINE - r, LINE)), other=0)
    buf[mgjit.ds(0, 1), :][...] = mgjit.load(rows, (mgjit.ds(line0 - 2, 1), mgjit.ds(LINE - r, LINE)), other=0)
    mgjit.cta_sync()  # the lines below overwrite what other threads stored
    for j in mgjit.static_range(3):
        line = (LAST - 3 + j) * (j > 0)  # 0, LAST - 2, LAST - 1
        buf[line + 1][...] = mgjit.load(v, mgjit.ds((line0 + line) * LINE - r, LINE), other=0)
    return buf


@mgjit.device
def weight_lines(stash, s, PL):
    """The weights of a row starting s elements into its envelope (`stash_lines`' r, and a multiple of 16 bytes
    more; or into this segment's, `segment_start`, which is whole lines of it less), as views of `stash` one per
    count of PL: a window from s - r elements before its second line."""
    q = 128 // stash.dtype.bits
    return line_parts(stash.window(LINE - (s & (LINE - q)), (held_width(PL), LINE)), PL)


def weight_rows(v):
    """A contiguous weight vector as rows of 2 * LINE elements starting LINE apart (rows overlap), for
    `stash_lines`: any LINE elements from a row's first LINE on lie in that row, whatever their start. A vector
    shorter than 2 * LINE (rows no piped mapping takes) as one row of its own length."""
    if v.numel() < 2 * LINE:
        return v.view(1, -1)
    return v.as_strided(((v.numel() - 2 * LINE) // LINE + 1, 2 * LINE), (LINE, 1))


@mgjit.device
def program_row(i, CTAS):
    """The row index of this program's i-th row (programs, or clusters of CTAS, take rows in turn)."""
    if CTAS == 1:
        return mgjit.program_id(0) + i * mgjit.num_programs(0)
    return mgjit.program_id(0) // CTAS + i * (mgjit.num_programs(0) // CTAS)


@mgjit.device
def program_segment(i, CTAS, SEGS, rows=0):
    """(row, segment) of this program's i-th row: a whole row (segment 0); over a cluster of CTAS, the segment of
    the CTA's rank; the `rows` rows split into SEGS segments, the i-th segment of this program's run
    (`program_items`)."""
    if SEGS > 1:
        first, _ = program_items(mgjit.program_id(0), rows, SEGS)
        return (first + i) // SEGS, (first + i) % SEGS
    if CTAS == 1:
        return program_row(i, CTAS), 0
    return program_row(i, CTAS), mgjit.cluster_rank()


@mgjit.device
def program_items(p, rows, SEGS):
    """(first, count): the run of program p of the grid over the segments of `rows` rows split into SEGS each, taken
    in order (a row's one after another): as even as the grid allows, the first programs one more. Whole rows dealt
    to programs in turn fall unevenly: bf16 rows of 100000 in 10 segments of 40 lines, 2 programs an SM, 1342 rows (6
    for 22 programs, 5 for the rest), ran 0.80 of copy bandwidth, in even runs 0.86 (H200, kernel alone)."""
    each, more = run_lengths(rows, SEGS)
    return p * each + mgjit.minimum(p, more), mgjit.where(p < more, each + 1, each)


@mgjit.device
def run_lengths(rows, SEGS):
    """(each, more): every program of the grid runs over `each` of the rows' segments, the first `more` one more."""
    items = rows * SEGS
    return items // mgjit.num_programs(0), items % mgjit.num_programs(0)


@mgjit.device
def item_program(item, rows, SEGS):
    """The program whose run (`program_items`) holds segment `item` of the rows' segments taken in order."""
    each, more = run_lengths(rows, SEGS)
    wide = more * (each + 1)
    return mgjit.where(item < wide, item // (each + 1), more + (item - wide) // mgjit.maximum(each, 1))


@mgjit.device
def envelope_start(x, row):
    """(a, s): the flat index of the first element of row `row`'s envelope (a whole line), and how far into it
    the row starts."""
    first = row * x.shape[1]
    a = first // LINE * LINE
    return a, first - a


@mgjit.device
def segment_start(x, row, seg, k):
    """(a, s): the flat index of the first element of segment `seg` (of k lines) of row `row`'s envelope, and the
    row's first element relative to it (negative in every segment but the first). A row split into segments
    (over a cluster, or SEGS) is split by whole lines of its envelope, segment j taking lines j * k to
    j * k + k - 1 (the last fewer: LAST), so that no two segments store into one line and only the first and the
    last hold columns outside the row."""
    a, s = envelope_start(x, row)
    return a + seg * k * LINE, s - seg * k * LINE


@mgjit.device
def copy_row(x, xl, buf, full, i, CTAS, SEGS=1):
    """Issue the copy of this CTA's segment of its program's i-th row's envelope into its slot."""
    row, seg = program_segment(i, CTAS, SEGS, x.shape[0])
    a, _ = segment_start(x, row, seg, buf.shape[1])
    slot = i % buf.shape[0]
    mgjit.copy_async(xl, (a // LINE, 0), buf[slot], barrier=full[slot])


@mgjit.device
def envelope(x, xl, buf, full, i, fill, CTAS, LAST, SEGS=1):
    """Wait for this program's i-th row; return (its slot, its row index, the first element of this CTA's segment
    of its envelope in the flat tensor, the row's start relative to it: `segment_start`), the segment's columns
    outside the row overwritten with `fill`."""
    n = x.shape[1]
    row, seg = program_segment(i, CTAS, SEGS, x.shape[0])
    a, s = segment_start(x, row, seg, buf.shape[1])
    slot = i % buf.shape[0]
    full[slot].wait()
    env = buf[slot]
    patch_tail(x, env, a, xl.shape[0])
    fill_outside(env, s, n, fill, CTAS * SEGS, LAST)
    mgjit.cta_sync()
    return env, row, a, s


@mgjit.device
def fill_outside(env, s, n, fill, SPLIT, LAST):
    """The segment's columns outside its row (of n columns from column s) overwritten with `fill`: in the first
    line of the first segment (s >= 0), and from line LAST - 2 of the last (where the row ends: past LAST, lines
    of the next row, or past the tensor). A row split into SPLIT segments."""
    if SPLIT == 1:
        fill_head(env, s, fill)
        fill_tail(env, s, n, fill, LAST)
    else:
        if s > 0:
            fill_head(env, s, fill)
        if last_segment(env, s, n):
            fill_tail(env, s, n, fill, LAST)


@mgjit.device
def last_segment(env, s, n):
    """Whether the segment in `env` (of a split row of n columns starting at s) is the row's last."""
    return s + n <= env.shape[0] * LINE


@mgjit.device
def fill_head(env, s, fill):
    head = env[mgjit.ds(0, 1), :]
    head[...] = mgjit.where(mgjit.arange(LINE)[None, :] < s, fill, head[...])


@mgjit.device
def fill_tail(env, s, n, fill, LAST):
    """Lines LAST - 2 on: as one array where they are a power of two (a row's last two lines), else line by line."""
    count = env.shape[0] - LAST + 2
    if count & (count - 1) == 0:
        tail = env[mgjit.ds(LAST - 2, count), :]
        cols = (LAST - 2) * LINE + mgjit.arange(count)[:, None] * LINE + mgjit.arange(LINE)[None, :]
        tail[...] = mgjit.where(cols >= s + n, fill, tail[...])
    else:
        for k in mgjit.static_range(LAST - 2, env.shape[0]):
            line = env[mgjit.ds(k, 1), :]
            line[...] = mgjit.where(k * LINE + mgjit.arange(LINE)[None, :] >= s + n, fill, line[...])


@mgjit.device
def patch_tail(x, env, a, full_lines):
    """The flat tensor's last partial line (past the lines view, so zero-filled by the copy) read into the
    segment from the last row, where the segment (from flat element a) reaches it."""
    if a + env.shape[0] * LINE > full_lines * LINE:
        n = x.shape[1]
        rest = x.shape[0] * n - full_lines * LINE
        env[mgjit.ds(full_lines - a // LINE, 1), :][...] = mgjit.load(
            x, (mgjit.ds(x.shape[0] - 1, 1), mgjit.ds(n - rest, LINE)), other=0)


@mgjit.device
def line_parts(env, PL):
    """Views of the envelope's lines, one per count of PL (`part_starts` lays them out)."""
    starts = part_starts(0, PL, 1)
    views = ()
    for p in mgjit.static_range(len(PL)):
        views = views + (env[mgjit.ds(starts[p], PL[p]), :],)
    return views


@mgjit.device
def read_lines(env, PL, dtype):
    """The envelope's lines as arrays of `dtype` (the kernel's: `_rows.wide` of the rows, or float32), one per
    count of PL."""
    parts = line_parts(env, PL)
    held = ()
    for p in mgjit.static_range(len(PL)):
        held = held + (parts[p][...].astype(dtype),)
    return held


@mgjit.device
def exp_lines(v):
    """(e, m, total) of a row's lines v (`read_lines`' arrays): m their maximum, e = exp(v - m) per array, total the
    sum of e (the fill, -inf, adds nothing; a segment of -inf alone, m = -inf, gets e = 0: `finite_shift`),
    each exp an fma and an ex2 (`_rows.shifted_exp`)."""
    m = mgjit.max(v)
    shift = -finite_shift(m) * LOG2E
    e = ()
    for p in mgjit.static_range(len(v)):
        e = e + (shifted_exp(v[p], shift),)
    return e, m, mgjit.sum(e)


@mgjit.device
def refill(x, xl, buf, full, i, count, CTAS, EARLY):
    """Once the stores of row i - 1 have read their slot, copy row i - 1 + STAGES into it: with two slots as row i
    begins (a kernel calls this with EARLY true there), with more once row i's results are in its slot (EARLY
    false). Two slots refilled after the row leave no copy in flight while a row is computed; refilled as it begins,
    they keep one, at the cost of a wait for the store just issued, which three slots do not repay (bf16, H200,
    kernel alone: layernorm 100000 over 8 CTAs of two slots 0.70 -> 0.85 of copy bandwidth, 8193 0.75 -> 0.84,
    rmsnorm 262144 0.83 -> 0.85, 100000 over 7 CTAs 0.84 -> 0.89; three slots: softmax 8193 0.93 -> 0.92, 150000
    0.88 -> 0.86, layernorm 16385 0.85 -> 0.82)."""
    stages = buf.shape[0]
    if (stages == 2) == EARLY:
        mgjit.store_async_wait(0)
        if i >= 1:
            if i - 1 + stages < count:
                copy_row(x, xl, buf, full, i - 1 + stages, CTAS)


@mgjit.device
def write_lines(env, y, PL):
    """The row's results (arrays as `read_lines` gave) into its envelope, in place."""
    parts = line_parts(env, PL)
    for p in mgjit.static_range(len(PL)):
        parts[p][...] = y[p].astype(env.dtype)


@mgjit.device
def store_envelope(out, outl, env, row, a, s, CTAS, LAST):
    """Store this CTA's segment of the row (`envelope`'s a and s): the lines wholly inside the row with one TMA
    store, the first line and, in the last segment, the last two through register windows that drop what lies
    outside the row."""
    if CTAS == 1:
        store_segment(out, outl, env, row, a, s, LAST, True)
    else:
        if last_segment(env, s, out.shape[1]):
            store_segment(out, outl, env, row, a, s, LAST, True)
        else:
            store_segment(out, outl, env, row, a, s, env.shape[0], False)


@mgjit.device
def store_segment(out, outl, env, row, a, s, LINES, LAST_SEGMENT):
    """`store_envelope` of a segment of LINES lines (the last segment: its last two lines hold the row's end)."""
    inside = LINES - 1 - 2 * LAST_SEGMENT
    mgjit.store_async(outl, (a // LINE + 1, 0), env[mgjit.ds(1, inside), :])
    out[mgjit.ds(row, 1), mgjit.ds(-s, LINE)] = env[mgjit.ds(0, 1), :][...]
    if LAST_SEGMENT:
        for k in mgjit.static_range(LINES - 2, LINES):
            out[mgjit.ds(row, 1), mgjit.ds(k * LINE - s, LINE)] = env[mgjit.ds(k, 1), :][...]
