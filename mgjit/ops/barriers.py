"""mbarriers and fences: BarrierAlloc (an array of mbarriers, initialised at kernel start), BarrierArrive,
BarrierArriveCluster (an arrival on the barrier of another CTA of the cluster), BarrierWait (on the phase parity
the frontend tracks for the user), FenceAsyncShared (orders ordinary SMEM writes before the TMA engine or tensor
cores read them).

An mbarrier completes a phase once it has seen its expected arrivals and, for TMA copies, its expected bytes;
a warpgroup arrives once (its first thread), a TMA copy arrives once with its byte count.
"""
from __future__ import annotations

from typing import Generator

from .. import dtypes, infer, interpret, lower
from ..errors import Check, InterpretError, Loc
from ..interpret.checker import fence, join
from ..interpret.machine import BarrierRef
from ..interpret.scheduler import Wait, Warpgroup
from ..ir import Op, RefType, Value, check, is_int_scalar, is_ref
from .smem import SmemTile, shared_address


class BarrierAlloc(Op):
    """`count` mbarriers, each expecting `arrivals` arrivals per phase; initialised at kernel start."""

    name = "barrier_alloc"
    requires = "mbarrier"

    def __init__(self, count: int, arrivals: int, loc: Loc | None):
        super().__init__([], [RefType("barrier", dtypes.int64, 1, (count,))], loc)
        self.count = count
        self.arrivals = arrivals

    def attrs(self):
        return {"count": self.count, "arrivals": self.arrivals}

    def verify(self):
        check(self.count >= 1 and 1 <= self.arrivals < 2**20, self,
               f"barriers need count >= 1 and 1 <= arrivals < 2**20, got {self.count} and {self.arrivals}")
        check(self.count <= 64, self, f"a barrier array holds at most 64 barriers (the frontend keeps each one's "
                                      f"phase as a bit of a 64-bit register), got {self.count}")


class BarrierArrive(Op):
    name = "barrier_arrive"
    requires = "mbarrier"

    def __init__(self, barrier: Value, loc: Loc | None):
        super().__init__([barrier], [], loc)

    def verify(self):
        check(is_ref(self.operands[0], "barrier") and self.operands[0].type.rank == 0, self,
               "arrive on one barrier: index the barrier array")


class BarrierArriveCluster(Op):
    """`bars[i].arrive(cta=r)`: one arrival (per warpgroup) on the barrier at the same slot in the CTA of cluster
    rank `r`, released at cluster scope: what that CTA's waiters see includes this CTA's work before it.

    `relaxed=True` releases nothing to the other CTA: no cluster-scope fence, which costs a membar stall per
    arrival (the multicast matmul gave back each ring slot this way: 42.8 against 27.0 µs at 1000x3000x2000 on
    the H100). It says only "I am done with what I read", which is enough where the reads are complete (a slot
    whose wgmmas were waited for): waiters are ordered after the arriver's completed async reads, not after its
    stores, and the interpreter reports a waiter that reads those stores."""

    name = "barrier_arrive_cluster"
    requires = "cluster"

    def __init__(self, barrier: Value, rank: Value, loc: Loc | None, relaxed: bool = False):
        super().__init__([barrier, rank], [], loc)
        self.relaxed = relaxed

    def attrs(self):
        return {"relaxed": self.relaxed} if self.relaxed else {}

    def verify(self):
        check(is_ref(self.operands[0], "barrier") and self.operands[0].type.rank == 0, self,
              "arrive on one barrier: index the barrier array")
        check(is_int_scalar(self.operands[1]), self, "cta= is the cluster rank of the CTA to arrive in: an integer")


class BarrierWait(Op):
    """Wait until the barrier completes the phase with parity `phase` (tracked by the frontend)."""

    name = "barrier_wait"
    requires = "mbarrier"

    def __init__(self, barrier: Value, phase: Value, loc: Loc | None):
        super().__init__([barrier, phase], [], loc)

    def verify(self):
        check(is_ref(self.operands[0], "barrier") and self.operands[0].type.rank == 0, self,
               "wait on one barrier: index the barrier array")


class FenceAsyncShared(Op):
    """Order this warpgroup's ordinary SMEM writes before later reads by the TMA engine or tensor cores: each
    thread fences its writes, then the warpgroup's threads meet, so that an MMA or copy the warpgroup issues
    next reads what every one of its threads wrote (a warp's part of a wgmma may read rows another warp
    stored)."""

    name = "fence_async_shared"

    def __init__(self, loc: Loc | None):
        super().__init__([], [], loc)


infer.rule(BarrierAlloc, BarrierArrive, BarrierArriveCluster, BarrierWait, FenceAsyncShared)(infer.no_arrays)


# ---------------------------------------------------------------------------------------------- lowering

