"""Shared memory: SmemAlloc (a static buffer for the whole kernel), SmemStore (`tile[...] = array`), SmemLoad
(`array = tile[...]`), and the addressing every SMEM user shares; views of a buffer are smem_views.py's.

How a tile is stored (stages of column blocks one swizzle wide, the swizzle's XOR, the TMA boxes, where a view
may be cut) is `tiles.Tile`'s job; `tile_of` gives a reference's. MMA operand descriptors address its column
blocks directly (K-major: SBO = 8*S; MN-major: LBO = the distance between blocks).

Reads and writes of register arrays take the layout inference chose; where that layout's accesses hit one
bank more than once per wavefront under the tile's swizzle (`bank_conflicts`), the IR notes it on the op and
the lowering warns at the user's line (`BankConflictWarning`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import Any, Callable, Sequence

import torch

from .. import infer, interpret, lower, tiles
from .. import mma_descriptors as md
from ..dtypes import DType
from ..errors import BankConflictWarning, Loc, compile_warning
from ..interpret.checker import Access, check_read, check_write
from ..interpret.machine import CTA
from ..interpret.scheduler import Warpgroup
from ..ir import ArrayType, Op, RefType, Value, check, is_ref
from ..layouts import THREADS_PER_WARPGROUP, LANES_PER_WARP, LayoutError, SplatLayout, TiledLayout, blocked
from ..lower.context import element_offsets, splat_to, stored_layout
from ..lower.emit import Index
from ..mma_descriptors import SmemDescriptor, SmemSwizzle, wgmma_smem_descriptor
from ..lower.words import from_bits, pack_words, to_bits, unpack_words

class SmemAlloc(Op):
    """A static shared-memory buffer, allocated for the whole kernel (leading dims are usually stages)."""

    name = "smem_alloc"

    def __init__(self, shape: tuple[int, ...], dtype: DType, swizzle: int | None, loc: Loc | None):
        super().__init__([], [RefType("smem", dtype, len(shape), shape, swizzle)], loc)

    def attrs(self):
        t = self.result.type
        return {"shape": t.shape, "dtype": t.dtype.name, "swizzle": t.swizzle}


class SmemStore(Op):
    """Write a register array into a whole SMEM tile (swizzled as the tile is), for TMA or MMA to read."""

    name = "smem_store"
    thread_smem = "store"

    def __init__(self, tile: Value, value: Value, loc: Loc | None):
        super().__init__([tile, value], [], loc)

    def attrs(self):
        return conflict_note(self.operands[0].type, self.operands[1])

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
    warpgroup's threads stored before it (a warpgroup barrier comes first, where a store may have come since the
    warpgroup last met), and what TMA copies completed on a barrier the warpgroup waited on."""

    name = "smem_load"
    free_anchor = True
    thread_smem = "load"

    def __init__(self, tile: Value, loc: Loc | None):
        super().__init__([tile], [ArrayType(tuple(tile.type.shape), tile.dtype)], loc)

    def attrs(self):
        return conflict_note(self.operands[0].type, self.result)

    def verify(self):
        check(is_ref(self.operands[0], "smem"), self, "smem_load reads an SMEM tile")

    def costs_in(self, layout) -> bool:
        if not isinstance(layout, TiledLayout):
            return False
        total, ideal = bank_conflicts(self.operands[0].type, layout, tuple(self.result.type.shape))
        return total > ideal


infer.rule(SmemAlloc)(infer.no_arrays)
infer.rule(SmemLoad)(infer.free_anchor_layout)


@infer.rule(SmemStore)
def _infer_smem_store(op: SmemStore, inf: infer.Inference) -> None:
    """No array of its own. Where the stored array's layout conflicts on the tile's banks and comes from free
    anchors alone (a GMEM load, cast or scaled on the way), inference restarts with them in the coalesced layout
    of the tile's dtype, if that one does not conflict: a bf16 load stored as float32 anchors 16 bytes of bf16 a
    lane, 32 bytes of float32 (two-way conflicts); 16 bytes of float32 a lane have none. A stored array copied over
    threads is spread where that layout does not conflict (`infer.spread_stored`)."""
    value, t = op.operands[1], op.operands[0].type
    if not value.is_array or not isinstance(value.layout, TiledLayout):
        return
    shape = tuple(value.type.shape)
    total, ideal = bank_conflicts(t, value.layout, shape)
    if total <= ideal:
        infer.spread_stored(op, inf, value, lambda layout: operator.le(*bank_conflicts(t, layout, shape)))
        return
    anchors = infer.free_origins(value)
    try:
        coalesced = blocked(shape, t.dtype)
    except LayoutError:
        return
    restart = inf.placement(anchors, coalesced)
    if restart is None:
        return
    total, ideal = bank_conflicts(t, coalesced, shape)
    if coalesced != value.layout and total <= ideal:
        raise restart


