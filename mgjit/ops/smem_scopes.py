"""Scoped shared memory: `with mgjit.scoped_smem(shape, dtype, swizzle) as buf:` is a ScopedSmemAlloc where the
block begins and an SmemFree where it ends; and the plan of where every SMEM buffer lives (`smem_plan`).

The kernel's scoped buffers share one arena, allocated once among the kernel's other shared memory (where the
first scoped buffer is lowered). A buffer takes the bytes after those of the scopes still open around it, so
blocks one after the other reuse the same bytes, and the arena is as large as the most that is open at once
(`scope_plan`): the budget counts the maximum live, not the sum. The branches of an `if` may run at the same
time (in different warpgroups, a warp-specialized kernel's roles), so the scopes of a branch take bytes after
those of the branches before it.

Reusing bytes is safe once every warpgroup is done with the earlier buffer: nothing asynchronous still reads or
writes it (a TMA store, an MMA: the race checks see those), and no warpgroup still uses it when another enters
a later scope over the same bytes. Leaving a block synchronises the threads of the warpgroup that leaves it;
the compiler inserts no barrier between warpgroups (the roles of a warp-specialized kernel leave their scopes at
different times), and the interpreter checks it (Check.SMEM_SCOPE): a warpgroup entering a scope must know,
through barriers, that every other warpgroup has left each scope whose bytes overlap.
"""
from __future__ import annotations

import dataclasses

from .. import infer, interpret, ir, lower, tiles
from ..errors import Check, InterpretError, Loc
from ..interpret.scheduler import Warpgroup
from ..ir import Op, Value, check
from .smem import SmemAlloc, SmemTile, tile_alignment, tile_of


class ScopedSmemAlloc(SmemAlloc):
    """A shared-memory buffer for one `with` block: its bytes are the scope plan's, reused after SmemFree."""

    def attrs(self):
        return {**super().attrs(), "scoped": True}


class SmemFree(Op):
    """The end of a scoped buffer's block: later scopes may take its bytes."""

    name = "smem_free"

    def __init__(self, buffer: Value, loc: Loc | None):
        super().__init__([buffer], [], loc)

    @property
    def alloc(self) -> ScopedSmemAlloc:
        return self.operands[0].owner

    def verify(self):
        check(isinstance(self.operands[0].owner, ScopedSmemAlloc), self, "smem_free ends a scoped SMEM buffer")


infer.rule(ScopedSmemAlloc, SmemFree)(infer.no_arrays)


@dataclasses.dataclass(frozen=True)
class ScopePlan:
    offsets: dict[int, int]  # id(ScopedSmemAlloc) -> its byte offset in the arena
    size: int  # the arena's bytes: the most that is open at once


