"""GMEM windows' geometry for the Load and Store rules of mgjit/ops/gmem.py (and the atomics): where each held
element of a window lives and whether it is inside the tensor, how many consecutive elements go as one access at
the alignment the launch proves (`int_divisor` of a window's start), and the one branch that spares a window
wholly inside, or the first 7/8 of its columns, every bounds test, with the loads that follow a load of words
shifted into place (a row's other arrays) emitted in each of its paths."""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Sequence

from .. import ir, lower
from ..ir import Op, Value
from ..layouts import THREADS_PER_WARPGROUP, TiledLayout
from ..lower.context import LoweredRef, element_offsets, num_elems
from .control import For
from .elementwise import Binary, Cast
from .gmem_access import _all, _Element
from .program import Constant


def int_divisor(ctx: lower.Context, v: ir.Value) -> int:
    """The largest power of two (<= 16) known to divide integer scalar `v` at compile time."""
    return _divisor(ctx, v, 0)


def _divisor(ctx: lower.Context, v: ir.Value, depth: int) -> int:
    if depth > 16:
        return 1
    if v.id in ctx.specs and isinstance(ctx.specs[v.id], int):
        return ctx.specs[v.id]
    op = v.owner
    if isinstance(op, ir.Block) and isinstance(op.parent, For) and v is op.args[0]:
        loop = op.parent  # the induction variable: lower + i * step
        return min(_divisor(ctx, loop.operands[0], depth + 1), _divisor(ctx, loop.operands[2], depth + 1))
    if isinstance(op, Constant):
        n = abs(int(op.value))
        return 16 if n == 0 else min(16, n & -n)
    if isinstance(op, Cast):
        return _divisor(ctx, op.operands[0], depth + 1)
    if isinstance(op, Binary):
        a, b = (_divisor(ctx, x, depth + 1) for x in op.operands)
        if op.kind in ("add", "sub"):
            return min(a, b)
        if op.kind == "mul":
            return min(16, a * b)
        if op.kind == "shl" and isinstance(op.operands[1].owner, Constant):
            return min(16, a << int(op.operands[1].owner.value))
    return 1


