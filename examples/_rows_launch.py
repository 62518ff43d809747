"""What the row examples' wrappers (softmax, rmsnorm, layernorm, cross_entropy, the fused elementwise kernel) share
around their kernels: the mappings float64 rows take (`for_dtypes`, `in_float64`), the checks of their arguments
(`floating`, `output`, `as_rows`) and the autotuned launch (`launch`, `tuned_launch`: the fastest of a mapping's
candidates for a shape, timed with mgjit.autotune on the first call and remembered on disk; `picked` and `timings`
say what it chose and measured). The mappings themselves and the kernels' device helpers are examples/_rows.py's."""
from __future__ import annotations

import functools
import os
from collections.abc import Sequence

from _rows import _row_grid, chunkings

import mgjit
from mgjit.targets import HOPPER, REGISTERS_PER_SM


def tuning_enabled(x) -> bool:
    """Tune on a GPU; on the CPU (the interpreter) launch the heuristic's pick."""
    return x.is_cuda and os.environ.get("MGJIT_INTERPRET") != "1"


@functools.lru_cache(maxsize=None)
def _tuned(kernel, configs: tuple[mgjit.Config, ...], key: str):
    return mgjit.autotune(configs=list(configs), key=[key])(kernel)


def _untuned(configs: Sequence[mgjit.Config], args: tuple) -> bool:
    """Launch the first config as it is: one candidate, no GPU, or two arguments are one tensor (timing would run
    the kernel on its own output)."""
    if len(configs) == 1 or not tuning_enabled(args[0]):
        return True
    pointers = [a.data_ptr() for a in args if hasattr(a, "data_ptr")]
    return len(set(pointers)) < len(pointers)


# The row examples whose piped mappings compute float64 rows in float64 (their wrappers pass `piped` to
# for_dtypes): cross-entropy's segment statistics are float32's
PIPED_FLOAT64 = ("softmax", "rmsnorm", "layernorm")
# The most float64 elements a warpgroup's held rows take: 64 a thread, 128 registers (a row of three arrays held as
# one padded one, four rows of 4096, took 256 and was refused)
FLOAT64_HELD = 8192


