"""How a reduction's per-thread partials cross lanes and warps (the lowering's steps 2 and 3, shared by Reduce,
ReduceAll and the fused row reductions of ops/reductions.py, and by the cluster reductions of ops/clusters.py):
`combine` one kind's two values, butterfly shuffles over lane bits (`across_lanes`; transposed where a thread holds
several rows and that costs less), then a small SMEM scratch owned by the warpgroup (`across_warps`).
"""
from __future__ import annotations

import math
from typing import Any, Callable

from .. import lower
from ..ir import Value
from ..layouts import LANES_PER_WARP
from .arrays import linear_index


def balanced(xs: list, combine_two: Callable[[Any, Any], Any]) -> Any:
    """xs combined as a balanced tree (a chain would make every combine wait for the one before it)."""
    while len(xs) > 1:
        xs = [combine_two(a, b) for a, b in zip(xs[::2], xs[1::2])] + xs[len(xs) & ~1:]
    return xs[0]


def combine(ctx: lower.Context, kind: str, dtype, a, b) -> Any:
    """a and b (MLIR values of `dtype`) combined by the reduction `kind` (sum, max or min)."""
    e = ctx.e
    if kind == "sum":
        return e.fbinary("add", a, b) if dtype.is_float else e.addi(a, b)
    if dtype.is_float:
        return e.fbinary(kind, a, b)
    return e.ibinary(kind, a, b, dtype.is_signed)


# What a butterfly over lanes spends, in issue slots: a shuffle counts twice (sm_90 shuffles 32 lanes a clock an
# SM, where it adds, selects and masks 64 to 128).
SHUFFLE_COST, ALU_COST = 2, 1
# Each of the 2^h lane codes a transposed butterfly gathers from is a lane index a thread keeps: three halvings of
# 8 rows gave no fewer PTX instructions than two (bf16 rows of 127, softmax 21.5 against 21.6 an element) and took
# more registers (layernorm 78 -> 85 against 80; of 98 in float16, 82 against 72).
MAX_HALVINGS = 2
# Threads of more rows keep the plain butterfly: grouped_matmul's tile table reduces (128, 128) squares, 32 rows a
# thread, at 255 registers, and transposed it spilled 8 bytes.
MAX_TRANSPOSED_GROUPS = 16


def across_lanes(ctx: lower.Context, kind: str, acc_dtype, groups: dict, lane_dims: list[tuple[int, int]]) -> dict:
    """Step 2: butterfly shuffles over each bit of the lane dimensions (stride, size) given; where a thread holds
    several groups (rows) and that costs less (`halvings`), transposed (`_transposed_across_lanes`)."""
    e = ctx.e
    bits = [s for stride, size in lane_dims for s in _lane_bits(stride, size)]
    steps = halvings(len(groups), len(bits))
    if steps:
        return _transposed_across_lanes(ctx, kind, acc_dtype, groups, bits, steps)
    for s in bits:
        groups = {k: combine(ctx, kind, acc_dtype, v, e.shfl_bfly(v, s)) for k, v in groups.items()}
    return groups


def _lane_bits(stride: int, size: int) -> list[int]:
    """The lane-index bits (as masks) of a lane dimension of `size` lanes `stride` apart."""
    return [stride << i for i in range(size.bit_length() - 1)]


def halvings(groups: int, bits: int) -> int:
    """How many of a butterfly's `bits` steps over lanes halve the groups a thread holds (0: none, the plain
    butterfly), the cheapest in SHUFFLE_COST and ALU_COST: each of `groups` (a power of two) costs a shuffle and a
    combine a step plainly; a halving step a shuffle, a combine and two selects a pair, the steps after it are paid
    by the groups left, the lanes' results are gathered back by one shuffle and one mask a group, and each
    halving's lane bit costs a mask and a compare, the gather's lanes one mask. At most MAX_HALVINGS, of at most
    MAX_TRANSPOSED_GROUPS. A thread of 4 rows over 32 lanes: 20 shuffles and 20 adds plainly, 10 shuffles, 6 adds,
    6 selects and 8 masks or compares so; of 2 rows over 8 lanes (3 bits), 6 and 6 plainly, kept."""
    if groups < 2 or groups > MAX_TRANSPOSED_GROUPS or groups & (groups - 1) or not bits:
        return 0
    step = SHUFFLE_COST + ALU_COST

    def cost(h: int) -> int:
        if h == 0:
            return groups * bits * step
        halving = sum(groups >> i for i in range(1, h + 1)) * (step + 2 * ALU_COST)
        return halving + (groups >> h) * (bits - h) * step + groups * step + (2 * h + 1) * ALU_COST
    return min(range(min(groups.bit_length() - 1, bits, MAX_HALVINGS) + 1), key=cost)


