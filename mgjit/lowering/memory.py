"""Lowering rules for GMEM windows: Load and Store.

Each thread moves the elements its layout gives it. Consecutive elements of a register's vector that are
contiguous in memory go as one access of up to 16 bytes when the launch's specialization proves it legal:
unit last stride, base and row strides aligned, the window's start and the last dimension's size divisible
by the access width (so that one bounds check covers the whole access). Every access is predicated on the
window being inside the tensor: ragged edges need no code from the user.
"""
from __future__ import annotations

from .. import dtypes, ir
from ..dtypes import DType
from ..layouts import SplatLayout, TiledLayout, blocked, LayoutError
from .core import Context, Frag, LoweredRef, element_offsets, int_divisor, num_elems, rule, splat_to


def _access_width(ctx: Context, op: ir.Op, ref: LoweredRef, layout: TiledLayout, shape: tuple[int, ...]) -> int:
    rank = len(op.sizes)
    if not ref.spec.unit_stride or op.squeeze[rank - 1] or not shape or layout.vector_dim is None:
        return 1
    entries = layout.tiling.dim_strides(len(shape))
    vdim, vstride = entries[len(entries) + layout.vector_dim]
    if vdim != len(shape) - 1 or vstride != 1:
        return 1
    itemsize = ref.dtype.itemsize
    w = min(layout.vector_length, max(16 // itemsize, 1), max(ref.spec.align // itemsize, 1),
            int_divisor(ctx, op.starts[rank - 1]), ref.spec.size_div)
    # Every other tiled dim along the last axis must step in whole accesses.
    for (d, s), size in zip(entries, layout.tiled_shape(shape)):
        if d == len(shape) - 1 and size > 1 and s % w and s != 1:
            return 1
    return max(w, 1)


def _element_addresses(ctx: Context, op: ir.Op, ref: LoweredRef, layout, shape: tuple[int, ...]):
    """Per held element: (i64 byte address, i1 in-bounds predicate)."""
    e = ctx.e
    rank = len(op.sizes)
    arr_dims = [d for d in range(rank) if not op.squeeze[d]]
    starts = [ctx.get(s) for s in op.starts]
    thread = ctx.thread_index(layout, shape) if shape else []
    base_idx = list(starts)
    for a, d in enumerate(arr_dims):
        base_idx[d] = e.addi(starts[d], thread[a])
    itemsize = e.i64(ref.dtype.itemsize)
    offsets = element_offsets(layout, shape) if shape else [()]
    out = []
    for off in offsets:
        addr = ref.ptr
        pred = None
        for d in range(rank):
            idx = base_idx[d]
            if d in arr_dims and off[arr_dims.index(d)]:
                idx = e.addi(idx, e.i32(off[arr_dims.index(d)]))
            inside = e.cmpi("ult", idx, ref.sizes[d])
            pred = inside if pred is None else e.andi(pred, inside)
            idx64 = e.ext_i64(idx)
            term = idx64 if (d == rank - 1 and ref.spec.unit_stride) else e.muli(idx64, ref.strides[d])
            addr = e.addi(addr, e.muli(term, itemsize))
        out.append((addr, pred))
    return out


def _storage_bits(dtype: DType) -> int:
    return 8 if dtype == dtypes.bool_ else dtype.bits


def _to_bits(e, x, dtype: DType):
    """An element as an integer of its storage width."""
    bits = _storage_bits(dtype)
    if dtype == dtypes.bool_:
        return e.zext(x, 8)
    if dtype.is_float:
        return e.bitcast(x, e.int_type(bits))
    return x


def _from_bits(e, x, dtype: DType):
    if dtype == dtypes.bool_:
        return e.cmpi("ne", x, e.const(0, dtypes.int8))
    if dtype.is_float:
        return e.bitcast(x, e.type(dtype))
    return x


def _pack_words(e, elems, dtype: DType) -> list:
    """Elements (one access) → 32-bit words (or one narrower integer for accesses under 32 bits)."""
    bits = _storage_bits(dtype)
    ints = [_to_bits(e, x, dtype) for x in elems]
    if bits == 64:
        words = []
        for x in ints:
            words.append(e.trunc(x, 32))
            words.append(e.trunc(e.m.arith.shrui(x, e.i64(32)), 32))
        return words
    per_word = 32 // bits
    if per_word == 1:
        return ints
    # Narrow elements go through a vector<per_word x iN> bitcast: one register move, not shifts and ors.
    return [e.pack_i32(ints[i:i + per_word]) for i in range(0, len(ints), per_word)]


def _unpack_words(e, words, dtype: DType, count: int) -> list:
    bits = _storage_bits(dtype)
    if bits == 64:
        out = []
        for lo, hi in zip(words[0::2], words[1::2]):
            x = e.ori(e.zext(lo, 64), e.m.arith.shli(e.zext(hi, 64), e.i64(32)))
            out.append(_from_bits(e, x, dtype))
        return out
    per_word = 32 // bits
    if per_word == 1:
        return [_from_bits(e, w, dtype) for w in words][:count]
    out = [x for w in words for x in e.unpack_i32(w, bits)]
    return [_from_bits(e, x, dtype) for x in out[:count]]


def _access_suffix(total_bits: int) -> tuple[str, int]:
    """The ld/st type suffix and the number of 32-bit registers for one access of `total_bits`."""
    if total_bits >= 32:
        n = total_bits // 32
        return (f".v{n}.b32" if n > 1 else ".b32"), n
    return {16: ".u16", 8: ".u8"}[total_bits], 1


def _load_access(ctx: Context, addr, pred, dtype: DType, count: int) -> list:
    e = ctx.e
    suffix, n = _access_suffix(count * _storage_bits(dtype))
    outs = ", ".join(f"${i}" for i in range(n))
    dst = f"{{{outs}}}" if n > 1 else outs
    zero = " ".join(f"mov.b32 ${i}, 0;" for i in range(n))
    text = f"{zero} @${n} ld.global{suffix} {dst}, [${n + 1}];"
    constraints = ",".join(["=r"] * n + ["b", "l"])
    words = e.asm(text, constraints, [pred, addr], [e.int_type(32)] * n, side_effects=True)
    if count * _storage_bits(dtype) < 32:
        words = [e.trunc(words[0], count * _storage_bits(dtype))]
        return _unpack_narrow(e, words[0], dtype, count)
    return _unpack_words(e, words, dtype, count)


def _unpack_narrow(e, word, dtype: DType, count: int) -> list:
    bits = _storage_bits(dtype)
    out = []
    for j in range(count):
        x = e.m.arith.shrui(word, e.const(j * bits, _int_of(word, e))) if j else word
        if word.type != e.int_type(bits):
            x = e.trunc(x, bits)
        out.append(_from_bits(e, x, dtype))
    return out


def _int_of(word, e) -> DType:
    width = e.ir.IntegerType(word.type).width
    return {8: dtypes.int8, 16: dtypes.int16, 32: dtypes.int32}[width]


def _store_access(ctx: Context, addr, pred, elems, dtype: DType) -> None:
    e = ctx.e
    total = len(elems) * _storage_bits(dtype)
    suffix, n = _access_suffix(total)
    if total < 32:
        ints = [_to_bits(e, x, dtype) for x in elems]
        word = None
        for j, x in enumerate(ints):
            x32 = e.zext(x, 32)
            if j:
                x32 = e.m.arith.shli(x32, e.i32(j * _storage_bits(dtype)))
            word = x32 if word is None else e.ori(word, x32)
        words = [word]
    else:
        words = _pack_words(e, elems, dtype)
    srcs = ", ".join(f"${i + 2}" for i in range(n))
    src = f"{{{srcs}}}" if n > 1 else srcs
    e.asm_void(f"@$0 st.global{suffix} [$1], {src};", ",".join(["b", "l"] + ["r"] * n), [pred, addr, *words])


@rule(ir.Load)
def _load(op: ir.Load, ctx: Context) -> None:
    ref: LoweredRef = ctx.get(op.ref)
    out = op.result
    dtype = ref.dtype
    if not out.is_array:
        ((addr, pred),) = _element_addresses(ctx, op, ref, None, ())
        ctx.set(out, _load_access(ctx, addr, pred, dtype, 1)[0])
        return
    layout, shape = out.layout, out.type.shape
    w = _access_width(ctx, op, ref, layout, shape)
    addrs = _element_addresses(ctx, op, ref, layout, shape)
    elems = []
    for i in range(0, len(addrs), w):
        addr, pred = addrs[i]
        elems.extend(_load_access(ctx, addr, pred, dtype, w))
    ctx.set(out, Frag(layout, shape, dtype, elems))


@rule(ir.Store)
def _store(op: ir.Store, ctx: Context) -> None:
    ref: LoweredRef = ctx.get(op.ref)
    value = op.value
    dtype = ref.dtype
    e = ctx.e
    if not value.is_array:
        ((addr, pred),) = _element_addresses(ctx, op, ref, None, ())
        pred = e.andi(pred, e.cmpi("eq", ctx.wg_tid, e.i32(0)))
        _store_access(ctx, addr, pred, [ctx.get(value)], dtype)
        return
    frag = ctx.frag(value)
    shape = frag.shape
    if isinstance(frag.layout, SplatLayout):
        try:
            frag = splat_to(ctx, frag, blocked(shape, dtype))
        except LayoutError as err:
            raise op.error(str(err), rule="layout") from None
    layout = frag.layout
    w = _access_width(ctx, op, ref, layout, shape)
    addrs = _element_addresses(ctx, op, ref, layout, shape)
    primary = ctx.is_primary(layout)
    assert len(addrs) == num_elems(layout, shape)
    for i in range(0, len(addrs), w):
        addr, pred = addrs[i]
        _store_access(ctx, addr, e.andi(pred, primary), frag.elems[i:i + w], dtype)
