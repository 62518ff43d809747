"""Blackwell's MMA: Tcgen05Mma (acc (TMEM) = a @ b (+ acc), optionally block-scaled, issued by one thread,
asynchronous), Tcgen05Copy (tcgen05.cp: block scales SMEM -> TMEM, in the MMAs' order) and Tcgen05Commit (one
arrival on an mbarrier once the MMAs and copies issued before it are done).

One thread issues every tcgen05.mma of a Tcgen05Mma: thread 0 of the issuing warpgroup, and in a 2-CTA
kernel only in the pair's leader CTA (even cluster rank). The accumulator's TMEM layout says how many
instructions one K step takes (`TMEMLayout.mma_pieces`: a half-lane accumulator takes two M=64 MMAs, the second
at lane offset 16). Operands in SMEM are addressed by tcgen05 shared-memory descriptors over the same
column-block storage as wgmma's (see smem.py): K-major SBO = 8 rows x swizzle; MN-major LBO = the distance
between swizzle-wide column blocks. The instruction descriptor comes from `mma_descriptors`.

A block-scaled MMA (mxfp8, mxfp4, nvfp4: `mma_descriptors.block_scaling`) also reads a TMEM matrix of scales
for A (rows, K / block) and one for B (N, K / block), in the `ScaleLayout`; each instruction names the word
holding its scales by address and the byte within it by the scale factor IDs of its descriptor. Tcgen05Copy
fills such a matrix from SMEM one 128 x 4 chunk (tcgen05.cp.32x128b.warpx4) at a time. tcgen05.cp and
tcgen05.mma issued by one thread execute in order, so a copy may feed the MMAs issued after it without a wait.
In a 2-CTA kernel the leader issues both for the pair: each CTA's scales go from its own SMEM to its own TMEM
(as the pair's MMA reads each CTA's SMEM at the same offset), so each CTA holds the A scales of its rows and the
B scales of all N columns.
"""
from __future__ import annotations

import dataclasses
import math
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
from ..mma_descriptors import (BlockScaling, Major, SmemDescriptor, SmemSwizzle, Tcgen05InstrDescriptor,
                               Tcgen05ScaledInstrDescriptor, block_scaling, tcgen05_kind, tcgen05_smem_descriptor)
from ..layouts import LANES_PER_WARP, WARPS_PER_WARPGROUP
from ..tmem_layouts import MMAPiece, TMEMLayoutError, check_tcgen05_shape, mma_data_path
from .clusters import cluster_ctarank, pair_leader_rank
from .smem import (SmemTile, descriptor_at, mma_operand, operand_descriptor, shared_address, stored_k_major,
                   tile_ranges)
from .tmem import LoweredTmem


