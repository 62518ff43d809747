"""Shared memory: SmemAlloc (a static buffer for the whole kernel), RefIndex (`buf[slot]`, also of barrier
arrays), RefTranspose (`tile.T`), SmemStore (`tile[...] = array`), SmemLoad (`array = tile[...]`), and the
addressing every SMEM user shares.

How a tile is stored (column blocks one swizzle wide, the swizzle's XOR, the TMA boxes) is `tiles.Tile`'s
job; `tile_of` gives a reference's. MMA operand descriptors address its column blocks directly (K-major:
SBO = 8*S; MN-major: LBO = the distance between blocks).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch

from .. import infer, interpret, ir, lower, tiles
from .. import mma_descriptors as md
from ..dtypes import DType
from ..errors import Check, InterpretError, Loc
from ..interpret.checker import Access, check_read, check_write
from ..interpret.machine import CTA, BarrierRef
from ..interpret.scheduler import Warpgroup
from ..ir import ArrayType, Op, RefType, Value, check, is_int_scalar, is_ref
from ..layouts import SplatLayout, blocked
from ..lower.context import element_offsets, splat_to
from ..lower.emit import Index
from ..mma_descriptors import SmemDescriptor, SmemSwizzle, wgmma_smem_descriptor
from ..lower.words import from_bits, pack_words, unpack_words

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


def tile_alignment(t: RefType) -> int:
    """Where an SMEM buffer may start: a swizzled one on the swizzle pattern's repeat (the XOR reads address
    bits), any other on 128 bytes."""
    return tiles.SWIZZLE_ALIGN if t.swizzle else 128


def stored_k_major(t: RefType, k_axis: int) -> bool:
    """Whether an MMA operand viewed as `t`, whose K runs along logical axis `k_axis` (A is (M, K): 1; B is
    (K, N): 0), is stored K-major: K is the last, contiguous, dimension of the tile it views."""
    return (k_axis == 1) != t.transposed


def descriptor_fields(t: RefType, mn_offset: int, k_offset: int, k_major: bool) -> tuple[int, SmemDescriptor]:
    """The operand block at (mn_offset, k_offset) of an SMEM tile as an MMA descriptor addresses it: its byte
    offset in the tile, and the descriptor's fields with start address 0.

    K-major: the tile is stored (MN, K) in column blocks along K; MN-major: stored (K, MN) in column blocks
    along MN. The stored shape is the tile's own (before any transposed view).
    """
    stored = tile_of(t)
    s = stored.swizzle
    if k_major:
        byte = stored.offset(mn_offset, k_offset, swizzled=False)
        lbo, sbo = 16, 8 * s  # LBO is unused by swizzled K-major layouts
    else:
        assert mn_offset % stored.block_cols == 0, "an MN-major operand block starts on a swizzle column"
        byte = stored.offset(k_offset, mn_offset, swizzled=False)
        lbo, sbo = stored.rows * s, 8 * s
    return byte, SmemDescriptor(0, lbo, sbo, SmemSwizzle.from_bytes(s))


@lower.rule(SmemAlloc)
def _smem_alloc(op: SmemAlloc, ctx: lower.Context) -> None:
    t = op.result.type
    offset = ctx.alloc_shared(tile_of(t).nbytes, tile_alignment(t))
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
    the wgmma format or, with encode=tcgen05_smem_descriptor, the tcgen05 one (they differ only there): the
    fields of `descriptor_fields` with the tile's shared address added."""
    e = ctx.e
    byte, fields = descriptor_fields(tile.type, mn_offset, k_offset, k_major)
    return descriptor_at(ctx, e.addi(shared_address(ctx, tile.offset), e.i32(byte)), encode(fields))


def descriptor_at(ctx: lower.Context, addr: Any, const: int) -> Any:
    """A 64-bit shared-memory descriptor (i64): the fields `const` encodes, with start address 0, and the start
    address field of `addr`, an i32 shared-window address."""
    e = ctx.e
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


# ---------------------------------------------------------------------------------------------- interpreter
# An SMEM reference is an SmemTile whose offset is an int: the same in every CTA, so that a peer's tile is the
# same offset in the peer's bytes.

