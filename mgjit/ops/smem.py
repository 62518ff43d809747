"""Shared memory: SmemAlloc (a static buffer for the whole kernel), RefIndex (`buf[slot]`, also of barrier
arrays), RefTranspose (`tile.T`), SmemStore (`tile[...] = array`), SmemLoad (`array = tile[...]`), and the
addressing every SMEM user shares.

How a tile is stored (column blocks one swizzle wide, the swizzle's XOR, the TMA boxes) is `tiles.Tile`'s
job; `tile_of` gives a reference's. MMA operand descriptors address its column blocks directly (K-major:
SBO = 8*S; MN-major: LBO = the distance between blocks).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .. import infer, lower, tiles
from ..dtypes import DType
from ..errors import Loc, Rule
from ..ir import ArrayType, Op, RefType, Value, check, is_int_scalar, is_ref
from ..layouts import SplatLayout, blocked
from ..lower.context import element_offsets, splat_to
from ..lower.emit import Index
from ..mma_descriptors import SmemDescriptor, SmemSwizzle, wgmma_smem_descriptor
from .gmem import from_bits, pack_words, unpack_words

class SmemAlloc(Op):
    """A static shared-memory buffer, allocated for the whole kernel (leading dims are usually stages)."""

    name = "smem_alloc"

    def __init__(self, shape: tuple[int, ...], dtype: DType, swizzle: int | None, loc: Loc | None):
        super().__init__([], [RefType("smem", dtype, len(shape), shape, swizzle)], loc)

    def attrs(self):
        t = self.result.type
        return {"shape": t.shape, "dtype": t.dtype.name, "swizzle": t.swizzle}


class RefIndex(Op):
    """`ref[i]`: drop the leading dimension of an SMEM or barrier reference at a runtime index."""

    name = "ref_index"

    def __init__(self, ref: Value, index: Value, loc: Loc | None):
        t = ref.type
        shape = t.shape[1:]
        super().__init__([ref, index], [RefType(t.space, t.dtype, t.rank - 1, shape, t.swizzle)], loc)

    def verify(self):
        t = self.operands[0].type
        check(t.space in ("smem", "barrier") and t.rank >= 1 and not t.transposed, self,
               f"only SMEM and barrier references can be indexed by a stage, got {t}")
        check(is_int_scalar(self.operands[1]), self, "a stage index must be an integer scalar")


class RefTranspose(Op):
    """`ref.T`: the same 2D SMEM tile read with its dimensions swapped (an MN-major MMA operand)."""

    name = "ref_transpose"

    def __init__(self, ref: Value, loc: Loc | None):
        t = ref.type
        super().__init__([ref], [RefType("smem", t.dtype, 2, (t.shape[1], t.shape[0]), t.swizzle, not t.transposed)],
                         loc)

    def verify(self):
        t = self.operands[0].type
        check(t.space == "smem" and t.rank == 2, self, f".T applies to 2D SMEM tiles, got {t}")


class SmemStore(Op):
    """Write a register array into a whole SMEM tile (swizzled as the tile is), for TMA or MMA to read."""

    name = "smem_store"

    def __init__(self, tile: Value, value: Value, loc: Loc | None):
        super().__init__([tile, value], [], loc)

    def verify(self):
        tile, value = self.operands
        check(is_ref(tile, "smem") and not tile.type.transposed, self, "store into an SMEM tile (not a transposed view)")
        shape = value.type.shape if value.is_array else ()
        check(shape == tile.type.shape, self, f"storing an array of shape {shape} into an SMEM tile of shape "
               f"{tile.type.shape}")
        check(value.dtype == tile.dtype, self, f"storing {value.dtype.name} into a {tile.dtype.name} SMEM tile; "
               "use .astype()")


class SmemLoad(Op):
    """Read a whole SMEM tile (or a transposed view of one) into a register array. Any register layout can be
    read, so the array takes the layout its users need (a free anchor for inference). It sees what the
    warpgroup's threads stored before it (a warpgroup barrier comes first), and what TMA copies completed on a
    barrier the warpgroup waited on."""

    name = "smem_load"
    free_anchor = True

    def __init__(self, tile: Value, loc: Loc | None):
        super().__init__([tile], [ArrayType(tuple(tile.type.shape), tile.dtype)], loc)

    def verify(self):
        check(is_ref(self.operands[0], "smem"), self, "smem_load reads an SMEM tile")


infer.rule(SmemAlloc, RefIndex, RefTranspose, SmemStore)(infer.no_arrays)
infer.rule(SmemLoad)(infer.free_anchor_layout)


# ---------------------------------------------------------------------------------------------- lowering

@dataclasses.dataclass
class SmemTile:
    offset: Any  # i32 byte offset into dynamic SMEM (runtime value)
    type: RefType


def shared_address(ctx: lower.Context, offset) -> Any:
    """The 32-bit shared-window address of a byte offset into the kernel's dynamic SMEM."""
    e = ctx.e
    base = e.m.llvm.ptrtoint(e.int_type(32), e.smem_base())
    return e.addi(base, offset)


