"""TMA copies between GMEM and SMEM: TmaLoad (completes on an mbarrier; multicast to a cluster),
TmaLoadCollective (a load by one CTA of a 2-CTA pair whose arrival counts in the pair's leader), TmaStore
(optionally a reduction into GMEM), TmaStoreWait, TmaPrefetch (a tile into L2), TmaGather (rows picked by an
index array into an SMEM tile: embedding lookups, MoE token gathers) and TmaDescriptorCut (a copy of a tensor's
descriptor, built on the device in GMEM, whose dimensions stop short of the tensor's: a store through it drops
what lies past them, as a grouped GEMM's stores must stop at their group's last row).

A copy moves a whole SMEM tile (or a view of one) as one TMA box per swizzle-wide column block of each of its
stages (`tiles.Tile.boxes`); the descriptor (box and swizzle) is built by the launcher from the tensor argument
and passed as a 128-byte grid-constant parameter. Out-of-bounds elements of a load read as zero; out-of-bounds
elements of a store are dropped. A gather copies one box of one row per row and column block: four rows per
instruction on Blackwell (tile::gather4), one on Hopper; the swizzle follows from each row's SMEM address, as
for any TMA write.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any, Generator, Iterator, Sequence

import torch

from .. import dtypes, infer, interpret, lower, tiles
from ..errors import Check, InterpretError, Loc, Rule
from ..interpret import numerics
from ..interpret.checker import Access, check_read, check_write, fence
from ..interpret.scheduler import AsyncOp, Wait, Warpgroup
from ..ir import Op, RefType, ScalarType, Value, check, is_int_scalar, is_ref
from ..lower.context import LoweredRef
from .clusters import cluster_ctarank, pair_leader_rank
from .gmem import window_slices
from .smem import SmemTile, shared_address, tile_of, tile_ranges
from .smem_views import base_alignment


class TmaLoad(Op):
    """Copy a tile of a GMEM tensor at `coords` into an SMEM tile with the TMA engine; completion is
    signalled on `barrier` (which the op arms with the byte count). Out-of-bounds elements read as zero."""

    name = "tma_load"
    requires = "tma"

    def __init__(self, src: Value, coords: Sequence[Value], dst: Value, barrier: Value, descriptor: int,
                 loc: Loc | None, multicast: int = 0, stride: int | None = None):
        super().__init__([src, *coords, dst, barrier], [], loc)
        self.descriptor = descriptor  # index into Kernel.tma_descriptors
        # With multicast=n, each of n CTAs copies 1/n of the tile's rows to all of them: the cluster's CTAs, or
        # with a stride those along one axis of it, ranks first + p * stride (p < n) around this CTA's.
        self.multicast = multicast
        self.stride = stride

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
        return {"descriptor": self.descriptor, **({"multicast": self.multicast} if self.multicast else {}),
                **({"stride": self.stride} if self.stride is not None else {})}

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
        check_boxes(self, self.dst)
        if self.multicast and not tile_of(self.dst.type).folds:
            raise self.error("a multicast copy splits the rows of one box over the cluster: copy a tile of one "
                             "stage (or whose stages fold into one box: one column block per row)", rule=Rule.CLUSTER)


class TmaLoadCollective(TmaLoad):
    """A TMA load by one CTA of a 2-CTA pair into its own SMEM whose arrival and bytes are counted on the
    barrier at the same offset in the pair's leader CTA (even cluster rank), where the 2-CTA MMA waits."""

    requires = "tcgen05"  # the .cta_group::2 form of the copy is Blackwell's
    name = "tma_load"

    def attrs(self):
        return {**super().attrs(), "collective": True}