def _transposed_across_lanes(ctx: lower.Context, kind: str, acc_dtype, groups: dict, bits: list[int],
                             steps: int) -> dict:
    """The butterfly over the lane bits `bits` with its first `steps` steps halving the groups a thread
    holds (a reduce-scatter): at the step over bit b, the lanes with b clear keep the first group of each pair
    and send the second, the others keep the second, so that each sends one shuffle where both groups would take
    one each. After h halvings, slot k holds group k * 2^h + (this lane's h bits, read as a number), and every
    lane takes each group from a lane that holds it (a shuffle by index: the result is one value, bit for bit,
    in every lane, as the plain butterfly leaves it)."""
    e = ctx.e
    word = e.int_type(acc_dtype.bits)

    def pick(upper, a, b):  # a where `upper`, else b: integer registers moved (selp.b32, .b64), as shuffles move them
        if a.type == word:
            return e.select(upper, a, b)
        return e.bitcast(e.select(upper, e.bitcast(a, word), e.bitcast(b, word)), a.type)
    slots = list(groups.values())
    for b in bits[:steps]:
        upper = e.cmpi("ne", e.andi(ctx.lane, e.i32(b)), e.i32(0))
        slots = [combine(ctx, kind, acc_dtype, pick(upper, second, first), e.shfl_bfly(pick(upper, first, second), b))
                 for first, second in zip(slots[::2], slots[1::2])]
    for b in bits[steps:]:
        slots = [combine(ctx, kind, acc_dtype, v, e.shfl_bfly(v, b)) for v in slots]
    halved = sum(bits[:steps])
    others = e.andi(ctx.lane, e.i32(~halved & (LANES_PER_WARP - 1)))
    out = {}
    for r, key in enumerate(groups):
        code = sum(b for i, b in enumerate(bits[:steps]) if r >> i & 1)
        out[key] = e.shfl_idx(slots[r >> steps], e.ori(others, e.i32(code)) if code else others)
    return out


def across_warps(ctx: lower.Context, kind: str, acc_dtype, groups: dict, warp_dims: list[tuple[int, int]],
                  out: Value) -> dict:
    """Step 3, through SMEM: slot [warp coordinate along the warp dimensions given][result element]."""
    e = ctx.e
    n_warps = math.prod(size for _, size in warp_dims)
    out_shape = out.type.shape if out.is_array else ()
    out_size = math.prod(out_shape) if out_shape else 1
    elem_bytes = acc_dtype.itemsize
    base = ctx.alloc_smem(n_warps * out_size * elem_bytes)
    wcoord = e.i32(0)
    scale = 1
    for stride, size in warp_dims:
        c = e.remui(e.divui(ctx.warp, e.i32(stride)), e.i32(size))
        wcoord = e.addi(wcoord, e.muli(c, e.i32(scale)))
        scale *= size
    if out_shape:
        thread = ctx.thread_index(out.layout, out_shape)
    slots = {}
    for key in groups:
        if out_shape:
            idx = [e.addi(t, e.i32(k)) for t, k in zip(thread, key)]
            slots[key] = linear_index(ctx, idx, out_shape)
        else:
            slots[key] = e.i32(0)
    ctx.warpgroup_barrier()  # a previous use of this scratch (in a loop) must be fully read
    for key, v in groups.items():
        slot = e.addi(e.muli(wcoord, e.i32(out_size)), slots[key])
        e.smem_store(v, e.addi(base, e.muli(slot, e.i32(elem_bytes))))
    ctx.warpgroup_barrier()
    t = e.type(acc_dtype)
    new = {}
    for key in groups:
        acc = None
        for w in range(n_warps):
            slot = e.addi(e.i32(w * out_size), slots[key])
            v = e.smem_load(t, e.addi(base, e.muli(slot, e.i32(elem_bytes))))
            acc = v if acc is None else combine(ctx, kind, acc_dtype, acc, v)
        new[key] = acc
    return new
