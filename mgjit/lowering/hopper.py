"""Lowering rules for the Hopper machinery: SMEM buffers, mbarriers, TMA copies and wgmma.

SMEM tiles are stored as column blocks one swizzle wide: a (rows, cols) tile under an S-byte swizzle is
cols*itemsize/S blocks of rows x S bytes, each copied by one TMA box and each a run of 8-row swizzle atoms
that wgmma descriptors address directly (K-major: SBO = 8*S; MN-major: LBO = distance between blocks).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from .. import dtypes, ir
from ..mma_descriptors import SmemDescriptor, SmemSwizzle, wgmma_smem_descriptor
from .core import Context, Frag, rule

_SWIZZLE_ALIGN = 1024  # the 128B swizzle pattern repeats every 1024 bytes; tiles start on that boundary


@dataclasses.dataclass
class SmemTile:
    offset: Any  # i32 byte offset into dynamic SMEM (runtime value)
    type: ir.RefType


def _shared_address(ctx: Context, offset) -> Any:
    """The 32-bit shared-window address of a byte offset into the kernel's dynamic SMEM."""
    e = ctx.e
    base = e.m.llvm.ptrtoint(e.int_type(32), e.smem_base())
    return e.addi(base, offset)


def _tile_bytes(t: ir.RefType) -> int:
    return math.prod(t.shape) * t.dtype.bits // 8


# Dynamic shared memory one CTA may use on sm_90a and sm_100a (227 KiB).
SMEM_LIMIT = 232448


def check_smem_budget(ctx: Context, op: ir.Op) -> None:
    if ctx.smem_bytes > SMEM_LIMIT:
        raise op.error(f"shared memory: the kernel needs {ctx.smem_bytes} bytes by this allocation, more than the "
                       f"{SMEM_LIMIT} bytes a CTA can have (fewer stages or smaller tiles)", rule="smem-budget")


@rule(ir.SmemAlloc)
def _smem_alloc(op: ir.SmemAlloc, ctx: Context) -> None:
    t = op.result.type
    offset = ctx.alloc_shared(_tile_bytes(t), _SWIZZLE_ALIGN if t.swizzle else 128)
    check_smem_budget(ctx, op)
    ctx.set(op.result, SmemTile(ctx.e.i32(offset), t))


@rule(ir.BarrierAlloc)
def _barrier_alloc(op: ir.BarrierAlloc, ctx: Context) -> None:
    e = ctx.e
    offset = ctx.alloc_shared(8 * op.count, 8)
    base = _shared_address(ctx, e.i32(offset))
    first = e.cmpi("eq", ctx.tid, e.i32(0))
    for i in range(op.count):
        e.asm_void(f"@$0 mbarrier.init.shared::cta.b64 [$1], {op.arrivals};", "b,r", [first, e.addi(base, e.i32(8 * i))])
    # Make the initialised barriers visible to every thread and to the async proxy before any use.
    e.asm_void("fence.mbarrier_init.release.cluster;", "", [])
    e.asm_void("bar.sync 0;", "", [])
    ctx.set(op.result, SmemTile(e.i32(offset), op.result.type))


@rule(ir.RefIndex)
def _ref_index(op: ir.RefIndex, ctx: Context) -> None:
    e = ctx.e
    src: SmemTile = ctx.get(op.operands[0])
    t = op.result.type
    stride = 8 if t.space == "barrier" else _tile_bytes(t)
    ctx.set(op.result, SmemTile(e.addi(src.offset, e.muli(ctx.get(op.operands[1]), e.i32(stride))), t))


@rule(ir.RefTranspose)
def _ref_transpose(op: ir.RefTranspose, ctx: Context) -> None:
    ctx.set(op.result, SmemTile(ctx.get(op.operands[0]).offset, op.result.type))