class TmaStore(Op):
    """Copy an SMEM tile to the tile of a GMEM tensor at `coords` with the TMA engine (or add it there, with
    reduce="add"); asynchronous: complete with TmaStoreWait before the tile is written again. With `cut` (a
    TmaDescriptorCut's result) the copy goes through that device-built descriptor instead of the launch's."""

    name = "tma_store"
    requires = "tma"

    def __init__(self, dst: Value, coords: Sequence[Value], src: Value, descriptor: int, reduce: str | None,
                 loc: Loc | None, cut: Value | None = None):
        super().__init__([dst, *coords, src, *([cut] if cut is not None else [])], [], loc)
        self.descriptor = descriptor
        self.reduce = reduce
        self.rank = len(coords)

    @property
    def coords(self) -> list[Value]:
        return self.operands[1:1 + self.rank]

    @property
    def src(self) -> Value:
        return self.operands[1 + self.rank]

    @property
    def cut(self) -> Value | None:
        return self.operands[2 + self.rank] if len(self.operands) > 2 + self.rank else None

    def attrs(self):
        return {"descriptor": self.descriptor, "reduce": self.reduce, **({"cut": True} if self.cut else {})}

    def verify(self):
        dst, src = self.operands[0], self.src
        check(is_ref(dst, "gmem") and is_ref(src, "smem") and not src.type.transposed, self,
               "a TMA store goes from an SMEM tile to a GMEM tensor")
        check(len(self.coords) == dst.type.rank == src.type.rank, self,
               f"a rank-{dst.type.rank} tensor needs {dst.type.rank} coordinates and an SMEM tile of that rank")
        check(dst.dtype == src.dtype, self, f"TMA cannot convert: {src.dtype.name} tile into {dst.dtype.name}")
        check(self.reduce in (None, "add", "min", "max"), self, f"TMA reductions are add, min, max; got {self.reduce}")
        check_boxes(self, src)


# The TMA engine reads and writes SMEM at 128-byte aligned addresses.
TMA_SMEM_ALIGN = 128
# A TMA load's box starts on a multiple of 16 bytes along the tensor's innermost dimension: an H200 faulted
# ("illegal instruction") on boxes of bf16 rows starting 3 elements in, or 133 elements in with rows 266 bytes
# apart inside a view whose strides are multiples of 16 (benchmarks/RESULTS.md, forty-sixth session).
TMA_GMEM_START_ALIGN = 16


def check_boxes(op: Op, tile: Value) -> None:
    """The SMEM side of a TMA copy: whole rows of each box stored one right after the other (not a view of some
    columns of several rows of an unswizzled tile, whose rows keep the pitch of the tile they were cut from; a
    view of one row has no pitch), each box starting on 128 bytes."""
    t = tile.type
    stored = tile_of(t)
    if not stored.dense and stored.rows > 1:
        raise op.error(f"TMA moves whole rows of a box, stored one after the other; this view of {t.shape[-1]} of "
                       f"the {t.storage[1]} columns of an unswizzled tile keeps their pitch: copy through a tile of "
                       f"its own, or a swizzled one (whose column blocks are boxes)", rule=Rule.SMEM_SLICE)
    align = math.gcd(base_alignment(tile), *(byte for _, byte in stored.boxes()))
    if align % TMA_SMEM_ALIGN:
        raise op.error(f"the TMA engine writes SMEM at {TMA_SMEM_ALIGN}-byte aligned addresses, but this tile's "
                       f"boxes start at multiples of only {align} bytes (its stages, views and rows are placed by "
                       f"the tile's shape): give the stages or rows a multiple of {TMA_SMEM_ALIGN} bytes",
                       rule=Rule.TMA_BOX)


class TmaDescriptorCut(Op):
    """Copy `tensor`'s TMA descriptor `descriptor` (the launch's) into the 128 bytes at `slot` of the uint8
    tensor `descriptors` and cut its dimension sizes to `dims` (None keeps one): the result, the copy's
    address, is what TmaStore's `cut` takes. The warpgroup's TMA stores issued before it complete first (one of
    them may still read the slot)."""

    name = "tma_descriptor_cut"
    requires = "tma"

    def __init__(self, tensor: Value, descriptors: Value, slot: Value, dims: Sequence[Value | None],
                 descriptor: int, loc: Loc | None):
        super().__init__([tensor, descriptors, slot, *(d for d in dims if d is not None)], [ScalarType(dtypes.int64)],
                         loc)
        self.cut_dims = tuple(d is not None for d in dims)
        self.descriptor = descriptor

    def attrs(self):
        return {"descriptor": self.descriptor, "cut": tuple(int(c) for c in self.cut_dims)}

    def verify(self):
        tensor, descriptors, slot = self.operands[:3]
        check(is_ref(tensor, "gmem") and len(self.cut_dims) == tensor.type.rank, self,
              "cut the dimensions of a tensor argument: one size (or None) per dimension")
        check(is_ref(descriptors, "gmem") and descriptors.dtype == dtypes.uint8 and descriptors.type.rank == 1, self,
              f"TMA descriptors built on the device go in a 1-D uint8 tensor of {DESCRIPTOR_BYTES}-byte slots, got "
              f"{descriptors.type}")
        for v in self.operands[2:]:
            check(is_int_scalar(v), self, f"a slot and dimension sizes are integer scalars, got {v.type}")