@lower.rule(BarrierAlloc)
def _barrier_alloc(op: BarrierAlloc, ctx: lower.Context) -> None:
    e = ctx.e
    offset = ctx.alloc_shared(8 * op.count, 8)
    base = shared_address(ctx, e.i32(offset))
    first = e.cmpi("eq", ctx.tid, e.i32(0))
    for i in range(op.count):
        e.asm_void(f"@$0 mbarrier.init.shared::cta.b64 [$1], {op.arrivals};", "b,r", [first, e.addi(base, e.i32(8 * i))])
    # Make the initialised barriers visible to every thread and to the async proxy before any use.
    e.asm_void("fence.mbarrier_init.release.cluster;", "", [])
    e.asm_void("bar.sync 0;", "", [])
    ctx.set(op.result, SmemTile(e.i32(offset), op.result.type))


@lower.rule(BarrierArrive)
def _barrier_arrive(op: BarrierArrive, ctx: lower.Context) -> None:
    e = ctx.e
    bar = shared_address(ctx, ctx.get(op.operands[0]).offset)
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))  # one arrival per warpgroup
    e.asm_void("@$0 mbarrier.arrive.shared::cta.b64 _, [$1];", "b,r", [elected, bar])


@lower.rule(BarrierArriveCluster)
def _barrier_arrive_cluster(op: BarrierArriveCluster, ctx: lower.Context) -> None:
    e = ctx.e
    local = shared_address(ctx, ctx.get(op.operands[0]).offset)
    remote = e.asm("mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r", [local, ctx.get(op.operands[1])],
                   [e.int_type(32)])[0]
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    sem = "" if op.relaxed else ".release.cluster"  # without one: release at CTA scope, nothing for the peer
    e.asm_void(f"@$0 mbarrier.arrive{sem}.shared::cluster.b64 _, [$1];", "b,r", [elected, remote])


@lower.rule(BarrierWait)
def _barrier_wait(op: BarrierWait, ctx: lower.Context) -> None:
    e = ctx.e
    bar = shared_address(ctx, ctx.get(op.operands[0]).offset)
    e.asm_void("{ .reg .pred done; WAIT: mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1; "
               "@!done bra WAIT; }", "r,r", [bar, ctx.get(op.operands[1])])


@lower.rule(FenceAsyncShared)
def _fence(op: FenceAsyncShared, ctx: lower.Context) -> None:
    ctx.fence_async()


# ---------------------------------------------------------------------------------------------- interpreter

@interpret.rule(BarrierAlloc)
def _interp_barrier_alloc(op: BarrierAlloc, wg: Warpgroup) -> Generator[Wait, None, None]:
    """Thread 0 initialises the barriers, then every thread of the CTA meets at bar.sync 0."""
    wg.cta.barrier_array(op)
    wg.set(op.result, BarrierRef(op))
    yield wg.rendezvous(op, wg.cta.sync)


@interpret.rule(BarrierArrive)
def _interp_barrier_arrive(op: BarrierArrive, wg: Warpgroup) -> None:
    wg.get(op.operands[0], op).get(wg.cta).arrive(wg.clock, op.loc)


@interpret.rule(BarrierArriveCluster)
def _interp_barrier_arrive_cluster(op: BarrierArriveCluster, wg: Warpgroup) -> None:
    rank = int(wg.scalar(op.operands[1], op))
    ctas = wg.cluster.ctas
    if not 0 <= rank < len(ctas):
        raise InterpretError(f"cta={rank} is outside this cluster of {len(ctas)} CTAs", op.loc, Check.OUT_OF_BOUNDS)
    clock = wg.clock
    if op.relaxed:  # what completed (async queues, barrier phases), not the stores ("wg" counts) it knows of
        clock = {k: v for k, v in clock.items() if k[0] != "wg"}
    wg.get(op.operands[0], op).get(ctas[rank]).arrive(clock, op.loc)


@interpret.rule(BarrierWait)
def _interp_barrier_wait(op: BarrierWait, wg: Warpgroup) -> Generator[Wait, None, None]:
    bar = wg.get(op.operands[0], op).get(wg.cta)
    parity = int(wg.scalar(op.operands[1], op))

    def describe() -> str:
        return (f"{bar.describe()} to complete its phase of parity {parity} (it has completed {bar.completed} "
                f"phases; the current one has {bar.count - bar.pending} of {bar.count} arrivals, {bar.tx} TMA "
                f"bytes outstanding)")

    yield Wait(op.loc, lambda: bar.passed(parity), describe, lambda: join(wg.clock, bar.released), bar)


@interpret.rule(FenceAsyncShared)
def _interp_fence(op: FenceAsyncShared, wg: Warpgroup) -> None:
    fence(wg.cta.smem_records, wg.agent)
