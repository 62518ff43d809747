"""Lowering rules for the Blackwell machinery: tensor memory (TMEM), tcgen05 MMA, TMA loads of a 2-CTA pair.

Tensor memory. Warp 0 allocates every TMEM reference of the kernel with one `tcgen05.alloc` (the sum of their
columns, each reference aligned to its own power-of-two size, rounded up to a power of two of at least 32),
writes the address to an SMEM word, relinquishes the allocation permit and synchronises the CTA (the CTA pair
in a 2-CTA kernel) with the tcgen05 fences around the barrier; every thread then reads the address. The end of
the kernel (TmemDealloc) synchronises again and warp 0 frees the columns. A TMEM address is lane << 16 |
column; a lowered reference is the address of its (lane 0, first column).

MMA. One thread issues every tcgen05.mma of a Tcgen05Mma: thread 0 of the issuing warpgroup, and in a 2-CTA
kernel only in the pair's leader CTA (even cluster rank). The accumulator's TMEM layout says how many
instructions one K step takes (`TMEMLayout.mma_pieces`: a half-lane accumulator takes two M=64 MMAs, the second
at lane offset 16). Operands in SMEM are addressed by tcgen05 shared-memory descriptors over the same
column-block storage as wgmma's (see hopper.py): K-major SBO = 8 rows x swizzle; MN-major LBO = the distance
between swizzle-wide column blocks. The instruction descriptor comes from `mma_descriptors`.

Registers. tcgen05.ld/st follow `TMEMLayout.access`: every warp addresses its own 32-lane quarter (warp w of a
warpgroup may touch lanes 32w..32w+31 only). Loads are followed by tcgen05.wait::ld with the loaded registers
threaded through it, so no use of them can be scheduled before the wait.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from .. import ir
from ..layouts import LANES_PER_WARP
from ..mma_descriptors import (
    Major,
    Tcgen05InstrDescriptor,
    tcgen05_kind,
    tcgen05_smem_descriptor,
)
from ..tmem_layouts import TMEM_COLUMNS, TMEMLayout, tmem_alloc_columns
from .core import Context, Frag, rule
from .hopper import SmemTile, operand_descriptor

BLACKWELL_TARGET = "sm_100a"
_ARCH_NAMES = {"sm_90a": "Hopper", "sm_100a": "Blackwell"}


@dataclasses.dataclass
class TmemRef:
    """A lowered TMEM reference."""

    addr: Any  # i32 TMEM address of its (lane 0, first column)
    type: ir.TmemRefType
    layout: TMEMLayout


@dataclasses.dataclass
class _TmemState:
    """The kernel's one allocation (made at its first TmemAlloc)."""

    base: Any  # i32 TMEM address tcgen05.alloc returned
    columns: int  # the columns allocated
    cta_group: int
    offsets: dict[int, int]  # id(TmemAlloc) -> first column of its reference


def require_blackwell(op: ir.Op, ctx: Context, what: str) -> None:
    """CompileError naming the kernel line unless this kernel is compiled for sm_100a."""
    target = getattr(ctx, "target", BLACKWELL_TARGET)
    if target != BLACKWELL_TARGET:
        arch = f" ({_ARCH_NAMES[target]})" if target in _ARCH_NAMES else ""
        raise op.error(f"{what} needs {BLACKWELL_TARGET} (Blackwell): tensor memory and tcgen05 exist only there; "
                       f"this kernel is being compiled for {target}{arch}", rule="target-arch")


def _shared_address(ctx: Context, offset) -> Any:
    """The 32-bit shared-window address of a byte offset into the kernel's dynamic SMEM."""
    e = ctx.e
    return e.addi(e.m.llvm.ptrtoint(e.int_type(32), e.smem_base()), offset)


def _i32(ctx: Context):
    return ctx.e.int_type(32)


def _cta_rank(ctx: Context) -> Any:
    """%cluster_ctarank (the rank of this CTA in its cluster)."""
    return ctx.e.asm("mov.u32 $0, %cluster_ctarank;", "=r", [], [_i32(ctx)])[0]


def _leader_rank(ctx: Context) -> Any:
    """The cluster rank of this CTA pair's leader (the even one)."""
    return ctx.e.andi(_cta_rank(ctx), ctx.e.i32(~1))


def _issuer(ctx: Context, cta_group: int) -> Any:
    """i1: this thread issues the tcgen05.mma/commit of its warpgroup (thread 0; in the leader CTA for 2 CTAs)."""
    e = ctx.e
    pred = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    if cta_group == 2:
        pred = e.andi(pred, e.cmpi("eq", e.andi(_cta_rank(ctx), e.i32(1)), e.i32(0)))
    return pred


