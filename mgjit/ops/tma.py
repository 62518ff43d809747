"""TMA copies between GMEM and SMEM: TmaLoad (completes on an mbarrier; multicast to a cluster),
TmaLoadCollective (a load by one CTA of a 2-CTA pair whose arrival counts in the pair's leader), TmaStore
(optionally a reduction into GMEM) and TmaStoreWait.

A copy moves a whole SMEM tile as one TMA box per swizzle-wide column block of the tile (see smem.py); the
descriptor (box and swizzle) is built by the launcher from the tensor argument and passed as a 128-byte
grid-constant parameter. Out-of-bounds elements of a load read as zero; out-of-bounds elements of a store are
dropped.
"""
from __future__ import annotations

import math
from typing import Sequence

from .. import infer, lower
from ..errors import Loc
from ..ir import Op, Value, check, is_ref
from .clusters import cluster_ctarank, pair_leader_rank
from .smem import SmemTile, shared_address, tile_bytes


class TmaLoad(Op):
    """Copy a tile of a GMEM tensor at `coords` into an SMEM tile with the TMA engine; completion is
    signalled on `barrier` (which the op arms with the byte count). Out-of-bounds elements read as zero."""

    name = "tma_load"
    requires = "tma"

    def __init__(self, src: Value, coords: Sequence[Value], dst: Value, barrier: Value, descriptor: int,
                 loc: Loc | None, multicast: int = 0):
        super().__init__([src, *coords, dst, barrier], [], loc)
        self.descriptor = descriptor  # index into Kernel.tma_descriptors
        # With multicast=n, each of the cluster's n CTAs copies 1/n of the tile's rows to all of them.
        self.multicast = multicast

    @property
    def src(self) -> Value:
        return self.operands[0]

    @property
    def coords(self) -> list[Value]:
        return self.operands[1:-2]

    @property
    def dst(self) -> Value:
        return self.operands[-2]

    @property
    def barrier(self) -> Value:
        return self.operands[-1]

    def attrs(self):
        return {"descriptor": self.descriptor, **({"multicast": self.multicast} if self.multicast else {})}

    def verify(self):
        check(is_ref(self.src, "gmem"), self, "TMA copies from a GMEM tensor argument")
        check(is_ref(self.dst, "smem") and not self.dst.type.transposed, self,
               "TMA copies into an SMEM tile (not a transposed view)")
        check(is_ref(self.barrier, "barrier") and self.barrier.type.rank == 0, self,
               "a TMA copy completes on one barrier: index the barrier array, e.g. bars[slot]")
        check(len(self.coords) == self.src.type.rank == self.dst.type.rank, self,
               f"a rank-{self.src.type.rank} tensor needs {self.src.type.rank} coordinates and an SMEM tile of "
               f"that rank, got {len(self.coords)} and rank {self.dst.type.rank}")
        check(self.src.dtype == self.dst.dtype, self,
               f"TMA cannot convert: {self.src.dtype.name} tensor into a {self.dst.dtype.name} tile")


class TmaLoadCollective(TmaLoad):
    """A TMA load by one CTA of a 2-CTA pair into its own SMEM whose arrival and bytes are counted on the
    barrier at the same offset in the pair's leader CTA (even cluster rank), where the 2-CTA MMA waits."""

    requires = "tcgen05"  # the .cta_group::2 form of the copy is Blackwell's
    name = "tma_load"

    def attrs(self):
        return {**super().attrs(), "collective": True}


class TmaStore(Op):
    """Copy an SMEM tile to the tile of a GMEM tensor at `coords` with the TMA engine (or add it there, with
    reduce="add"); asynchronous: complete with TmaStoreWait before the tile is written again."""

    name = "tma_store"
    requires = "tma"

    def __init__(self, dst: Value, coords: Sequence[Value], src: Value, descriptor: int, reduce: str | None,
                 loc: Loc | None):
        super().__init__([dst, *coords, src], [], loc)
        self.descriptor = descriptor
        self.reduce = reduce

    @property
    def coords(self) -> list[Value]:
        return self.operands[1:-1]

    def attrs(self):
        return {"descriptor": self.descriptor, "reduce": self.reduce}

    def verify(self):
        dst, src = self.operands[0], self.operands[-1]
        check(is_ref(dst, "gmem") and is_ref(src, "smem") and not src.type.transposed, self,
               "a TMA store goes from an SMEM tile to a GMEM tensor")
        check(len(self.coords) == dst.type.rank == src.type.rank, self,
               f"a rank-{dst.type.rank} tensor needs {dst.type.rank} coordinates and an SMEM tile of that rank")
        check(dst.dtype == src.dtype, self, f"TMA cannot convert: {src.dtype.name} tile into {dst.dtype.name}")
        check(self.reduce in (None, "add", "min", "max"), self, f"TMA reductions are add, min, max; got {self.reduce}")


class TmaStoreWait(Op):
    """Wait until at most `pending` TMA store groups of this warpgroup still read their SMEM source."""

    name = "tma_store_wait"
    requires = "tma"

    def __init__(self, pending: int, loc: Loc | None):
        super().__init__([], [], loc)
        self.pending = pending

    def attrs(self):
        return {"pending": self.pending}


