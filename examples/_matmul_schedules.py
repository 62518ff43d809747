"""Schedules and tiles for examples/matmul_hopper.py: how a problem's operands reach the kernel, which
schedules and tiles are worth trying for its shape (heuristics), the one to use (the fastest candidate, timed
once per shape and remembered on disk beside the kernel cache), and the stream-K workspace.

A config is a dict of matmul_kernel's constexprs plus SWAP_AB (compute C^T = B^T A^T), or a GEMV's
(examples/_matmul_gemv.py: GEMV="k-major" or "n-major" and its constexprs). The heuristics:
- M <= 64 (decode): swap-AB, so the weights stream through the 64-row side of every wgmma and M pads only to a
  multiple of 8 on its N side; one CTA per weight tile over all of K, or stream-K spreading the few row tiles'
  k-iterations over every SM. With 16-bit weights and a few rows, also a GEMV on the CUDA cores (K-major
  weights M <= 4, N-major M <= 8).
- M of 65 to 96 (SWAP_ROWS), where the weights make enough 64-row tiles: the swapped data-parallel tile beside the
  others below (cuBLAS's own 64 x 80 tiles at 80 x 3000 x 4096); M of 65 to 256, swapped 64-row weight tiles on
  clusters of four sharing the activations by multicast (cuBLAS's 4 x 1 clusters there) and 128-row ones.
- a partial last wave (tiles not a multiple of the SMs, fewer than ~8 waves): stream-K over the last wave or
  two beside the data-parallel tiles, smaller tiles (more tiles, smaller tail), and 192 x 192 ones.
- fewer tiles than SMs with a long K: stream-K or split-K, split-K over clusters sharing A where the tiles are
  very few, or one wave of whole tiles.
- in both of those, where the usual tiles overflow a round of the persistent grid, the tile width that fits the
  rounds best (`wave_fitted`: 128 x 160 at 1024 x 4936 x 5376, B transposed).
- else data-parallel 128 x 256 tiles (the large-shape schedule, ~1.0x cuBLAS).
Beside the data-parallel tiles of the larger shapes, their multicast form is tried: clusters of two CTAs on
M-neighbour tiles that load their shared B tile once, each CTA half of it into both (MULTICAST="b"; cuBLAS's
kernel for 1000 x 3000 x 2000 shares one operand across a 1 x 2 cluster the same way). It lost everywhere while
each slot's release to the peer CTA carried a cluster-scope fence (42.9 against 33.2 us there); released relaxed,
it ran in 27.0 against 33.0 us (benchmarks/RESULTS.md).
"""
from __future__ import annotations

import dataclasses
import os
import statistics
from typing import Any, Callable

import mgjit
from _device import current_stream, kept_zero

import _matmul_gemv as gemv

# One 128-byte swizzle row of K per tile row: 64 bf16/f16, 128 fp8, 32 tf32.
BK_FOR_BITS = {16: 64, 8: 128, 32: 32}
# The operand dtypes wgmma multiplies (float32 as tf32), as torch names them.
OPERAND_DTYPES = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float32")
SMEM_BYTES = 232448   # what one CTA may use on sm_90a (targets.HOPPER.smem_bytes)
SMEM_RESERVE = 2048   # mbarriers, scratch, alignment
MAX_STAGES = 12
MAX_CUTS = 8  # contributors per stream-K tile: the one that finishes it reads all of their partials
# Below this many multiply-adds a problem takes a few microseconds whatever its K: the small problems' tiles, not
# cuts of K (128 x 2048 x 1024 ran 10.5 us on its best long-K candidate, 8.7 on cuBLAS's 128 CTAs of 64 x 32).
# Unless K is this many k-tiles or more: 96 x 1240 x 8192 (under SMALL_WORK) ran its best small tile, 64 x 32 on
# 78 CTAs over all of K, at 0.64 of cuBLAS, 64 x 64 tiles split 3 ways on 120 CTAs at 0.90.
SMALL_WORK = 1 << 30
LONG_K_TILES = 64
SWAP_ROWS = 96  # M of 65 to this many rows also tries swapped 64-row weight tiles (`candidates`)
TUNE = os.environ.get("MGJIT_MATMUL_TUNE", "1") != "0"  # 0: take the first candidate, time nothing
# The candidates are timed round-robin, each by the median of its rounds: timed one after another, the GPU's
# drift between them (clocks, heat) picked 128x64 tiles for 256 x 1024 x 512 (7.8 us against 8.1), which ran
# 8.4 us against 64x128's 7.4 in the benchmark's interleaved rounds.
TIMING_ROUNDS = 3


