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
warp_id = _builtin("warp_id", "warp_id(): the warp's index in its warpgroup, for warp roles: `if mgjit.warp_id() == "
                              "w:` runs its block on warp w alone (scalar work and what one thread issues: TMA "
                              "copies, barriers, tcgen05 MMAs) while the other warps go on; such blocks end their "
                              "block.")
arange = _builtin("arange", "arange(stop) or arange(start, stop): a 1D int32 array; bounds are static.")
zeros = _builtin("zeros", "zeros(shape, dtype=float32): an array of zeros (shape (): a runtime scalar).")
full = _builtin("full", "full(shape, value, dtype=None): an array of one value (shape (): a runtime scalar).")
where = _builtin("where", "where(cond, a, b): elementwise choice.")
minimum = _builtin("minimum", "minimum(a, b): elementwise minimum.")
maximum = _builtin("maximum", "maximum(a, b): elementwise maximum.")
static_range = _builtin("static_range", "static_range(...): like range, unrolled at compile time.")
exp = _builtin("exp", "exp(x, ftz=False): e**x through ex2.approx; ftz=True flushes results below 2**-126 to "
                       "zero (3 instructions an element instead of 6)")
exp2 = _builtin("exp2", "exp2(x, ftz=False): 2**x through ex2.approx; ftz=True as for exp")
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
sum = _builtin("sum", "sum(x, axis=None): a reduction; sum((a, b, ...)): of every element of several arrays, one "
                      "scalar (their threads combine once, not once an array).")
max = _builtin("max", "max(x, axis=None): a reduction; max((a, b, ...)) as sum's.")
min = _builtin("min", "min(x, axis=None): a reduction; min((a, b, ...)) as sum's.")
cdiv = _builtin("cdiv", "cdiv(a, b): (a + b - 1) // b")

# Atomics and semaphores on GMEM (ordering: sem = "relaxed" | "acquire" | "release" | "acq_rel"; scope = "cta" |
# "cluster" | "gpu" | "sys")
_ATOMIC_DOC = ("(x, index, value, sem='relaxed', scope='gpu') -> the old values: atomically {what} the window "
               "x[index] (integers, or mgjit.ds windows; a scalar index: once per warpgroup, by its first thread)")
load = _builtin("load", "load(x, index, other=0): the window x[index] of a tensor argument (as x[index] reads it), "
                        "with `other` (a static number) wherever the window lies outside the tensor")
store = _builtin("store", "store(x, index, value, staged=False): x[index] = value; value may be a tuple of "
                          "arrays side by side along the window's last axis (their widths adding up to it: a row held "
                          "as 8 + 1 columns); staged=True (a static bool) moves a 2D window of whole rows of a "
                          "contiguous tensor through shared memory as one run of aligned 16-byte chunks, where rows "
                          "are not 16-byte aligned (mgjit/ops/gmem_flat.py)")
atomic_add = _builtin("atomic_add", "atomic_add" + _ATOMIC_DOC.format(what="add value to"))
atomic_min = _builtin("atomic_min", "atomic_min" + _ATOMIC_DOC.format(what="take the minimum of value and"))
atomic_max = _builtin("atomic_max", "atomic_max" + _ATOMIC_DOC.format(what="take the maximum of value and"))
atomic_xchg = _builtin("atomic_xchg", "atomic_xchg" + _ATOMIC_DOC.format(what="write value to"))
atomic_cas = _builtin("atomic_cas", "atomic_cas(x, index, compare, value, sem='relaxed', scope='gpu') -> the old "
                                    "values: atomically write value where x[index] equals compare")
semaphore_signal = _builtin("semaphore_signal", "semaphore_signal(x, index, inc=1, scope='gpu'): add inc to the "
                                                "int32 cell x[index] with release ordering, once per warpgroup "
                                                "(every write the warpgroup made before happens before it)")
semaphore_wait = _builtin("semaphore_wait", "semaphore_wait(x, index, value, scope='gpu'): wait until the int32 "
                                            "cell x[index] holds at least value, with acquire ordering (every "
                                            "access the warpgroup makes after happens after)")

# Hopper machinery
smem = _builtin("smem", "smem(shape, dtype, swizzle=None): a shared-memory buffer for the whole kernel. buf[slot] "
                        "is a stage; buf[a:b], buf[s, :, mgjit.ds(i, 64)] are views of the same bytes (a "
                        "swizzled tile is sliced in 8-row atoms and whole column blocks, an unswizzled one in "
                        "16-byte runs of columns); buf.window(start, shape) views an unswizzled tile's elements "
                        "in storage order from element start (on 16 bytes) as a tile of shape; buf[...] reads "
                        "it into registers, buf[...] = x writes it.")
scoped_smem = _builtin("scoped_smem", "with scoped_smem(shape, dtype, swizzle=None) as buf: a shared-memory "
                                      "buffer for the `with` block only; later blocks reuse its bytes, so the "
                                      "kernel needs the most that is open at once. Every warpgroup must be done "
                                      "with it (a barrier) before another writes a later block's buffer.")
