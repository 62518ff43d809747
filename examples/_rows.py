"""What the row examples (softmax, rmsnorm, layernorm, cross_entropy) share: how rows are mapped to programs,
how a row is held in registers, the grids, and the device helpers that load, reduce and store it (the wrappers'
argument checks and autotuned launch: examples/_rows_launch.py).

A mapping is a Config of six constexprs. Held rows (BLOCK=0) are read from memory once and kept in registers:
a program (CTA) holds ROWS rows, or a segment of one row: a row too long for one warpgroup is split into
segments of equal width, one per warpgroup of a cluster of CTAS CTAs with WGS warpgroups each, and the
segments exchange their statistics once through distributed shared memory (`mgjit.cluster_gather`: one
mbarrier wait per row). Up to 8 CTAs of 4 warpgroups, 8192 columns each: rows of up to 262144 columns can
be held. Chunked rows (BLOCK > 0, CHUNKS > 0): a row is split into segments of CHUNKS chunks of BLOCK columns,
one per CTA of a cluster of CTAS (one warpgroup each); each CTA reads its segment once, chunk by chunk, and
the kernels that read a row twice (softmax, the norms) keep it in shared memory meanwhile (a (CHUNKS, BLOCK)
buffer in the input's dtype): a thread holds one chunk at a time, not its whole segment, so many CTAs fit on
an SM and their loads overlap each other's arithmetic and exchanges (layernorm, bf16 rows of 100000 on an
H100: 0.86 of copy bandwidth, where the held mapping reached 0.53). Streamed rows (BLOCK > 0, CHUNKS = 0):
one program per row loops over BLOCK-wide chunks, each kernel's own way (cross-entropy reads the row once
with an online logsumexp, the others twice); they are candidates for every row longer than 4096 columns (the
mapping these examples used before rows were split over clusters, so the autotuner never does worse than that)
and the only mapping of rows longer than a cluster holds. Chunked rows are candidates for rows longer than 4096
columns too.

A register array's dimensions are powers of two, so a row of n columns rounded up to one array would waste up
to half the work (4097 columns would compute 8192). A row (or segment) is held as a few arrays whose widths
are the binary digits of n rounded up to a multiple of 128 (4097 → 4096 + 128, 5000 → 4096 + 1024): PARTS, a
constexpr tuple; a held row is a Python tuple of (ROWS, width) arrays. A split row's segments take their
parts part-major (`part_starts`): the widest parts of all segments first, so that only the narrow ones reach
the row's end.

Persistent held rows (PERSIST > 0, the norms only): a grid of PERSIST one-CTA programs an SM, each looping over
row groups with its segment of the weights copied into shared memory once, as float32 (`persisting`).

Which mapping serves a row length is tuned: `candidates(n)` lists a few (the first is the heuristic's pick,
used without a GPU), and `_rows_launch.launch` times them with mgjit.autotune on the first call for a shape and
dtype.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from _device import sm_count as device_sm_count

import mgjit
from mgjit.targets import HOPPER

SEGMENT = 8192  # the widest segment one warpgroup holds in registers (64 float32 per thread)
MAX_CTAS, MAX_WGS = 8, 4  # a portable cluster; warpgroups per CTA
MAX_SPLIT_ROW = SEGMENT * MAX_CTAS * MAX_WGS  # 262144: longer rows stream
STREAM = 4096  # the chunk width of streamed rows
MAX_ROWS = 1024  # rows a program holds, at most
LOG2E = math.log2(math.e)  # held rows' exp(x - m) is 2 ** fma(x, LOG2E, -m * LOG2E) (`shifted_exp`)
CHUNK_SEGMENT = 16384  # chunked rows: the fewest CTAs (a power of two) whose segments are at most this wide
CHUNK_WIDTHS = (1024, 2048)  # chunked rows: the chunk widths tried (and 4096 where a segment is wider)
PERSIST_WARPGROUPS = 4  # persistent held rows (kernels with weights): the warpgroups an SM holds
STASH_SLACK = 2048  # persistent held rows: shared memory a CTA uses beside its weights (reductions, reserved)


def binary_digits(n: int) -> tuple[int, ...]:
    """The powers of two that sum to n, widest first (300 -> (256, 32, 8, 4))."""
    return tuple(1 << b for b in range(n.bit_length() - 1, -1, -1) if n >> b & 1)


def parts(n: int) -> tuple[int, ...]:
    """The widths a row of n columns is held in: one power of two below 128 columns, else the binary digits of
    n rounded up to a multiple of 128, widest first."""
    if n <= 128:
        return (1 << max(n - 1, 0).bit_length(),)
    return binary_digits(-(-n // 128) * 128)


# Rows held as two arrays (`_two_parts`) narrower than this take the examples' tiny-row tunings (layernorm's
# unmasked path, cross-entropy's capped registers).
TWO_PARTS_BELOW = 256
# `_fine_parts` rounds a row up to a multiple of this many columns (16 bytes of bf16).
FINE_COLUMNS = 8


def _two_parts(n: int) -> tuple[int, ...]:
    """For a row a warpgroup holds (at most SEGMENT columns), two widths (powers of two) that hold it with less
    padding than `parts` gives it, or () where there are none: 33 columns as (32, 1), not 64; 35 as (32, 4); 260 as
    (256, 4), not (256, 128). Each array costs its own reductions, but a padded one its lanes' shuffles, exps and
    masks over columns that hold nothing (PTX instructions an element, bf16 softmax: 33 columns 53.3 -> 28.9, 9
    columns 41.8 -> 26.8, 260 18.6 -> 14.2; H200, tuned, bf16: layernorm 260 0.84 -> 0.92 of copy bandwidth, 1030
    0.84 -> 0.94, cross-entropy 1030 0.78 -> 0.92)."""
    high = 1 << (n.bit_length() - 1)
    if n > SEGMENT or n == high:
        return ()
    low = 1 << (n - high - 1).bit_length()
    return (high, low) if high + low < sum(parts(n)) else ()


def _fine_parts(n: int) -> tuple[int, ...]:
    """For a row a warpgroup holds, the binary digits of n rounded up to FINE_COLUMNS columns where they are three
    (300 as 256 + 32 + 16, 1100 as 1024 + 64 + 16; where two, `_two_parts` has them), or (): a third array's
    reductions for a tail padded to 16 bytes, where two arrays pad it to a power of two (300 as 256 + 64). H200,
    tuned, bf16: softmax 300 0.84 -> 0.99 of copy bandwidth, cross-entropy 300 0.79 -> 0.89, 1100 0.82 -> 0.93."""
    digits = binary_digits(-(-n // FINE_COLUMNS) * FINE_COLUMNS)
    return digits if n <= SEGMENT and len(digits) == 3 else ()


def _segment_parts(width: int) -> tuple[int, ...]:
    """A segment's arrays: the binary digits of its width when there are at most two (each array costs its own
    reductions), else one power of two (the padding is masked: it costs no memory traffic)."""
    split = parts(width)
    return split if len(split) <= 2 else (1 << (width - 1).bit_length(),)


def hold(rows: int, widths: tuple[int, ...], ctas: int = 1, wgs: int = 1) -> mgjit.Config:
    """The mapping that holds `rows` rows, or a segment of `widths` columns of one row per warpgroup of a
    cluster of `ctas` CTAs with `wgs` warpgroups each, in registers."""
    return mgjit.Config(ROWS=rows, PARTS=widths, CTAS=ctas, WGS=wgs, BLOCK=0, CHUNKS=0,
                        num_warpgroups=wgs if wgs > 1 else None, cluster=(ctas, 1, 1) if ctas > 1 else None)


def streaming(block: int = STREAM) -> mgjit.Config:
    """The mapping that streams each row through one program in `block`-wide chunks."""
    return mgjit.Config(ROWS=1, PARTS=(), CTAS=1, WGS=1, BLOCK=block, CHUNKS=0)


def chunked(ctas: int, block: int, chunks: int) -> mgjit.Config:
    """The mapping that splits each row over a cluster of `ctas` CTAs, `chunks` chunks of `block` columns each."""
    return mgjit.Config(ROWS=1, PARTS=(), CTAS=ctas, WGS=1, BLOCK=block, CHUNKS=chunks,
                        cluster=(ctas, 1, 1) if ctas > 1 else None)


def chunkings(n: int, segment: int = CHUNK_SEGMENT, widths: tuple[int, ...] = CHUNK_WIDTHS,
              max_ctas: int = MAX_CTAS) -> list[mgjit.Config]:
    """The chunked mappings of rows of n columns: over the fewest CTAs (a power of two, at most max_ctas) whose
    segments are at most `segment` columns wide, in chunks of each of `widths` (and twice the widest where
    segments are wider), where no CTA's segment lies wholly past the row's end."""
    ctas = 1
    while ctas < max_ctas and -(-n // ctas) > segment:
        ctas *= 2
    widths = widths + ((2 * widths[-1],) if -(-n // ctas) > segment else ())
    configs = []
    for block in widths:
        chunks = -(-n // (ctas * block))
        if (ctas - 1) * chunks * block < n:
            configs.append(chunked(ctas, block, chunks))
    return configs


def candidates(n: int, stream: int = STREAM) -> list[mgjit.Config]:
    """The mappings tried for rows of n columns, the heuristic's pick first.

    Short rows: ROWS rows per program, about 4096 elements (half and twice that too, or four times where a row is
    wider than 2048 columns), and again in two or three arrays where those pad less (`_two_parts`, `_fine_parts`;
    about 4096 elements and twice that), and rows of three arrays or more in one padded array too. Rows of 4097 to
    8192 also as two warpgroups, streamed and chunked (`chunkings`): a warpgroup holding such a row holds 64 values
    a thread, and where its one array crosses the row's end (8065 to 8191 columns) every access is bounds-checked
    (H100, bf16 rows of 8191: the held mappings ran softmax at 0.41-0.54 of copy bandwidth, cross-entropy at
    0.56-0.65, where chunks of 2048 ran rows of 8193 at 0.79 and 0.81). Longer rows: segments of 8192 or 4096
    columns over a cluster, the fewest CTAs and warpgroups that cover the row, more CTAs first (they spread the row
    over more SMs); or one CTA per whole 4096 columns, the rest spread over them (12289: 4096 + 128 columns on each
    of 3 CTAs, not 4096 on 4, the last holding one column: softmax 0.70 -> 0.79 of copy bandwidth on an H200); and
    the row streamed in `stream`-wide chunks; and chunked over a cluster. Rows longer than MAX_SPLIT_ROW: streamed
    only."""
    if n > MAX_SPLIT_ROW:
        return [streaming(stream)]
    configs: list[mgjit.Config] = []
    if n <= SEGMENT:
        widths = parts(n)
        width = sum(widths)
        # ROWS is an array dimension, so a power of two: the largest whose rows hold at most 4096 columns, at most
        # MAX_ROWS (a program of 512 rows of one column moved 1 KB each way; kernel alone, bf16 rows of 1 on an
        # H200: softmax / RMSNorm / layernorm 0.75 / 0.77 / 0.73 of copy bandwidth at 512 rows, 0.80 / 0.86 / 0.80
        # at 1024, 0.77 / 0.85 / 0.82 at 2048; rows of 3 staged 0.71 / 0.73 / 0.67 at 512, 0.77 / 0.76 / 0.71 at 1024)
        best = 1 << max(0, min(MAX_ROWS.bit_length() - 1, (4096 // width).bit_length() - 1))
        # Rows wider than 2048 columns (best 1, none below it) take four a program instead: a warp holds each
        # (ops/gmem.py WARP_ROWS), so no reduction crosses warps (bf16 layernorm of 2304: 26.4 -> 14.4 PTX
        # instructions an element; H200, tuned: 0.93 -> 0.98 of copy bandwidth).
        for rows in dict.fromkeys((best, best * 2, best // 2 if best > 1 else 4)):
            if rows <= MAX_ROWS and rows * width <= 16384:
                configs.append(hold(rows, widths))
        pair = _two_parts(n)
        fine = _fine_parts(n)
        for tighter in (pair, fine if sum(fine) < sum(pair or widths) else ()):
            if tighter:
                configs += [hold(rows, tighter) for rows in (best, best * 2, best // 2)
                            if 1 <= rows <= MAX_ROWS][:2]
        # A row of three arrays or more also goes as one, the next power of two, padded and masked (about 4096
        # elements a program; four rows of 4096). H200, tuned: bf16 and f16 cross-entropy over 777 columns 0.78
        # -> 0.86 of copy bandwidth, layernorm 1800 and 1900 0.91 -> 1.01 (against the other candidates' best in
        # the same run); where it pads a quarter of the array or more, as at 777, the other kernels keep their
        # parts (layernorm 0.79 against 0.70 in one array).
        whole = 1 << (n - 1).bit_length()
        if len(widths) > 2 and whole <= STREAM:
            configs.append(hold(4096 // whole if whole <= 2048 else 4, (whole,)))
        if n > SEGMENT // 2:
            configs += [hold(1, _segment_parts(-(-n // 2)), wgs=2), streaming(stream), *chunkings(n)]
        return configs
    for segment in (SEGMENT, SEGMENT // 2):
        need = -(-n // segment)
        splits = sorted(((c * g, -c, c, g) for c in range(1, MAX_CTAS + 1) for g in range(1, MAX_WGS + 1)
                         if need <= c * g < need + g), key=lambda s: s[:2])
        for _, _, ctas, wgs in splits[:2]:
            configs.append(hold(1, _segment_parts(-(-n // (ctas * wgs))), ctas, wgs))
    ctas = n // (SEGMENT // 2)
    if ctas <= MAX_CTAS:
        spread = hold(1, _segment_parts(-(-n // ctas)), ctas)
        if spread.kwargs["PARTS"][0] == SEGMENT // 2 and spread not in configs:
            configs.append(spread)
    return configs + [streaming(stream)] + chunkings(n)


def staging(configs: Sequence[mgjit.Config], n: int) -> tuple[mgjit.Config, ...]:
    """`configs`, then, where rows of n 16-bit elements do not start on 16 bytes, their held mappings of four or
    more rows on one warpgroup again with staged stores (STAGED=1: `mgjit.store(..., staged=True)`,
    mgjit/ops/gmem_flat.py): a program's rows, one run of bytes in a contiguous tensor, stored as aligned 16-byte
    chunks from shared memory where they went in accesses straddling the L2's sectors; a row held as two arrays (33
    as 32 + 1) in one store, side by side (`store_row`). A held array of short rows stored only staged also loads
    in 16-byte vectors, a row's elements in a few threads (ops/gmem.py SHORT_ROW_BYTES). Tuned, bf16, H200 (the
    tuner picks), rows of 3 / 5 / 9 / 17 / 33 / 65: softmax 0.72 / 0.67 / 0.59 / 0.56 / 0.63 / 0.60 -> 0.85 / 0.98
    / 1.02 / 0.93 / 0.98 / 0.92 of copy bandwidth (the two arrays staged, one store each before: 0.52 / 0.50 / 0.60
    at 9 / 17 / 65); RMSNorm 0.73 / 0.68 / 0.62 / 0.60 / 0.67 / 0.74 -> 0.90 / 0.98 / 1.00 / 0.92 / 0.95 / 0.92;
    255 0.92 -> 0.93 (softmax, one array, kernel alone). Layernorm takes them for rows shorter than
    layernorm.py STAGED_ROWS."""
    twins = tuple(c.replace(STAGED=1) for c in configs
                  if n % 8 and c.kwargs["ROWS"] >= 4 and not c.kwargs["BLOCK"]
                  and c.kwargs["CTAS"] == 1 and c.kwargs["WGS"] == 1 and not c.kwargs.get("PIPE"))
    return tuple(c.replace(STAGED=0) for c in configs) + twins if twins else tuple(configs)


def persisting(configs: Sequence[mgjit.Config], weights: int) -> tuple[mgjit.Config, ...]:
    """`configs` (PERSIST=0), then their held one-CTA mappings without an occupancy cap (OCC) again as persistent
    grids of PERSIST = PERSIST_WARPGROUPS / WGS CTAs an SM (ptxas capped to fit them), where PERSIST copies of
    their `weights` vectors' segments fit an SM's shared memory as float32. Each program loops over row groups:
    a kernel with weights (the norms) reads its segment of them from global memory once per program into shared
    memory (`stash_vector`), not once per row group from L2 after the row's statistics (a dependent round trip,
    with a bounds test and a conversion per element). The same mapping without and with persistence, bf16 rows:
    layernorm of 8191 on two warpgroups 0.73 -> 0.80 of copy bandwidth on an H100, 0.59 -> 0.67 on an H200; of
    4095, 0.85 -> 0.87 and 0.66 -> 0.73; of 4097 (two rows a group) 0.90 -> 0.90 and 0.70 -> 0.82; rmsnorm of 8191
    0.79 -> 0.84 and 0.64 -> 0.73. One-warpgroup CTAs at 2 and 3 an SM ran 0.61 to 0.85 (fewer rows in flight);
    aligned rows lose (4096: 0.99 -> 0.93), so the tuner keeps PERSIST=0 there."""
    def fits(c: mgjit.Config) -> bool:
        stash = weights * 4 * sum(c.kwargs["PARTS"]) * c.kwargs["WGS"]
        return PERSIST_WARPGROUPS // c.kwargs["WGS"] * (stash + STASH_SLACK) <= HOPPER.smem_bytes
    return tuple(c.replace(PERSIST=0) for c in configs) + tuple(
        c.replace(PERSIST=PERSIST_WARPGROUPS // c.kwargs["WGS"]) for c in configs
        if not c.kwargs["BLOCK"] and c.kwargs["CTAS"] == 1 and not c.kwargs.get("OCC")
        and c.kwargs["WGS"] <= PERSIST_WARPGROUPS and fits(c))


@functools.lru_cache(maxsize=None)
def sm_count(device=None) -> int:
    """The SMs a persistent grid fills on `device` (a torch.device; None: no GPU): `_device.sm_count`."""
    return device_sm_count((device.index or 0) if device is not None and device.type == "cuda" else None)


def resident_clusters(device, ctas: int, per_sm: int) -> int:
    """The clusters of `ctas` CTAs that run at once, `per_sm` CTAs an SM: a persistent grid of more would run the
    rest in a second wave (mgjit.max_active_clusters, which asks the driver once). Without a GPU, as many as
    `sm_count` SMs hold, at least 1."""
    if device is None or device.type != "cuda":
        return max(1, sm_count(device) * per_sm // ctas)
    return mgjit.max_active_clusters(ctas, per_sm, device=device.index or 0)


def grid(rows: int, config: mgjit.Config, device=None) -> tuple[int]:
    """The grid of a row kernel's launch over `rows` rows on `device` (a torch.device; None: no GPU)."""
    return _row_grid(rows, config.kwargs, device)