@rule(ir.TmaLoad)
def _tma_load(op: ir.TmaLoad, ctx: Context) -> None:
    e = ctx.e
    dst: SmemTile = ctx.get(op.dst)
    bar = _shared_address(ctx, ctx.get(op.barrier).offset)
    desc = ctx.tma_descriptors[op.descriptor]
    spec = ctx.kernel.tma_descriptors[op.descriptor]
    t = dst.type
    rank = len(t.shape)
    box_inner = spec.box[-1]
    blocks = t.shape[-1] // box_inner
    block_bytes = _tile_bytes(t) // blocks
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    # The barrier expects the whole tile, also under multicast, where the other CTAs deliver their parts.
    e.asm_void(f"@$0 mbarrier.arrive.expect_tx.shared::cta.b64 _, [$1], {_tile_bytes(t)};", "b,r", [elected, bar])
    coords = [ctx.get(c) for c in op.coords]
    dst_addr = _shared_address(ctx, dst.offset)
    extra, suffix, mask = [], "", []
    if op.multicast:
        # This CTA copies rows [rank*R/n, (rank+1)*R/n) of every column block, to every CTA of the cluster.
        n = op.multicast
        rank_id = e.asm("mov.u32 $0, %cluster_ctarank;", "=r", [], [e.int_type(32)])[0]
        part_rows = spec.box[0]
        first_row = e.muli(rank_id, e.i32(part_rows))
        coords = [e.addi(coords[0], first_row)] + coords[1:]
        dst_addr = e.addi(dst_addr, e.muli(first_row, e.i32(block_bytes // t.shape[0])))
        suffix = ".multicast::cluster"
        mask = [e.trunc(e.i32((1 << n) - 1), 16)]
        extra = [f"${4 + rank}"]
    for j in range(blocks):
        inner = e.addi(coords[-1], e.i32(j * box_inner)) if j else coords[-1]
        # TMA coordinates are innermost first.
        ordered = [inner] + coords[-2::-1]
        slots = ", ".join(f"${i + 4}" for i in range(rank))
        e.asm_void(
            f"@$0 cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes{suffix} "
            f"[$1], [$2, {{{slots}}}], [$3]{''.join(', ' + x for x in extra)};",
            ",".join(["b", "r", "l", "r"] + ["r"] * rank + ["h"] * len(mask)),
            [elected, e.addi(dst_addr, e.i32(j * block_bytes)), desc, bar, *ordered, *mask])


@rule(ir.BarrierArrive)
def _barrier_arrive(op: ir.BarrierArrive, ctx: Context) -> None:
    e = ctx.e
    bar = _shared_address(ctx, ctx.get(op.operands[0]).offset)
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))  # one arrival per warpgroup
    e.asm_void("@$0 mbarrier.arrive.shared::cta.b64 _, [$1];", "b,r", [elected, bar])


@rule(ir.BarrierWait)
def _barrier_wait(op: ir.BarrierWait, ctx: Context) -> None:
    e = ctx.e
    bar = _shared_address(ctx, ctx.get(op.operands[0]).offset)
    e.asm_void("{ .reg .pred done; WAIT: mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1; "
               "@!done bra WAIT; }", "r,r", [bar, ctx.get(op.operands[1])])


@rule(ir.ClusterRank)
def _cluster_rank(op: ir.ClusterRank, ctx: Context) -> None:
    ctx.set(op.result, ctx.e.asm("mov.u32 $0, %cluster_ctarank;", "=r", [], [ctx.e.int_type(32)])[0])


@rule(ir.ClusterSync)
def _cluster_sync(op: ir.ClusterSync, ctx: Context) -> None:
    ctx.e.asm_void("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;", "", [])


@rule(ir.FenceAsyncShared)
def _fence(op: ir.FenceAsyncShared, ctx: Context) -> None:
    ctx.e.asm_void("fence.proxy.async.shared::cta;", "", [])


@rule(ir.SetMaxRegisters)
def _set_max_registers(op: ir.SetMaxRegisters, ctx: Context) -> None:
    ctx.e.asm_void(f"setmaxnreg.{'inc' if op.increase else 'dec'}.sync.aligned.u32 {op.count};", "", [])


_PTX_TYPE = {dtypes.bfloat16: "bf16", dtypes.float16: "f16", dtypes.float32: "tf32",
             dtypes.float8_e4m3fn: "e4m3", dtypes.float8_e5m2: "e5m2"}


def operand_descriptor(ctx: Context, tile: SmemTile, mn_offset: int, k_offset: int, k_major: bool,
                       encode: Callable[[SmemDescriptor], int] = wgmma_smem_descriptor) -> Any:
    """The MMA descriptor (i64) of the operand block starting at (mn_offset, k_offset) of an SMEM tile, in
    the wgmma format or, with encode=tcgen05_smem_descriptor, the tcgen05 one (they differ only there).

    K-major: the tile is stored (MN, K) in column blocks along K; MN-major: stored (K, MN) in column blocks
    along MN. `k_major` says which; the stored shape is the tile's own (before any transposed view).
    """
    e = ctx.e
    t = tile.type
    s = t.swizzle
    isz = t.dtype.bits // 8
    per_row = s // isz  # elements in one swizzle-wide row
    rows, _ = (t.shape[::-1] if t.transposed else t.shape)  # stored rows
    if k_major:
        block, within = divmod(k_offset, per_row)
        byte = block * rows * s + mn_offset * s + within * isz
        lbo, sbo = 16, 8 * s  # LBO is unused by swizzled K-major layouts
    else:
        block, within = divmod(mn_offset, per_row)
        assert within == 0, "an MN-major operand block starts on a swizzle column (checked by the MMA op)"
        byte = block * rows * s + k_offset * s
        lbo, sbo = rows * s, 8 * s
    const = encode(SmemDescriptor(0, lbo, sbo, SmemSwizzle.from_bytes(s)))
    addr = e.addi(_shared_address(ctx, tile.offset), e.i32(byte))
    field = e.ext_i64(e.m.arith.shrui(e.andi(addr, e.i32(0x3FFFF)), e.i32(4)), signed=False)
    return e.m.arith.ori(field, e.i64(const))


@rule(ir.Wgmma)
def _wgmma(op: ir.Wgmma, ctx: Context) -> None:
    e = ctx.e
    acc: Frag = ctx.frag(op.operands[0])
    a = ctx.get(op.operands[1])  # an SmemTile, or a Frag for A from registers
    b: SmemTile = ctx.get(op.operands[2])
    m, n = op.result.type.shape
    a_regs = isinstance(a, Frag)
    k = op.operands[1].type.shape[1]
    dtype = op.operands[1].dtype
    k_step = 256 // dtype.bits
    a_k_major = a_regs or not a.type.transposed  # a is (M, K): stored K-major unless it is a transposed view
    b_k_major = b.type.transposed  # b is (K, N): stored N-major unless it is a transposed view of (N, K)
    ab = _PTX_TYPE[dtype]
    per_tile = n // 2  # accumulator registers per thread per m64 tile
    elems = list(acc.elems)
    f32 = e.type(dtypes.float32)
    e.asm_void("wgmma.fence.sync.aligned;", "", [])
    one = e.i32(1)
    for t in range(m // 64):
        regs = elems[t * per_tile:(t + 1) * per_tile]
        for kk in range(k // k_step):
            db = operand_descriptor(ctx, b, 0, kk * k_step, b_k_major)
            outs = ", ".join(f"${i}" for i in range(per_tile))
            if a_regs:
                # The A fragment of one m64k16 step: 8 elements per thread, (column block, row half, pair)
                # in the WGMMA layout's register order, packed into 4 b32 registers a0..a3.
                per_block = k // 8 * 2 * 2  # elements per m64 tile of A, per thread
                chunk = a.elems[t * per_block + kk * 8:t * per_block + kk * 8 + 8]
                a_ops = [e.pack_i32([e.bitcast(x, e.int_type(16)) for x in chunk[i:i + 2]]) for i in range(0, 8, 2)]
                a_text = "{" + ", ".join(f"${per_tile + i}" for i in range(4)) + "}"
                a_cons = ["r"] * 4
            else:
                a_ops = [operand_descriptor(ctx, a, t * 64, kk * k_step, a_k_major)]
                a_text, a_cons = f"${per_tile}", ["l"]
            nb = per_tile + len(a_ops)
            # Only 16-bit operands have the transpose immediates (tf32 and fp8 must be K-major); A in
            # registers has only B's.
            if dtype.bits != 16:
                transposes = ""
            elif a_regs:
                transposes = f", {0 if b_k_major else 1}"
            else:
                transposes = f", {0 if a_k_major else 1}, {0 if b_k_major else 1}"
            text = (f"{{ .reg .pred p; setp.ne.b32 p, ${nb + 1}, 0; "
                    f"wgmma.mma_async.sync.aligned.m64n{n}k{k_step}.f32.{ab}.{ab} {{{outs}}}, {a_text}, "
                    f"${nb}, p, 1, 1{transposes}; }}")
            constraints = ",".join(["=f"] * per_tile + a_cons + ["l", "r"] + [str(i) for i in range(per_tile)])
            regs = e.asm(text, constraints, [*a_ops, db, one, *regs], [f32] * per_tile, side_effects=True)
        elems[t * per_tile:(t + 1) * per_tile] = regs
    e.asm_void("wgmma.commit_group.sync.aligned;", "", [])
    ctx.set(op.result, Frag(acc.layout, acc.shape, acc.dtype, elems))


_CONSTRAINT = {32: "f", 16: "h"}


@rule(ir.WgmmaWait)
def _wgmma_wait(op: ir.WgmmaWait, ctx: Context) -> None:
    e = ctx.e
    flat, where = [], []
    for v in op.operands:
        f = ctx.frag(v)
        where.append((len(flat), len(f.elems)))
        flat.extend(f.elems)
    if not flat:
        e.asm_void(f"wgmma.wait_group.sync.aligned {op.pending};", "", [])
        return
    cons = []
    for x in flat:
        cons.append("r" if str(x.type).startswith("i") else "f")
    constraints = ",".join([f"={c}" for c in cons] + [str(i) for i in range(len(flat))])
    out = e.asm(f"wgmma.wait_group.sync.aligned {op.pending};", constraints, flat, [x.type for x in flat],
                side_effects=True)
    for v, r, (start, count) in zip(op.operands, op.results, where):
        f = ctx.frag(v)
        ctx.set(r, Frag(f.layout, f.shape, f.dtype, out[start:start + count]))


def _swizzled(ctx: Context, tile: SmemTile, row, col) -> Any:
    """The byte offset (i32) of element (row, col) of an SMEM tile; rows count over all leading dims.

    Swizzled tiles are column blocks one swizzle wide; within a block the 16-byte chunk index of each
    128-byte line is XORed with the line index modulo swizzle/16 (the pattern TMA and wgmma apply)."""
    e = ctx.e
    t = tile.type
    isz = t.dtype.bits // 8
    rows = math.prod(t.shape[:-1])
    if not t.swizzle:
        return e.addi(tile.offset, e.muli(e.addi(e.muli(row, e.i32(t.shape[-1])), col), e.i32(isz)))
    s = t.swizzle
    per_row = s // isz
    block = e.divui(col, e.i32(per_row))
    linear = e.addi(e.muli(row, e.i32(s)), e.muli(e.remui(col, e.i32(per_row)), e.i32(isz)))
    chunk_xor = e.m.arith.shli(e.andi(e.m.arith.shrui(linear, e.i32(7)), e.i32(s // 16 - 1)), e.i32(4))
    swizzled = e.m.arith.xori(linear, chunk_xor)
    return e.addi(tile.offset, e.addi(e.muli(block, e.i32(rows * s)), swizzled))


@rule(ir.SmemStore)
def _smem_store(op: ir.SmemStore, ctx: Context) -> None:
    from ..layouts import blocked, SplatLayout
    from .core import element_offsets, splat_to
    from .memory import _pack_words, _storage_bits
    e = ctx.e
    tile: SmemTile = ctx.get(op.operands[0])
    frag: Frag = ctx.frag(op.operands[1])
    shape = tile.type.shape
    if isinstance(frag.layout, SplatLayout):
        frag = splat_to(ctx, frag, blocked(shape, frag.dtype))
    layout = frag.layout
    bits = _storage_bits(frag.dtype)
    # Contiguous elements of a register's vector along the last dim go as one store, within one 16-byte chunk.
    w = 1
    if layout.vector_dim is not None:
        entries = layout.tiling.dim_strides(len(shape))
        dim, stride = entries[len(entries) + layout.vector_dim]
        if dim == len(shape) - 1 and stride == 1:
            w = max(1, min(layout.vector_length, 128 // bits))
            while w > 1 and (w * bits) % 32:
                w //= 2
    thread = ctx.thread_index(layout, shape)
    offsets = element_offsets(layout, shape)
    base = _shared_address(ctx, e.i32(0))
    for i in range(0, len(offsets), w):
        off = offsets[i]
        idx = [e.addi(t, e.i32(o)) if o else t for t, o in zip(thread, off)]
        row = e.i32(0)
        for d in range(len(shape) - 1):
            row = e.addi(e.muli(row, e.i32(shape[d])), idx[d])
        addr = e.addi(base, _swizzled(ctx, tile, row, idx[-1]))
        words = _pack_words(e, frag.elems[i:i + w], frag.dtype) if w * bits >= 32 else None
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


@rule(ir.TmaStore)
def _tma_store(op: ir.TmaStore, ctx: Context) -> None:
    e = ctx.e
    src: SmemTile = ctx.get(op.operands[-1])
    desc = ctx.tma_descriptors[op.descriptor]
    spec = ctx.kernel.tma_descriptors[op.descriptor]
    t = src.type
    rank = len(t.shape)
    blocks = t.shape[-1] // spec.box[-1]
    block_bytes = _tile_bytes(t) // blocks
    # Every thread's ordinary SMEM writes must be visible to the TMA engine before one thread issues it.
    e.asm_void("fence.proxy.async.shared::cta;", "", [])
    ctx.warpgroup_barrier()
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    coords = [ctx.get(c) for c in op.coords]
    src_addr = _shared_address(ctx, src.offset)
    verb = (f"cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.{op.reduce}.tile.bulk_group" if op.reduce
            else f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group")
    for j in range(blocks):
        inner = e.addi(coords[-1], e.i32(j * spec.box[-1])) if j else coords[-1]
        ordered = [inner] + coords[-2::-1]
        slots = ", ".join(f"${i + 3}" for i in range(rank))
        e.asm_void(f"@$0 {verb} [$1, {{{slots}}}], [$2];", ",".join(["b", "l", "r"] + ["r"] * rank),
                   [elected, desc, e.addi(src_addr, e.i32(j * block_bytes)), *ordered])
    e.asm_void("@$0 cp.async.bulk.commit_group;", "b", [elected])


@rule(ir.TmaStoreWait)
def _tma_store_wait(op: ir.TmaStoreWait, ctx: Context) -> None:
    e = ctx.e
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    e.asm_void(f"@$0 cp.async.bulk.wait_group.read {op.pending};", "b", [elected])
    ctx.warpgroup_barrier()  # the whole warpgroup may now overwrite the tiles