class TmaStoreWait(Op):
    """Wait until at most `pending` TMA store groups of this warpgroup still read their SMEM source."""

    name = "tma_store_wait"
    requires = "tma"
    releases_smem = True

    def __init__(self, pending: int, loc: Loc | None):
        super().__init__([], [], loc)
        self.pending = pending

    def attrs(self):
        return {"pending": self.pending}


class TmaPrefetch(Op):
    """Prefetch into L2 the tile of a GMEM tensor at `coords` that a copy into an SMEM tile typed `tile` would
    read (the same descriptor and boxes): no SMEM is written and nothing completes, it is a hint."""

    name = "tma_prefetch"
    requires = "tma"

    def __init__(self, src: Value, coords: Sequence[Value], tile: RefType, descriptor: int, loc: Loc | None):
        super().__init__([src, *coords], [], loc)
        self.tile = tile
        self.descriptor = descriptor

    def attrs(self):
        return {"descriptor": self.descriptor, "box": tile_of(self.tile).tma_box()}

    def verify(self):
        src, coords = self.operands[0], self.operands[1:]
        check(is_ref(src, "gmem") and len(coords) == src.type.rank == self.tile.rank, self,
               f"a rank-{src.type.rank} tensor's tile needs {src.type.rank} coordinates, got {len(coords)}")
        check(all(is_int_scalar(c) for c in coords), self, "TMA coordinates are integers")


infer.rule(TmaLoad, TmaLoadCollective, TmaStore, TmaStoreWait, TmaPrefetch, TmaDescriptorCut)(infer.no_arrays)
DESCRIPTOR_BYTES = 128  # a CUtensorMap; a copy in GMEM must sit at a multiple of 128 bytes


# ---------------------------------------------------------------------------------------------- lowering

def _boxes(ctx: lower.Context, tile: SmemTile, coords: list, addr) -> Iterator[tuple[list, Any]]:
    """Per TMA box of a tile: its coordinates, innermost first as the instruction takes them, and the SMEM
    address it fills or drains (computed as each is needed, so each copy's arithmetic sits beside it)."""
    e = ctx.e
    for offsets, byte in tile_of(tile.type).boxes():
        at = [e.addi(c, e.i32(o)) if o else c for c, o in zip(coords, offsets)]
        yield at[::-1], e.addi(addr, e.i32(byte))


@lower.rule(TmaLoad)
def _tma_load(op: TmaLoad, ctx: lower.Context) -> None:
    e = ctx.e
    dst: SmemTile = ctx.get(op.dst)
    bar = shared_address(ctx, ctx.get(op.barrier).offset)
    desc = ctx.tma_descriptors[op.descriptor]
    spec = ctx.kernel.tma_descriptors[op.descriptor]
    stored = tile_of(dst.type)
    rank = len(stored.shape)
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    # The barrier expects the whole tile, also under multicast, where the other CTAs deliver their parts.
    e.asm_void(f"@$0 mbarrier.arrive.expect_tx.shared::cta.b64 _, [$1], {stored.nbytes};", "b,r", [elected, bar])
    coords = [ctx.get(c) for c in op.coords]
    dst_addr = shared_address(ctx, dst.offset)
    extra, suffix, mask = [], "", []
    if op.multicast:
        # This CTA, the p-th of the n it copies for, copies rows [p*R/n, (p+1)*R/n) of every column block to
        # each of them: the whole cluster (p its rank), or the CTAs along one axis, p its place on that axis.
        n = op.multicast
        rank_id = cluster_ctarank(ctx)
        if op.stride is None:
            place, mask = rank_id, e.i32((1 << n) - 1)
        else:
            place = e.remui(e.divui(rank_id, e.i32(op.stride)), e.i32(n))
            group = sum(1 << (p * op.stride) for p in range(n))
            mask = e.m.arith.shli(e.i32(group), e.subi(rank_id, e.muli(place, e.i32(op.stride))))
        first_row = e.muli(place, e.i32(spec.box[0]))
        coords = [e.addi(coords[0], first_row)] + coords[1:]
        dst_addr = e.addi(dst_addr, e.muli(first_row, e.i32(stored.dim0_bytes())))
        suffix = ".multicast::cluster"
        mask = [e.trunc(mask, 16)]
        extra = [f"${4 + rank}"]
    slots = ", ".join(f"${i + 4}" for i in range(rank))
    for ordered, addr in _boxes(ctx, dst, coords, dst_addr):
        e.asm_void(
            f"@$0 cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes{suffix} "
            f"[$1], [$2, {{{slots}}}], [$3]{''.join(', ' + x for x in extra)};",
            ",".join(["b", "r", "l", "r"] + ["r"] * rank + ["h"] * len(mask)),
            [elected, addr, desc, bar, *ordered, *mask])