@functools.lru_cache(maxsize=None, typed=True)  # typed: rows_per_program=2.0 is refused, not served as 2's
def mapping(n: int, rows_per_program: int | None = None, stream: int = STREAM) -> tuple[mgjit.Config, ...]:
    """The candidate mappings for rows of n columns (ROWS forced to rows_per_program for short rows). Made once
    per row length: building them costs hundreds of microseconds, more than a launch, and every call asks."""
    if rows_per_program is not None and n <= SEGMENT:
        if type(rows_per_program) is not int or rows_per_program < 1 or rows_per_program & (rows_per_program - 1):
            raise ValueError(f"rows_per_program must be a power of two (it is an array dimension), got "
                             f"{rows_per_program!r}")
        return (hold(rows_per_program, parts(n)),)
    return tuple(candidates(n, stream))


def _row_grid(rows: int, config, device) -> tuple[int]:
    """A row kernel's grid from its constexprs (a Config's kwargs, or a launch's named arguments): CTAS programs
    (a cluster) per ROWS rows, or (PERSIST, PIPE) that many programs on each SM of `device`, each looping over
    groups of ROWS rows (piped over clusters of CTAS: as many clusters as run at once, `resident_clusters`; STASH:
    as many programs or clusters, rounded down to a multiple of STASH, at least STASH)."""
    groups = -(-rows // config["ROWS"])
    if config.get("SEGS"):  # programs take a row's segments as rows
        groups *= config["SEGS"]
    persist = config.get("PERSIST") or config.get("PIPE")
    sms = sm_count(device)
    stash = config.get("STASH") or 1  # a multiple of STASH programs or clusters (examples/_rows_piped.py, stash_lines)
    if config.get("PIPE") and config["CTAS"] > 1:
        clusters = max(1, resident_clusters(device, config["CTAS"], persist) // stash) * stash
        return (min(groups, clusters) * config["CTAS"],)
    if config.get("STASH"):
        return (min(groups, max(1, sms * persist // stash) * stash),)
    if persist:
        return (min(groups, sms * persist),)
    return (groups * config["CTAS"],)


# ---- device helpers

@mgjit.device
def held_width(PARTS):
    """The columns that arrays of the widths PARTS hold together."""
    width = 0
    for p in mgjit.static_range(len(PARTS)):
        width += PARTS[p]
    return width


@mgjit.device
def first_row(ROWS, CTAS):
    """The first of the rows this program holds (a segment of)."""
    if CTAS == 1:
        return mgjit.program_id(0) * ROWS
    return (mgjit.program_id(0) // CTAS) * ROWS


@mgjit.device
def segment(ROWS, PARTS, CTAS, WGS):
    """The rows this program holds (a mgjit.ds) and the first column of each of its parts (`part_starts`)."""
    rows = mgjit.ds(first_row(ROWS, CTAS), ROWS)
    if CTAS * WGS == 1:
        return rows, part_starts(0, PARTS, 1)
    if CTAS == 1:
        return rows, part_starts(mgjit.warpgroup_id(), PARTS, WGS)
    return rows, part_starts(mgjit.cluster_rank() * WGS + mgjit.warpgroup_id(), PARTS, CTAS * WGS)


@mgjit.device
def part_starts(k, PARTS, SPLIT):
    """The first column of each part of segment k of SPLIT. Part-major: the SPLIT segments' parts of width
    PARTS[0] tile the row's first SPLIT * PARTS[0] columns, then those of PARTS[1], and so on, so that only the
    narrow parts reach the row's end. Segment-major (segment k from column k * held_width), a row of 8193 over
    2 CTAs of 4096 + 128 columns had its second CTA's 4096-wide array cross the row's end, and every one of its
    accesses was bounds-checked."""
    starts = ()
    before = 0
    for p in mgjit.static_range(len(PARTS)):
        starts = starts + (before * SPLIT + k * PARTS[p],)
        before += PARTS[p]
    return starts


@mgjit.device
def segment_count(n, starts, PARTS):
    """The columns of a row of n that a segment with parts from `starts` holds."""
    count = 0
    for p in mgjit.static_range(len(PARTS)):
        count = count + mgjit.minimum(mgjit.maximum(n - starts[p], 0), PARTS[p])
    return count


@mgjit.device
def row_groups(x, ROWS):
    """The number of groups of ROWS rows of x: a persistent program (PERSIST) takes groups program_id,
    program_id + num_programs, ... below it."""
    return (x.shape[0] + ROWS - 1) // ROWS


@mgjit.device
def stash_vector(w, starts, PARTS, WGS):
    """A 1D tensor's (a weight's) elements of a segment's parts (from `starts`), copied into shared memory as
    `wide` (one buffer per width of PARTS, a slot per warpgroup) for `weights` to read once per row group:
    converted once, not per row (layernorm over bf16 rows of 4095, PTX simulator: 27.4 -> 23.6 instructions an
    element)."""
    bufs = ()
    for p in mgjit.static_range(len(PARTS)):
        buf = mgjit.smem((WGS, PARTS[p]), wide(w))
        buf[mgjit.warpgroup_id()][...] = w[mgjit.ds(starts[p], PARTS[p])].astype(wide(w))
        bufs = bufs + (buf,)
    return bufs


@mgjit.device
def weights(w, bufs, starts, PARTS, PERSIST):
    """A weight's elements of a segment's parts (from `starts`), as `wide` arrays: read from the shared-memory copy
    `stash_vector` made (PERSIST), else from global memory."""
    if PERSIST:
        held = ()
        for p in mgjit.static_range(len(PARTS)):
            held = held + (bufs[p][mgjit.warpgroup_id()][...],)
        return held
    return load_vector(w, starts, PARTS)


@mgjit.device
def columns(starts, PARTS):
    """The column indices of a segment's parts (from `starts`), one int32 array per width of PARTS. Kernels use these
    same arrays for every mask and comparison: one set of index arrays takes the layout of the data it is
    compared with (a second `arange` would bring a layout of its own that the loads would follow)."""
    cols = ()
    for p in mgjit.static_range(len(PARTS)):
        cols = cols + (starts[p] + mgjit.arange(PARTS[p]),)
    return cols


@mgjit.device
def wide(x):
    """The dtype the row kernels compute x's elements in: float64 for float64 x, else float32 (bf16 and f16 rows
    rounded once, at the store)."""
    return mgjit.float64 if x.dtype == mgjit.float64 else mgjit.float32


@mgjit.device
def load_row(x, rows, starts, PARTS, fill):
    """A segment's parts (from `starts`) of the rows `rows` (a mgjit.ds) of x as `wide` arrays, one per width
    of PARTS; what lies outside x (columns past the row's end) holds `fill`. The load fills them: a mask on the
    loaded values would cost an index, a compare and a select per element, where the fill costs nothing in
    windows wholly inside."""
    held = ()
    for p in mgjit.static_range(len(PARTS)):
        held = held + (mgjit.load(x, (rows, mgjit.ds(starts[p], PARTS[p])), other=fill).astype(wide(x)),)
    return held


@mgjit.device
def load_vector(w, starts, PARTS):
    """A 1D tensor's (a weight's) elements of a segment's parts (from `starts`), as `wide` arrays."""
    held = ()
    for p in mgjit.static_range(len(PARTS)):
        held = held + (w[mgjit.ds(starts[p], PARTS[p])].astype(wide(w)),)
    return held


@mgjit.device
def segment_max(held):
    """The maximum of each held row over the columns this program holds."""
    m = held[0].max(axis=1)
    for p in mgjit.static_range(1, len(held)):
        m = mgjit.maximum(m, held[p].max(axis=1))
    return m


@mgjit.device
def segment_sum(held):
    """The sum of each held row over the columns this program holds."""
    s = held[0].sum(axis=1)
    for p in mgjit.static_range(1, len(held)):
        s = s + held[p].sum(axis=1)
    return s


@mgjit.device
def row_sum(held, SPLIT):
    """The sum of each row over its SPLIT segments (the warpgroups of a cluster)."""
    if SPLIT == 1:
        return segment_sum(held)
    return mgjit.cluster_reduce(segment_sum(held), "sum")


@mgjit.device
def finite_shift(m):
    """The maximum m of some elements to take exp(x - m) by, or 0 where m is -inf (every element -inf: masked
    logits, or a segment wholly past its row's end), so that those exps are 0, not exp(-inf + inf) = NaN."""
    return mgjit.where(m == -float("inf"), 0.0, m)


@mgjit.device
def merge_pair(top, total, m, s):
    """(maximum, sum of exp(x - that maximum)) of the elements of two parts, from each part's (maximum, sum of
    exp(x - its maximum)); parts of -inf alone (sum 0) add 0."""
    merged = mgjit.maximum(top, m)
    shift = finite_shift(merged)
    return merged, total * mgjit.exp(top - shift) + s * mgjit.exp(m - shift)


@mgjit.device
def streamed_exp_sum(x, row, BLOCK):
    """(m, s): row `row` of x's maximum and the sum of exp(x - m), read in BLOCK-wide chunks with a running
    maximum, the sum rescaled when it grows. A chunk of -inf alone (a masked stretch of logits) adds 0."""
    m = -float("inf")
    s = 0.0
    for c0 in range(0, x.shape[1], BLOCK):
        v = mgjit.load(x, (row, mgjit.ds(c0, BLOCK)), other=-float("inf")).astype(wide(x))
        m_new = mgjit.maximum(m, v.max())
        shift = finite_shift(m_new)
        s = s * mgjit.exp(m - shift) + mgjit.exp(v - shift, ftz=v.dtype == mgjit.float32).sum()
        m = m_new
    return m, s


@mgjit.device
def exp_segment(v, SPLIT):
    """(e, m, s) of held rows v: m their maximum over this segment, e = exp(v - m) per part, s the sum of e. A
    segment wholly past its row's end (m = -inf, when a row is split) gets e = 0, not NaN. The exps flush results
    below 2**-126 to zero (ftz): terms that small beside the maximum's 1 change neither the sum nor any output
    above 2**-126, and the subnormal fix-up cost 3 of an element's instructions (cross-entropy bf16, rows of
    4097: 0.875 -> 0.927 of copy bandwidth on an H100; softmax 1-6% at 8193 to 100000)."""
    m = segment_max(v)
    shift = m
    if SPLIT > 1:
        shift = finite_shift(m)
    scaled = shift * -LOG2E
    e = ()
    for p in mgjit.static_range(len(v)):
        e = e + (shifted_exp(v[p], scaled[:, None]),)
    return e, m, segment_sum(e)


@mgjit.device
def shifted_exp(v, shift):
    """exp(v - m) from shift = -m * LOG2E (computed once a row), flushing results below 2**-126 to zero (ftz):
    2 ** fma(v, log2(e), shift), one instruction an element fewer than the subtraction and the scaling apart, and
    no less exact, the fma rounding once and the product rounded once a row, an error every e of the row shares
    (a softmax divides it out, a logsumexp takes about 2**-24 relative of m). H200, kernel alone, bf16 held rows:
    cross-entropy 2047 0.85 -> 0.88, 8191 0.94 -> 0.95, 255 0.81 -> 0.83; softmax 4097 0.90 -> 0.92."""
    return mgjit.exp2(mgjit.fma(v, LOG2E, shift), ftz=v.dtype == mgjit.float32)


@mgjit.device
def merge_exp(maxima, sums, SPLIT):
    """The row's maximum and its sum of exp(x - maximum), from each segment's maximum and sum of
    exp(x - its own maximum) (tuples over the SPLIT segments, from mgjit.cluster_gather)."""
    top = maxima[0]
    for k in mgjit.static_range(1, SPLIT):
        top = mgjit.maximum(top, maxima[k])
    total = sums[0] * mgjit.exp(maxima[0] - top)
    for k in mgjit.static_range(1, SPLIT):
        total = total + sums[k] * mgjit.exp(maxima[k] - top)
    return top, total


@mgjit.device
def merge_moments(sums, deviations, n, PARTS, SPLIT):
    """The row's mean and sum of squared deviations from it, from each segment's sum and sum of squared
    deviations from its own mean (tuples over the SPLIT segments of a row of n, parts of the widths PARTS laid
    out by `part_starts`): Chan's parallel update, exact where the sums of squares about one mean would cancel."""
    total = sums[0]
    for k in mgjit.static_range(1, SPLIT):
        total = total + sums[k]
    mean = total / n
    m2 = 0.0
    for k in mgjit.static_range(SPLIT):
        count = segment_count(n, part_starts(k, PARTS, SPLIT), PARTS).astype(sums[k].dtype)
        d = sums[k] - count * mean
        m2 = m2 + deviations[k] + d * d / mgjit.maximum(count, 1.0)
    return mean, m2


@mgjit.device
def store_stat(out, rows, value, starts, SPLIT):
    """out[rows] = value (one float per row), stored once per row: by the segment that holds its first column."""
    if SPLIT == 1:
        out[rows] = value
    else:
        if mgjit.warpgroup_id() == 0:
            if starts[0] == 0:
                out[rows] = value


@mgjit.device
def store_row(out, rows, starts, held, PARTS, STAGED):
    """STAGED: through shared memory, the program's rows as one run of aligned 16-byte chunks (`staging`): a row
    held whole (one segment), its parts side by side from column 0 in one store."""
    if STAGED:
        parts = ()
        for p in mgjit.static_range(len(PARTS)):
            parts = parts + (held[p].astype(out.dtype),)
        mgjit.store(out, (rows, mgjit.ds(0, held_width(PARTS))), parts, staged=True)
    else:
        for p in mgjit.static_range(len(PARTS)):
            mgjit.store(out, (rows, mgjit.ds(starts[p], PARTS[p])), held[p].astype(out.dtype))


# ---- chunked rows (BLOCK > 0, CHUNKS > 0)

@mgjit.device
def chunked_segment(CTAS, BLOCK, CHUNKS):
    """The row this CTA reads a segment of, and the segment's first column."""
    if CTAS == 1:
        return mgjit.program_id(0), 0
    return mgjit.program_id(0) // CTAS, mgjit.cluster_rank() * (CHUNKS * BLOCK)


@mgjit.device
def stage(x, buf, row, c0, BLOCK, CHUNKS, fill, KIND, GROUP):
    """Read columns c0.. of x's row into buf (CHUNKS chunks of BLOCK), `fill` past the row's end, and return the
    chunks' elementwise maximum (KIND "max", `wide`), sum ("sum") or sum of squares ("squares"). The chunks go
    in groups of GROUP columns, each group unrolled: ptxas issues a group's loads before the first arrives. A
    wider group keeps more in flight and takes more registers (fewer CTAs an SM): on an H100, softmax over bf16
    rows of 100000 in chunks of 1024 ran at 0.90 of copy bandwidth in groups of 4096 columns (63 registers),
    0.75 with all 13 chunks unrolled (101); layernorm, 0.71 and 0.86 (48 and 77 registers)."""
    if KIND == "max":
        acc = mgjit.full((BLOCK,), -float("inf"), wide(x))
    else:
        acc = mgjit.zeros((BLOCK,), wide(x))
    per_group = max(1, GROUP // BLOCK)
    groups = CHUNKS // per_group
    for g in range(groups):
        acc = stage_chunks(x, buf, row, c0, BLOCK, g * per_group, per_group, fill, KIND, acc)
    return stage_chunks(x, buf, row, c0, BLOCK, groups * per_group, CHUNKS - groups * per_group, fill, KIND, acc)


@mgjit.device
def stage_chunks(x, buf, row, c0, BLOCK, first, COUNT, fill, KIND, acc):
    """Chunks first.. first + COUNT - 1 of `stage`, unrolled, folded into acc."""
    for j in mgjit.static_range(COUNT):
        v = mgjit.load(x, (row, mgjit.ds(c0 + (first + j) * BLOCK, BLOCK)), other=fill)
        buf[first + j][...] = v
        f = v.astype(acc.dtype)
        if KIND == "max":
            acc = mgjit.maximum(acc, f)
        elif KIND == "sum":
            acc = acc + f
        else:
            acc = mgjit.fma(f, f, acc)
    return acc
