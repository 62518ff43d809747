"""Arrays as wholes: Splat (one value everywhere), Iota (arange), Broadcast, ArraySlice (`x[a:b, c:d]` with static
bounds), and Relayout (inserted by layout inference to move an array into another register layout; visible in
the IR).

A splat costs nothing to place in any layout; an iota is a free anchor (each thread computes the indices it
holds); a broadcast reuses the elements a thread already holds (inference picks a result layout whose reduction
is the operand's, or, where every thread holds the whole operand, any layout its users want); a slice that
starts and ends on whole tiles of its operand's layout keeps the layout and selects the registers of those tiles
(a 64-column chunk of a wgmma accumulator), any other goes through SMEM like a relayout, which moves data between
threads (but out of an array every thread holds whole, which each thread picks from its own registers).
"""
from __future__ import annotations

import functools
import math
from typing import Any

import torch

from .. import dtypes, infer, interpret, lower
from ..errors import Loc, Rule
from ..interpret.scheduler import Warpgroup
from ..ir import ArrayType, Op, ScalarType, Value, check
from ..layouts import SPLAT, THREADS_PER_WARPGROUP, Layout, LayoutError, SplatLayout, TiledLayout, blocked
from ..lower.context import element_offsets, num_elems, splat_to

# A broadcast of an array that every thread holds whole (a row's statistics reduced across warps) takes any layout
# where the array has at most this many elements: a thread that needs one picks it by a select over them.
SELECTED_ELEMENTS = 16


class Splat(Op):
    """An array whose every element is one scalar."""

    name = "splat"

    def __init__(self, x: Value, shape: tuple[int, ...], loc: Loc | None):
        super().__init__([x], [ArrayType(shape, x.dtype)], loc)

    def verify(self):
        check(isinstance(self.operands[0].type, ScalarType), self, "splat takes a scalar")


class Iota(Op):
    """arange: element i of a 1D int32 array is start + i."""

    name = "iota"
    free_anchor = True
    index_only = True

    def __init__(self, start: int, size: int, loc: Loc | None):
        super().__init__([], [ArrayType((size,), dtypes.int32)], loc)
        self.start = start

    def attrs(self):
        return {"start": self.start}


class Broadcast(Op):
    """Broadcast `x` to `shape`; `dims[i]` is the result dimension that operand dimension i becomes."""

    name = "broadcast"
    free_with_operand = True

    def __init__(self, x: Value, shape: tuple[int, ...], dims: tuple[int, ...], loc: Loc | None):
        super().__init__([x], [ArrayType(shape, x.dtype)], loc)
        self.dims = dims

    @property
    def takes_any_layout(self) -> bool:
        """Whether every thread holds every element of the operand, which has at most SELECTED_ELEMENTS: the result
        is then made in any layout from the thread's own registers (`_broadcast`), with no relayout of the operand."""
        x = self.operands[0]
        return isinstance(x.layout, TiledLayout) and selectable(x.layout, x.type.shape)

    def attrs(self):
        return {"dims": self.dims}

    def verify(self):
        src = self.operands[0].type.shape
        shape = self.results[0].type.shape
        check(len(src) == len(self.dims), self, f"broadcast dims {self.dims} do not match operand rank {len(src)}")
        for d, n in zip(self.dims, src):
            check(shape[d] == n, self, f"cannot broadcast a dimension of {n} to {shape[d]}")


class ArraySlice(Op):
    """`x[a:b, c:d]`: the block of `x` of `sizes` from `starts` (static), in x's dtype."""

    name = "array_slice"

    def __init__(self, x: Value, starts: tuple[int, ...], sizes: tuple[int, ...], loc: Loc | None):
        super().__init__([x], [ArrayType(sizes, x.dtype)], loc)
        self.starts, self.sizes = starts, sizes

    def attrs(self):
        return {"starts": self.starts, "sizes": self.sizes}

    def verify(self):
        shape = self.operands[0].type.shape
        check(len(self.starts) == len(shape) == len(self.sizes), self,
              f"a slice of a {len(shape)}D array takes {len(shape)} bounds, got {len(self.starts)}")
        for d, (start, size, n) in enumerate(zip(self.starts, self.sizes, shape)):
            check(0 <= start and 0 < size and start + size <= n, self,
                  f"slice {start}:{start + size} of dimension {d} is outside its {n} elements (or empty)")