# ---------------------------------------------------------------------------------------------- addressing

def tile_of(t: RefType) -> tiles.Tile:
    """The storage of an SMEM reference (of the tile it views, for a transposed view)."""
    return tiles.Tile(tuple(t.shape[::-1] if t.transposed else t.shape), t.dtype.storage_bits, t.swizzle, t.storage)


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
    along MN. The stored shape is the tile's own (before any transposed view); the distance between column
    blocks is its storage's (a view of some rows of a wider tile keeps the blocks of the tile).
    """
    stored = tile_of(t)
    s = stored.swizzle
    if k_major:
        byte = stored.offset(mn_offset, k_offset, swizzled=False)
        lbo, sbo = 16, 8 * s  # LBO is unused by swizzled K-major layouts
    else:
        assert mn_offset % stored.block_cols == 0, "an MN-major operand block starts on a swizzle column"
        byte = stored.offset(k_offset, mn_offset, swizzled=False)
        lbo, sbo = stored.block_rows * s, 8 * s
    return byte, SmemDescriptor(0, lbo, sbo, SmemSwizzle.from_bytes(s))


def access_width(t: RefType, layout: TiledLayout, shape: tuple[int, ...]) -> int:
    """Elements one SMEM access moves: consecutive elements of a register's vector along the stored last
    dimension, whole 32-bit words within one 16-byte chunk, aligned to their size wherever a row starts."""
    bits = t.dtype.storage_bits
    if layout.vector_dim is None or t.transposed:
        return 1
    entries = layout.tiling.dim_strides(len(shape))
    dim, stride = entries[len(entries) + layout.vector_dim]
    if dim != len(shape) - 1 or stride != 1:
        return 1
    row_align = math.gcd(16, tile_of(t).row_bytes) * 8
    w = max(1, min(layout.vector_length, 128 // bits))
    while w > 1 and ((w * bits) % 32 or row_align % (w * bits)):
        w //= 2
    return w


def element_offset(stored: tiles.Tile, index: Sequence[Any], transposed: bool) -> Any:
    """The byte offset in the stored tile of the element at logical `index` of a reference (ints, index
    tensors or lowering Indexes): leading indices fold into the stored row."""
    if transposed:
        index = index[::-1]
    row = index[0] if len(index) > 1 else 0
    for d in range(1, len(index) - 1):
        row = row * stored.shape[d] + index[d]
    return stored.offset(row, index[-1])


@functools.lru_cache(maxsize=256)
def bank_conflicts(t: RefType, layout: TiledLayout, shape: tuple[int, ...]) -> tuple[int, int]:
    """(wavefronts, the fewest its bytes need) of the worst warp-wide access that moves an array in `layout`
    to or from a tile typed `t` (the accesses `_accesses` emits, `tiles.wavefronts` per warp)."""
    stored = tile_of(t)
    w = access_width(t, layout, shape)
    nbytes = w * stored.itemsize
    thread = torch.tensor([layout.element_index(shape, tid, [0] * len(layout.registers_shape(shape)), 0)
                           for tid in range(THREADS_PER_WARPGROUP)], dtype=torch.int64)
    offsets = torch.tensor(element_offsets(layout, shape)[::w], dtype=torch.int64)
    index = thread[None, :, :] + offsets[:, None, :]  # (access, thread, dim)
    addresses = element_offset(stored, [index[..., d] for d in range(len(shape))], t.transposed).tolist()
    worst = (1, 1)
    for per_access in {tuple(a) for a in addresses}:
        for first in range(0, THREADS_PER_WARPGROUP, LANES_PER_WARP):
            total, ideal = tiles.wavefronts(list(per_access[first:first + LANES_PER_WARP]), nbytes)
            if total * worst[1] > worst[0] * ideal:
                worst = (total, ideal)
    return worst


def conflict_note(t: RefType, array: Value) -> dict:
    """The IR's note on an SMEM access of `array` whose layout is inferred and conflicts: {"bank_conflict":
    "4-way"}. A splat array is written in the coalesced layout of its shape, as the lowering writes it."""
    if array.layout is None or not array.is_array:
        return {}
    shape = tuple(array.type.shape)
    layout = blocked(shape, array.dtype) if isinstance(array.layout, SplatLayout) else array.layout
    total, ideal = bank_conflicts(t, layout, shape)
    return {"bank_conflict": f"{total / ideal:g}-way"} if total > ideal else {}


def warn_bank_conflicts(op: Op, t: RefType, layout: TiledLayout, shape: tuple[int, ...], what: str) -> None:
    """Warn at the op's line when its accesses conflict (BankConflictWarning)."""
    total, ideal = bank_conflicts(t, layout, shape)
    if total <= ideal or op.loc is None:
        return
    swizzle = f"{t.swizzle}B swizzle" if t.swizzle else "no swizzle"
    view = ", read transposed" if t.transposed else ""
    compile_warning(
        f"{what} of the {t.dtype.name}{list(t.shape)} SMEM tile ({swizzle}{view}) in the layout inference chose "
        f"takes {total} shared-memory wavefronts per warp where {ideal} would do ({total / ideal:g}-way bank "
        f"conflicts): a 128B swizzle, or an array in the tile's own row order, avoids them",
        BankConflictWarning, op.loc)


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


