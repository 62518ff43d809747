"""What the row examples (softmax, rmsnorm, layernorm, cross_entropy) share: how rows are mapped to programs,
how a row is held in registers, the device helpers that load, reduce and store it, and the autotuned launch.

Every row is read from memory once and held in registers. A program (CTA) holds ROWS rows, or a segment of
one row: a row too long for one warpgroup is split into segments of equal width, one per warpgroup of a
cluster of CTAS CTAs with WGS warpgroups each, and the segments combine their statistics through distributed
shared memory (`mgjit.cluster_reduce`). Up to 8 CTAs of 4 warpgroups, 8192 columns each: rows of up to
262144 columns go this way; longer ones stream through registers twice (each example's `*_long` kernel).

A register array's dimensions are powers of two, so a row of n columns rounded up to one array would waste up
to half the work (4097 columns would compute 8192). A row (or segment) is held as a few arrays whose widths
are the binary digits of n rounded up to a multiple of 128 (4097 → 4096 + 128, 5000 → 4096 + 1024): PARTS, a
constexpr tuple; a held row is a Python tuple of (ROWS, width) arrays.

Which mapping serves a row length is tuned: `candidates(n)` lists a few (the first is the heuristic's pick,
used without a GPU), and `launch` times them with mgjit.autotune on the first call for a shape and dtype.
"""
from __future__ import annotations

import functools
import os

import mgjit

SEGMENT = 8192  # the widest segment one warpgroup holds in registers (64 float32 per thread)
MAX_CTAS, MAX_WGS = 8, 4  # a portable cluster; warpgroups per CTA
MAX_SPLIT_ROW = SEGMENT * MAX_CTAS * MAX_WGS  # 262144: longer rows stream