@lower.rule(TmaLoadCollective)
def _tma_load_collective(op: TmaLoadCollective, ctx: lower.Context) -> None:
    e = ctx.e
    dst: SmemTile = ctx.get(op.dst)
    desc = ctx.tma_descriptors[op.descriptor]
    stored = tile_of(dst.type)
    rank = len(stored.shape)
    # The barrier at the same offset in the leader CTA, in the cluster's shared window.
    local = shared_address(ctx, ctx.get(op.barrier).offset)
    bar = e.asm("mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r", [local, pair_leader_rank(ctx)], [e.int_type(32)])[0]
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    e.asm_void(f"@$0 mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64 _, [$1], {stored.nbytes};",
               "b,r", [elected, bar])
    coords = [ctx.get(c) for c in op.coords]
    slots = ", ".join(f"${i + 4}" for i in range(rank))
    for ordered, addr in _boxes(ctx, dst, coords, shared_address(ctx, dst.offset)):
        e.asm_void(f"@$0 cp.async.bulk.tensor.{rank}d.cta_group::2.shared::cluster.global.mbarrier::complete_tx::bytes "
                   f"[$1], [$2, {{{slots}}}], [$3];", ",".join(["b", "r", "l", "r"] + ["r"] * rank),
                   [elected, addr, desc, bar, *ordered])