def _thread_sync(ctx: Context, cta_group: int) -> None:
    """Order tcgen05 operations across all threads of the CTA (of both CTAs of a pair): fence, barrier, fence."""
    e = ctx.e
    e.asm_void("tcgen05.fence::before_thread_sync;", "", [])
    if cta_group == 2:
        e.asm_void("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;", "", [])
    else:
        e.asm_void("bar.sync 0;", "", [])
    e.asm_void("tcgen05.fence::after_thread_sync;", "", [])


def _warp0(ctx: Context) -> Any:
    return ctx.e.cmpi("ult", ctx.tid, ctx.e.i32(LANES_PER_WARP))


# ---------------------------------------------------------------------------------------------- TMEM

def _allocate(op: ir.TmemAlloc, ctx: Context) -> _TmemState:
    allocs = [o for o in ctx.kernel.body.ops if isinstance(o, ir.TmemAlloc)]
    cta_group = ir.kernel_cta_group(ctx.kernel)
    offsets, used = {}, 0
    # Largest first: powers of two then pack without gaps, each aligned to its own size.
    for o in sorted(allocs, key=lambda o: -o.columns):
        offsets[id(o)] = used
        used += o.columns
        if used > TMEM_COLUMNS:
            raise o.error(f"the kernel's TMEM references need {used} columns by this one, more than the "
                          f"{TMEM_COLUMNS} a CTA has", rule="tmem-alloc")
    columns = tmem_alloc_columns(used)
    e = ctx.e
    slot = _shared_address(ctx, e.i32(ctx.alloc_shared(4, 16)))
    warp0 = _warp0(ctx)
    e.asm_void(f"@$0 tcgen05.alloc.cta_group::{cta_group}.sync.aligned.shared::cta.b32 [$1], {columns};", "b,r",
               [warp0, slot])
    e.asm_void(f"@$0 tcgen05.relinquish_alloc_permit.cta_group::{cta_group}.sync.aligned;", "b", [warp0])
    _thread_sync(ctx, cta_group)
    base = e.asm("ld.shared.b32 $0, [$1];", "=r,r", [slot], [_i32(ctx)], side_effects=True)[0]
    return _TmemState(base, columns, cta_group, offsets)


@rule(ir.TmemAlloc)
def _tmem_alloc(op: ir.TmemAlloc, ctx: Context) -> None:
    require_blackwell(op, ctx, "mgjit.tmem")
    state = getattr(ctx, "blackwell_tmem", None)
    if state is None:
        state = ctx.blackwell_tmem = _allocate(op, ctx)
    offset = state.offsets[id(op)]
    addr = ctx.e.addi(state.base, ctx.e.i32(offset)) if offset else state.base
    ctx.set(op.result, TmemRef(addr, op.result.type, ir.tmem_layout(op.result.type)))


@rule(ir.TmemDealloc)
def _tmem_dealloc(op: ir.TmemDealloc, ctx: Context) -> None:
    state: _TmemState = ctx.blackwell_tmem
    _thread_sync(ctx, state.cta_group)
    ctx.e.asm_void(f"@$0 tcgen05.dealloc.cta_group::{state.cta_group}.sync.aligned.b32 $1, {state.columns};", "b,r",
                   [_warp0(ctx), state.base])


@rule(ir.TmemSlice)
def _tmem_slice(op: ir.TmemSlice, ctx: Context) -> None:
    src: TmemRef = ctx.get(op.operands[0])
    column = op.start // src.type.packing
    addr = ctx.e.addi(src.addr, ctx.e.i32(column)) if column else src.addr
    ctx.set(op.result, TmemRef(addr, op.result.type, ir.tmem_layout(op.result.type)))


def _register_index(layout, shape) -> dict[tuple[int, ...], int]:
    """Register-layout register index -> position of its first element in a Frag's `elems`."""
    regs = list(layout.registers(shape))
    return {r: i * layout.vector_length for i, r in enumerate(regs)}


def _warp_address(ctx: Context, ref: TmemRef) -> Any:
    """The reference's address in this warp's 32-lane quarter."""
    e = ctx.e
    return e.addi(ref.addr, e.m.arith.shli(ctx.warp, e.i32(16 + 5)))  # (32 * warp) << 16


def _words_to_elems(ctx: Context, word, dtype) -> list:
    e = ctx.e
    if dtype.bits == 32:
        return [e.bitcast(word, e.type(dtype)) if dtype.is_float else word]
    parts = e.unpack_i32(word, dtype.bits)
    return [e.bitcast(x, e.type(dtype)) if dtype.is_float else x for x in parts]