barrier = _builtin("barrier", "barrier(count=1, arrivals=1): an array of up to 64 mbarriers, each completing a "
                              "phase after `arrivals` arrivals (every copy_async on it and every arrive() of a "
                              "warpgroup counts one) and their bytes; bars[i].wait() tracks the phase for you.")
copy_async = _builtin("copy_async", "copy_async(src, coords, dst, barrier=bars[i], multicast=False): TMA copy of the tile of "
                                    "tensor `src` at element coordinates `coords` into SMEM tile `dst`; it is one "
                                    "arrival on the barrier, with the tile's bytes. multicast=True: each CTA of "
                                    "the cluster copies its part of the tile's rows to all of them; "
                                    "multicast='x' (or 'y', 'z'): to the CTAs along that axis of the cluster "
                                    "that share this CTA's other coordinates. collective=True (2-CTA "
                                    "Blackwell kernels): the arrival counts on that barrier in the pair's leader "
                                    "CTA, where the 2-CTA MMA waits.")
store_async = _builtin("store_async", "store_async(dst, coords, src, reduce=None): TMA copy of SMEM tile `src` "
                                      "to the tile of tensor `dst` at `coords` (reduce='add' adds it there).")
tma_bounded = _builtin("tma_bounded", "tma_bounded(x, shape, descriptors, slot): tensor x as store_async sees it, "
                                      "its dimensions cut to `shape` (runtime sizes; None keeps one), so that a "
                                      "store drops what lies past them. The descriptor is built on the device in "
                                      "descriptors[128 * slot:][:128] (a 1-D uint8 tensor, 128-byte aligned) at each "
                                      "store: give each warpgroup that stores at once its own slot.")
store_async_wait = _builtin("store_async_wait", "store_async_wait(n=0): wait until at most n TMA stores of this "
                                                "warpgroup still read their SMEM tiles.")
prefetch_async = _builtin("prefetch_async", "prefetch_async(src, coords, tile): bring the tile of tensor `src` at "
                                            "`coords` that copy_async(src, coords, tile, ...) would copy into L2 "
                                            "(`tile` may be a static block shape); a hint, nothing to wait for.")
gather_async = _builtin("gather_async", "gather_async(src, rows, col, dst, barrier=bars[i]): TMA copy of rows "
                                        "rows[i] of the 2D tensor `src`, columns col.. (as many as `dst` has), "
                                        "into row i of SMEM tile `dst`; one arrival on the barrier with the "
                                        "tile's bytes. rows is an int32 array of dst.shape[0] (a multiple of 4) "
                                        "indices; rows outside `src` read as zeros. Blackwell copies four rows "
                                        "per instruction (gather4), Hopper one.")
pipeline = _builtin("pipeline", "for k, *tiles in pipeline(steps, tile(...), ..., stages=2, release=1, "
                                "warp_specialize=False, registers=None): a TMA→SMEM ring feeding the loop body. "
                                "With warp_specialize=True, warpgroup 0 produces and skips the rest of the block "
                                "the loop is in: the code after it runs in the consumer warpgroups only.")
tile = _builtin("tile", "tile(tensor, origin, block, step, swizzle=None): a block of `tensor` for mgjit.pipeline: "
                        "at step k it is the block at origin + k * step (element coordinates).")
cluster_rank = _builtin("cluster_rank", "cluster_rank(): the rank of this CTA in its cluster.")
cluster_sync = _builtin("cluster_sync", "cluster_sync(): a barrier for every thread of every CTA in the cluster.")
cluster_reduce = _builtin("cluster_reduce", "cluster_reduce(x, kind): x (a float32, int32, float64 or int64 scalar or "
                                            "array) combined elementwise by kind ('sum', 'max' or 'min') over "
                                            "every warpgroup of every CTA in the cluster; each gets the same "
                                            "result. Every warpgroup of the cluster must call it: each waits for "
                                            "every other's value. It orders no other memory access (cluster_sync "
                                            "does).")
cluster_gather = _builtin("cluster_gather", "cluster_gather(x, ...): x (a float32, int32, float64 or int64 scalar or "
                                            "array) as every warpgroup of every CTA in the cluster holds it: a "
                                            "tuple, slot = CTA rank x warpgroups + warpgroup index. Several values "
                                            "go in one exchange and give a tuple each. Every warpgroup of the "
                                            "cluster must call it: each waits for every other's values (through an "
                                            "mbarrier, not a cluster barrier: it orders no other memory access).")
wgmma = _builtin("wgmma", "wgmma(acc, a, b) -> acc + a @ b, with a and b SMEM tiles (asynchronous).")
wgmma_wait = _builtin("wgmma_wait", "wgmma_wait(n): wait until at most n wgmma groups are in flight.")
fence_async_shared = _builtin("fence_async_shared", "fence_async_shared(): order the warpgroup's SMEM stores "
                                                    "before TMA/MMA reads of them (each thread fences, then the "
                                                    "warpgroup's threads meet).")