@functools.lru_cache(maxsize=None)
def in_float64(configs: tuple[mgjit.Config, ...], forced: bool = False, n: int = 0,
               piped: bool = False) -> tuple[mgjit.Config, ...]:
    """The `configs` float64 rows take, computed in float64 (`_rows.wide`): held (over the warpgroups of a cluster
    too: its exchanges move 64-bit values as two words), streamed or chunked, and with `piped` (a kernel whose piped
    rows compute in `wide`: PIPED_FLOAT64's, over float64 rows) piped. Not those that persist, or cross-entropy's
    piped ones (its segment statistics are float32's), or store staged or flat (16-bit rows' remedies:
    examples/_rows.py), nor chunked ones whose segment of float64 would not fit in shared memory (rows of 262144
    over 8 CTAs). Unless the rows a program are `forced`: not held ones of
    more than FLOAT64_HELD elements a warpgroup, held one-CTA mappings of 8 rows or more also with a quarter of the
    rows, streamed ones in chunks over FLOAT64_CAPPED_BLOCK also with half the chunk, and each held or streamed
    mapping also with its registers capped for the occupancies its elements fit (`float64_occupancies`): a float64
    exp, libdevice's, inlined for every element a thread holds takes registers (softmax over rows of 127, 16 a
    program, 134 registers, 3 CTAs an SM; over rows of 4097, 255 registers, 2 CTAs an SM). Where `configs` chunk
    rows of `n` columns, also chunked as float64's bytes ask (`float64_chunkings`). Cached: a wrapper's launches
    are keyed by the configs' identity (`tuned_launch`)."""
    kept = tuple(c for c in configs + float64_chunkings(configs, n)
                 if not any(c.kwargs.get(k) for k in ("PIPE",) * (not piped) + ("PERSIST", "FLAT", "STAGED"))
                 and c.kwargs["CHUNKS"] * c.kwargs["BLOCK"] * 8 <= HOPPER.smem_bytes)  # a chunked segment fits
    if forced:  # rows a program as the caller asked (rows_per_program; too many: the compiler says so)
        return kept
    kept = tuple(c for c in kept if c.kwargs["ROWS"] * sum(c.kwargs["PARTS"]) <= FLOAT64_HELD)
    assert kept, f"no float64 mapping among {configs}"
    kept += tuple(c.replace(ROWS=c.kwargs["ROWS"] // 4) for c in kept if c.kwargs["ROWS"] >= 8
                  and c.kwargs["CTAS"] * c.kwargs["WGS"] == 1)
    kept += tuple(c.replace(BLOCK=c.kwargs["BLOCK"] // 2) for c in kept
                  if c.kwargs["BLOCK"] > FLOAT64_CAPPED_BLOCK and not c.kwargs["CHUNKS"])
    capped = tuple(c.replace(OCC=occ) for c in kept for occ in float64_occupancies(c))
    uncapped = tuple(c.replace(OCC=c.kwargs.get("OCC", 0)) for c in kept)  # the tuner's configs set one set of names
    return tuple(dict.fromkeys(uncapped + capped))


# Warpgroups an SM that float64 rows are also tried at (ptxas caps registers to fit them), on an H200: rows of 4097
# held one a program, softmax 0.87 of copy bandwidth uncapped (255 registers), 0.98 at 3, 0.90 at 4, cross-entropy
# 0.62, 0.78, 0.86; cross-entropy over rows of 1000, four a program, 0.65 uncapped, 0.81 at 3. Tuned (capped
# mappings picked): softmax over rows of 9000 0.80 -> 0.98, of 32000 0.74 -> 0.85 (over 7 CTAs, at 4);
# cross-entropy 9000 0.59 -> 0.81 (two warpgroups, at 2 CTAs), 32000 0.67 -> 0.84 and 100003 0.47 -> 0.69
# (streamed in chunks of 4096, at 4); RMSNorm 32000 0.92 -> 0.97
FLOAT64_OCC = (3, 4)
# Registers a thread of a capped float64 mapping keeps beside its elements' (2 each): cross-entropy streaming chunks
# of 8192 (64 elements a thread) spilled at 168 registers
FLOAT64_SPARE_REGISTERS = 48
# Streamed float64 chunks wider than this are also tried at half the width, which a cap can fit (64 elements a
# thread cannot)
FLOAT64_CAPPED_BLOCK = 4096


# Chunked float64 rows: segments of at most this many columns (32 KB, as 16-bit rows' CHUNK_SEGMENT), over up to
# FLOAT64_MAX_CTAS CTAs (a non-portable cluster), in chunks of FLOAT64_CHUNK_WIDTHS columns. H200, kernel alone,
# of copy bandwidth: softmax over rows of 32000 on 8 CTAs in chunks of 1024 0.91 (held, tuned: 0.86), of 100003 on 16
# in chunks of 512 0.66 (8 CTAs of 13 chunks of 1024, 104 KB, tuned: 0.55); RMSNorm 32000 0.96, layernorm 0.86 (0.82)
FLOAT64_CHUNK_SEGMENT = 4096
FLOAT64_CHUNK_WIDTHS = (512, 1024)
FLOAT64_MAX_CTAS = HOPPER.max_cluster_ctas


def float64_chunkings(configs: tuple[mgjit.Config, ...], n: int) -> tuple[mgjit.Config, ...]:
    """The chunked mappings of float64 rows of n columns (`_rows.chunkings` by FLOAT64_CHUNK_SEGMENT): a 16-bit
    row's segment of 16384 columns is 128 KB of float64, one CTA an SM. Each takes the other constexprs of the
    first chunked mapping of `configs` (none there, or n 0: none)."""
    like = next((c for c in configs if c.kwargs["CHUNKS"]), None)
    if like is None or not n:
        return ()
    chunked = chunkings(n, FLOAT64_CHUNK_SEGMENT, FLOAT64_CHUNK_WIDTHS, FLOAT64_MAX_CTAS)
    return tuple(c.replace(**{k: v for k, v in like.kwargs.items() if k not in c.kwargs}) for c in chunked)


def float64_occupancies(config: mgjit.Config) -> tuple[int, ...]:
    """The OCC (CTAs an SM) a mapping, held or streamed (not piped: PIPE caps it), without a cap of its own also
    runs at: FLOAT64_OCC warpgroups an SM in CTAs of its warpgroups, two or more of them, where that register share
    (65536 over those warpgroups' threads) holds a thread's float64 elements (of a row group, a segment or a chunk)
    and FLOAT64_SPARE_REGISTERS more."""
    k = config.kwargs
    if k["CHUNKS"] or k.get("OCC") or k.get("PIPE"):
        return ()
    elements = (k["BLOCK"] or k["ROWS"] * sum(k["PARTS"])) // 128
    return tuple(warpgroups // k["WGS"] for warpgroups in FLOAT64_OCC
                 if warpgroups % k["WGS"] == 0 and warpgroups // k["WGS"] >= 2
                 and 2 * elements + FLOAT64_SPARE_REGISTERS <= REGISTERS_PER_SM // (128 * warpgroups))


def for_dtypes(configs: tuple[mgjit.Config, ...], dtypes: Sequence, forced: bool = False, n: int = 0,
               piped: bool = False) -> tuple[mgjit.Config, ...]:
    """`configs` (of rows of n columns) as a wrapper launches them for tensors of `dtypes` (rows, weights):
    float64's own (`in_float64`) where one of them is float64, their piped mappings kept where the kernel's compute
    in float64 (`piped`, PIPED_FLOAT64) and the rows are float64."""
    import torch
    if torch.float64 not in dtypes:
        return configs
    return in_float64(configs, forced, n, piped and dtypes[0] == torch.float64)


def floating(name: str, **tensors) -> None:
    """Refuse integer and bool tensors where a row example computes in floating point, as torch does: the kernels
    would truncate their results into an output of x's integer dtype, or fail to compile with no -inf to fill a
    boolean row with."""
    for arg, t in tensors.items():
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} takes a floating-point {arg}, got {t.dtype}")


def output(out, shape: tuple, device, dtype, name: str, **inputs):
    """`out` checked, or a new tensor of `shape` and `dtype`: an out of another shape would be written in part
    (each window stops at the tensor's edge), one of an integer dtype would be truncated; either is refused. So
    is an out that shares memory with one of `inputs` without being that very view (in place: out=x): programs
    would read elements that others have already written."""
    import torch
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name}: out must be a tensor (or None), got {out!r}")
    if out.shape != shape or not out.dtype.is_floating_point or out.device != device:
        raise ValueError(f"{name}: out must be a floating-point tensor of shape {tuple(shape)} on {device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if inputs and out.numel():
        low, high = _span(out)
        for arg, t in inputs.items():
            t_low, t_high = _span(t) if t.numel() else (high, high)
            if t_low < high and low < t_high and (t.data_ptr(), t.shape, t.stride(), t.dtype) != (
                    out.data_ptr(), out.shape, out.stride(), out.dtype):
                raise ValueError(f"{name}: out overlaps {arg} in part; pass out={arg} itself to work in place, or "
                                 "memory of its own")
    return out


def as_rows(name: str, x, out, **inputs):
    """(rows, out, out_rows) for a wrapper over the last dimension of x, as torch's: x's leading dimensions
    flattened into rows (a view where its strides allow one, else a copy), out checked against x's shape or made
    (`output`) and viewed as rows the same way; an empty x (no rows, or rows of no columns) comes back whole, for
    the wrapper to return out without a launch."""
    if x.ndim == 0:
        raise ValueError(f"{name} takes x whose last dimension holds the rows, got a 0-dimensional tensor")
    out = output(out, x.shape, x.device, x.dtype, name, x=x, **inputs)
    if x.ndim == 2 or x.numel() == 0:
        return x, out, out
    n = x.shape[-1]
    try:
        out_rows = out.view(-1, n)
    except RuntimeError:
        raise ValueError(f"{name}: out of shape {tuple(out.shape)} and strides {out.stride()} is not a view of rows "
                         f"of {n}: pass a contiguous out") from None
    return x.reshape(-1, n), out, out_rows


def _span(t) -> tuple[int, int]:
    """The addresses of a tensor's first and past its last byte, whatever its strides (tensors of two
    allocations never share one: no need to ask for their storages)."""
    itemsize = t.element_size()
    if t.is_contiguous():  # the common case, on every call of a row example: no loop over the dimensions
        return t.data_ptr(), t.data_ptr() + t.numel() * itemsize
    low = high = t.data_ptr()
    for size, stride in zip(t.shape, t.stride()):
        if stride < 0:
            low += (size - 1) * stride * itemsize
        else:
            high += (size - 1) * stride * itemsize
    return low, high + itemsize


def picked(kernel, configs: Sequence[mgjit.Config], args: tuple, views: tuple = (), **constexprs) -> mgjit.Config:
    """The config `tuned_launch` launched for these arguments, tuned by an earlier launch (what benchmarks report)."""
    if _untuned(configs, args):
        return configs[0]
    return _tuned(kernel, tuple(configs), kernel.arg_names[0]).best_config(_named(kernel, args, views, constexprs))


def _named(kernel, args: tuple, views: tuple, constexprs: dict) -> dict:
    """A launch's arguments by name, as the tuner binds them."""
    return {**dict(zip(kernel.arg_names, (*args, *views))), **constexprs}


def timings(kernel, configs: Sequence[mgjit.Config], args: tuple, views: tuple = (),
            **constexprs) -> list[tuple[mgjit.Config, float | None]]:
    """Each config's time in ms (None: pruned) in the sweep `tuned_launch` ran (or read from the store) for these
    arguments in this process; empty when it launched without tuning."""
    if _untuned(configs, args):
        return []
    try:
        report = _tuned(kernel, tuple(configs), kernel.arg_names[0]).tuning_report(_named(kernel, args, views,
                                                                                          constexprs))
    except LookupError:
        return []
    return [(row.config, row.ms) for row in report.rows]


def tuned_launch(kernel, configs: Sequence[mgjit.Config], grid_of, args: tuple, views: tuple = (),
                 **constexprs) -> mgjit.Config:
    """Launch `kernel` on args and then `views` (views of args, which the check below skips) with the fastest of
    `configs` for the shape of args[0] and the arguments' dtypes (timed on the first call, remembered on disk), or
    with the first config without a GPU or when two of args are one tensor and the shape is not tuned yet in this
    process (timing would run the kernel on its own output; once tuned, such a call launches the pick too); return
    the config launched. grid_of(rows of args[0], a config's constexprs and options) gives the grid: it must
    follow from args[0]'s shape, the config and its device, as it is worked out once for them."""
    x = args[0]
    key = (kernel, id(configs), x.shape, x.device, *map(_dtype, args))
    known = _launches.get(key)
    if known is not None and known[0] is configs:  # tuned before: launched as tuned, in place or not
        known[2](*args, *views, **constexprs, **known[3])
        return known[1]
    if _untuned(configs, args):
        options = configs[0].launch_kwargs()
        kernel[grid_of(x.shape[0], options)](*args, *views, **constexprs, **options)
        return configs[0]
    name = kernel.arg_names[0]
    tuned = _tuned(kernel, tuple(configs), name)
    tuned[lambda named: grid_of(named[name].shape[0], named)](*args, *views, **constexprs)
    config = tuned.best_config(_named(kernel, args, views, constexprs))
    options = config.launch_kwargs()
    if len(_launches) >= MAX_LAUNCHES:  # callers building new configs per call would grow it without end
        _launches.clear()
    _launches[key] = (configs, config, kernel[grid_of(x.shape[0], options)], options)
    return config


# The launches of tuned keys seen in this process: (kernel, id(configs), args[0]'s shape and device, the arguments'
# dtypes) -> (configs, the config picked, the kernel bound to its grid, its options). The tuner's own dispatch runs
# the grid callable on a dict of every argument and option each call, where this costs one lookup: layernorm's
# wrapper took 60-80 us a call on the H200's host, more than its kernel at 256 MB (tuned 0.46 of copy bandwidth
# where the kernel alone ran 0.85).
_launches: dict = {}
MAX_LAUNCHES = 1024


def _dtype(value):
    return getattr(value, "dtype", None)


def launch(kernel, configs: Sequence[mgjit.Config], args: tuple, views: tuple = (), **constexprs) -> mgjit.Config:
    """Launch a row kernel on the rows of args[0] (see `tuned_launch`); return the config launched."""
    device = args[0].device
    return tuned_launch(kernel, configs, lambda rows, config: _row_grid(rows, config, device), args, views,
                        **constexprs)