infer.rule(TmaLoad, TmaLoadCollective, TmaStore, TmaStoreWait)(infer.no_arrays)


# ---------------------------------------------------------------------------------------------- lowering

@lower.rule(TmaLoad)
def _tma_load(op: TmaLoad, ctx: lower.Context) -> None:
    e = ctx.e
    dst: SmemTile = ctx.get(op.dst)
    bar = shared_address(ctx, ctx.get(op.barrier).offset)
    desc = ctx.tma_descriptors[op.descriptor]
    spec = ctx.kernel.tma_descriptors[op.descriptor]
    t = dst.type
    rank = len(t.shape)
    box_inner = spec.box[-1]
    blocks = t.shape[-1] // box_inner
    block_bytes = tile_bytes(t) // blocks
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    # The barrier expects the whole tile, also under multicast, where the other CTAs deliver their parts.
    e.asm_void(f"@$0 mbarrier.arrive.expect_tx.shared::cta.b64 _, [$1], {tile_bytes(t)};", "b,r", [elected, bar])
    coords = [ctx.get(c) for c in op.coords]
    dst_addr = shared_address(ctx, dst.offset)
    extra, suffix, mask = [], "", []
    if op.multicast:
        # This CTA copies rows [rank*R/n, (rank+1)*R/n) of every column block, to every CTA of the cluster.
        n = op.multicast
        rank_id = cluster_ctarank(ctx)
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


@lower.rule(TmaLoadCollective)
def _tma_load_collective(op: TmaLoadCollective, ctx: lower.Context) -> None:
    e = ctx.e
    dst: SmemTile = ctx.get(op.dst)
    desc = ctx.tma_descriptors[op.descriptor]
    spec = ctx.kernel.tma_descriptors[op.descriptor]
    t = dst.type
    rank = len(t.shape)
    nbytes = math.prod(t.shape) * t.dtype.bits // 8
    blocks = t.shape[-1] // spec.box[-1]
    # The barrier at the same offset in the leader CTA, in the cluster's shared window.
    local = shared_address(ctx, ctx.get(op.barrier).offset)
    bar = e.asm("mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r", [local, pair_leader_rank(ctx)], [e.int_type(32)])[0]
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    e.asm_void(f"@$0 mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64 _, [$1], {nbytes};", "b,r",
               [elected, bar])
    coords = [ctx.get(c) for c in op.coords]
    dst_addr = shared_address(ctx, dst.offset)
    for j in range(blocks):
        inner = e.addi(coords[-1], e.i32(j * spec.box[-1])) if j else coords[-1]
        ordered = [inner] + coords[-2::-1]  # innermost first
        slots = ", ".join(f"${i + 4}" for i in range(rank))
        e.asm_void(f"@$0 cp.async.bulk.tensor.{rank}d.cta_group::2.shared::cluster.global.mbarrier::complete_tx::bytes "
                   f"[$1], [$2, {{{slots}}}], [$3];", ",".join(["b", "r", "l", "r"] + ["r"] * rank),
                   [elected, e.addi(dst_addr, e.i32(j * nbytes // blocks)), desc, bar, *ordered])


@lower.rule(TmaStore)
def _tma_store(op: TmaStore, ctx: lower.Context) -> None:
    e = ctx.e
    src: SmemTile = ctx.get(op.operands[-1])
    desc = ctx.tma_descriptors[op.descriptor]
    spec = ctx.kernel.tma_descriptors[op.descriptor]
    t = src.type
    rank = len(t.shape)
    blocks = t.shape[-1] // spec.box[-1]
    block_bytes = tile_bytes(t) // blocks
    # Every thread's ordinary SMEM writes must be visible to the TMA engine before one thread issues it.
    e.asm_void("fence.proxy.async.shared::cta;", "", [])
    ctx.warpgroup_barrier()
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    coords = [ctx.get(c) for c in op.coords]
    src_addr = shared_address(ctx, src.offset)
    verb = (f"cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.{op.reduce}.tile.bulk_group" if op.reduce
            else f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group")
    for j in range(blocks):
        inner = e.addi(coords[-1], e.i32(j * spec.box[-1])) if j else coords[-1]
        ordered = [inner] + coords[-2::-1]
        slots = ", ".join(f"${i + 3}" for i in range(rank))
        e.asm_void(f"@$0 {verb} [$1, {{{slots}}}], [$2];", ",".join(["b", "l", "r"] + ["r"] * rank),
                   [elected, desc, e.addi(src_addr, e.i32(j * block_bytes)), *ordered])
    e.asm_void("@$0 cp.async.bulk.commit_group;", "b", [elected])


@lower.rule(TmaStoreWait)
def _tma_store_wait(op: TmaStoreWait, ctx: lower.Context) -> None:
    e = ctx.e
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    e.asm_void(f"@$0 cp.async.bulk.wait_group.read {op.pending};", "b", [elected])
    ctx.warpgroup_barrier()  # the whole warpgroup may now overwrite the tiles
