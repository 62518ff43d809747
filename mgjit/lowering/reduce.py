"""Lowering rules that move data between threads: Reduce and Relayout.

A reduction combines, in order: the elements one thread holds that differ only along reduced axes; then
across lanes with butterfly shuffles (one per bit of each lane dimension that indexes a reduced axis); then
across warps through a small SMEM scratch owned by the warpgroup. Narrow floats accumulate in f32.
"""
from __future__ import annotations

import math

from .. import dtypes, ir
from ..layouts import SplatLayout, TiledLayout
from .core import Context, Frag, element_offsets, num_elems, rule, splat_to


def _combine(ctx: Context, kind: str, dtype, a, b):
    e = ctx.e
    if kind == "sum":
        return e.fbinary("add", a, b) if dtype.is_float else e.addi(a, b)
    if dtype.is_float:
        return e.fbinary(kind, a, b)
    return e.ibinary(kind, a, b, dtype.is_signed)


def _linear(ctx: Context, index: list, shape: tuple[int, ...]):
    """Row-major linear index (i32) of an element index given as i32 values."""
    e = ctx.e
    lin = e.i32(0)
    for i, n in zip(index, shape):
        lin = e.addi(e.muli(lin, e.i32(n)), i)
    return lin


@rule(ir.Reduce)
def _reduce(op: ir.Reduce, ctx: Context) -> None:
    e = ctx.e
    src = ctx.frag(op.operands[0])
    out = op.result
    dtype = src.dtype
    if dtype.bits == 64 or dtype == dtypes.bool_:
        raise op.error(f"reductions over {dtype.name} arrays are not supported; cast to a 32-bit type first")
    acc_dtype = dtypes.float32 if dtype.is_float else dtype
    rank = len(src.shape)
    reduced_count = math.prod(src.shape[a] for a in op.axes)

    if src.is_splat:
        x = e.cast(src.elems[0], dtype, acc_dtype)
        if op.kind == "sum":
            x = _combine(ctx, "mul", acc_dtype, x, e.const(reduced_count, acc_dtype)) if acc_dtype.is_float \
                else e.muli(x, e.const(reduced_count, acc_dtype))
        x = e.cast(x, acc_dtype, dtype)
        ctx.set(out, x if not out.is_array else Frag(out.layout, out.type.shape, dtype, [x]))
        return

    layout: TiledLayout = src.layout
    keep = [d for d in range(rank) if d not in op.axes]
    # 1. within the thread: group held elements by their offset along the kept axes.
    groups: dict[tuple, object] = {}
    for off, x in zip(element_offsets(layout, src.shape), src.elems):
        key = tuple(off[d] for d in keep)
        x = e.cast(x, dtype, acc_dtype)
        groups[key] = x if key not in groups else _combine(ctx, op.kind, acc_dtype, groups[key], x)
    # 2. across lanes.
    for stride, size in layout.reduced_lane_dims(op.axes, rank):
        s = stride
        while s < stride * size:
            groups = {k: _combine(ctx, op.kind, acc_dtype, v, e.shfl_bfly(v, s)) for k, v in groups.items()}
            s *= 2
    # 3. across warps, through SMEM: slot [warp coordinate along reduced dims][result element].
    warp_dims = layout.reduced_warp_dims(op.axes, rank)
    if warp_dims:
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
                slots[key] = _linear(ctx, idx, out_shape)
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
                acc = v if acc is None else _combine(ctx, op.kind, acc_dtype, acc, v)
            new[key] = acc
        groups = new
    # 4. lay the groups out in the result's register order.
    if not out.is_array:
        (x,) = groups.values()
        ctx.set(out, e.cast(x, acc_dtype, dtype))
        return
    elems = [e.cast(groups[off], acc_dtype, dtype) for off in element_offsets(out.layout, out.type.shape)]
    ctx.set(out, Frag(out.layout, out.type.shape, dtype, elems))


@rule(ir.Relayout)
def _relayout(op: ir.Relayout, ctx: Context) -> None:
    """Splat → anything is free; between tiled layouts, through SMEM (each thread writes what it holds and
    reads what it needs)."""
    e = ctx.e
    src = ctx.frag(op.operands[0])
    out = op.result
    target = out.layout
    if src.is_splat:
        ctx.set(out, splat_to(ctx, src, target))
        return
    if isinstance(target, SplatLayout):
        raise op.error("internal error: relayout of an array into a splat")
    shape, dtype = src.shape, src.dtype
    storage = dtypes.int8 if dtype == dtypes.bool_ else dtype
    size = math.prod(shape) * storage.itemsize
    base = ctx.alloc_smem(size)
    ctx.warpgroup_barrier()
    thread = ctx.thread_index(src.layout, shape)
    for off, x in zip(element_offsets(src.layout, shape), src.elems):
        idx = [e.addi(t, e.i32(o)) for t, o in zip(thread, off)]
        addr = e.addi(base, e.muli(_linear(ctx, idx, shape), e.i32(storage.itemsize)))
        e.smem_store(e.zext(x, 8) if dtype == dtypes.bool_ else x, addr)
    ctx.warpgroup_barrier()
    thread = ctx.thread_index(target, shape)
    elems = []
    for off in element_offsets(target, shape):
        idx = [e.addi(t, e.i32(o)) for t, o in zip(thread, off)]
        addr = e.addi(base, e.muli(_linear(ctx, idx, shape), e.i32(storage.itemsize)))
        v = e.smem_load(e.type(storage), addr)
        elems.append(e.cmpi("ne", v, e.const(0, dtypes.int8)) if dtype == dtypes.bool_ else v)
    assert len(elems) == num_elems(target, shape)
    ctx.set(out, Frag(target, shape, dtype, elems))