def tile_of(t: RefType) -> tiles.Tile:
    """The storage of an SMEM reference (of the tile it views, for a transposed view)."""
    return tiles.Tile(tuple(t.shape[::-1] if t.transposed else t.shape), t.dtype.storage_bits, t.swizzle)


def check_smem_budget(ctx: lower.Context, op: Op) -> None:
    limit = ctx.target.smem_bytes
    if ctx.smem_bytes > limit:
        raise op.error(f"shared memory: the kernel needs {ctx.smem_bytes} bytes by this allocation, more than the "
                       f"{limit} bytes a CTA can have (fewer stages or smaller tiles)", rule=Rule.SMEM_BUDGET)


@lower.rule(SmemAlloc)
def _smem_alloc(op: SmemAlloc, ctx: lower.Context) -> None:
    t = op.result.type
    offset = ctx.alloc_shared(tile_of(t).nbytes, tiles.SWIZZLE_ALIGN if t.swizzle else 128)
    check_smem_budget(ctx, op)
    ctx.set(op.result, SmemTile(ctx.e.i32(offset), t))


@lower.rule(RefIndex)
def _ref_index(op: RefIndex, ctx: lower.Context) -> None:
    e = ctx.e
    src: SmemTile = ctx.get(op.operands[0])
    t = op.result.type
    stride = 8 if t.space == "barrier" else tile_of(t).nbytes
    ctx.set(op.result, SmemTile(e.addi(src.offset, e.muli(ctx.get(op.operands[1]), e.i32(stride))), t))


@lower.rule(RefTranspose)
def _ref_transpose(op: RefTranspose, ctx: lower.Context) -> None:
    ctx.set(op.result, SmemTile(ctx.get(op.operands[0]).offset, op.result.type))


def operand_descriptor(ctx: lower.Context, tile: SmemTile, mn_offset: int, k_offset: int, k_major: bool,
                       encode: Callable[[SmemDescriptor], int] = wgmma_smem_descriptor) -> Any:
    """The MMA descriptor (i64) of the operand block starting at (mn_offset, k_offset) of an SMEM tile, in
    the wgmma format or, with encode=tcgen05_smem_descriptor, the tcgen05 one (they differ only there).

    K-major: the tile is stored (MN, K) in column blocks along K; MN-major: stored (K, MN) in column blocks
    along MN. `k_major` says which; the stored shape is the tile's own (before any transposed view).
    """
    e = ctx.e
    stored = tile_of(tile.type)
    s = stored.swizzle
    if k_major:
        byte = stored.offset(mn_offset, k_offset, swizzled=False)
        lbo, sbo = 16, 8 * s  # LBO is unused by swizzled K-major layouts
    else:
        assert mn_offset % stored.block_cols == 0, "an MN-major operand block starts on a swizzle column"
        byte = stored.offset(k_offset, mn_offset, swizzled=False)
        lbo, sbo = stored.rows * s, 8 * s
    const = encode(SmemDescriptor(0, lbo, sbo, SmemSwizzle.from_bytes(s)))
    addr = e.addi(shared_address(ctx, tile.offset), e.i32(byte))
    field = e.ext_i64(e.m.arith.shrui(e.andi(addr, e.i32(0x3FFFF)), e.i32(4)), signed=False)
    return e.m.arith.ori(field, e.i64(const))