def smem_plan(kernel: ir.Kernel) -> tuple[dict[int, int], int]:
    """Byte offsets of the kernel's SMEM buffers (by id(SmemAlloc)) in program order, aligned as the lowering
    aligns them, and the bytes they need in all."""
    offsets, size = {}, 0
    for op in kernel.walk():
        if isinstance(op, SmemAlloc):
            align = tile_alignment(op.result.type)
            size = -(-size // align) * align
            offsets[id(op)] = size
            size += tile_of(op.result.type).nbytes
    return offsets, -(-size // 16) * 16


@functools.lru_cache(maxsize=64)
def tile_byte_offsets(tile: tiles.Tile) -> torch.Tensor:
    """The byte offset of every element of a tile, shape (rows, cols): where an SMEM store puts it."""
    rows = torch.arange(tile.rows, dtype=torch.int64)[:, None]
    cols = torch.arange(tile.cols, dtype=torch.int64)[None, :]
    return tile.offset(rows, cols)


def tile_range(tile: SmemTile) -> tuple[int, int]:
    return tile.offset, tile.offset + tile_of(tile.type).nbytes


def mma_operand(cta: CTA, tile: SmemTile, mn_offset: int, rows: int, k_offset: int, k: int, k_major: bool,
                tcgen05: bool) -> torch.Tensor:
    """The (rows, k) block of an SMEM operand that one MMA instruction reads, read as the tensor cores read it:
    through the descriptor the lowering encodes for it (decoded field by field), not through the tile's own
    geometry, so that a wrong descriptor reads wrong numbers."""
    byte, fields = descriptor_fields(tile.type, mn_offset, k_offset, k_major)
    encode = md.tcgen05_smem_descriptor if tcgen05 else wgmma_smem_descriptor
    desc = md.decode_smem_descriptor(encode(dataclasses.replace(fields, start_address=tile.offset + byte)), tcgen05)
    mn = torch.arange(rows, dtype=torch.int64)[:, None]
    kk = torch.arange(k, dtype=torch.int64)[None, :]
    address = md.operand_address(desc, md.Major.K if k_major else md.Major.MN, mn, kk, tile.type.dtype.bits)
    return cta.read_smem(address, tile.type.dtype)


@interpret.rule(SmemAlloc)
def _interp_smem_alloc(op: SmemAlloc, wg: Warpgroup) -> None:
    wg.set(op.result, SmemTile(wg.run.smem_offsets[id(op)], op.result.type))


@interpret.rule(RefIndex)
def _interp_ref_index(op: RefIndex, wg: Warpgroup) -> None:
    src = wg.get(op.operands[0], op)
    index = int(wg.scalar(op.operands[1], op))
    t = op.operands[0].type
    if not 0 <= index < t.shape[0]:
        what = "barrier array" if t.space == "barrier" else "SMEM buffer"
        alloc = op.operands[0].owner
        while isinstance(alloc, (RefIndex, RefTranspose)):
            alloc = alloc.operands[0].owner
        raise InterpretError(f"index {index} is outside this {what} of {t.shape[0]} (shape {t.shape})", op.loc,
                             Check.OUT_OF_BOUNDS, (alloc.loc,) if isinstance(alloc, Op) and alloc.loc else ())
    if t.space == "barrier":
        wg.set(op.result, BarrierRef(src.alloc, index))
    else:
        wg.set(op.result, SmemTile(src.offset + index * tile_of(op.result.type).nbytes, op.result.type))


@interpret.rule(RefTranspose)
def _interp_ref_transpose(op: RefTranspose, wg: Warpgroup) -> None:
    wg.set(op.result, SmemTile(wg.get(op.operands[0], op).offset, op.result.type))


@interpret.rule(SmemStore)
def _interp_smem_store(op: SmemStore, wg: Warpgroup) -> None:
    """Each element goes where `Tile.offset` puts it (the lowering's addressing); the store is recorded as the
    warpgroup's, unfenced until fence_async_shared (or a TMA store, which fences first)."""
    tile = wg.get(op.operands[0], op)
    value = wg.get(op.operands[1], op)
    stored = tile_of(tile.type)
    start, end = tile_range(tile)
    cta = wg.cta
    check_write(cta.smem_records, start, end, wg.clock, op.loc, "this SMEM store")
    cta.write_smem(tile.offset + tile_byte_offsets(stored), value.reshape(stored.rows, stored.cols), tile.type.dtype)
    cta.smem_records.add(Access(start, end, "store", wg.agent, wg.event(), op.loc, "SMEM store", fenced=False))


@interpret.rule(SmemLoad)
def _interp_smem_load(op: SmemLoad, wg: Warpgroup) -> None:
    """Each element read from where `Tile.offset` puts it (a transposed view reads its stored tile and swaps the
    indices); the bytes must not be written by a TMA copy not yet waited for, nor by another warpgroup's store
    that nothing orders before this read."""
    tile = wg.get(op.operands[0], op)
    stored = tile_of(tile.type)
    start, end = tile_range(tile)
    check_read(wg.cta.smem_records, start, end, wg.clock, op.loc, "this SMEM read", async_proxy=False)
    values = wg.cta.read_smem(tile.offset + tile_byte_offsets(stored), tile.type.dtype).reshape(stored.shape)
    wg.set(op.result, values.transpose(-1, -2) if tile.type.transposed else values)