def _elems_to_word(ctx: Context, elems: list, dtype) -> Any:
    e = ctx.e
    ints = [e.bitcast(x, e.int_type(dtype.bits)) if dtype.is_float else x for x in elems]
    return ints[0] if dtype.bits == 32 else e.pack_i32(ints)


@rule(ir.TmemLoad)
def _tmem_load(op: ir.TmemLoad, ctx: Context) -> None:
    require_blackwell(op, ctx, "a TMEM load (ref.load())")
    e = ctx.e
    ref: TmemRef = ctx.get(op.operands[0])
    out = op.result
    dtype, shape, layout = out.dtype, out.type.shape, out.layout
    access = ref.layout.access(dtype.bits, layout)
    per_word = 32 // dtype.bits
    where = _register_index(layout, shape)
    e.asm_void("tcgen05.fence::after_thread_sync;", "", [])
    base = _warp_address(ctx, ref)
    words, slots = [], []
    for ins in access.instructions:
        n = len(ins.operands)
        addr = e.addi(base, e.i32((ins.lane_offset << 16) + ins.column_offset))
        outs = ", ".join(f"${i}" for i in range(n))
        words += e.asm(f"{access.opcode(ins)} {{{outs}}}, [${n}];", ",".join(["=r"] * n + ["r"]), [addr],
                       [_i32(ctx)] * n, side_effects=True)
        slots += [where[reg] + pos for reg, pos in ins.operands]
    # The registers pass through the wait, so that no use of them is scheduled before it.
    n = len(words)
    words = e.asm("tcgen05.wait::ld.sync.aligned;", ",".join(["=r"] * n + [str(i) for i in range(n)]), words,
                  [_i32(ctx)] * n, side_effects=True)
    elems: list[Any] = [None] * (len(where) * layout.vector_length)
    for word, slot in zip(words, slots, strict=True):
        elems[slot:slot + per_word] = _words_to_elems(ctx, word, dtype)
    assert all(x is not None for x in elems), "TMEM access plan does not cover the register layout"
    ctx.set(out, Frag(layout, shape, dtype, elems))


@rule(ir.TmemStore)
def _tmem_store(op: ir.TmemStore, ctx: Context) -> None:
    require_blackwell(op, ctx, "a TMEM store (ref.store(x))")
    e = ctx.e
    ref: TmemRef = ctx.get(op.operands[0])
    frag: Frag = ctx.frag(op.operands[1])
    dtype, shape, layout = frag.dtype, frag.shape, frag.layout
    access = ref.layout.access(dtype.bits, layout)
    per_word = 32 // dtype.bits
    where = _register_index(layout, shape)
    base = _warp_address(ctx, ref)
    for ins in access.instructions:
        n = len(ins.operands)
        words = [_elems_to_word(ctx, frag.elems[where[reg] + pos:where[reg] + pos + per_word], dtype)
                 for reg, pos in ins.operands]
        addr = e.addi(base, e.i32((ins.lane_offset << 16) + ins.column_offset))
        srcs = ", ".join(f"${i + 1}" for i in range(n))
        e.asm_void(f"{access.opcode(ins, store=True)} [$0], {{{srcs}}};", ",".join(["r"] * (n + 1)), [addr, *words])
    e.asm_void("tcgen05.wait::st.sync.aligned;", "", [])
    # The MMA that reads this is issued by one thread of the warpgroup: make every warp's stores visible to it.
    e.asm_void("tcgen05.fence::before_thread_sync;", "", [])
    ctx.warpgroup_barrier()
    e.asm_void("tcgen05.fence::after_thread_sync;", "", [])


# ---------------------------------------------------------------------------------------------- MMA

