"""Blackwell's MMA: Tcgen05Mma (acc (TMEM) = a @ b (+ acc), issued by one thread, asynchronous) and
Tcgen05Commit (one arrival on an mbarrier once the MMAs issued before it are done).

One thread issues every tcgen05.mma of a Tcgen05Mma: thread 0 of the issuing warpgroup, and in a 2-CTA
kernel only in the pair's leader CTA (even cluster rank). The accumulator's TMEM layout says how many
instructions one K step takes (`TMEMLayout.mma_pieces`: a half-lane accumulator takes two M=64 MMAs, the second
at lane offset 16). Operands in SMEM are addressed by tcgen05 shared-memory descriptors over the same
column-block storage as wgmma's (see smem.py): K-major SBO = 8 rows x swizzle; MN-major LBO = the distance
between swizzle-wide column blocks. The instruction descriptor comes from `mma_descriptors`.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import dtypes, infer, interpret, lower
from .. import mma_descriptors as md
from ..errors import Loc, Rule
from ..interpret import numerics
from ..interpret.checker import Access, check_read, check_write
from ..interpret.machine import CTA
from ..interpret.scheduler import AsyncOp, Warpgroup
from ..ir import Op, ScalarType, Value, check, is_ref
from ..mma_descriptors import Major, Tcgen05InstrDescriptor, tcgen05_kind, tcgen05_smem_descriptor
from ..tmem_layouts import MMAPiece, TMEMLayoutError, check_tcgen05_shape, mma_data_path
from .clusters import cluster_ctarank, pair_leader_rank
from .smem import SmemTile, mma_operand, operand_descriptor, shared_address, stored_k_major, tile_ranges
from .tmem import LoweredTmem


class Tcgen05Mma(Op):
    """acc = a @ b (+ acc when `accumulate`), on the tensor cores, issued by one thread and asynchronous (its
    completion is signalled by Tcgen05Commit). acc is a TMEM reference; a an SMEM tile or a TMEM reference;
    b an SMEM tile; SMEM tiles may be transposed views. A 2-CTA (collective) MMA takes each CTA's share:
    acc (M/2, N), a (M/2, K), b (K, N/2); the pair's leader CTA issues it."""

    name = "tcgen05_mma"
    requires = "tcgen05"

    def __init__(self, acc: Value, a: Value, b: Value, accumulate: Value, loc: Loc | None):
        super().__init__([acc, a, b, accumulate], [], loc)

    @property
    def collective(self) -> bool:
        return self.operands[0].type.collective

    @property
    def mnk(self) -> tuple[int, int, int]:
        """The MMA's M (both CTAs' rows for a 2-CTA MMA), N and K."""
        (rows, n), k = self.operands[0].type.shape, self.operands[1].type.shape[1]
        return rows * (2 if self.collective else 1), n, k

    def attrs(self):
        m, n, k = self.mnk
        out = {"m": m, "n": n, "k": k}
        try:
            out["kind"] = md.tcgen05_kind(self.operands[1].dtype).value
        except md.DescriptorError:  # an op that failed verification is still printable
            pass
        if self.operands[0].layout is not None:
            out["tmem_layout"] = self.operands[0].layout.kind.value
        out["cta_group"] = 2 if self.collective else 1
        out["a"] = self.operands[1].type.space
        return out

    def verify(self):
        acc, a, b, accumulate = self.operands
        check(is_ref(acc, "tmem") and acc.type.rank == 2, self,
               "the tcgen05_mma accumulator must be a TMEM reference (mgjit.tmem((M, N), mgjit.float32))")
        check((is_ref(a, "smem") or is_ref(a, "tmem")) and a.type.rank == 2, self,
               "tcgen05_mma operand a must be a 2D SMEM tile or a TMEM reference")
        check(is_ref(b, "smem") and b.type.rank == 2, self, "tcgen05_mma operand b must be a 2D SMEM tile")
        check(isinstance(accumulate.type, ScalarType) and accumulate.dtype == dtypes.bool_, self,
               "accumulate= must be a bool (a constant or a runtime condition such as k > 0)")
        for name, v in (("a", a), ("b", b)):
            if v.type.space == "smem":
                check(v.type.swizzle is not None, self, f"tcgen05_mma operand {name} needs a swizzled SMEM tile "
                       "(mgjit.smem(..., swizzle=32/64/128))")
        collective = acc.type.collective
        (rows, n), (ra, k), (kb, nb) = acc.type.shape, a.type.shape, b.type.shape
        n_cta = n // 2 if collective else n
        if ra != rows or kb != k or nb != n_cta:
            per_cta = " per CTA: acc (M/2, N), a (M/2, K), b (K, N/2)" if collective else ""
            raise self.error(f"tcgen05_mma shapes do not chain{per_cta}: acc {acc.type.shape}, a {a.type.shape}, "
                             f"b {b.type.shape}", rule=Rule.TCGEN05_SHAPE)
        if acc.type.packing != 1:
            raise self.error("an MMA accumulator is stored one element per 32-bit column: allocate it with packing=1",
                             rule=Rule.TCGEN05_SHAPE)
        if a.type.space == "tmem":
            if a.type.collective != collective:
                raise self.error("operand a in TMEM and the accumulator belong to different CTA groups",
                                 rule=Rule.CTA_GROUP)
            if a.type.shape[0] != 128 or a.type.packing != 32 // a.dtype.bits:
                raise self.error(f"an A operand in TMEM has 128 rows and is packed {32 // a.dtype.bits} to a column "
                                 f"(mgjit.tmem((128, K), {a.dtype.name})), got {a.type}", rule=Rule.TCGEN05_SHAPE)
        try:
            k_step = md.tcgen05_kind(a.dtype).instruction_k
            if k % k_step:
                raise md.DescriptorError(f"the K extent of tcgen05 tiles must be a multiple of {k_step} for "
                                         f"{a.dtype.name} (32 bytes per instruction), got {k}")
            for v in (a, b):
                if v.type.space != "smem":
                    continue
                cols = (v.type.shape[::-1] if v.type.transposed else v.type.shape)[1]
                md.check_swizzle(v.type.swizzle)
                if (cols * v.dtype.bits // 8) % v.type.swizzle:
                    raise md.DescriptorError(
                        f"a {v.type.swizzle}B-swizzled tile needs rows that are a multiple of {v.type.swizzle} "
                        f"bytes, got {cols} x {v.dtype.name} = {cols * v.dtype.bits // 8} bytes")
        except md.DescriptorError as e:
            raise self.error(str(e), rule=Rule.TCGEN05_SHAPE) from None


class Tcgen05Commit(Op):
    """Arrive once on `barrier` when every tcgen05 MMA the issuing thread started before it has completed
    (tcgen05.commit ... mbarrier::arrive::one); in a 2-CTA kernel the arrival goes to both CTAs of the pair.
    `cta_group` is the kernel's, set by layout inference."""

    name = "tcgen05_commit"
    requires = "tcgen05"

    def __init__(self, barrier: Value, loc: Loc | None):
        super().__init__([barrier], [], loc)
        self.cta_group: int | None = None

    def attrs(self):
        return {"cta_group": self.cta_group} if self.cta_group else {}

    def verify(self):
        check(is_ref(self.operands[0], "barrier") and self.operands[0].type.rank == 0, self,
               "tcgen05_commit arrives on one barrier: index the barrier array, e.g. bars[slot]")


@infer.rule(Tcgen05Commit)
def _infer_tcgen05_commit(op: Tcgen05Commit, inf: infer.Inference) -> None:
    op.cta_group = inf.kernel.cta_group


@infer.rule(Tcgen05Mma)
def _infer_tcgen05_mma(op: Tcgen05Mma, inf: infer.Inference) -> None:
    """The instructions an MMA takes follow from its accumulator's TMEM layout (chosen by the accumulator's
    TmemAlloc, earlier in the kernel): each must be a tcgen05.mma shape the hardware has."""
    acc, a, b, _ = op.operands
    pieces = acc.layout.mma_pieces()
    m, n, _ = op.mnk
    try:
        kind = md.tcgen05_kind(a.dtype)
        if op.collective and len(pieces) != 1:
            raise md.DescriptorError(f"a 2-CTA MMA writes its accumulator with one instruction: N <= 256, got {n}")
        for piece in pieces:
            check_tcgen05_shape(m, piece.n, kind.instruction_k, kind, op.collective)
            instr_descriptor(op, piece)
        per_row = b.type.swizzle * 8 // b.dtype.bits
        if not _k_major(op)[1] and any(p.col_start % per_row for p in pieces):
            raise md.DescriptorError(f"this accumulator takes {len(pieces)} MMAs of N = {pieces[0].n}; with an "
                                     f"N-major B each must start on a {b.type.swizzle}B swizzle column "
                                     f"({per_row} elements)")
    except (md.DescriptorError, TMEMLayoutError) as e:
        raise op.error(str(e), rule=Rule.TCGEN05_SHAPE) from None


# ---------------------------------------------------------------------------------------------- lowering

def _issuer(ctx: lower.Context, cta_group: int) -> Any:
    """i1: this thread issues the tcgen05.mma/commit of its warpgroup (thread 0; in the leader CTA for 2 CTAs)."""
    e = ctx.e
    pred = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    if cta_group == 2:
        pred = e.andi(pred, e.cmpi("eq", e.andi(cluster_ctarank(ctx), e.i32(1)), e.i32(0)))
    return pred


def _k_major(op: Tcgen05Mma) -> tuple[bool, bool]:
    """Whether A and B are stored K-major (A in TMEM is: its K runs along the columns)."""
    a, b = op.operands[1].type, op.operands[2].type
    return a.space == "tmem" or stored_k_major(a, 1), stored_k_major(b, 0)


def instr_descriptor(op: Tcgen05Mma, piece: MMAPiece) -> Tcgen05InstrDescriptor:
    """The instruction descriptor of one of the MMA's instructions (`TMEMLayout.mma_pieces`)."""
    acc, a, b, _ = op.operands
    a_k_major, b_k_major = _k_major(op)
    return Tcgen05InstrDescriptor(op.mnk[0], piece.n, a.dtype, b.dtype, acc.dtype,
                                  Major.K if a_k_major else Major.MN, Major.K if b_k_major else Major.MN)


def _a_tmem_column(op: Tcgen05Mma, kk: int) -> int:
    """For A in TMEM: the column K step `kk` starts at (A's K runs along TMEM columns, 32 bits each)."""
    a = op.operands[1]
    return kk * tcgen05_kind(a.dtype).instruction_k * a.dtype.bits // 32


@lower.rule(Tcgen05Mma)
def _tcgen05_mma(op: Tcgen05Mma, ctx: lower.Context) -> None:
    e = ctx.e
    acc_v, a_v, b_v, accumulate_v = op.operands
    acc: LoweredTmem = ctx.get(acc_v)
    a = ctx.get(a_v)
    b: SmemTile = ctx.get(b_v)
    cta_group = 2 if op.collective else 1
    _, _, k = op.mnk
    kind = tcgen05_kind(a_v.dtype)
    k_step = kind.instruction_k
    a_in_tmem = isinstance(a, LoweredTmem)
    a_k_major, b_k_major = _k_major(op)
    issuer = _issuer(ctx, cta_group)
    accumulate = ctx.get(accumulate_v)
    true = e.const_bool(True)
    a_operand = "[$2]" if a_in_tmem else "$2"
    e.asm_void("tcgen05.fence::after_thread_sync;", "", [])
    for piece in acc.layout.mma_pieces():
        idesc = instr_descriptor(op, piece)
        text = (f"@$0 tcgen05.mma.cta_group::{cta_group}.kind::{kind.value} [$1], {a_operand}, $3, $4, $5;")
        d = e.addi(acc.addr, e.i32((piece.lane_offset << 16) + piece.column_offset))
        for kk in range(k // k_step):
            if a_in_tmem:
                columns = _a_tmem_column(op, kk)
                da = e.addi(a.addr, e.i32(columns)) if columns else a.addr
            else:
                da = operand_descriptor(ctx, a, 0, kk * k_step, a_k_major, tcgen05_smem_descriptor)
            db = operand_descriptor(ctx, b, piece.col_start, kk * k_step, b_k_major,
                                    tcgen05_smem_descriptor)
            e.asm_void(text, ",".join(["b", "r", "r" if a_in_tmem else "l", "l", "r", "b"]),
                       [issuer, d, da, db, e.i32(idesc.encode()), accumulate if kk == 0 else true])


@lower.rule(Tcgen05Commit)
def _tcgen05_commit(op: Tcgen05Commit, ctx: lower.Context) -> None:
    e = ctx.e
    cta_group = op.cta_group or ctx.kernel.cta_group
    bar = shared_address(ctx, ctx.get(op.operands[0]).offset)
    issuer = _issuer(ctx, cta_group)
    if cta_group == 1:
        e.asm_void("@$0 tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [$1];", "b,r",
                   [issuer, bar])
        return
    # Both CTAs of the pair wait on their own copy of the barrier: multicast the arrival to both.
    mask = e.trunc(e.m.arith.shli(e.i32(3), pair_leader_rank(ctx)), 16)
    e.asm_void("@$0 tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 "
               "[$1], $2;", "b,r,h", [issuer, bar, mask])


# ---------------------------------------------------------------------------------------------- interpreter
# The MMA as the hardware runs it, from what the lowering encodes: each instruction of each piece reads its
# operands through its SMEM descriptors (or A's TMEM columns), takes M, N and the operands' majors from its
# instruction descriptor read back, and writes D where the PTX data path (`tmem_layouts.mma_data_path`) puts it.
# A 2-CTA MMA, issued by the pair's leader, multiplies each CTA's rows of A by B's two halves side by side (the
# leader's columns first) into each CTA's own TMEM.

def _tmem_a(cta: CTA, a: LoweredTmem, column: int, k: int, dtype, loc) -> torch.Tensor:
    """K elements of each of A's 128 rows from TMEM: row r in lane r, packed along the columns from `column`."""
    per = 32 // dtype.bits
    kk = torch.arange(k, dtype=torch.int64)
    lanes = torch.arange(128, dtype=torch.int64)[:, None].expand(128, k)
    columns = (column + kk // per).expand(128, k)
    cta.tmem.check(loc, "this tcgen05_mma's A", lanes, columns, a.addr, a.addr + a.layout.columns)
    words = cta.tmem.cells[lanes, columns].to(torch.int64) & 0xFFFFFFFF
    return numerics.from_bits((words >> (kk % per * dtype.bits)) & ((1 << dtype.bits) - 1), dtype)


@interpret.rule(Tcgen05Mma)
def _interp_tcgen05_mma(op: Tcgen05Mma, wg: Warpgroup) -> None:
    """Issued by one thread (the pair's leader CTA's, for 2 CTAs). Its SMEM operands must be ready now; they
    count as read, and its accumulator columns as written, until a barrier of a commit issued after it tells
    the reader the MMA is done."""
    cta_group = 2 if op.collective else 1
    cta, engine = wg.cta, wg.engine
    if cta.rank % cta_group:
        return
    acc_v, a_v, b_v, accumulate_v = op.operands
    acc, a, b = (wg.get(v, op) for v in (acc_v, a_v, b_v))
    accumulate = bool(wg.scalar(accumulate_v, op))
    pair = wg.cluster.ctas[cta.rank:cta.rank + cta_group]
    kind = tcgen05_kind(a_v.dtype)
    k_step, k = kind.instruction_k, a_v.type.shape[1]
    a_in_tmem = isinstance(a, LoweredTmem)
    queue = ("mma", cta.rank, wg.index)
    ordinal = engine.next_in(queue)
    acc_columns = (acc.addr, acc.addr + acc.layout.columns)
    for c in pair:
        for tile in ((b,) if a_in_tmem else (a, b)):
            for start, end in tile_ranges(tile):
                check_read(c.smem_records, start, end, wg.clock, op.loc, "this tcgen05_mma")
                c.smem_records.add(Access(start, end, "read", queue, ordinal, op.loc, "tcgen05_mma"))
        check_write(c.tmem.records, *acc_columns, wg.clock, op.loc, "this tcgen05_mma", space="TMEM", queue=queue)
        c.tmem.records.add(Access(*acc_columns, "mma", queue, ordinal, op.loc, "tcgen05_mma"))
        if a_in_tmem:
            c.tmem.records.add(Access(a.addr, a.addr + a.layout.columns, "read", queue, ordinal, op.loc, "tcgen05_mma"))

    def compute() -> None:
        d_dtype = acc_v.dtype
        for piece in acc.layout.mma_pieces():
            idesc = Tcgen05InstrDescriptor.decode(instr_descriptor(op, piece).encode(), kind)
            rows, n = idesc.m // cta_group, idesc.n
            lane, column = mma_data_path(idesc.m, n, cta_group, torch.arange(rows)[:, None], torch.arange(n)[None, :])
            lanes, columns = lane + piece.lane_offset, column + acc.addr + piece.column_offset
            b_blocks = [torch.cat([mma_operand(c, b, piece.col_start, n // cta_group, kk * k_step, k_step,
                                               idesc.b_major is Major.K, tcgen05=True) for c in pair])
                        for kk in range(k // k_step)]
            for c in pair:
                c.tmem.check(op.loc, "this tcgen05_mma", lanes, columns, *acc_columns)
                d = torch.zeros(rows, n)
                if accumulate:
                    words = c.tmem.cells[lanes, columns].to(torch.int64) & ((1 << d_dtype.bits) - 1)
                    d = numerics.from_bits(words, d_dtype).to(torch.float32)
                for kk, b_block in enumerate(b_blocks):
                    if a_in_tmem:
                        a_block = _tmem_a(c, a, a.addr + _a_tmem_column(op, kk), k_step, a_v.dtype, op.loc)
                    else:
                        a_block = mma_operand(c, a, 0, rows, kk * k_step, k_step, idesc.a_major is Major.K,
                                              tcgen05=True)
                    d = d + numerics.mma_input(a_block) @ numerics.mma_input(b_block).T
                bits = numerics.to_bits(d.to(numerics.torch_dtype(d_dtype)), d_dtype).to(torch.int64)
                c.tmem.cells[lanes, columns] = (bits & ((1 << d_dtype.bits) - 1)).to(torch.int32)

    engine.issue(AsyncOp(queue, op.loc, "tcgen05_mma", compute, tuple(pair)))


@interpret.rule(Tcgen05Commit)
def _interp_tcgen05_commit(op: Tcgen05Commit, wg: Warpgroup) -> None:
    """One arrival (on each CTA of the pair, for 2 CTAs) once the MMAs issued before it are done: it completes in
    the MMAs' queue, after them, and its arrival tells the waiters so."""
    cta_group = op.cta_group or wg.run.kernel.cta_group
    cta, engine = wg.cta, wg.engine
    if cta.rank % cta_group:
        return
    queue = ("mma", cta.rank, wg.index)
    clock = dict(wg.clock)
    clock[queue] = max(clock.get(queue, 0), engine.next_in(queue) - 1)
    ref = wg.get(op.operands[0], op)
    bars = [ref.get(c) for c in wg.cluster.ctas[cta.rank:cta.rank + cta_group]]

    def arrive() -> None:
        for bar in bars:
            bar.arrive(clock, op.loc)

    engine.issue(AsyncOp(queue, op.loc, "tcgen05_commit", arrive))
