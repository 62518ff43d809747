"""The kernel language's builtins as the user names them (`mgjit.exp`, `mgjit.ds`, ...).

They are markers: the frontend recognises each by identity and emits IR for it. Called from ordinary Python
they raise, because they only mean something inside a kernel.
"""
from __future__ import annotations

import dataclasses
from typing import Any


class constexpr:
    """Annotation for kernel parameters whose value is fixed at compile time (part of the cache key)."""


@dataclasses.dataclass(frozen=True)
class ds:
    """A dynamic slice: `size` elements from `start` (start may be a runtime value, size must be static)."""

    start: Any
    size: int


class Builtin:
    def __init__(self, name: str, doc: str):
        self.name = name
        self.__doc__ = doc
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"mgjit.{self.name} can only be used inside an @mgjit.kernel or @mgjit.device function")

    def __repr__(self) -> str:
        return f"<mgjit builtin {self.name}>"


def _builtin(name: str, doc: str) -> Builtin:
    return Builtin(name, doc)


program_id = _builtin("program_id", "program_id(axis): the index of this CTA along grid axis 0, 1 or 2.")
num_programs = _builtin("num_programs", "num_programs(axis): the grid size along axis 0, 1 or 2.")
warpgroup_id = _builtin("warpgroup_id", "warpgroup_id(): the index of this warpgroup in the CTA.")
arange = _builtin("arange", "arange(stop) or arange(start, stop): a 1D int32 array; bounds are static.")
zeros = _builtin("zeros", "zeros(shape, dtype=float32): an array of zeros.")
full = _builtin("full", "full(shape, value, dtype=None): an array of one value.")
where = _builtin("where", "where(cond, a, b): elementwise choice.")
minimum = _builtin("minimum", "minimum(a, b): elementwise minimum.")
maximum = _builtin("maximum", "maximum(a, b): elementwise maximum.")
static_range = _builtin("static_range", "static_range(...): like range, unrolled at compile time.")
exp = _builtin("exp", "exp(x)")
exp2 = _builtin("exp2", "exp2(x)")
log = _builtin("log", "log(x)")
log2 = _builtin("log2", "log2(x)")
sqrt = _builtin("sqrt", "sqrt(x)")
rsqrt = _builtin("rsqrt", "rsqrt(x): 1 / sqrt(x)")
tanh = _builtin("tanh", "tanh(x)")
erf = _builtin("erf", "erf(x)")
sin = _builtin("sin", "sin(x)")
cos = _builtin("cos", "cos(x)")
abs = _builtin("abs", "abs(x)")
fma = _builtin("fma", "fma(a, b, c): a * b + c rounded once (f32, f64; narrower floats in f32, then rounded).")
clz = _builtin("clz", "clz(x): the number of leading zero bits of each integer, within its dtype's width.")
popc = _builtin("popc", "popc(x): the number of one bits of each integer, within its dtype's width.")
sum = _builtin("sum", "sum(x, axis=None): a reduction.")
max = _builtin("max", "max(x, axis=None): a reduction.")
min = _builtin("min", "min(x, axis=None): a reduction.")
cdiv = _builtin("cdiv", "cdiv(a, b): (a + b - 1) // b")

# Hopper machinery
smem = _builtin("smem", "smem(shape, dtype, swizzle=None): a shared-memory buffer for the whole kernel.")
barrier = _builtin("barrier", "barrier(count=1, arrivals=1): an array of mbarriers, each completing a phase "
                              "after `arrivals` arrivals (every copy_async on it and every arrive() of a "
                              "warpgroup counts one) and their bytes; bars[i].wait() tracks the phase for you.")
copy_async = _builtin("copy_async", "copy_async(src, coords, dst, barrier=bars[i], multicast=False): TMA copy of the tile of "
                                    "tensor `src` at element coordinates `coords` into SMEM tile `dst`; it is one "
                                    "arrival on the barrier, with the tile's bytes. collective=True (2-CTA "
                                    "Blackwell kernels): the arrival counts on that barrier in the pair's leader "
                                    "CTA, where the 2-CTA MMA waits.")
store_async = _builtin("store_async", "store_async(dst, coords, src, reduce=None): TMA copy of SMEM tile `src` "
                                      "to the tile of tensor `dst` at `coords` (reduce='add' adds it there).")
store_async_wait = _builtin("store_async_wait", "store_async_wait(n=0): wait until at most n TMA stores of this "
                                                "warpgroup still read their SMEM tiles.")
pipeline = _builtin("pipeline", "for k, *tiles in pipeline(steps, tile(...), ..., stages=2, release=1, "
                                "warp_specialize=False, registers=None): a TMA→SMEM ring feeding the loop body.")
tile = _builtin("tile", "tile(tensor, origin, block, step, swizzle=None): a block of `tensor` for mgjit.pipeline: "
                        "at step k it is the block at origin + k * step (element coordinates).")
cluster_rank = _builtin("cluster_rank", "cluster_rank(): the rank of this CTA in its cluster.")
cluster_sync = _builtin("cluster_sync", "cluster_sync(): a barrier for every thread of every CTA in the cluster.")
wgmma = _builtin("wgmma", "wgmma(acc, a, b) -> acc + a @ b, with a and b SMEM tiles (asynchronous).")
wgmma_wait = _builtin("wgmma_wait", "wgmma_wait(n): wait until at most n wgmma groups are in flight.")
fence_async_shared = _builtin("fence_async_shared", "fence_async_shared(): order SMEM stores before TMA/MMA "
                                                    "reads of them.")
set_max_registers = _builtin("set_max_registers", "set_max_registers(n, increase=True): setmaxnreg for the "
                                                  "warpgroup (warp specialization).")

# Blackwell machinery (sm_100a)
tmem = _builtin("tmem", "tmem(shape, dtype, collective=False, packing=None): a (rows, cols) tensor-memory reference "
                        "for the whole kernel (rows 128, or 64; a power of two of 32..512 TMEM columns); "
                        "collective=True for 2-CTA MMAs. ref.load() / ref.store(x) move it to and from registers; "
                        "ref[:, a:b] takes columns of a 128-row reference.")
tcgen05_mma = _builtin("tcgen05_mma", "tcgen05_mma(acc, a, b, accumulate=True): acc (TMEM) = a @ b (+ acc), a an SMEM "
                                      "tile or TMEM reference, b an SMEM tile; issued by thread 0 of the calling "
                                      "warpgroup (call it from one warpgroup), asynchronous (tcgen05_commit "
                                      "signals completion). For collective acc, each CTA passes acc (M/2, N), "
                                      "a (M/2, K), b (K, N/2), and only the pair's leader (even cluster rank) "
                                      "issues it.")
tcgen05_commit = _builtin("tcgen05_commit", "tcgen05_commit(bars[i]): one arrival on the barrier once the MMAs this "
                                            "warpgroup issued are complete (on both CTAs of a 2-CTA pair).")

UNARY_BUILTINS = {exp: "exp", exp2: "exp2", log: "log", log2: "log2", sqrt: "sqrt", rsqrt: "rsqrt",
                  tanh: "tanh", erf: "erf", sin: "sin", cos: "cos", abs: "abs", clz: "clz", popc: "popc"}
REDUCE_BUILTINS = {sum: "sum", max: "max", min: "min"}