def _accesses(ctx: lower.Context, tile: SmemTile, layout, shape: tuple[int, ...], bits: int):
    """The SMEM accesses that move a register array in `layout` to or from a tile: (shared-window address,
    first element, elements) for each, several contiguous elements of a register's vector along the stored
    last dimension going as one access within a 16-byte chunk. A transposed view reads its stored tile with the
    indices swapped."""
    e = ctx.e
    stored = tile_of(tile.type)
    transposed = tile.type.transposed
    w = 1
    if layout.vector_dim is not None and not transposed:
        entries = layout.tiling.dim_strides(len(shape))
        dim, stride = entries[len(entries) + layout.vector_dim]
        if dim == len(shape) - 1 and stride == 1:
            w = max(1, min(layout.vector_length, 128 // bits))
            while w > 1 and (w * bits) % 32:
                w //= 2
    thread = ctx.thread_index(layout, shape)
    offsets = element_offsets(layout, shape)
    base = shared_address(ctx, e.i32(0))
    for i in range(0, len(offsets), w):
        off = offsets[i]
        idx = [e.addi(t, e.i32(o)) if o else t for t, o in zip(thread, off)]
        if transposed:
            idx = idx[::-1]
        row = e.i32(0)
        for d in range(len(shape) - 1):
            row = e.addi(e.muli(row, e.i32(stored.shape[d])), idx[d])
        addr = e.addi(base, (Index(e, tile.offset) + stored.offset(Index(e, row), Index(e, idx[-1]))).value)
        yield addr, i, w


@lower.rule(SmemStore)
def _smem_store(op: SmemStore, ctx: lower.Context) -> None:
    e = ctx.e
    tile: SmemTile = ctx.get(op.operands[0])
    frag: lower.Frag = ctx.frag(op.operands[1])
    shape = tile.type.shape
    if isinstance(frag.layout, SplatLayout):
        frag = splat_to(ctx, frag, blocked(shape, frag.dtype))
    bits = frag.dtype.storage_bits
    for addr, i, w in _accesses(ctx, tile, frag.layout, shape, bits):
        words = pack_words(e, frag.elems[i:i + w], frag.dtype) if w * bits >= 32 else None
        if words is None:
            value = frag.elems[i]
            x = e.bitcast(value, e.int_type(bits)) if frag.dtype.is_float else value
            e.asm_void(f"st.shared.b{bits} [$0], $1;", "r,h" if bits == 16 else "r,r",
                       [addr, x if bits >= 16 else e.zext(x, 16)])
            continue
        n = len(words)
        vec = f".v{n}" if n > 1 else ""
        srcs = ", ".join(f"${j + 1}" for j in range(n))
        e.asm_void(f"st.shared{vec}.b32 [$0], {'{' + srcs + '}' if n > 1 else srcs};", ",".join(["r"] + ["r"] * n),
                   [addr, *words])


@lower.rule(SmemLoad)
def _smem_load(op: SmemLoad, ctx: lower.Context) -> None:
    e = ctx.e
    tile: SmemTile = ctx.get(op.operands[0])
    out = op.result
    dtype, layout, shape = out.dtype, out.layout, out.type.shape
    bits = dtype.storage_bits
    elems: list[Any] = []
    ctx.warpgroup_barrier()  # elements other threads of the warpgroup stored
    for addr, i, w in _accesses(ctx, tile, layout, shape, bits):
        if w * bits < 32:
            half = e.asm(f"ld.shared.{'b16' if bits == 16 else 'u8'} $0, [$1];", "=h,r", [addr], [e.int_type(16)])[0]
            x = half if bits == 16 else e.trunc(half, 8)
            elems.append(from_bits(e, x, dtype))
            continue
        n = w * bits // 32
        outs = ", ".join(f"${j}" for j in range(n))
        words = e.asm(f"ld.shared{f'.v{n}' if n > 1 else ''}.b32 {'{' + outs + '}' if n > 1 else outs}, [${n}];",
                      ",".join(["=r"] * n + ["r"]), [addr], [e.int_type(32)] * n)
        elems.extend(unpack_words(e, words, dtype, w))
    ctx.set(out, lower.Frag(layout, shape, dtype, elems))