def check_operands(name: str, **tensors) -> None:
    """Refuse operands of a dtype wgmma does not multiply (integers, float64: an int8 matrix was taken for fp8 by
    its size), naming the argument."""
    for arg, t in tensors.items():
        if str(t.dtype).removeprefix("torch.") not in OPERAND_DTYPES:
            raise TypeError(f"{name} multiplies {', '.join(OPERAND_DTYPES)} operands, got {arg} of {t.dtype}")


@dataclasses.dataclass(frozen=True)
class Problem:
    """c (m x n) = a (m x k) @ b (k x n), with each operand as the kernel will read it: `a_op` is (m, k), or
    (k, m) when `a_mn` (a transposed view given); `b_op` is (k, n), or (n, k) when `b_k` (K-major)."""

    m: int
    n: int
    k: int
    bits: int
    a_op: Any
    b_op: Any
    a_mn: bool
    b_k: bool
    out_dtype: Any
    epilogue: tuple  # (scaled, biased, activation)

    @classmethod
    def of(cls, a, b, b_kmajor: bool, out_dtype, scaled: bool, biased: bool, activation: str | None) -> "Problem":
        bits = a.element_size() * 8
        m, k = a.shape
        n = b.shape[0] if b_kmajor else b.shape[1]
        a_mn, b_t = transposed_views(a, b, b_kmajor)
        return cls(m, n, k, bits, operand(a, a_mn), operand(b, b_t), a_mn, b_kmajor or b_t, out_dtype,
                   (scaled, biased, activation))

    def key(self) -> tuple:
        """What the choice of schedule depends on."""
        return (self.m, self.n, self.k, str(self.a_op.dtype), str(self.out_dtype), self.a_mn, self.b_k,
                self.epilogue)


def transposed_views(a, b, b_kmajor: bool) -> tuple[bool, bool]:
    """Whether a and b are transposed views, read as they are stored: a column-major a as (k, m), MN-major
    (16-bit types only); a column-major (k, n) b, not given K-major, as the (n, k) tensor it views, K-major."""
    a_t = a.element_size() == 2 and a.stride(1) != 1 and a.stride(0) == 1
    return a_t, not b_kmajor and b.stride(1) != 1 and b.stride(0) == 1


def operand(t, transposed: bool):
    """An operand as the kernel reads it: the tensor a transposed view views, else t with unit column stride
    (a copy where its columns are strided)."""
    if transposed:
        return t.t()
    return t if t.stride(1) == 1 else t.contiguous()