def slice_keeps_layout(layout: Layout, shape: tuple[int, ...], starts: tuple[int, ...],
                       sizes: tuple[int, ...]) -> bool:
    """Whether a slice of an array in `layout` can keep it: a splat, or bounds on whole outer tiles of a tiled
    layout (each thread then holds the slice's elements among its own, at the same place in the tile)."""
    if isinstance(layout, SplatLayout):
        return True
    tile = layout.tiling.tiles[0]
    tail = len(shape) - len(tile)
    try:
        layout.check_shape(sizes)
    except LayoutError:
        return False
    return all(start % t == 0 for start, t in zip(starts[tail:], tile))


@infer.rule(ArraySlice)
def _infer_array_slice(op: ArraySlice, inf: infer.Inference) -> None:
    src = op.operands[0].layout
    if slice_keeps_layout(src, op.operands[0].type.shape, op.starts, op.sizes):
        inf.set_layout(op.result, src, op)
        return
    try:
        inf.set_layout(op.result, blocked(op.sizes, op.result.dtype), op)
    except LayoutError as e:
        raise op.error(f"the slice {op.sizes} of this array is off its layout's tiles ({src}) and has no layout of "
                       f"its own: {e}", rule=Rule.LAYOUT) from None


@infer.relayout_op
class Relayout(Op):
    """Move an array into another register layout (inserted by layout inference; visible in the IR)."""

    name = "relayout"

    def __init__(self, x: Value, layout: Layout, loc: Loc | None):
        super().__init__([x], [x.type], loc)
        self.results[0].layout = layout


@infer.rule(Splat)
def _infer_splat(op: Splat, inf: infer.Inference) -> None:
    inf.set_layout(op.result, SPLAT, op)


infer.rule(Iota)(infer.free_anchor_layout)
infer.rule(Relayout)(infer.no_arrays)  # its result layout is set when inference inserts it


@infer.rule(Broadcast)
def _infer_broadcast(op: Broadcast, inf: infer.Inference) -> None:
    src = op.operands[0]
    shape = op.result.type.shape
    if isinstance(src.layout, SplatLayout):
        inf.set_layout(op.result, SPLAT, op)
        return
    axes = tuple(d for d in range(len(shape)) if d not in op.dims)
    placed = inf.overrides.get(id(op))
    if placed is not None:  # a user needs the result in this layout: the operand takes its reduction
        if not op.takes_any_layout:
            inf.move_or_relayout(op, 0, placed.reduce(axes, len(shape)))
        inf.set_layout(op.result, placed, op)
        return
    candidates = list(reversed(inf.by_shape.get(shape, [])))
    try:
        candidates.append(blocked(shape, op.result.dtype))
    except LayoutError as e:  # no default layout (a side not a power of two): only an array's of that shape
        if not candidates:  # (a wgmma accumulator of N = 24, for a bias broadcast along its rows)
            raise op.error(str(e), rule=Rule.LAYOUT) from None
    for layout in candidates:
        if layout.reduce(axes, len(shape)) == src.layout:
            inf.set_layout(op.result, layout, op)
            return
    target = candidates[0]
    wanted = target.reduce(axes, len(shape))
    # An operand that comes (through elementwise ops) from loads/iotas only is loaded straight into the layout.
    inf.move_or_relayout(op, 0, wanted)
    inf.set_layout(op.result, target, op)


# ---------------------------------------------------------------------------------------------- lowering

@lower.rule(Splat)
def _splat(op: Splat, ctx: lower.Context) -> None:
    ctx.set(op.result, lower.Frag(op.result.layout, op.result.type.shape, op.result.dtype, [ctx.get(op.operands[0])]))


@lower.rule(Iota)
def _iota(op: Iota, ctx: lower.Context) -> None:
    out = op.result
    layout, shape, e = out.layout, out.type.shape, ctx.e
    base = e.addi(ctx.thread_index(layout, shape)[0], e.i32(op.start))
    elems = [e.addi(base, e.i32(off[0])) for off in element_offsets(layout, shape)]
    ctx.set(out, lower.Frag(layout, shape, out.dtype, elems))