@rule(ir.Tcgen05Mma)
def _tcgen05_mma(op: ir.Tcgen05Mma, ctx: Context) -> None:
    require_blackwell(op, ctx, "mgjit.tcgen05_mma")
    e = ctx.e
    acc_v, a_v, b_v, accumulate_v = op.operands
    acc: TmemRef = ctx.get(acc_v)
    a = ctx.get(a_v)
    b: SmemTile = ctx.get(b_v)
    cta_group = 2 if op.collective else 1
    m, _, k = op.mnk
    kind = tcgen05_kind(a_v.dtype)
    k_step = kind.instruction_k
    a_in_tmem = isinstance(a, TmemRef)
    a_k_major = a_in_tmem or not a.type.transposed  # a is (M, K): K-major unless a transposed view
    b_k_major = b.type.transposed  # b is (K, N): N-major unless a transposed view of an (N, K) tile
    issuer = _issuer(ctx, cta_group)
    accumulate = ctx.get(accumulate_v)
    true = e.const_bool(True)
    a_operand = "[$2]" if a_in_tmem else "$2"
    e.asm_void("tcgen05.fence::after_thread_sync;", "", [])
    for piece in acc.layout.mma_pieces():
        idesc = Tcgen05InstrDescriptor(m, piece.n, a_v.dtype, b_v.dtype, acc_v.dtype,
                                       Major.K if a_k_major else Major.MN, Major.K if b_k_major else Major.MN)
        text = (f"@$0 tcgen05.mma.cta_group::{cta_group}.kind::{kind.value} [$1], {a_operand}, $3, $4, $5;")
        d = e.addi(acc.addr, e.i32((piece.lane_offset << 16) + piece.column_offset))
        for kk in range(k // k_step):
            if a_in_tmem:  # A's K runs along TMEM columns, 32 bits each
                columns = kk * k_step * a_v.dtype.bits // 32
                da = e.addi(a.addr, e.i32(columns)) if columns else a.addr
            else:
                da = operand_descriptor(ctx, a, 0, kk * k_step, a_k_major, tcgen05_smem_descriptor)
            db = operand_descriptor(ctx, b, piece.col_start, kk * k_step, b_k_major,
                                    tcgen05_smem_descriptor)
            e.asm_void(text, ",".join(["b", "r", "r" if a_in_tmem else "l", "l", "r", "b"]),
                       [issuer, d, da, db, e.i32(idesc.encode()), accumulate if kk == 0 else true])


@rule(ir.Tcgen05Commit)
def _tcgen05_commit(op: ir.Tcgen05Commit, ctx: Context) -> None:
    require_blackwell(op, ctx, "mgjit.tcgen05_commit")
    e = ctx.e
    cta_group = op.cta_group or ir.kernel_cta_group(ctx.kernel)
    bar = _shared_address(ctx, ctx.get(op.operands[0]).offset)
    issuer = _issuer(ctx, cta_group)
    if cta_group == 1:
        e.asm_void("@$0 tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [$1];", "b,r",
                   [issuer, bar])
        return
    # Both CTAs of the pair wait on their own copy of the barrier: multicast the arrival to both.
    mask = e.trunc(e.m.arith.shli(e.i32(3), _leader_rank(ctx)), 16)
    e.asm_void("@$0 tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 "
               "[$1], $2;", "b,r,h", [issuer, bar, mask])


# ---------------------------------------------------------------------------------------------- 2-CTA TMA

@rule(ir.TmaLoadCollective)
def _tma_load_collective(op: ir.TmaLoadCollective, ctx: Context) -> None:
    require_blackwell(op, ctx, "copy_async(..., collective=True)")
    e = ctx.e
    dst: SmemTile = ctx.get(op.dst)
    desc = ctx.tma_descriptors[op.descriptor]
    spec = ctx.kernel.tma_descriptors[op.descriptor]
    t = dst.type
    rank = len(t.shape)
    nbytes = math.prod(t.shape) * t.dtype.bits // 8
    blocks = t.shape[-1] // spec.box[-1]
    # The barrier at the same offset in the leader CTA, in the cluster's shared window.
    local = _shared_address(ctx, ctx.get(op.barrier).offset)
    bar = e.asm("mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r", [local, _leader_rank(ctx)], [_i32(ctx)])[0]
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    e.asm_void(f"@$0 mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64 _, [$1], {nbytes};", "b,r",
               [elected, bar])
    coords = [ctx.get(c) for c in op.coords]
    dst_addr = _shared_address(ctx, dst.offset)
    for j in range(blocks):
        inner = e.addi(coords[-1], e.i32(j * spec.box[-1])) if j else coords[-1]
        ordered = [inner] + coords[-2::-1]  # innermost first
        slots = ", ".join(f"${i + 4}" for i in range(rank))
        e.asm_void(f"@$0 cp.async.bulk.tensor.{rank}d.cta_group::2.shared::cluster.global.mbarrier::complete_tx::bytes "
                   f"[$1], [$2, {{{slots}}}], [$3];", ",".join(["b", "r", "l", "r"] + ["r"] * rank),
                   [elected, e.addi(dst_addr, e.i32(j * nbytes // blocks)), desc, bar, *ordered])


__all__ = ["TmemRef", "require_blackwell", "BLACKWELL_TARGET"]