class Tcgen05Mma(Op):
    """acc = a @ b (+ acc when `accumulate`), on the tensor cores, issued by one thread and asynchronous (its
    completion is signalled by Tcgen05Commit). acc is a TMEM reference; a an SMEM tile or a TMEM reference;
    b an SMEM tile; SMEM tiles may be transposed views. A 2-CTA (collective) MMA takes each CTA's share:
    acc (M/2, N), a (M/2, K), b (K, N/2); the pair's leader CTA issues it. With `a_scale` and `b_scale` (TMEM
    scale matrices (M per CTA, K / block) and (N, K / block)) it is block-scaled: (A * scale_A) @ (B * scale_B)."""

    name = "tcgen05_mma"
    requires = "tcgen05"

    def __init__(self, acc: Value, a: Value, b: Value, accumulate: Value, loc: Loc | None,
                 a_scale: Value | None = None, b_scale: Value | None = None):
        scales = [v for v in (a_scale, b_scale) if v is not None]
        super().__init__([acc, a, b, accumulate, *scales], [], loc)

    @property
    def scales(self) -> tuple[Value, Value] | None:
        """The TMEM scale matrices of A and B, for a block-scaled MMA."""
        return (self.operands[4], self.operands[5]) if len(self.operands) == 6 else None

    @property
    def kind(self) -> md.Tcgen05Kind:
        return tcgen05_kind(self.operands[1].dtype, self.scales[0].dtype if self.scales else None)

    @property
    def scaling(self) -> BlockScaling | None:
        return block_scaling(self.operands[1].dtype, self.scales[0].dtype) if self.scales else None

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
            out["kind"] = self.kind.value
            if self.scales:
                out["scaling"] = self.scaling.qualifier
        except md.DescriptorError:  # an op that failed verification is still printable
            pass
        if self.operands[0].layout is not None:
            out["tmem_layout"] = self.operands[0].layout.kind.value
        out["cta_group"] = 2 if self.collective else 1
        out["a"] = self.operands[1].type.space
        return out

    def verify(self):
        acc, a, b, accumulate = self.operands[:4]
        check(is_ref(acc, "tmem") and acc.type.rank == 2 and not acc.type.scales, self,
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
        if self.scales:
            self._verify_scales()
        try:
            k_step = self.kind.instruction_k
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

    def _verify_scales(self) -> None:
        acc, a = self.operands[0], self.operands[1]
        a_scale, b_scale = self.scales
        for name, v in (("a_scale", a_scale), ("b_scale", b_scale)):
            check(is_ref(v, "tmem") and v.type.scales and len(v.type.shape) == 2, self,
                  f"{name} must be a TMEM scale matrix (mgjit.tmem((rows, K // block), dtype, scales=True)), "
                  "indexed to one stage")
        check(a.type.space == "smem", self, "a block-scaled MMA takes A from SMEM", rule=Rule.TCGEN05_SHAPE)
        check(acc.dtype == dtypes.float32, self, f"a block-scaled MMA accumulates into float32, got {acc.dtype.name}",
              rule=Rule.TCGEN05_SHAPE)
        check(a_scale.dtype == b_scale.dtype, self, f"A and B scales differ: {a_scale.dtype.name} and "
              f"{b_scale.dtype.name}", rule=Rule.TCGEN05_SHAPE)
        try:
            scaling = self.scaling
        except md.DescriptorError as e:
            raise self.error(str(e), rule=Rule.TCGEN05_SHAPE) from None
        k_values = a.type.shape[1] * scaling.values_per_element
        rows, n = acc.type.shape
        expected = {"a_scale": (rows, k_values // scaling.block), "b_scale": (n, k_values // scaling.block)}
        for name, v in (("a_scale", a_scale), ("b_scale", b_scale)):
            if tuple(v.type.shape) != expected[name]:
                raise self.error(f"{name} holds one {v.dtype.name} scale per {scaling.block} values of K for each "
                                 f"{'row of A' if name == 'a_scale' else 'column of B (all N, both CTAs)'}: shape "
                                 f"{expected[name]} for this MMA, got {tuple(v.type.shape)}", rule=Rule.TCGEN05_SHAPE)


class Tcgen05Copy(Op):
    """tcgen05.cp: fill a TMEM scale matrix (rows, cols) from an SMEM tile of its rows * cols scales, 16 bytes to
    a row (e.g. shape (rows // 128, cols // 4 * 32, 16)): 128 x 4 chunks of 512 bytes, row-tile major, each in
    `tmem_layouts.chunk_byte` order (what `blocked_scales` makes of a (rows, cols) matrix). Issued by one thread,
    asynchronous, ordered with the MMAs that thread issues; a commit after it signals its completion."""

    name = "tcgen05_copy"
    requires = "tcgen05"

    def __init__(self, dst: Value, src: Value, loc: Loc | None):
        super().__init__([dst, src], [], loc)

    def verify(self):
        dst, src = self.operands
        check(is_ref(dst, "tmem") and dst.type.scales and len(dst.type.shape) == 2, self,
              "tcgen05_copy fills a TMEM scale matrix (mgjit.tmem(..., scales=True)), indexed to one stage")
        check(is_ref(src, "smem") and not src.type.transposed and src.type.swizzle is None, self,
              "tcgen05_copy reads an SMEM tile without swizzle (not a transposed view)")
        check(src.dtype == dst.dtype, self, f"tcgen05_copy cannot convert {src.dtype.name} into {dst.dtype.name}")
        rows, cols = dst.type.shape
        if src.type.shape[-1] != 16 or math.prod(src.type.shape) != rows * cols:
            raise self.error(f"a {rows}x{cols} scale matrix comes from an SMEM tile of its {rows * cols} scales in "
                             f"16-byte rows, e.g. shape ({rows // 128}, {cols // 4 * 32}, 16); got "
                             f"{src.type.shape}", rule=Rule.TMEM_LAYOUT)


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


infer.rule(Tcgen05Copy)(infer.no_arrays)


@infer.rule(Tcgen05Mma)
def _infer_tcgen05_mma(op: Tcgen05Mma, inf: infer.Inference) -> None:
    """The instructions an MMA takes follow from its accumulator's TMEM layout (chosen by the accumulator's
    TmemAlloc, earlier in the kernel): each must be a tcgen05.mma shape the hardware has."""
    acc, a, b = op.operands[:3]
    pieces = acc.layout.mma_pieces()
    m, n, k = op.mnk
    try:
        kind = op.kind
        if op.collective and len(pieces) != 1:
            raise md.DescriptorError(f"a 2-CTA MMA writes its accumulator with one instruction: N <= 256, got {n}")
        for piece in pieces:
            check_tcgen05_shape(m, piece.n, kind.instruction_k, kind, op.collective)
            for kk in range(k // kind.instruction_k if op.scales else 1):
                instr_descriptor(op, piece, kk)
            if op.scales and piece.col_start % LANES_PER_WARP:
                raise md.DescriptorError(f"this accumulator takes MMAs of N = {piece.n}; a block-scaled one must "
                                         f"start on a {LANES_PER_WARP}-column boundary (a column of its B scales)")
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


def instr_descriptor(op: Tcgen05Mma, piece: MMAPiece, k_step: int = 0
                     ) -> Tcgen05InstrDescriptor | Tcgen05ScaledInstrDescriptor:
    """The instruction descriptor of one of the MMA's instructions (`TMEMLayout.mma_pieces`): of K step
    `k_step`, whose scale factor IDs pick its scales in a block-scaled MMA."""
    acc, a, b = op.operands[:3]
    a_k_major, b_k_major = _k_major(op)
    a_major, b_major = Major.K if a_k_major else Major.MN, Major.K if b_k_major else Major.MN
    if op.scales:
        _, scale_id = op.scaling.scale_word(k_step)
        return Tcgen05ScaledInstrDescriptor(op.mnk[0], piece.n, a.dtype, b.dtype, op.scales[0].dtype, a_major,
                                            b_major, scale_id, scale_id)
    return Tcgen05InstrDescriptor(op.mnk[0], piece.n, a.dtype, b.dtype, acc.dtype, a_major, b_major)


def _scale_columns(op: Tcgen05Mma, piece: MMAPiece, k_step: int) -> tuple[int, int]:
    """For a block-scaled MMA's instruction: the columns (from each scale matrix's first) of the words it names,
    for A's rows and for B's columns from the piece's first."""
    group, _ = op.scaling.scale_word(k_step)
    a_scale, b_scale = (v.layout for v in op.scales)
    return a_scale.word_column(0, group), b_scale.word_column(piece.col_start, group)


def _a_tmem_column(op: Tcgen05Mma, kk: int) -> int:
    """For A in TMEM: the column K step `kk` starts at (A's K runs along TMEM columns, 32 bits each)."""
    a = op.operands[1]
    return kk * tcgen05_kind(a.dtype).instruction_k * a.dtype.bits // 32


@lower.rule(Tcgen05Mma)
def _tcgen05_mma(op: Tcgen05Mma, ctx: lower.Context) -> None:
    e = ctx.e
    acc_v, a_v, b_v, accumulate_v = op.operands[:4]
    acc: LoweredTmem = ctx.get(acc_v)
    a = ctx.get(a_v)
    b: SmemTile = ctx.get(b_v)
    scales = [ctx.get(v) for v in op.scales] if op.scales else None
    cta_group = 2 if op.collective else 1
    _, _, k = op.mnk
    kind = op.kind
    k_step = kind.instruction_k
    a_in_tmem = isinstance(a, LoweredTmem)
    a_k_major, b_k_major = _k_major(op)
    issuer = _issuer(ctx, cta_group)
    accumulate = ctx.get(accumulate_v)
    true = e.const_bool(True)
    a_operand = "[$2]" if a_in_tmem else "$2"
    scaling = f".{op.scaling.qualifier}" if scales else ""
    scale_operands = " [$6], [$7]," if scales else ""
    text = (f"@$0 tcgen05.mma.cta_group::{cta_group}.kind::{kind.value}{scaling} [$1], {a_operand}, $3, $4,"
            f"{scale_operands} $5;")
    constraints = ",".join(["b", "r", "r" if a_in_tmem else "l", "l", "r", "b"] + ["r", "r"] * bool(scales))
    e.asm_void("tcgen05.fence::after_thread_sync;", "", [])
    for piece in acc.layout.mma_pieces():
        d = e.addi(acc.addr, e.i32((piece.lane_offset << 16) + piece.column_offset))
        for kk in range(k // k_step):
            if a_in_tmem:
                columns = _a_tmem_column(op, kk)
                da = e.addi(a.addr, e.i32(columns)) if columns else a.addr
            else:
                da = operand_descriptor(ctx, a, 0, kk * k_step, a_k_major, tcgen05_smem_descriptor)
            db = operand_descriptor(ctx, b, piece.col_start, kk * k_step, b_k_major,
                                    tcgen05_smem_descriptor)
            idesc = instr_descriptor(op, piece, kk)
            extra = []
            if scales:
                extra = [e.addi(ref.addr, e.i32(column)) if column else ref.addr
                         for ref, column in zip(scales, _scale_columns(op, piece, kk))]
            e.asm_void(text, constraints, [issuer, d, da, db, e.i32(idesc.encode()),
                                           accumulate if kk == 0 else true, *extra])


# The descriptor fields (start address 0) of a 128x4 scale chunk in SMEM, what tcgen05.cp.32x128b reads: 32 rows
# of 16 bytes, K-major without swizzle, its 8-row core matrices 128 bytes apart.
CHUNK_DESCRIPTOR = SmemDescriptor(0, 16, 128, SmemSwizzle.NONE)


@lower.rule(Tcgen05Copy)
def _tcgen05_copy(op: Tcgen05Copy, ctx: lower.Context) -> None:
    e = ctx.e
    dst: LoweredTmem = ctx.get(op.operands[0])
    src: SmemTile = ctx.get(op.operands[1])
    cta_group = ctx.kernel.cta_group
    issuer = _issuer(ctx, cta_group)
    const = tcgen05_smem_descriptor(CHUNK_DESCRIPTOR)
    e.asm_void("tcgen05.fence::after_thread_sync;", "", [])
    for byte, column in dst.layout.chunks():
        desc = descriptor_at(ctx, e.addi(shared_address(ctx, src.offset), e.i32(byte)), const)
        taddr = e.addi(dst.addr, e.i32(column)) if column else dst.addr
        e.asm_void(f"@$0 tcgen05.cp.cta_group::{cta_group}.32x128b.warpx4 [$1], $2;", "b,r,l", [issuer, taddr, desc])


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


def _decoded(op: Tcgen05Mma, piece: MMAPiece, k_step: int):
    """Instruction `k_step` of `piece`'s descriptor, read back from its bits as the tensor cores read it."""
    desc = instr_descriptor(op, piece, k_step)
    return type(desc).decode(desc.encode(), op.kind)


def _scale_bytes(cta: CTA, ref: LoweredTmem, lanes, columns, first: int, count: int, dtype, loc) -> torch.Tensor:
    """Scales `first` .. `first + count - 1` of the words at (lanes, columns), as float32: (..., count)."""
    cta.tmem.check(loc, "this tcgen05_mma's scales", lanes, columns, ref.addr, ref.addr + ref.layout.columns)
    words = cta.tmem.cells[lanes, columns].to(torch.int64)[..., None] & 0xFFFFFFFF
    shifts = 8 * torch.arange(first, first + count, dtype=torch.int64)
    return numerics.from_bits((words >> shifts) & 0xFF, dtype).to(torch.float32)


def _scaled_product(op: Tcgen05Mma, cta: CTA, piece: MMAPiece, k_step: int, idesc, a_block: torch.Tensor,
                    b_block: torch.Tensor, scales: list[LoweredTmem]) -> torch.Tensor:
    """(A * scale_A) @ (B * scale_B)^T of one block-scaled instruction on this CTA's 128 rows. Row m's scales come
    from lane m, column (the word the instruction names) + m // 32; partition p (rows 32p..32p+31) reads column
    n's B scales from its own copy, lane 32p + n % 32, column + n // 32; the scale factor IDs pick the bytes."""
    scaling = op.scaling
    count, dtype = scaling.scales_per_instruction, scaling.scale_dtype
    a_ref, b_ref = scales
    a_column, b_column = _scale_columns(op, piece, k_step)
    a_vals, b_vals = numerics.mma_input(a_block), numerics.mma_input(b_block)
    rows, n = a_vals.shape[0], b_vals.shape[0]
    m = torch.arange(rows)
    sa = _scale_bytes(cta, a_ref, m, a_ref.addr + a_column + m // LANES_PER_WARP, idesc.a_scale_id, count, dtype,
                      op.loc)
    a_scaled = a_vals * sa.repeat_interleave(scaling.block, dim=1)
    cols = torch.arange(n)
    out = torch.empty(rows, n)
    for p in range(WARPS_PER_WARPGROUP):
        sb = _scale_bytes(cta, b_ref, LANES_PER_WARP * p + cols % LANES_PER_WARP,
                          b_ref.addr + b_column + cols // LANES_PER_WARP, idesc.b_scale_id, count, dtype, op.loc)
        part = slice(LANES_PER_WARP * p, LANES_PER_WARP * (p + 1))
        out[part] = a_scaled[part] @ (b_vals * sb.repeat_interleave(scaling.block, dim=1)).T
    return out


@interpret.rule(Tcgen05Mma)
def _interp_tcgen05_mma(op: Tcgen05Mma, wg: Warpgroup) -> None:
    """Issued by one thread (the pair's leader CTA's, for 2 CTAs). Its SMEM operands must be ready now; they
    count as read, and its accumulator columns as written, until a barrier of a commit issued after it tells
    the reader the MMA is done. A block-scaled MMA reads each CTA's scales from that CTA's TMEM."""
    cta_group = 2 if op.collective else 1
    cta, engine = wg.cta, wg.engine
    if cta.rank % cta_group:
        return
    acc_v, a_v, b_v, accumulate_v = op.operands[:4]
    acc, a, b = (wg.get(v, op) for v in (acc_v, a_v, b_v))
    scales = [wg.get(v, op) for v in op.scales] if op.scales else []
    accumulate = bool(wg.scalar(accumulate_v, op))
    pair = wg.cluster.ctas[cta.rank:cta.rank + cta_group]
    k_step, k = op.kind.instruction_k, a_v.type.shape[1]
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
        for ref in ([a] if a_in_tmem else []) + scales:
            c.tmem.records.add(Access(ref.addr, ref.addr + ref.layout.columns, "read", queue, ordinal, op.loc,
                                      "tcgen05_mma"))

    def compute() -> None:
        d_dtype = acc_v.dtype
        for piece in acc.layout.mma_pieces():
            idesc = _decoded(op, piece, 0)
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
                    if scales:
                        d = d + _scaled_product(op, c, piece, kk, _decoded(op, piece, kk), a_block, b_block,
                                                scales)
                    else:
                        d = d + numerics.mma_input(a_block) @ numerics.mma_input(b_block).T
                bits = numerics.to_bits(d.to(numerics.torch_dtype(d_dtype)), d_dtype).to(torch.int64)
                c.tmem.cells[lanes, columns] = (bits & ((1 << d_dtype.bits) - 1)).to(torch.int32)

    engine.issue(AsyncOp(queue, op.loc, "tcgen05_mma", compute, tuple(pair)))


@interpret.rule(Tcgen05Copy)
def _interp_tcgen05_copy(op: Tcgen05Copy, wg: Warpgroup) -> None:
    """Issued by one thread (the pair's leader, for 2 CTAs) into the MMAs' queue: each CTA's tile is read as the
    instruction reads it, through each chunk's descriptor, and written to every partition of its TMEM (warpx4)."""
    cta_group = wg.run.kernel.cta_group
    cta, engine = wg.cta, wg.engine
    if cta.rank % cta_group:
        return
    dst, src = (wg.get(v, op) for v in op.operands)
    pair = wg.cluster.ctas[cta.rank:cta.rank + cta_group]
    queue = ("mma", cta.rank, wg.index)
    ordinal = engine.next_in(queue)
    columns = (dst.addr, dst.addr + dst.layout.columns)
    for c in pair:
        for start, end in tile_ranges(src):
            check_read(c.smem_records, start, end, wg.clock, op.loc, "this tcgen05_copy")
            c.smem_records.add(Access(start, end, "read", queue, ordinal, op.loc, "tcgen05_copy"))
        check_write(c.tmem.records, *columns, wg.clock, op.loc, "this tcgen05_copy", space="TMEM", queue=queue)
        c.tmem.records.add(Access(*columns, "mma", queue, ordinal, op.loc, "tcgen05_copy"))
    rows = torch.arange(LANES_PER_WARP, dtype=torch.int64)[:, None]
    byte = torch.arange(16, dtype=torch.int64)[None, :]
    lanes = (rows + LANES_PER_WARP * torch.arange(WARPS_PER_WARPGROUP)).T.reshape(-1, 1)  # every partition

    def copy() -> None:
        for c in pair:
            for offset, column in dst.layout.chunks():
                desc = md.decode_smem_descriptor(tcgen05_smem_descriptor(
                    dataclasses.replace(CHUNK_DESCRIPTOR, start_address=src.offset + offset)), tcgen05=True)
                data = c.read_smem(md.operand_address(desc, Major.K, rows, byte, 8), dtypes.uint8).to(torch.int64)
                words = (data.reshape(LANES_PER_WARP, 4, 4) << 8 * torch.arange(4)).sum(-1)
                targets = dst.addr + column + torch.arange(4)[None, :].expand(lanes.numel(), 4)
                c.tmem.check(op.loc, "this tcgen05_copy", lanes.expand(-1, 4), targets, *columns)
                c.tmem.cells[lanes.expand(-1, 4), targets] = words.repeat(WARPS_PER_WARPGROUP, 1).to(torch.int32)

    engine.issue(AsyncOp(queue, op.loc, "tcgen05_copy", copy, tuple(pair)))


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