@lower.rule(Broadcast)
def _broadcast(op: Broadcast, ctx: lower.Context) -> None:
    """The operand's layout is the result's layout reduced over the new axes (inference guarantees it), so
    each result element is found among the thread's own operand elements: no data moves. Or every thread holds
    every operand element (`Broadcast.takes_any_layout`): where the result's layout gives threads different
    operand elements, each picks its own by a select over them (`_held_element`)."""
    src = ctx.frag(op.operands[0])
    out = op.result
    if src.is_splat:
        ctx.set(out, lower.Frag(out.layout, out.type.shape, out.dtype, [src.elems[0]]))
        return
    layout: TiledLayout = out.layout
    shape = out.type.shape
    src_shape = src.shape
    position = {off: i for i, off in enumerate(element_offsets(src.layout, src_shape))}
    axes = tuple(d for d in range(len(shape)) if d not in op.dims)
    selected = (src.layout.holds_every_element and layout.reduce(axes, len(shape)) != src.layout
                and _threads_differ(layout, shape, op.dims))
    picked: dict[tuple[int, ...], Any] = {}
    elems = []
    for off in element_offsets(layout, shape):
        src_off = tuple(off[d] for d in op.dims)
        if selected:
            if src_off not in picked:
                picked[src_off] = _held_element(ctx, src, position, layout, shape, op.dims, src_off)
            elems.append(picked[src_off])
            continue
        i = position.get(src_off)
        if i is None:
            raise op.error(f"internal error: broadcast source layout {src.layout} does not hold element {src_off}")
        elems.append(src.elems[i])
    ctx.set(out, lower.Frag(layout, shape, out.dtype, elems))


def selectable(layout: TiledLayout, shape: tuple[int, ...]) -> bool:
    """Whether each thread can pick any element of an array in `layout` from its own registers by a select: every
    thread holds every element, and there are at most SELECTED_ELEMENTS."""
    return layout.holds_every_element and math.prod(shape) <= SELECTED_ELEMENTS