@lower.rule(TmaStore)
def _tma_store(op: TmaStore, ctx: lower.Context) -> None:
    e = ctx.e
    src: SmemTile = ctx.get(op.src)
    desc = ctx.get(op.cut) if op.cut is not None else ctx.tma_descriptors[op.descriptor]
    rank = len(src.type.shape)
    # Every thread's ordinary SMEM writes must be visible to the TMA engine before one thread issues it.
    if ctx.async_unfenced:
        ctx.fence_async()
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    coords = [ctx.get(c) for c in op.coords]
    src_addr = shared_address(ctx, src.offset)
    verb = (f"cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.{op.reduce}.tile.bulk_group" if op.reduce
            else f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group")
    slots = ", ".join(f"${i + 3}" for i in range(rank))
    for ordered, addr in _boxes(ctx, src, coords, src_addr):
        e.asm_void(f"@$0 {verb} [$1, {{{slots}}}], [$2];", ",".join(["b", "l", "r"] + ["r"] * rank),
                   [elected, desc, addr, *ordered])
    e.asm_void("@$0 cp.async.bulk.commit_group;", "b", [elected])


@lower.rule(TmaDescriptorCut)
def _tma_descriptor_cut(op: TmaDescriptorCut, ctx: lower.Context) -> None:
    """The first thread copies the launch's descriptor (a grid-constant parameter) into the slot with ordinary
    stores, rewrites its dimension sizes (tensormap.replace, dimension 0 the innermost), and fences so that
    the TMA engine (the tensormap proxy) reads what it wrote. A slot past the tensor's end or not 128-byte
    aligned traps."""
    e = ctx.e
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    param = ctx.tma_descriptors[op.descriptor]
    slots: LoweredRef = ctx.get(op.operands[1])
    slot = e.addi(slots.ptr, e.muli(e.ext_i64(ctx.get(op.operands[2])), e.i64(DESCRIPTOR_BYTES)))
    # A slot outside the tensor or off the 128-byte grid would be a descriptor the TMA engine misreads: trap.
    e.asm_void(f"{{ .reg .pred bad; .reg .b64 low; and.b64 low, $0, {DESCRIPTOR_BYTES - 1}; setp.ne.or.b64 bad, "
               f"low, 0, $1; @bad trap; }}", "l,b", [slot, e.cmpi("uge", ctx.get(op.operands[2]),
                                                                 e.divui(slots.sizes[0], e.i32(DESCRIPTOR_BYTES)))])
    e.asm_void("@$0 cp.async.bulk.wait_group 0;", "b", [elected])
    copy = " ".join(f"ld.v4.b32 {{w0, w1, w2, w3}}, [$1 + {i}]; st.global.v4.b32 [$2 + {i}], {{w0, w1, w2, w3}};"
                    for i in range(0, DESCRIPTOR_BYTES, 16))
    e.asm_void(f"{{ .reg .b32 w0, w1, w2, w3; @!$0 bra CUTDONE; {copy} CUTDONE: }}", "b,l,l", [elected, param, slot])
    sizes = iter(op.operands[3:])
    rank = len(op.cut_dims)
    for d, cut in enumerate(op.cut_dims):
        if cut:
            e.asm_void(f"@$0 tensormap.replace.tile.global_dim.global.b1024.b32 [$1], {rank - 1 - d}, $2;", "b,l,r",
                       [elected, slot, ctx.get(next(sizes))])
    e.asm_void("@$0 fence.proxy.tensormap::generic.release.gpu;", "b", [elected])
    e.asm_void(f"@$0 fence.proxy.tensormap::generic.acquire.gpu [$1], {DESCRIPTOR_BYTES};", "b,l", [elected, slot])
    ctx.set(op.result, slot)


@lower.rule(TmaPrefetch)
def _tma_prefetch(op: TmaPrefetch, ctx: lower.Context) -> None:
    e = ctx.e
    desc = ctx.tma_descriptors[op.descriptor]
    rank = op.tile.rank
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    coords = [ctx.get(c) for c in op.operands[1:]]
    slots = ", ".join(f"${i + 2}" for i in range(rank))
    for ordered, _ in _boxes(ctx, SmemTile(e.i32(0), op.tile), coords, e.i32(0)):
        e.asm_void(f"@$0 cp.async.bulk.prefetch.tensor.{rank}d.L2.global.tile [$1, {{{slots}}}];",
                   ",".join(["b", "l"] + ["r"] * rank), [elected, desc, *ordered])


@lower.rule(TmaStoreWait)
def _tma_store_wait(op: TmaStoreWait, ctx: lower.Context) -> None:
    e = ctx.e
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    e.asm_void(f"@$0 cp.async.bulk.wait_group.read {op.pending};", "b", [elected])
    ctx.smem_released = True  # the warpgroup's next store to SMEM meets it first (Context.smem_released)


# ---------------------------------------------------------------------------------------------- interpreter
# A copy moves the boxes the lowering issues (one per column block of the tile, `Tile.boxes`), each as the TMA
# engine does: the descriptor's box read from GMEM at the box's coordinates (zeros outside the tensor) and
# written row-major from the box's SMEM address with the descriptor's swizzle applied to the address.

_loads = itertools.count()


@functools.lru_cache(maxsize=64)
def _row_major(box: tuple[int, ...], itemsize: int) -> torch.Tensor:
    return torch.arange(math.prod(box), dtype=torch.int64).reshape(box) * itemsize


def box_addresses(box: tuple[int, ...], itemsize: int, swizzle: int, address: int) -> torch.Tensor:
    """The SMEM byte address of every element of a TMA box written (or read) at `address`."""
    addresses = address + _row_major(box, itemsize)
    return tiles.swizzle(addresses, swizzle) if swizzle else addresses


def _read_box(tensor: torch.Tensor, coords: list[int], box: tuple[int, ...]) -> torch.Tensor:
    # Zero bytes, viewed as the element type (torch cannot fill some 8-bit float types, e.g. float4_e2m1fn_x2).
    data = torch.zeros(math.prod(box) * tensor.element_size(), dtype=torch.uint8).view(tensor.dtype).reshape(box)
    inside = window_slices(tensor.shape, coords, box)
    if inside is not None:
        data[inside[1]] = tensor[inside[0]]
    return data


def _copy_boxes(stored: tiles.Tile, coords: list[int], address: int) -> list[tuple[list[int], int]]:
    """(GMEM coordinates, outermost first, and SMEM address) of each TMA box of a copy."""
    return [([c + o for c, o in zip(coords, offsets)], address + byte) for offsets, byte in stored.boxes()]


@interpret.rule(TmaLoad, TmaLoadCollective)
def _interp_tma_load(op: TmaLoad, wg: Warpgroup) -> None:
    """Arm the barrier with the tile's bytes (arrive.expect_tx) and issue the copy. A multicast copy brings this
    CTA's share of rows to every CTA of the cluster, counted on each one's barrier at the same slot; a collective
    one counts on the barrier of the pair's leader."""
    cta, cluster = wg.cta, wg.cluster
    dst = wg.get(op.dst, op)
    ref = wg.get(op.barrier, op)
    coords = [int(wg.scalar(c, op)) for c in op.coords]
    spec = wg.run.kernel.tma_descriptors[op.descriptor]
    stored = tile_of(dst.type)
    collective = isinstance(op, TmaLoadCollective)
    bar_cta = cluster.ctas[cta.rank & ~1] if collective else cta
    address, receivers = dst.offset, [cta]
    if op.multicast:
        stride = op.stride or 1  # the whole cluster: ranks 0 .. n-1
        place = cta.rank // stride % op.multicast
        first_row = place * spec.box[0]
        coords[0] += first_row
        address += first_row * stored.dim0_bytes()
        first = cta.rank - place * stride
        receivers = [cluster.ctas[first + p * stride] for p in range(op.multicast)]
    targets = [(t, ref.get(bar_cta if collective else t)) for t in receivers]
    issue_load(op, wg, wg.get(op.src, op), spec, dst.type, _copy_boxes(stored, coords, address), targets,
               ref.get(bar_cta))


def issue_load(op: Op, wg: Warpgroup, src: torch.Tensor, spec, dst: RefType, boxes: list[tuple[list[int], int]],
               targets: list, armed) -> None:
    """Arm barrier `armed` with the bytes of a tile typed `dst` (one arrival) and issue the TMA copies of
    `boxes` (GMEM coordinates, SMEM address) of descriptor `spec` into each (CTA, barrier) of `targets`, whose
    barrier counts the bytes landing there. The bytes are recorded as written by an unfinished copy until it
    lands: reading them before waiting on that barrier is a race."""
    stored, dtype = tile_of(dst), dst.dtype
    box_bytes = math.prod(spec.box) * stored.itemsize
    for box_coords, _ in boxes:
        if box_coords[-1] * stored.itemsize % TMA_GMEM_START_ALIGN:
            raise InterpretError(f"this TMA copy's box starts at element {box_coords[-1]} of the tensor's innermost "
                                 f"dimension, {box_coords[-1] * stored.itemsize} bytes in: the TMA engine starts a "
                                 f"box on a multiple of {TMA_GMEM_START_ALIGN} bytes there (the GPU faults with an "
                                 f"illegal instruction)", op.loc, Check.TMA_START)
    for box_coords, _ in boxes:  # the GMEM it reads: other CTAs' stores must be ordered before the issue
        inside = window_slices(src.shape, box_coords, spec.box)
        if inside is not None:
            wg.run.gmem.check_load(src[inside[0]], wg.clock, op.loc, "this TMA copy", wg.cta.program_id)
    landing = []
    for t, bar in targets:
        accesses = []
        for _, addr in boxes:
            check_write(t.smem_records, addr, addr + box_bytes, wg.clock, op.loc, "this TMA copy")
            access = Access(addr, addr + box_bytes, "tma", bar.key, None, op.loc, "TMA copy")
            t.smem_records.add(access)
            accesses.append(access)
        landing.append((t, bar, accesses))
    armed.arrive(wg.clock, op.loc, tx=stored.nbytes)
    clock = dict(wg.clock)

    def land() -> None:
        for t, bar, accesses in landing:
            for (box_coords, addr), access in zip(boxes, accesses):
                data = _read_box(src, box_coords, spec.box)
                t.write_smem(box_addresses(spec.box, stored.itemsize, spec.swizzle, addr), data, dtype)
                access.count = bar.completed + 1
            bar.complete_tx(box_bytes * len(boxes), clock, op.loc)

    wg.engine.issue(AsyncOp(("tma_load", next(_loads)), op.loc, "TMA copy", land, tuple(t for t, _ in targets)))


_REDUCE = {"add": torch.add, "min": torch.minimum, "max": torch.maximum}


@interpret.rule(TmaStore)
def _interp_tma_store(op: TmaStore, wg: Warpgroup) -> None:
    """Fence the warpgroup's SMEM stores (the lowering does, before it issues), check the tile is ready, and
    issue the copy: at completion each box is read from SMEM and written (or reduced) into the tensor, with
    what falls outside dropped. The tile counts as read by the store until a store_async_wait retires it."""
    cta, engine = wg.cta, wg.engine
    dst = wg.get(op.operands[0], op)
    if op.cut is not None:  # the device-built descriptor's sizes: what lies past them is dropped
        dst = dst[tuple(slice(0, size) for size in wg.get(op.cut, op).sizes)]
    src = wg.get(op.src, op)
    coords = [int(wg.scalar(c, op)) for c in op.coords]
    spec = wg.run.kernel.tma_descriptors[op.descriptor]
    stored, dtype = tile_of(src.type), src.type.dtype
    fence(cta.smem_records, wg.agent)
    queue = ("tma_store", cta.rank, wg.index)
    for start, end in tile_ranges(src):
        check_read(cta.smem_records, start, end, wg.clock, op.loc, "this TMA store")
        cta.smem_records.add(Access(start, end, "read", queue, engine.next_in(queue), op.loc, "TMA store"))

    def store() -> None:
        for box_coords, addr in _copy_boxes(stored, coords, src.offset):
            data = cta.read_smem(box_addresses(spec.box, stored.itemsize, spec.swizzle, addr), dtype)
            inside = window_slices(dst.shape, box_coords, spec.box)
            if inside is None:
                continue
            part = data[inside[1]]
            if op.reduce:
                wide = _REDUCE[op.reduce](numerics.widen(dst[inside[0]], dtype), numerics.widen(part, dtype))
                part = wide.to(dst.dtype)
            dst[inside[0]] = part

    engine.issue(AsyncOp(queue, op.loc, "TMA store", store, (cta,)))


@dataclasses.dataclass(frozen=True)
class CutDescriptor:
    """A TmaDescriptorCut's result in the interpreter: the dimension sizes of the tensor as it describes it."""

    sizes: tuple[int, ...]


@interpret.rule(TmaDescriptorCut)
def _interp_tma_descriptor_cut(op: TmaDescriptorCut, wg: Warpgroup) -> None:
    tensor, slots = wg.get(op.operands[0], op), wg.get(op.operands[1], op)
    slot = int(wg.scalar(op.operands[2], op))
    if not 0 <= slot < slots.shape[0] // DESCRIPTOR_BYTES:
        raise InterpretError(f"descriptor slot {slot} of a {slots.shape[0]}-byte tensor: it holds "
                             f"{slots.shape[0] // DESCRIPTOR_BYTES} slots of {DESCRIPTOR_BYTES} bytes", op.loc,
                             Check.OUT_OF_BOUNDS)
    sizes = iter(int(wg.scalar(v, op)) for v in op.operands[3:])
    wg.set(op.result, CutDescriptor(tuple(max(0, min(next(sizes), n)) if cut else n
                                          for cut, n in zip(op.cut_dims, tensor.shape))))


@interpret.rule(TmaPrefetch)
def _interp_tma_prefetch(op: TmaPrefetch, wg: Warpgroup) -> None:
    """L2 is not modelled: a prefetch reads its coordinates and changes nothing."""
    for c in op.operands[1:]:
        wg.scalar(c, op)


@interpret.rule(TmaStoreWait)
def _interp_tma_store_wait(op: TmaStoreWait, wg: Warpgroup) -> Generator[Wait, None, None]:
    yield wg.wait_async(op, ("tma_store", wg.cta.rank, wg.index), op.pending, "store_async_wait")