def _vector_width(ctx: lower.Context, op: Op, ref: LoweredRef, layout: TiledLayout,
                  shape: tuple[int, ...]) -> tuple[int, int, bool]:
    """(w, align, narrowed): how many consecutive elements of a register's vector go as one access (1: one
    element per access), the power of two of bytes that every such access's address is known to be a multiple
    of, and whether the alignment made the accesses narrower than the layout allows."""
    rank = len(op.sizes)
    itemsize = ref.dtype.itemsize
    if not ref.spec.unit_stride or op.squeeze[rank - 1] or not shape or layout.vector_dim is None:
        return 1, itemsize, False
    entries = layout.tiling.dim_strides(len(shape))
    vdim, vstride = entries[len(entries) + layout.vector_dim]
    if vdim != len(shape) - 1 or vstride != 1:
        return 1, itemsize, False
    w = min(layout.vector_length, max(16 // itemsize, 1))
    # Every other tiled dim along the last axis must step in whole accesses.
    for (d, s), size in zip(entries, layout.tiled_shape(shape)):
        if d == len(shape) - 1 and size > 1 and s % w and s != 1:
            return 1, itemsize, False
    align = min(16, ref.spec.align, int_divisor(ctx, op.starts[rank - 1]) * itemsize)
    narrowed = align < w * itemsize and (align >= 4 or w * itemsize < 4)
    if narrowed:
        # Aligned accesses of `align` bytes (4 f32 of a misaligned row one by one): they cost no shifting. Below
        # 4 bytes, accesses too narrow to shift within 32-bit words too.
        w = max(align // itemsize, 1)
    return w, max(align, itemsize), narrowed


def _element_addresses(ctx: lower.Context, op: Op, ref: LoweredRef, layout, shape: tuple[int, ...],
                       step: int = 1) -> list[_Element | None]:
    """Where each held element lives and whether it is inside the tensor (only every `step`-th one: None for
    the others, whose addresses and bounds a store works out where it needs them, not kept in registers).

    Each thread's base address is computed once; an element's address is that base plus its offset in bytes,
    a constant along a contiguous last dimension (which ptxas folds into the access) and one product per
    distinct offset along the others. An element is in bounds when its index along every dimension is below
    that dimension's size (indices are unsigned there, so a negative start masks too)."""
    e = ctx.e
    rank = len(op.sizes)
    arr_dims = [d for d in range(rank) if not op.squeeze[d]]
    starts = [ctx.get(s) for s in op.starts]
    thread = ctx.thread_index(layout, shape) if shape else []
    base_idx = list(starts)
    for a, d in enumerate(arr_dims):
        base_idx[d] = e.addi(starts[d], thread[a])
    isz = ref.dtype.itemsize
    contiguous = ref.spec.unit_stride
    stride_bytes = [e.muli(ref.strides[d], e.i64(isz)) if not (d == rank - 1 and contiguous) else None
                    for d in range(rank)]
    base = ref.ptr
    for d in range(rank):
        idx64 = e.ext_i64(base_idx[d])
        base = e.addi(base, e.muli(idx64, e.i64(isz)) if stride_bytes[d] is None else e.muli(idx64, stride_bytes[d]))
    offsets = element_offsets(layout, shape) if shape else [()]
    steps: dict[tuple[int, int], Any] = {}  # (dim, offset) -> its i64 byte offset along a strided dim
    index: dict[tuple[int, int], Any] = {}  # (dim, offset) -> i32 index
    inside: dict[tuple[int, int], Any] = {}  # (dim, offset) -> i1
    rows_inside: dict[tuple[int, ...], Any] = {}  # offsets along every dim but the last -> i1
    out: list[_Element | None] = []
    for i, off in enumerate(offsets):
        if i % step:
            out.append(None)
            continue
        by_dim = {d: off[arr_dims.index(d)] for d in arr_dims}
        addr, constant = base, 0
        for d in range(rank):
            k = by_dim.get(d, 0)
            if (d, k) not in inside:
                index[(d, k)] = e.addi(base_idx[d], e.i32(k)) if k else base_idx[d]
                inside[(d, k)] = e.cmpi("ult", index[(d, k)], ref.sizes[d])
            if not k:
                continue
            if stride_bytes[d] is None:
                constant += k * isz
            else:
                if (d, k) not in steps:
                    steps[(d, k)] = e.muli(stride_bytes[d], e.i64(k))
                addr = e.addi(addr, steps[(d, k)])
        ks = tuple(by_dim.get(d, 0) for d in range(rank))
        if ks[:-1] not in rows_inside:
            rows_inside[ks[:-1]] = _all(e, [inside[(d, k)] for d, k in enumerate(ks[:-1])])
        rows, last = rows_inside[ks[:-1]], (rank - 1, ks[-1])
        out.append(_Element(e.addi(addr, e.i64(constant)) if constant else addr,
                            inside[last] if rows is None else e.andi(rows, inside[last]), rows, index[last],
                            addr, constant))
    return out


def _window_inside(ctx: lower.Context, op: Op, ref: LoweredRef, columns: tuple[int, int]) -> Any:
    """i1, the same in every thread: the window's columns [lo, hi) (relative to its start along the last
    dimension), in every row of it, lie wholly inside the tensor. The end is compared as start <= n - hi:
    start + hi wraps past 2**31 - 1 (a start read from memory, 2147483647, passed for a window inside, and its
    unchecked loads read far past the tensor)."""
    e = ctx.e
    conds = []
    last = len(op.sizes) - 1
    for d, (start, size, n) in enumerate(zip(op.starts, op.sizes, ref.sizes)):
        lo, hi = columns if d == last else (0, size)
        s = ctx.get(start)
        conds += [e.cmpi("sge", s, e.i32(-lo)), e.cmpi("sle", s, e.subi(n, e.i32(hi)))]
    return _all(e, conds)


@functools.lru_cache(maxsize=256)
def column_split(layout: TiledLayout, shape: tuple[int, ...], w: int, window_columns: int,
                 squeezed_last: bool) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(hi, head, tail): the accesses of `w` elements of an array in `layout` (the Frag indices of their first
    elements) split into those whose columns, over all the warpgroup's threads, lie in the window's first
    `hi` <= 7/8 of its columns, and the rest. Where a row ends in the window's last eighth (rows of 4095 in a
    window of 4096), only the tail's accesses need bounds tests. (Each head or tail empty: no split.)"""
    every = tuple(range(0, num_elems(layout, shape), w))
    if squeezed_last or not shape:
        return window_columns, every, ()
    offsets = element_offsets(layout, shape)
    first = next(iter(layout.registers(shape)))
    spread = [layout.element_index(shape, tid, first, 0)[-1] for tid in range(THREADS_PER_WARPGROUP)]
    last = max(spread) - spread[0] + w  # past the columns of an access's threads, from its first thread's first
    bound = window_columns - window_columns // 8
    head = tuple(i for i in every if offsets[i][-1] + last <= bound)
    tail = tuple(i for i in every if offsets[i][-1] + last > bound)
    if min(spread) != spread[0] or not head or not tail:
        return window_columns, every, ()
    return max(offsets[i][-1] + last for i in head), head, tail


def _inside_or_checked(ctx: lower.Context, op: Op, ref: LoweredRef, layout: TiledLayout, shape: tuple[int, ...],
                       w: int, emit: Callable[[bool, tuple], list], types: list,
                       also: tuple[Callable[[], list], list] = (list, [])) -> list:
    """What `emit(checked, accesses)` yields for every access of `w` elements of an array in `layout` (in Frag
    order), under one branch that every thread takes alike: unchecked (no bounds test per access or element)
    where the whole window lies inside the tensor; else, where the head of its column_split does (a window at a
    fixed or stepped start), the head unchecked and the tail checked; else all checked. One branch, not one per
    group of columns: ptxas waits for a branch's loads where it joins, so loads under consecutive branches took a
    memory latency each (branches for columns up to 1/2, 3/4 and 7/8 of a window of 4096 and the rest: softmax
    over rows of 4097 0.94 -> 0.70 of copy bandwidth, H200). `also`: a function emitting more values (of its
    types) in every path, after the window's, and those types."""
    e = ctx.e
    hi, head, tail = column_split(layout, shape, w, op.sizes[-1], bool(op.squeeze[-1]))
    every = tuple(sorted(head + tail))
    if not _fixed_or_stepped(op.starts[-1]):
        tail = ()
    more, more_types = also
    types = types + more_types

    def split_checked() -> list:
        values = dict(zip(head, _per_access(emit(False, head), len(head))))
        values.update(zip(tail, _per_access(emit(True, tail), len(tail))))
        return [v for i in every for v in values[i]] + more()

    def checked() -> list:
        if not tail:
            return emit(True, every) + more()
        return e.if_else(_window_inside(ctx, op, ref, (0, hi)), types, split_checked,
                         lambda: emit(True, every) + more())

    return e.if_else(_window_inside(ctx, op, ref, (0, op.sizes[-1])), types, lambda: emit(False, every) + more(),
                     checked)


def _fixed_or_stepped(start: Value) -> bool:
    """Whether a window's start is a constant or a loop's induction variable: a row's parts, or its chunks in
    turn. Only those windows take a head path. Where the start comes from the CTA (a row split over a cluster),
    the third path cost registers and no row ended in a head: softmax over rows of 50257 on 7 CTAs, 127 -> 159
    registers, 0.67 -> 0.55 of copy bandwidth; over rows of 8193 on 2, 0.79 -> 0.76 (H200)."""
    owner = start.owner
    return isinstance(owner, Constant) or (isinstance(owner, ir.Block) and isinstance(owner.parent, For)
                                           and start is owner.args[0])


def _per_access(values: list, accesses: int) -> list[list]:
    per = len(values) // accesses if accesses else 0
    return [values[k * per:(k + 1) * per] for k in range(accesses)]


class _LoadPaths(NamedTuple):
    """How an array Load lowers: `emit(checked, accesses)` the values of those accesses (tested per access, word or
    element where checked), `every` all of them, `types` the values' types, `finish(values)` the result made of
    them; `shifted`: its accesses are words shifted into place; `window`: what _inside_or_checked needs besides."""
    shifted: bool
    emit: Callable[[bool, Sequence[int]], list]
    every: range
    types: list
    finish: Callable[[list], None]
    window: tuple


# Loads lowered inside the paths of a Load before them (`_followers`)
LOWERED_WITH_LEADER = "loads lowered with the load before them"


def _followers(op: Op, ctx: lower.Context) -> tuple[list[Op], list[Constant]]:
    """The array Loads (ops of `op`'s class) of `op`'s tensor after it in its block with nothing between but them,
    Casts of their results and constants (a row's arrays loaded and widened in turn, `_rows.load_row`, each at a
    constant start), whose operands are all defined before `op` or by those constants; and those constants."""
    groups = ctx.analyses.get("load followers")
    if groups is None:
        groups = ctx.analyses["load followers"] = {}

        def visit(block: ir.Block) -> None:
            for k, o in enumerate(block.ops):
                for region in o.regions:
                    visit(region)
                if not (type(o) is type(op) and o.result.is_array):
                    continue
                loaded, after, constants = {o.result.id}, [], []
                for p in block.ops[k + 1:]:
                    if isinstance(p, Constant):
                        constants.append(p)
                    elif isinstance(p, Cast) and p.operands[0].id in loaded:
                        loaded.add(p.result.id)
                    elif (type(p) is type(op) and p.result.is_array and p.ref is o.ref
                          and not any(v.id in loaded for v in p.operands)):
                        loaded.add(p.result.id)
                        after.append(p)
                    else:
                        break
                groups[id(o)] = (after, constants)
        visit(ctx.kernel.body)
    return groups[id(op)]