def scope_plan(kernel: ir.Kernel) -> ScopePlan:
    """Where each scoped buffer lives in the arena: after the buffers of the scopes open around it, and in each
    region of an op after the bytes the regions before it took (branches may run at the same time)."""
    offsets: dict[int, int] = {}
    marks: dict[int, int] = {}

    def plan(block: ir.Block, start: int) -> int:
        pointer = peak = start
        for op in block.ops:
            if isinstance(op, ScopedSmemAlloc):
                align = tile_alignment(op.result.type)
                marks[id(op)] = pointer
                pointer = -(-pointer // align) * align
                offsets[id(op)] = pointer
                pointer += tile_of(op.result.type).nbytes
                peak = max(peak, pointer)
            elif isinstance(op, SmemFree):
                pointer = marks[id(op.alloc)]
            region_start = pointer
            for region in op.regions:
                region_start = plan(region, region_start)
                peak = max(peak, region_start)
        return peak

    size = plan(kernel.body, 0)
    return ScopePlan(offsets, -(-size // 16) * 16)


def smem_plan(kernel: ir.Kernel) -> tuple[dict[int, int], int]:
    """Byte offsets of the kernel's SMEM buffers (by id of their alloc op), laid out in program order and
    aligned as the lowering lays them out (the scoped buffers in the arena, placed where the first is), and the
    bytes they need in all. The interpreter's SMEM is this plan."""
    offsets, size, arena = {}, 0, None
    scopes = scope_plan(kernel)
    for op in kernel.walk():
        if isinstance(op, ScopedSmemAlloc):
            if arena is None:
                size = arena = -(-size // tiles.SWIZZLE_ALIGN) * tiles.SWIZZLE_ALIGN
                size += scopes.size
            offsets[id(op)] = arena + scopes.offsets[id(op)]
        elif isinstance(op, SmemAlloc):
            align = tile_alignment(op.result.type)
            size = -(-size // align) * align
            offsets[id(op)] = size
            size += tile_of(op.result.type).nbytes
    return offsets, -(-size // 16) * 16


def check_smem_budget(kernel: ir.Kernel, limit: int) -> None:
    """Refuse, as the lowering does (lower.over_smem_budget), a kernel whose buffers do not fit `limit` bytes,
    naming the first allocation that ends past it. (The lowering also counts the scratch of reductions and
    relayouts; the interpreter lays out the buffers alone.)"""
    offsets, size = smem_plan(kernel)
    if size <= limit:
        return
    for op in kernel.walk():
        end = offsets[id(op)] + tile_of(op.result.type).nbytes if isinstance(op, SmemAlloc) else 0
        if end > limit:
            raise lower.over_smem_budget(op, end, limit)


# ---------------------------------------------------------------------------------------------- lowering

@lower.rule(ScopedSmemAlloc)
def _scoped_smem_alloc(op: ScopedSmemAlloc, ctx: lower.Context) -> None:
    if ctx.smem_arena is None:
        plan = scope_plan(ctx.kernel)
        ctx.smem_arena = (ctx.alloc_shared(plan.size, tiles.SWIZZLE_ALIGN), plan)
    base, plan = ctx.smem_arena
    ctx.set(op.result, SmemTile(ctx.e.i32(base + plan.offsets[id(op)]), op.result.type))


@lower.rule(SmemFree)
def _smem_free(op: SmemFree, ctx: lower.Context) -> None:
    """The warpgroup's threads meet: none still reads the buffer when one of them starts writing a later
    scope's bytes (a TMA copy issued by one thread, say). Other warpgroups are the kernel's to order."""
    ctx.warpgroup_barrier()


# ---------------------------------------------------------------------------------------------- interpreter
# cta.scopes: id(ScopedSmemAlloc) -> {warpgroup index: (count of its own clock component when it left the
# scope, or None while inside; the line it left at)}.

@interpret.rule(ScopedSmemAlloc)
def _interp_scoped_smem_alloc(op: ScopedSmemAlloc, wg: Warpgroup) -> None:
    """Entering a scope: every other warpgroup's use of a scope over the same bytes must be known to have
    ended (its exit ordered before this entry by a barrier)."""
    offsets = wg.run.smem_offsets
    start = offsets[id(op)]
    end = start + tile_of(op.result.type).nbytes
    for other, users in wg.cta.scopes.items():
        if other is op:
            continue
        o_start = offsets[id(other)]
        if not (o_start < end and start < o_start + tile_of(other.result.type).nbytes):
            continue
        for index, (left, left_at) in users.items():
            if index == wg.index:
                continue
            where = f"the scoped SMEM buffer of line {other.loc.line if other.loc else '?'}"
            if left is None:
                raise InterpretError(f"this scope's buffer reuses the bytes of {where}, which warpgroup {index} is "
                                     f"still inside: let every warpgroup leave that block, then synchronise (a "
                                     f"barrier both pass), before another enters this one", op.loc, Check.SMEM_SCOPE,
                                     (other.loc,) if other.loc else ())
            if wg.clock.get(("wg", wg.cta.rank, index), 0) < left:
                raise InterpretError(f"this scope's buffer reuses the bytes of {where}, and nothing orders warpgroup "
                                     f"{index}'s exit from that block before this: synchronise (a barrier both pass) "
                                     f"between them", op.loc, Check.SMEM_SCOPE,
                                     tuple(x for x in (other.loc, left_at) if x))
    wg.cta.scopes.setdefault(op, {})[wg.index] = (None, None)
    wg.set(op.result, SmemTile(start, op.result.type))


@interpret.rule(SmemFree)
def _interp_smem_free(op: SmemFree, wg: Warpgroup) -> None:
    wg.cta.scopes[op.alloc][wg.index] = (wg.event(), op.loc)