cta_sync = _builtin("cta_sync", "cta_sync(): a barrier for every warpgroup of the CTA (bar.sync 0): SMEM written "
                                "before it by any warpgroup can be read after it by any other.")
named_barrier = _builtin("named_barrier", "named_barrier(count=1, warpgroups=2): `count` barriers between warpgroups "
                                          "(hardware named barriers), each completing a phase once `warpgroups` "
                                          "warpgroups have arrived: nb[i].sync() arrives and waits, nb[i].arrive() "
                                          "arrives without waiting (a warpgroup arrives once per phase).")
set_max_registers = _builtin("set_max_registers", "set_max_registers(n, increase=True): setmaxnreg for the "
                                                  "warpgroup (warp specialization).")
min_ctas_per_sm = _builtin("min_ctas_per_sm", "min_ctas_per_sm(n): ask that n CTAs of this kernel fit on one SM "
                                              "at once (PTX .minnctapersm): ptxas caps each thread at "
                                              "65536 / (n * threads) registers, spilling past it. n static.")

# Blackwell machinery (sm_100a)
tmem = _builtin("tmem", "tmem(shape, dtype, collective=False, packing=None, scales=False): a (rows, cols) "
                        "tensor-memory reference for the whole kernel (rows 128, or 64; a power of two of 32..512 "
                        "TMEM columns), or (stages, rows, cols) of them, ref[i] being stage i; collective=True for "
                        "2-CTA MMAs; scales=True for the (rows, K // block) block scales of a block-scaled MMA. "
                        "ref.load() / ref.store(x) move it to and from registers; ref[:, a:b] takes columns of a "
                        "128-row one.")
tcgen05_mma = _builtin("tcgen05_mma", "tcgen05_mma(acc, a, b, accumulate=True, a_scale=None, b_scale=None): acc "
                                      "(TMEM) = a @ b (+ acc), a an SMEM tile or TMEM reference, b an SMEM tile; "
                                      "issued by thread 0 of the calling warpgroup (call it from one warpgroup), "
                                      "asynchronous (tcgen05_commit signals completion). For collective acc, each CTA"
                                      " passes acc (M/2, N), a (M/2, K), b (K, N/2), and only the pair's leader (even"
                                      " cluster rank) issues it. With a_scale and b_scale (TMEM scale references (M, "
                                      "K // block) and (N, K // block)) it is block-scaled: mxfp8, mxfp4 or nvfp4.")
clc_try_cancel = _builtin("clc_try_cancel", "clc_try_cancel(response, barrier=bars[i], multicast=False): cluster "
                                            "launch control: ask for a cluster of this grid that has not launched, "
                                            "cancelling it; the 16-byte SMEM `response` completes on the barrier (one"
                                            " arrival, armed with its bytes). multicast=True: every CTA of the "
                                            "cluster arms its barrier and gets the response; rank 0 asks.")
clc_query = _builtin("clc_query", "canceled, (x, y, z) = clc_query(response): whether the try_cancel cancelled a "
                                  "cluster, and the program id of its first CTA (-1 when it did not). After a "
                                  "failure, do not ask again.")
tcgen05_copy = _builtin("tcgen05_copy", "tcgen05_copy(scales_tmem, scales_smem): copy block scales from an SMEM tile "
                                        "(128 x 4 chunks of 512 bytes, as mgjit.blocked_scales lays them out) into a "
                                        "TMEM scale reference (tcgen05.cp), issued like tcgen05_mma and ordered with "
                                        "the MMAs issued after it.")
tcgen05_commit = _builtin("tcgen05_commit", "tcgen05_commit(bars[i]): one arrival on the barrier once the MMAs this "
                                            "warpgroup issued are complete (on both CTAs of a 2-CTA pair).")

# Debugging and profiling
print = _builtin("print", "print(fmt, *values, where=\"cta\"): print scalars and arrays with a format string of "
                          "{} fields ({:.3f} and every Python format spec work), once per CTA (warpgroup 0), once per "
                          "warpgroup (where=\"warpgroup\") or from every thread, each with the elements it holds "
                          "(where=\"thread\"). The text shows when the launch completes.")
trace = _builtin("trace", "with trace(name): a span of this warpgroup, recorded when a launch profiles "
                          "(kernel[grid](..., profile=mgjit.Profile())); nothing at all otherwise.")
device_assert = _builtin("device_assert", "device_assert(cond, message): stop the launch where the scalar cond is "
                                          "false: on the GPU the kernel traps (the launch fails with an illegal "
                                          "instruction, and the CUDA context with it), the interpreter raises "
                                          "InterpretError naming the line and the message; a cond known when the "
                                          "kernel is traced is checked then (a CompileError where false).")

UNARY_BUILTINS = {exp: "exp", exp2: "exp2", log: "log", log2: "log2", sqrt: "sqrt", rsqrt: "rsqrt",
                  tanh: "tanh", erf: "erf", sin: "sin", cos: "cos", abs: "abs", clz: "clz", popc: "popc"}
REDUCE_BUILTINS = {sum: "sum", max: "max", min: "min"}