@functools.lru_cache(maxsize=256)
def _threads_differ(layout: TiledLayout, shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    """Whether threads of `layout` hold elements at different indices along `dims` in the same register."""
    first = next(layout.registers(shape))
    along = {tuple(layout.element_index(shape, tid, first, 0)[d] for d in dims)
             for tid in range(THREADS_PER_WARPGROUP)}
    return len(along) > 1


def _held_element(ctx: lower.Context, src: lower.Frag, position: dict, layout: TiledLayout, shape: tuple[int, ...],
                  dims: tuple[int, ...], src_off: tuple[int, ...]) -> Any:
    """The element of `src` (every thread holds all of them, at `position`) at index `src_off` past this thread's
    index along `dims` in `layout`: a select over them."""
    e = ctx.e
    base = ctx.thread_index(layout, shape)
    wanted = linear_index(ctx, [e.addi(base[d], e.i32(o)) for d, o in zip(dims, src_off)], src.shape)
    value = src.elems[0]
    for index, i in position.items():
        if i:
            value = e.select(e.cmpi("eq", wanted, e.i32(linear_offset(index, src.shape))), src.elems[i], value)
    return value


def linear_offset(index: tuple[int, ...], shape: tuple[int, ...]) -> int:
    """Row-major linear index of a static element index."""
    lin = 0
    for i, n in zip(index, shape):
        lin = lin * n + i
    return lin


def linear_index(ctx: lower.Context, index: list, shape: tuple[int, ...]):
    """Row-major linear index (i32) of an element index given as i32 values."""
    e = ctx.e
    lin = e.i32(0)
    for i, n in zip(index, shape):
        lin = e.addi(e.muli(lin, e.i32(n)), i)
    return lin


@lower.rule(ArraySlice)
def _array_slice(op: ArraySlice, ctx: lower.Context) -> None:
    """On whole tiles: each result element is the thread's own operand element at the slice's offset; else
    through SMEM, as a relayout is."""
    src = ctx.frag(op.operands[0])
    out = op.result
    if src.is_splat:
        ctx.set(out, lower.Frag(out.layout, out.type.shape, out.dtype, [src.elems[0]]))
        return
    if out.layout != src.layout or not slice_keeps_layout(src.layout, src.shape, op.starts, op.sizes):
        # (an off-tile slice may take a layout equal to its operand's: the elements still move between threads)
        ctx.set(out, _through_smem(ctx, src, out.layout, op.starts, op.sizes))
        return
    position = {off: i for i, off in enumerate(element_offsets(src.layout, src.shape))}
    elems = [src.elems[position[tuple(o + s for o, s in zip(off, op.starts))]]
             for off in element_offsets(out.layout, out.type.shape)]
    ctx.set(out, lower.Frag(out.layout, out.type.shape, out.dtype, elems))


@lower.rule(Relayout)
def _relayout(op: Relayout, ctx: lower.Context) -> None:
    """Splat → anything is free; from an array every thread holds whole (of at most SELECTED_ELEMENTS), each
    thread's own registers (`_held_element`); between other tiled layouts, through SMEM (each thread writes what
    it holds and reads what it needs)."""
    src = ctx.frag(op.operands[0])
    target = op.result.layout
    if src.is_splat:
        ctx.set(op.result, splat_to(ctx, src, target))
        return
    if isinstance(target, SplatLayout):
        raise op.error("internal error: relayout of an array into a splat")
    shape = src.shape
    if selectable(src.layout, shape):
        position = {off: i for i, off in enumerate(element_offsets(src.layout, shape))}
        dims = tuple(range(len(shape)))
        elems = [_held_element(ctx, src, position, target, shape, dims, off)
                 for off in element_offsets(target, shape)]
        ctx.set(op.result, lower.Frag(target, shape, src.dtype, elems))
        return
    ctx.set(op.result, _through_smem(ctx, src, target, (0,) * len(shape), shape))


def _through_smem(ctx: lower.Context, src: lower.Frag, target: Layout, starts: tuple[int, ...],
                  sizes: tuple[int, ...]) -> lower.Frag:
    """The block of `src` of `sizes` from `starts`, in `target`: each thread writes what it holds to SMEM and
    reads what it needs."""
    e = ctx.e
    shape, dtype = src.shape, src.dtype
    storage = dtypes.int8 if dtype == dtypes.bool_ else dtype
    size = math.prod(shape) * storage.itemsize
    base = ctx.alloc_smem(size)
    ctx.warpgroup_barrier()
    thread = ctx.thread_index(src.layout, shape)
    for off, x in zip(element_offsets(src.layout, shape), src.elems):
        idx = [e.addi(t, e.i32(o)) for t, o in zip(thread, off)]
        addr = e.addi(base, e.muli(linear_index(ctx, idx, shape), e.i32(storage.itemsize)))
        e.smem_store(e.zext(x, 8) if dtype == dtypes.bool_ else x, addr)
    ctx.warpgroup_barrier()
    thread = ctx.thread_index(target, sizes)
    elems = []
    for off in element_offsets(target, sizes):
        idx = [e.addi(t, e.i32(o + s)) for t, o, s in zip(thread, off, starts)]
        addr = e.addi(base, e.muli(linear_index(ctx, idx, shape), e.i32(storage.itemsize)))
        v = e.smem_load(e.type(storage), addr)
        elems.append(e.cmpi("ne", v, e.const(0, dtypes.int8)) if dtype == dtypes.bool_ else v)
    assert len(elems) == num_elems(target, sizes)
    return lower.Frag(target, tuple(sizes), dtype, elems)


# ---------------------------------------------------------------------------------------------- interpreter
# An array is one tensor of its logical shape: which thread holds an element does not change its value, so a
# relayout moves nothing and a broadcast is a view.

@interpret.rule(Splat)
def _interp_splat(op: Splat, wg: Warpgroup) -> None:
    wg.set(op.result, wg.get(op.operands[0], op).expand(op.result.type.shape))


@interpret.rule(Iota)
def _interp_iota(op: Iota, wg: Warpgroup) -> None:
    wg.set(op.result, torch.arange(op.start, op.start + op.result.type.shape[0], dtype=torch.int32))


@interpret.rule(Broadcast)
def _interp_broadcast(op: Broadcast, wg: Warpgroup) -> None:
    x = wg.get(op.operands[0], op)
    shape = op.result.type.shape
    order = sorted(range(len(op.dims)), key=lambda i: op.dims[i])
    view = [1] * len(shape)
    for i in order:
        view[op.dims[i]] = x.shape[i]
    wg.set(op.result, x.permute(order).reshape(view).expand(shape))


@interpret.rule(ArraySlice)
def _interp_array_slice(op: ArraySlice, wg: Warpgroup) -> None:
    x = wg.get(op.operands[0], op)
    wg.set(op.result, x[tuple(slice(s, s + n) for s, n in zip(op.starts, op.sizes))])


@interpret.rule(Relayout)
def _interp_relayout(op: Relayout, wg: Warpgroup) -> None:
    wg.set(op.result, wg.get(op.operands[0], op))