def stages_that_fit(bm: int, bn: int, bk: int, itemsize: int, epilogue: int) -> int:
    """The most ring slots of a bm x bk A tile and a bn x bk B tile (of `itemsize`-byte elements) that fit a CTA's
    shared memory beside `epilogue` bytes, at most MAX_STAGES."""
    stage = (bm * bk + bn * bk) * itemsize
    return min(MAX_STAGES, (SMEM_BYTES - SMEM_RESERVE - epilogue) // stage)


def epilogue_n(bn: int) -> int:
    """The columns of one chunk of a TMA-stored epilogue (matmul_hopper.epilogue): 64, a 128-byte swizzle row of
    16-bit elements; 32 (a 64-byte swizzle row) where BN is an odd multiple of 32; else the whole tile."""
    return 64 if bn % 64 == 0 else 32 if bn % 32 == 0 else bn


def epilogue_bytes(consumers: int, bn: int, out_bytes: int) -> int:
    """The shared memory of a TMA-stored epilogue: two 64 x epilogue_n(bn) buffers a consumer."""
    return consumers * 2 * 64 * epilogue_n(bn) * out_bytes


def config(problem: Problem, bm: int, bn: int, swap: bool = False, stream_k: int = 0, **extra) -> dict:
    """A full config for `problem` with a bm x bn tile (of C^T when `swap`): BK from the element width, the
    TMA-store epilogue where the output allows it (a stream-K 256-wide tile stores from registers: its fix-up
    path and the TMA tile do not fit the consumers' registers together), and as many stages as fit."""
    bk = BK_FOR_BITS[problem.bits]
    out_bytes = problem.out_dtype.itemsize
    tma_store = (not swap and out_bytes == 2 and not (stream_k and bn > 192)
                 and epilogue_n(bn) * out_bytes in (32, 64, 128))  # a chunk's rows fill a swizzle row
    stages = stages_that_fit(bm, bn, bk, problem.bits // 8, epilogue_bytes(bm // 64, bn, out_bytes) if tma_store else 0)
    return {"SWAP_AB": swap, "BM": bm, "BN": bn, "BK": bk, "STAGES": stages, "GROUP_M": 8, "STREAM_K": stream_k,
            "TMA_STORE": tma_store, "EPILOGUE_N": epilogue_n(bn), **extra}


def candidates(problem: Problem, sms: int) -> list[dict]:
    """The configs worth timing for this shape, the heuristics' favourite first (what runs untimed)."""
    m, n = problem.m, problem.n
    k_tiles = -(-problem.k // BK_FOR_BITS[problem.bits])

    def tiles(bm: int, bn: int) -> int:
        return -(-m // bm) * -(-n // bn)

    def wave_split(bm: int, bn: int) -> int:
        """The cuts of K that put bm x bn tiles on about one wave of CTAs (at most MAX_CUTS; below 2: none)."""
        return min(MAX_CUTS, sms // tiles(bm, bn))

    side = _swapped_n(problem)  # M as a swapped tile's N
    if m <= 64 and _swap_allowed(problem):  # decode: the weights stream through the 64-row side
        # One CTA per 64 weight rows over the whole of K streams the weights with no fix-up: at 3 x 4096 x 4096
        # its 64 CTAs (12 stages of TMA in flight each) ran in 21.8 us against stream-K's 24.9 and cuBLAS's 20.6
        # (cuBLAS runs the same shape: 64 x 8 tiles on 64 CTAs). Stream-K stays for the shapes with few tiles.
        # (One CTA per 128 weight rows never won: 3 x 14336 x 4096 0.995 of cuBLAS against 64 rows' 1.004.)
        out = [config(problem, 64, side, swap=True), config(problem, 128, side, swap=True, stream_k=1),
               config(problem, 64, side, swap=True, stream_k=1)]
        # Few weight tiles (N = 1240: 20 of 64 rows): each split over as many CTAs as the SMs hold, one cut of one
        # tile a CTA, where stream-K's CTAs take up to two cuts in turn.
        split = wave_split(64, 64)  # M <= 64: one row of tiles
        if split > 1:
            out.append(config(problem, 64, side, swap=True, stream_k=1, SPLIT=split))
        # 16-bit weights: also on the CUDA cores, as row reductions (K-major, a linear layer's) or column blocks
        # (N-major)
        gemvs = [] if problem.bits != 16 else gemv.candidates(m, problem.k) if problem.b_k else \
            gemv.nmajor_candidates(m, n, problem.k, sms)
        # Past 16 rows, unswapped 64-row tiles too (the TMA-stored epilogue), and split like the swapped ones
        # where they are few: 64 x 1240 x 4096 (20 tiles of 64 x 64, 6 cuts each) ran 12.6 us, swapped 15.1,
        # cuBLAS 12.7 (its split-K on 120 CTAs).
        unswapped = [config(problem, 64, 128, stream_k=1)] if m > 16 else []
        if m > 16 and split > 1:
            unswapped.append(config(problem, 64, 64, stream_k=1, SPLIT=split))
        return out + unswapped + gemvs
    big = tiles(128, 256)
    # M of 65 to SWAP_ROWS rows (padded: an MN-major A pads M to 128), where the weights' 64-row tiles fill a third
    # of the SMs: those tiles swapped onto the wgmma's M side, one CTA a tile over all of K (cuBLAS's 64 x 80 tiles
    # at 80 x 3000 x 4096: 1.02 of cuBLAS where the best unswapped tile ran 0.86; 96 x 3000 x 4096 1.05 against
    # 0.94; at 128 rows it lost, 0.81-0.87 against 0.97-1.0, and on 20 tiles, 96 x 1240 x 8192, 0.55). LM heads too:
    # 80 x 50257 x 4096 (B transposed) 115 us against 132 for the best 128 x 256 tile; 96 x 32000 x 4096 1.01 of
    # cuBLAS against 0.88.
    swapped = [config(problem, 64, side, swap=True)] if (
        _swap_allowed(problem) and side <= SWAP_ROWS and tiles(side, 64) >= sms // 3) else []
    # M of 65 to 256 rows: the same weight tiles with the activations shared by clusters of four of them, each CTA
    # multicasting a quarter (M as a multiple of 32: parts of 8 rows), data-parallel and stream-K (cuBLAS's 64 x 104
    # and 256 x 160 tiles on 4 x 1 clusters), and 128-row weight tiles unshared (its 128 x 200 at 200 x 16384 x
    # 8192). H200, of cuBLAS: 100 x 7328 x 3784 0.85 -> 0.88-0.92 (64 x 128 shared), 160 x 8896 x 16384 0.75 ->
    # 0.94-0.96 (64 x 160 shared, stream-K), 144 x 4096 x 14336 0.81 -> 0.85-0.87 (64 x 160 shared), 160 x 5232 x
    # 8384 (A strided) 0.84 -> 1.05, 150 x 12288 x 4096 0.82 -> 0.93 (128 x 160), 200 x 16384 x 8192 (B transposed)
    # 0.72 -> 0.95 (128 x 200). 128-row tiles shared by four lost to unshared ones (30 clusters of four run at once
    # on an H200, so 32 items take two rounds), as did pairs; at 80 x 2000 x 6000 all of these lost
    # (benchmarks/RESULTS.md).
    side4 = max(side, -(-m // 32) * 32)
    shared4 = [config(problem, 64, side4, swap=True, MULTICAST="b", CLUSTER=4),
               config(problem, 64, side4, swap=True, stream_k=1, MULTICAST="b", CLUSTER=4),
               config(problem, 128, side, swap=True)] if (
        _swap_allowed(problem) and 64 < m and side4 <= 256 and tiles(side4, 64) >= sms // 3) else []
    if big % sms == 0 or big >= 8 * sms:  # whole waves, or a tail too small to matter
        return [config(problem, 128, 256), config(problem, 128, 256, MULTICAST="b")] + (
            [config(problem, 128, 128)] if big < 16 * sms else [])
    if big >= sms:  # a partial last wave: stream-K it (and the wave before), or smaller tiles
        # Or 192 x 192 tiles (three consumers): 2048 x 11008 x 4096 (B transposed, cuBLAS's tile there) ran
        # 275.6 us against 280.3 for the best of the others (cuBLAS 269.8); 4096^3 209.1 against 193.4.
        # (M-neighbour pairs sharing B where M holds two 128-row tiles: else every pair's second tile is empty.)
        # (And clusters of four of them where M holds four: 1024 x 4936 x 5376 128 x 192 0.82 -> 0.85 of cuBLAS.)
        paired = [config(problem, 128, 256, MULTICAST="b"), config(problem, 128, 192, MULTICAST="b")] \
            if m > 128 else []
        paired += [config(problem, 128, 192, MULTICAST="b", CLUSTER=4)] if m > 384 else []
        return [config(problem, 128, 256, stream_k=2), config(problem, 128, 256),
                config(problem, 128, 128, stream_k=2), config(problem, 128, 192),
                *paired, config(problem, 192, 192), *wave_fitted(problem, sms), *swapped, *shared4]
    # fewer tiles than SMs, K long enough to cut
    if k_tiles >= 16 and (m * n * problem.k >= SMALL_WORK or k_tiles >= LONG_K_TILES):
        # Very few tiles (256 x 512 x 65536: 16 of 128 x 64): split-K over clusters of two N-neighbours sharing
        # their A tile, which halves the L2 traffic that limits this shape (57.9 us against 65.1 unshared; cuBLAS
        # 52.8 runs the same: 128 x 64 tiles, 1 x 2 clusters, split-K). The CTA that finishes a cut tile reads
        # every contributor's partial: at most MAX_CUTS per tile.
        pairs, split = -(-tiles(128, 64) // 2), 1
        while 2 * split <= MAX_CUTS and pairs * 2 * split <= sms // 2:
            split *= 2
        out = [config(problem, 128, 64, stream_k=1, SPLIT=split, MULTICAST="a")] if split > 1 else []
        # Or stream-K over every SM (split-K on fewer where the tiles are too few: at most MAX_CUTS per tile);
        # or no cut at all: one wave of the largest tiles that fill the most SMs (1000x3000x2000: 128x192 is
        # 128 tiles, 128x128 a wave and a half), or two CTAs per tile (split-K) where even 128x128 is few.
        # The 128x192 wave also as 64 clusters of two M-neighbours sharing their B tile. (Stream-K on 128 x 256
        # tiles lost to all of these at 1024 x 1024 x 16384, 256 x 512 x 65536, 1000 x 3000 x 2000 and
        # 128 x 8192 x 8192.) The two-way split over clusters of two N-neighbours sharing A: on an H200,
        # 1024 x 1024 x 16384 ran 58.4 us against 61.0 unshared (cuBLAS 54.1); on an H100 61.8 against 62.1.
        # 64 x 128 tiles beside 128 x 64 ones: at 128 x 8192 x 8192 (128 tiles either way) one consumer's
        # m64n128 wgmmas ran 46.3 us against two consumers' m64n64 at 48.4 (cuBLAS 44.5). The 128x192 wave runs
        # shared (unshared it never won: 29.2 against 24.7 us at 1000 x 3000 x 2000).
        # And 64 x 64 tiles, one wave of them or split to about one (M of 65 to 128: 128 x 4096 x 4096 data-parallel
        # on 128 CTAs 0.97 of cuBLAS where the others ran 0.81-0.88; 100 x 2000 x 6000 split 2 0.95 against 0.91).
        # A data-parallel 128 x 256 wave, fewer CTAs than any of these, left the list for it.
        # Where M is one row of 128-row tiles, M-neighbours sharing B would leave every pair's second tile empty:
        # the swapped tiles instead, where there are any.
        cover = tiles(128, 128) * MAX_CUTS >= sms
        split64 = wave_split(64, 64)
        paired = [config(problem, 128, 192, MULTICAST="b")] if m > 128 else swapped
        return out + [config(problem, 128, 128, stream_k=1, **({} if cover else {"SPLIT": MAX_CUTS})),
                      config(problem, 64, 64, **({"stream_k": 1, "SPLIT": split64} if split64 > 1 else {})),
                      *paired, config(problem, 128, 128),
                      config(problem, 128, 64), config(problem, 64, 128),
                      config(problem, 128, 128, stream_k=1, SPLIT=2, MULTICAST="a"), *wave_fitted(problem, sms),
                      *shared4]
    # Small problems: latency more than throughput. Many small tiles, or a few tiles cut in two. (256 x 1024 x
    # 512: cuBLAS runs 128 CTAs of 64 x 32 tiles in 5.3 us, ours 64 CTAs of 64 x 64 in 5.8, ncu.)
    return [config(problem, 128, 128), config(problem, 128, 64), config(problem, 64, 128),
            config(problem, 128, 128, stream_k=1, SPLIT=2), config(problem, 64, 64), config(problem, 64, 32),
            *swapped]


# A persistent grid runs ceil(tiles / SMs) rounds of its tiles: a shape whose tiles overflow a round by a few
# pays a whole round for them. cuBLAS sizes its tile's width to the shape (1024 x 4936 x 5376: 256 x 160 tiles,
# 124 of them, one round, where our 128 x 192 take two of 208; 3000 x 1120 x 1792, B transposed: 192 x 144, 128
# tiles). Tile widths the operands allow: a K-major B any multiple of 16 (its SMEM rows are K), an N-major B a
# multiple of 64 (its rows fill 128-byte swizzle rows; the kernel runs odd multiples of 32 in 64-byte ones, but
# 1024 x 4936 x 5376 with an N-major B ran 0.62 of cuBLAS on 128 x 160 tiles so, 0.84 on the usual ones). H200,
# B transposed, of cuBLAS, one run: 1024 x 4936 x 5376 0.90 on 128 x 160 tiles, 0.78 on 128 x 192 shared by pairs;
# 3000 x 1120 x 1792 0.94-0.97 on 128 x 224, 0.87 on 128 x 256, 0.82 on 192 x 144 (the forty-eighth session's pick
# there, 128 x 128, ran 0.88).
FIT_GAIN = 0.92  # a fitted tile is offered where it puts at most this much of the usual tiles' work on one SM


def wave_fitted(problem: Problem, sms: int) -> list[dict]:
    """Data-parallel 128- and 192-row tiles of the width (128 to 256 columns, to 192 with three consumers) that
    puts the least work on the busiest SM, rounds of tiles times a tile's area (ties: the wider), each where that
    comes to at most FIT_GAIN of the usual tiles' least (128 x 256, 128 x 192, 128 x 128, 192 x 192)."""
    m, n = problem.m, problem.n

    def busiest(bm: int, bn: int) -> int:
        return -(-(-(-m // bm) * -(-n // bn)) // sms) * bm * bn

    usual = min(busiest(bm, bn) for bm, bn in ((128, 256), (128, 192), (128, 128), (192, 192)))
    step = 16 if problem.b_k else 64
    fitted = []
    for bm, widest in ((128, 256), (192, 192)):
        bn = min(range(128, widest + 1, step), key=lambda w: (busiest(bm, w), -w))
        if busiest(bm, bn) <= FIT_GAIN * usual:
            fitted.append(config(problem, bm, bn))
    return fitted


def _swap_allowed(problem: Problem) -> bool:
    """Swap-AB reads A as the wgmma's B operand: K-major, or (16-bit) MN-major with 64-wide rows."""
    return problem.bits == 16 or not problem.a_mn


def _swapped_n(problem: Problem) -> int:
    """M as the N of the swapped wgmma: a multiple of 8 (a K-major tile of A), or of 64 when A is MN-major
    (its SMEM rows are then M-wide and must fill the 128-byte swizzle)."""
    step = 64 if problem.a_mn else 8
    return -(-problem.m // step) * step


def normalize(problem: Problem, given: dict) -> dict:
    """A caller's config with the rest filled in as `config` would (TMA store where allowed, stages that fit); a
    GEMV config as given."""
    if given.get("GEMV"):
        gemv.check(given, problem.k, problem.b_k, problem.bits)
        return dict(given)
    base = config(problem, given.get("BM", 128), given.get("BN", 256), given.get("SWAP_AB", False),
                  given.get("STREAM_K", 0))
    out = {**base, **given}
    if "STAGES" not in given and (out["BK"] != base["BK"] or out["TMA_STORE"] != base["TMA_STORE"]):
        out["STAGES"] = stages_that_fit(out["BM"], out["BN"], out["BK"], problem.bits // 8,
                                        epilogue_bytes(out["BM"] // 64, out["BN"], 2) if out["TMA_STORE"] else 0)
    return out


# ---------------------------------------------------------------------------------------------- choosing

_CHOSEN: dict[tuple, dict] = {}
_TIMED: dict[tuple, dict[str, str]] = {}  # problem key -> each timed candidate in words -> its time or refusal
KERNEL_NAME = "examples.matmul_hopper.matmul"
# What times a candidate: an autotune timer (Run -> ms, with a `device` name). None: CUDA events, on a GPU.
TIMER: Callable[[Any], float] | None = None


def choose(problem: Problem, given: dict | None, sms: int, launch: Callable[[dict, Any], None], kernel: Any,
           output: Callable[[], Any]) -> dict:
    """The config to run: the caller's, else the remembered choice for this shape, else the heuristics'
    candidates, each timed (`launch(config, c)` runs one of `kernel`'s into c, an output made by `output()` as
    the caller makes its own: with rows padded for TMA stores) and the fastest remembered in memory and on disk
    (under the source keys of `kernel` and the GEMV: an edited kernel is timed again)."""
    if given is not None:
        return normalize(problem, given)
    key = (problem.key(), sms)
    chosen = _CHOSEN.get(key)
    if chosen is None:
        options = candidates(problem, sms)
        timed = TUNE and len(options) > 1 and (TIMER is not None or problem.a_op.device.type == "cuda")
        chosen = _CHOSEN[key] = _fastest(problem, options, launch, kernel, output) if timed else options[0]
    return chosen


def _fastest(problem: Problem, options: list[dict], launch: Callable[[dict, Any], None], kernel: Any,
             output: Callable[[], Any]) -> dict:
    from mgjit.autotune import Config, CudaEventTimer, Result, ResultStore, Run
    from mgjit.autotune.store import default_root
    from mgjit.cache.store import hash_parts

    timer = TIMER or CudaEventTimer(warmup_ms=2.0, rep_ms=10.0)
    store = ResultStore(default_root())
    # The candidates run `kernel` or a GEMV: an edit of any of them times them again.
    source_key = hash_parts(kernel.source_key(), gemv.gemv_kmajor.source_key(), gemv.gemv_nmajor.source_key())
    device = timer.device
    key = [list(map(str, problem.key()))]
    known = store.load(KERNEL_NAME, source_key, device, key)
    c = output()
    samples: dict[str, list[float]] = {Config(**o).key(): [] for o in options if Config(**o).key() not in known}
    for _ in range(TIMING_ROUNDS):
        for option in options:
            name = Config(**option).key()
            if name not in samples or name in known:  # remembered, or refused in an earlier round
                continue
            try:
                samples[name].append(timer(Run(Config(**option), lambda: None, lambda o=option: launch(o, c))))
            except mgjit.CompileError as error:  # a candidate the compiler refuses is skipped, with its reason
                known[name] = Result(pruned=f"{error.rule or 'compile'}: {error.message}"[:300])
    for name, ms in samples.items():
        if name not in known:
            known[name] = Result(ms=statistics.median(ms))
    times = {name: result.ms if result.ms is not None else float("inf") for name, result in known.items()}
    store.save(KERNEL_NAME, source_key, device, key, known)
    _TIMED[problem.key()] = {describe(o): _in_words(known[Config(**o).key()]) for o in options}
    best = min(options, key=lambda o: times[Config(**o).key()])
    if times[Config(**best).key()] == float("inf"):
        reasons = [known[Config(**o).key()].pruned for o in options]
        raise RuntimeError(f"no candidate schedule compiles for {problem.key()}: {reasons}")
    return best


def _in_words(result: Any) -> str:
    return f"{result.ms:.4f} ms" if result.ms is not None else f"refused ({result.pruned})"


def chosen(a, b) -> dict | None:
    """The config chosen for `a @ b` (16-bit operands, plain epilogue), if one was yet."""
    key = Problem.of(a, b, False, a.dtype, False, False, None).key()
    return next((cfg for (k, _), cfg in _CHOSEN.items() if k == key), None)


def timings(a, b) -> dict[str, str]:
    """The candidates timed for `a @ b` (16-bit operands, plain epilogue): each in words, with its time or why
    the compiler refused it; empty where none were timed."""
    return _TIMED.get(Problem.of(a, b, False, a.dtype, False, False, None).key(), {})


def describe(cfg: dict | None) -> str:
    """A config in a few words: `stream-K(2) 128x256 4 stages`, `swap-AB 128x8 stream-K(1) 12 stages`."""
    if cfg is None:
        return "-"
    if cfg.get("GEMV") == "k-major":
        return f"GEMV {cfg['ROWS']} rows x {cfg['KC']} columns x {cfg['KCH']} chunks"
    if cfg.get("GEMV") == "n-major":
        return f"GEMV N-major {cfg['BN']} columns x {cfg['KB']}x{cfg['UNROLL']} rows a step, K split {cfg['SPLIT']}"
    parts = ["swap-AB"] if cfg.get("SWAP_AB") else []
    if cfg.get("STREAM_K"):
        parts.append(f"stream-K({cfg['STREAM_K']})" + ("" if cfg.get("DETERMINISTIC", True) else " atomic")
                     + (f" split {cfg['SPLIT']}" if cfg.get("SPLIT") else ""))
    else:
        parts.append("data-parallel")
    if cfg.get("MULTICAST"):
        parts.append(f"multicast {cfg['MULTICAST'].upper()} x{cfg.get('CLUSTER', 2)}")
    parts += [f"{cfg['BM']}x{cfg['BN']}", f"{cfg['STAGES']} stages",
              "TMA store" if cfg.get("TMA_STORE") else "st.global"]
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------- launching

@dataclasses.dataclass(frozen=True)
class Plan:
    """How `config` runs for a problem: operands swapped or not, the kernel's constexprs and launch options,
    the grid, and the number of output tiles (of C, or of C^T when swapped; with MULTICAST CLUSTER a cluster's
    work item)."""

    swap: bool
    kernel_cfg: dict
    grid: tuple
    tiles: int
    gemv: str | None = None  # "k-major" or "n-major": examples/_matmul_gemv.py's kernel, not matmul_kernel


_PLANS: dict[tuple, Plan] = {}


def launch_plan(problem: Problem, cfg: dict, sms: int) -> Plan:
    """The Plan of `cfg` for `problem` (made once per shape and config). Swapped, the kernel's A is B^T (the b
    operand as stored), its B is A^T (the a operand) and its C is c transposed (a view, stored element by
    element)."""
    key = (problem.key(), tuple(sorted(cfg.items())), sms)
    plan = _PLANS.get(key)
    if plan is None and cfg.get("GEMV"):
        scaled, biased, activation = problem.epilogue
        kernel_cfg = {"M": problem.m, **{k: v for k, v in cfg.items() if k != "GEMV"}, "SCALED": scaled,
                      "BIAS": biased, "ACTIVATION": activation}
        plan = _PLANS[key] = Plan(False, kernel_cfg, gemv.grid(problem.n, cfg), 0, gemv=cfg["GEMV"])
    if plan is None:
        kernel_cfg = {k: v for k, v in cfg.items() if k not in ("SWAP_AB", "SPLIT")}
        scaled, biased, activation = problem.epilogue
        # At most 4 warpgroups, so that a BM the kernel has no consumers for (256) is refused by its BM assertion,
        # not by the launch's count of warpgroups
        kernel_cfg.update(SCALED=scaled, BIAS=biased, ACTIVATION=activation,
                          num_warpgroups=min(4, cfg["BM"] // 64 + 1))
        cluster = cfg.get("CLUSTER", 2)  # the CTAs of a multicast cluster
        if cfg.get("MULTICAST"):
            kernel_cfg["cluster"] = (cluster, 1, 1)
        if cfg["SWAP_AB"]:
            kernel_cfg.update(A_MNMAJOR=not problem.b_k, B_KMAJOR=not problem.a_mn, BIAS_ROWS=True, TMA_STORE=False)
            rows, cols = problem.n, problem.m
        else:
            kernel_cfg.update(A_MNMAJOR=problem.a_mn, B_KMAJOR=problem.b_k)
            rows, cols = problem.m, problem.n
        tiles = -(-rows // cfg["BM"]) * -(-cols // cfg["BN"])
        # Stream-K takes every SM (or SPLIT CTAs per tile: split-K); data-parallel one CTA per tile, one per SM.
        # Multicast: the same over clusters of CLUSTER CTAs and items of as many tiles (an item's tiles past M or N
        # count as tiles: they have fix-up slots all the same), as many clusters as run at once.
        if cfg.get("MULTICAST"):
            item_m, item_n = (cluster, 1) if cfg["MULTICAST"] == "b" else (1, cluster)
            items = -(-rows // (cfg["BM"] * item_m)) * -(-cols // (cfg["BN"] * item_n))
            clusters = resident_clusters(problem, cluster, cfg["BM"] // 64 + 1, sms)
            grid = (cluster * (min(clusters, items * cfg.get("SPLIT", clusters)) if cfg["STREAM_K"] else
                               min(items, clusters)),)
            tiles = cluster * items
        else:
            grid = (min(sms, tiles * cfg.get("SPLIT", sms)) if cfg["STREAM_K"] else min(tiles, sms),)
        plan = _PLANS[key] = Plan(cfg["SWAP_AB"], kernel_cfg, grid, tiles)
    return plan


def resident_clusters(problem: Problem, cluster: int, warpgroups: int, sms: int) -> int:
    """The clusters of `cluster` CTAs (one an SM, of `warpgroups` warpgroups) that run at once, at least one (a
    launch the GPU cannot place fails, where an empty grid would leave C unwritten): a cluster's CTAs share a GPC,
    and the H200 measured ran 30 clusters of four at once, not 33 (mgjit.max_active_clusters; a grid of 33 would
    run the last three after the others). Pairs, and any cluster off the GPU, as the SMs divide."""
    device = problem.a_op.device
    if cluster == 2 or device.type != "cuda":
        return max(sms // cluster, 1)
    return max(mgjit.max_active_clusters(cluster, 1, threads=128 * warpgroups, device=device.index or 0), 1)


def workspace(kernel_cfg: dict, tiles: int, grid: tuple, c) -> tuple:
    """(ws, locks) for a launch: for stream-K, room for a BM x BN f32 partial tile per slot (slots t + p, t a
    tile, p a CTA) and an int32 lock per 64 rows of each tile, zero, as every launch leaves them. Kept per
    device, stream (launches on one stream never overlap) and fix-up kind, and grown as needed. Other schedules
    never read them: they get c, as the other unused operands do."""
    if not kernel_cfg["STREAM_K"]:
        return c, c
    bm = kernel_cfg["BM"]
    return _workspace(((tiles + grid[0]) * bm, kernel_cfg["BN"], tiles * (bm // 64)), kernel_cfg, c.device)


def launch_workspace(plan: Plan, c) -> tuple:
    """(ws, locks) for a launch of `plan`: stream-K's (`workspace`), or a split gemv_nmajor's: a BN-wide f32 row
    for each column block, activation row and part of the split, and an int32 lock per column block (shared with
    the deterministic stream-K launches of the stream: both overwrite their rows and leave the locks zero); else
    c, c (read by nothing). The K-major GEMV takes none: ()."""
    cfg = plan.kernel_cfg
    if plan.gemv == "k-major":
        return ()
    if plan.gemv == "n-major":
        if cfg["SPLIT"] == 1:
            return c, c
        blocks = plan.grid[0]
        return _workspace((blocks * cfg["M"] * cfg["SPLIT"], cfg["BN"], blocks), cfg, c.device)
    return workspace(cfg, plan.tiles, plan.grid, c)


def _workspace(need: tuple[int, int, int], kernel_cfg: dict, device) -> tuple:
    """The workspace of `workspace_key`, at least `need` = (f32 rows, columns, int32 locks) large, zero."""
    import torch
    rows, cols, locks = need
    return kept_zero(workspace_key(kernel_cfg, device), (((rows, cols), torch.float32), ((locks,), torch.int32)),
                     device)


def workspace_key(kernel_cfg: dict, device) -> tuple:
    """Where `workspace` keeps the workspace of a stream-K launch on `device`: per device, current stream, and
    fix-up kind (non-deterministic fix-ups add into zeroed slots and zero them again; deterministic ones
    overwrite theirs)."""
    return ("matmul", str(device), current_stream(device), kernel_cfg.get("DETERMINISTIC", True))