@lower.rule(SmemAlloc)
def _smem_alloc(op: SmemAlloc, ctx: lower.Context) -> None:
    t = op.result.type
    offset = ctx.alloc_shared(tile_of(t).nbytes, tile_alignment(t))
    ctx.set(op.result, SmemTile(ctx.e.i32(offset), t))


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


def _accesses(ctx: lower.Context, tile: SmemTile, layout, shape: tuple[int, ...]):
    """The SMEM accesses that move a register array in `layout` to or from a tile: (shared-window address,
    first element, elements) for each (`access_width` elements at a time). A transposed view reads its stored
    tile with the indices swapped."""
    e = ctx.e
    stored = tile_of(tile.type)
    w = access_width(tile.type, layout, shape)
    thread = ctx.thread_index(layout, shape)
    if ctx.rematerialize:  # the addresses are computed here, from the thread's index read here
        thread = [e.opaque(t) for t in thread]
    offsets = element_offsets(layout, shape)
    base = shared_address(ctx, e.i32(0))
    for i in range(0, len(offsets), w):
        idx = [Index(e, e.addi(t, e.i32(o)) if o else t) for t, o in zip(thread, offsets[i])]
        offset = Index(e, tile.offset) + element_offset(stored, idx, tile.type.transposed)
        yield e.addi(base, offset.value), i, w


@lower.rule(SmemStore)
def _smem_store(op: SmemStore, ctx: lower.Context) -> None:
    e = ctx.e
    tile: SmemTile = ctx.get(op.operands[0])
    frag: lower.Frag = ctx.frag(op.operands[1])
    shape = tile.type.shape
    if isinstance(frag.layout, SplatLayout):
        frag = splat_to(ctx, frag, stored_layout(op.operands[1]))
    warn_bank_conflicts(op, tile.type, frag.layout, shape, "this SMEM store")
    bits = frag.dtype.storage_bits
    ctx.smem_write_barrier(op.operands[0], frag.layout)  # elements other threads of the warpgroup may yet read
    for addr, i, w in _accesses(ctx, tile, frag.layout, shape):
        store_shared(e, addr, frag.elems[i:i + w] if w * bits >= 32 else frag.elems[i:i + 1], frag.dtype)
    ctx.stored(op.operands[0], frag.layout)


def store_shared(e, addr, elems: list, dtype: DType, pred=None) -> None:
    """One access at shared-window address `addr`: `elems` as their 32-bit words (st.shared.v{n}.b32), or one
    element narrower than a word; where `pred` holds (None: always)."""
    bits = dtype.storage_bits
    guard, operands, constraints = ("", [], []) if pred is None else ("@$0 ", [pred], ["b"])
    k = len(operands)
    if len(elems) * bits >= 32:
        words = pack_words(e, elems, dtype)
        vec = f".v{len(words)}" if len(words) > 1 else ""
        srcs = ", ".join(f"${k + 1 + j}" for j in range(len(words)))
        e.asm_void(f"{guard}st.shared{vec}.b32 [${k}], {'{' + srcs + '}' if len(words) > 1 else srcs};",
                   ",".join(constraints + ["r"] * (1 + len(words))), [*operands, addr, *words])
        return
    (x,) = elems
    x = to_bits(e, x, dtype)
    e.asm_void(f"{guard}st.shared.{'u8' if bits == 8 else f'b{bits}'} [${k}], ${k + 1};",
               ",".join(constraints + ["r", "h"]), [*operands, addr, e.zext(x, 16) if bits == 8 else x])