def parts(n: int) -> tuple[int, ...]:
    """The widths a row of n columns is held in: one power of two below 128 columns, else the binary digits of
    n rounded up to a multiple of 128, widest first."""
    if n <= 128:
        return (1 << max(n - 1, 0).bit_length(),)
    n = -(-n // 128) * 128
    return tuple(1 << b for b in range(n.bit_length() - 1, 6, -1) if n >> b & 1)


def _segment_parts(width: int) -> tuple[int, ...]:
    """A segment's arrays: the binary digits of its width when there are at most two (each array costs its own
    reductions), else one power of two (the padding is masked: it costs no memory traffic)."""
    split = parts(width)
    return split if len(split) <= 2 else (1 << (width - 1).bit_length(),)


def candidates(n: int) -> list[mgjit.Config]:
    """The mappings tried for rows of n columns (n <= MAX_SPLIT_ROW), the heuristic's pick first.

    Short rows: ROWS rows per program, about 4096 elements (half and twice that too). Rows of 4097 to 8192 also
    as two warpgroups. Longer rows: segments of 8192 or 4096 columns over a cluster, the fewest CTAs and
    warpgroups that cover the row, more CTAs first (they spread the row over more SMs)."""
    configs: list[mgjit.Config] = []
    if n <= SEGMENT:
        held = parts(n)
        width = sum(held)
        best = max(1, min(512, 4096 // width))
        for rows in dict.fromkeys((best, best * 2, best // 2)):
            if 1 <= rows <= 512 and rows * width <= 16384:
                configs.append(mgjit.Config(ROWS=rows, PARTS=held, CTAS=1, WGS=1))
        if n > 4096:
            configs.append(mgjit.Config(ROWS=1, PARTS=_segment_parts(-(-n // 2)), CTAS=1, WGS=2, num_warpgroups=2))
        return configs
    for segment in (SEGMENT, SEGMENT // 2):
        need = -(-n // segment)
        splits = sorted(((c * g, -c, c, g) for c in range(1, MAX_CTAS + 1) for g in range(1, MAX_WGS + 1)
                         if need <= c * g < need + g), key=lambda s: s[:2])
        for _, _, ctas, wgs in splits[:2]:
            configs.append(mgjit.Config(ROWS=1, PARTS=_segment_parts(-(-n // (ctas * wgs))), CTAS=ctas, WGS=wgs,
                                        num_warpgroups=wgs, cluster=(ctas, 1, 1) if ctas > 1 else None))
    return configs


def grid(rows: int, config: mgjit.Config) -> tuple[int]:
    """The grid of a row kernel's launch over `rows` rows."""
    return (-(-rows // config.kwargs["ROWS"]) * config.kwargs["CTAS"],)


def mapping(n: int, rows_per_program: int | None = None) -> list[mgjit.Config] | None:
    """The candidate mappings for rows of n columns (ROWS forced to rows_per_program for short rows), or None
    for rows that stream."""
    if n > MAX_SPLIT_ROW:
        return None
    if rows_per_program is not None and n <= SEGMENT:
        return [mgjit.Config(ROWS=rows_per_program, PARTS=parts(n), CTAS=1, WGS=1)]
    return candidates(n)


def tuning_enabled(x) -> bool:
    """Tune on a GPU; on the CPU (the interpreter) launch the heuristic's pick."""
    return x.is_cuda and os.environ.get("MGJIT_INTERPRET") != "1"


@functools.lru_cache(maxsize=None)
def _tuned(kernel, configs: tuple[mgjit.Config, ...], key: str):
    return mgjit.autotune(configs=list(configs), key=[key])(kernel)


def _untuned(configs: list[mgjit.Config], args: tuple) -> bool:
    """Launch the first config as it is: one candidate, no GPU, or two arguments are one tensor (timing would run
    the kernel on its own output)."""
    pointers = [a.data_ptr() for a in args if hasattr(a, "data_ptr")]
    return len(configs) == 1 or len(set(pointers)) < len(pointers) or not tuning_enabled(args[0])


def picked(kernel, configs: list[mgjit.Config], args: tuple, **constexprs) -> mgjit.Config:
    """The config `tuned_launch` launches for these arguments (tuned by an earlier launch)."""
    if _untuned(configs, args):
        return configs[0]
    named = {**dict(zip(kernel.arg_names, args)), **constexprs}
    return _tuned(kernel, tuple(configs), kernel.arg_names[0]).best_config(named)


def tuned_launch(kernel, configs: list[mgjit.Config], grid_of, args: tuple, **constexprs) -> None:
    """Launch `kernel` with the fastest of `configs` for the shape of args[0] and the arguments' dtypes (timed on
    the first call, remembered on disk), or with the first config without a GPU or when two arguments are one
    tensor (timing would run the kernel on its own output). grid_of(rows of args[0], constexprs and options)
    gives the grid."""
    x = args[0]
    if _untuned(configs, args):
        options = configs[0].launch_kwargs()
        kernel[grid_of(x.shape[0], options)](*args, **constexprs, **options)
        return
    key = kernel.arg_names[0]
    _tuned(kernel, tuple(configs), key)[lambda named: grid_of(named[key].shape[0], named)](*args, **constexprs)


def launch(kernel, configs: list[mgjit.Config], args: tuple, **constexprs) -> None:
    """Launch a row kernel on the rows of args[0] (see `tuned_launch`)."""
    tuned_launch(kernel, configs, lambda rows, c: (-(-rows // c["ROWS"]) * c["CTAS"],), args, **constexprs)


# ---- device helpers

@mgjit.device
def segment(ROWS, PARTS, CTAS, WGS):
    """The rows this program holds (a mgjit.ds) and the first column of its segment of them."""
    width = 0
    for p in mgjit.static_range(len(PARTS)):
        width += PARTS[p]
    if CTAS * WGS == 1:
        return mgjit.ds(mgjit.program_id(0) * ROWS, ROWS), 0
    first = (mgjit.program_id(0) // CTAS) * ROWS
    if CTAS == 1:
        return mgjit.ds(first, ROWS), mgjit.warpgroup_id() * width
    return mgjit.ds(first, ROWS), (mgjit.cluster_rank() * WGS + mgjit.warpgroup_id()) * width


@mgjit.device
def columns(c0, PARTS):
    """The column indices of a segment starting at c0, one int32 array per width of PARTS. Kernels use these
    same arrays for every mask and comparison: one set of index arrays takes the layout of the data it is
    compared with (a second `arange` would bring a layout of its own that the loads would follow)."""
    cols = ()
    c = c0
    for p in mgjit.static_range(len(PARTS)):
        cols = cols + (c + mgjit.arange(PARTS[p]),)
        c += PARTS[p]
    return cols


@mgjit.device
def load_row(x, rows, c0, cols, PARTS, fill):
    """Columns c0.. (their indices `cols`, from `columns`) of the rows `rows` (a mgjit.ds) of x as float32
    arrays, one per width of PARTS; columns past the row's end hold `fill`."""
    n = x.shape[1]
    held = ()
    c = c0
    for p in mgjit.static_range(len(PARTS)):
        v = x[rows, mgjit.ds(c, PARTS[p])].astype(mgjit.float32)
        held = held + (mgjit.where(cols[p] < n, v, fill),)
        c += PARTS[p]
    return held


@mgjit.device
def load_vector(w, c0, PARTS):
    """Elements c0.. of a 1D tensor (a weight) split like a row, as float32 arrays."""
    held = ()
    c = c0
    for p in mgjit.static_range(len(PARTS)):
        held = held + (w[mgjit.ds(c, PARTS[p])].astype(mgjit.float32),)
        c += PARTS[p]
    return held


@mgjit.device
def combine(value, kind, SPLIT):
    """A per-segment statistic combined over the SPLIT segments of a row (a cluster's warpgroups)."""
    if SPLIT == 1:
        return value
    return mgjit.cluster_reduce(value, kind)


@mgjit.device
def row_max(held, SPLIT):
    m = held[0].max(axis=1)
    for p in mgjit.static_range(1, len(held)):
        m = mgjit.maximum(m, held[p].max(axis=1))
    return combine(m, "max", SPLIT)


@mgjit.device
def row_sum(held, SPLIT):
    s = held[0].sum(axis=1)
    for p in mgjit.static_range(1, len(held)):
        s = s + held[p].sum(axis=1)
    return combine(s, "sum", SPLIT)


@mgjit.device
def store_row(out, rows, c0, held, PARTS):
    c = c0
    for p in mgjit.static_range(len(PARTS)):
        out[rows, mgjit.ds(c, PARTS[p])] = held[p].astype(out.dtype)
        c += PARTS[p]