@lower.rule(SmemLoad)
def _smem_load(op: SmemLoad, ctx: lower.Context) -> None:
    e = ctx.e
    tile: SmemTile = ctx.get(op.operands[0])
    out = op.result
    dtype, layout, shape = out.dtype, out.layout, out.type.shape
    warn_bank_conflicts(op, tile.type, layout, shape, "this SMEM read")
    bits = dtype.storage_bits
    elems: list[Any] = []
    ctx.smem_read_barrier(op.operands[0])  # elements other threads of the warpgroup stored
    for addr, i, w in _accesses(ctx, tile, layout, shape):
        if w * bits < 32:
            half = e.asm(f"ld.shared.{'b16' if bits == 16 else 'u8'} $0, [$1];", "=h,r", [addr], [e.int_type(16)],
                         side_effects=True)[0]
            x = half if bits == 16 else e.trunc(half, 8)
            elems.append(from_bits(e, x, dtype))
            continue
        n = w * bits // 32
        outs = ", ".join(f"${j}" for j in range(n))
        words = e.asm(f"ld.shared{f'.v{n}' if n > 1 else ''}.b32 {'{' + outs + '}' if n > 1 else outs}, [${n}];",
                      ",".join(["=r"] * n + ["r"]), [addr], [e.int_type(32)] * n, side_effects=True)
        elems.extend(unpack_words(e, words, dtype, w))
    ctx.loaded(op.operands[0], layout)
    ctx.set(out, lower.Frag(layout, shape, dtype, elems))


# ---------------------------------------------------------------------------------------------- interpreter
# An SMEM reference is an SmemTile whose offset is an int: the same in every CTA, so that a peer's tile is the
# same offset in the peer's bytes.

@functools.lru_cache(maxsize=64)
def tile_byte_offsets(tile: tiles.Tile) -> torch.Tensor:
    """The byte offset of every element of a tile, shape (rows, cols): where an SMEM store puts it."""
    rows = torch.arange(tile.rows, dtype=torch.int64)[:, None]
    cols = torch.arange(tile.cols, dtype=torch.int64)[None, :]
    return tile.offset(rows, cols)


def tile_ranges(tile: SmemTile) -> list[tuple[int, int]]:
    """The SMEM byte ranges [start, end) a tile's elements occupy (one for a whole tile; a view of some rows of
    a tile of several column blocks has one per block)."""
    return [(tile.offset + start, tile.offset + end) for start, end in tile_of(tile.type).spans()]


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


@interpret.rule(SmemStore)
def _interp_smem_store(op: SmemStore, wg: Warpgroup) -> None:
    """Each element goes where `Tile.offset` puts it (the lowering's addressing); the store is recorded as the
    warpgroup's, unfenced until fence_async_shared (or a TMA store, which fences first)."""
    tile = wg.get(op.operands[0], op)
    value = wg.get(op.operands[1], op)
    stored = tile_of(tile.type)
    cta = wg.cta
    ranges = tile_ranges(tile)
    for start, end in ranges:
        check_write(cta.smem_records, start, end, wg.clock, op.loc, "this SMEM store")
    cta.write_smem(tile.offset + tile_byte_offsets(stored), value.reshape(stored.rows, stored.cols), tile.type.dtype)
    event = wg.event()
    for start, end in ranges:
        cta.smem_records.add(Access(start, end, "store", wg.agent, event, op.loc, "SMEM store", fenced=False))


@interpret.rule(SmemLoad)
def _interp_smem_load(op: SmemLoad, wg: Warpgroup) -> None:
    """Each element read from where `Tile.offset` puts it (a transposed view reads its stored tile and swaps the
    indices); the bytes must not be written by a TMA copy not yet waited for, nor by another warpgroup's store
    that nothing orders before this read."""
    tile = wg.get(op.operands[0], op)
    stored = tile_of(tile.type)
    for start, end in tile_ranges(tile):
        check_read(wg.cta.smem_records, start, end, wg.clock, op.loc, "this SMEM read", async_proxy=False)
    values = wg.cta.read_smem(tile.offset + tile_byte_offsets(stored), tile.type.dtype).reshape(stored.shape)
    wg.set(op.result, values.transpose(-1, -2) if tile.type.transposed else values)
